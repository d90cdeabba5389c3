"""THE list of sparse formats: names, classes, conversion.

Each format class registers itself under its ``name`` when defined
(:attr:`SparseFormat.registry`); importing this module imports every format
module, so :data:`FORMATS` is complete. Everything that needs the list of formats
(validation of ``format=`` arguments, the benchmark grids, the cost model) reads it
here.
"""

from __future__ import annotations

from . import ell, formats  # noqa: F401  (defining the classes registers them)
from .formats import SparseFormat

__all__ = ["FORMATS", "FORMAT_NAMES", "convert", "check_format_name"]

FORMATS: dict[str, type] = dict(SparseFormat.registry)
"""Format name -> class: ``coo``, ``csr``, ``csc``, ``ell``, ``hybrid``."""

FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def check_format_name(name: str, *, allow_auto: bool = False) -> str:
    """Return ``name`` if it names a format (or ``"auto"`` when allowed).

    Raises:
        ValueError: anything else, listing the valid names.
    """
    if (allow_auto and name == "auto") or name in FORMATS:
        return name
    valid = (("auto",) if allow_auto else ()) + FORMAT_NAMES
    raise ValueError(f"format must be one of {valid}, got {name!r}")


def convert(A: SparseFormat, name: str) -> SparseFormat:
    """``A`` in the format called ``name`` (``A`` itself if already there).

    Raises:
        ValueError: unknown format name.
    """
    return A.to(check_format_name(name))
