"""Backend dispatch: which implementation runs each sparse kernel.

Every kernel of :mod:`corgnn.sparse.library` (a ``torch.library`` custom op) runs on
one *backend*. A backend declares, per case, whether it can run it, and when it
cannot, *why* (the pattern of xformers' ``ops/fmha/dispatch.py``):

* ``numba``:  parallel Numba kernels on CPU tensors (float32/float64).
* ``torch``:  the portable reference in plain torch ops (gather / ``index_add_``),
  any device and floating dtype; it materialises the ``(q, f)`` messages the
  fused kernels avoid, so it is the fallback, never the first choice.
* ``triton``: Triton kernels on CUDA tensors (CPU tensors through Triton's
  interpreter, ``TRITON_INTERPRET=1``; :mod:`corgnn.sparse.backends.triton`).

Dispatch walks :data:`PRIORITY` for the tensors' device and takes the first
backend whose ``supports(case)`` returns ``None``. The public controls force one:

* :func:`use_backend` (context manager, this thread) and
* the environment variable ``CORGNN_BACKEND=name`` (process-wide, read at the
  process's first dispatch: set it before running the script).

A forced backend that cannot run a case raises ``ValueError`` listing every
backend's reason; nothing silently falls back. :func:`available_backends` says which
backends are usable on this machine at all.

Dispatch happens *inside* the custom ops, at run time: ``torch.compile`` sees one
opaque op per kernel (its fake implementation gives the output shapes), and the
backend choice, including a :func:`use_backend` around a compiled model's call,
is made when the op runs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable

from .backends.base import Backend, Case, TransientReason

__all__ = ["Case", "Backend", "register_backend", "use_backend", "available_backends", "select", "bind", "token", "PRIORITY", "ENV_VAR"]

ENV_VAR = "CORGNN_BACKEND"

PRIORITY: dict[str, tuple[str, ...]] = {
    "cpu": ("numba", "torch"),
    "cuda": ("cusparse", "triton", "torch"),  # cusparse first: measured faster than the Triton SpMM on an H100 (benchmarks/results/gpu-h100-20261127)
}
"""Backends tried in order, per device type; other device types use ``("torch",)``."""


_BACKENDS: dict[str, Backend] = {}
_SELECTED: dict[tuple[Case, str | None], tuple[Backend, Callable]] = {}
"""Memo of :func:`select` per (case, forced name): a backend's answers depend on the
case and the machine only, so each case is decided once per process (except past a
:class:`~corgnn.sparse.backends.base.TransientReason`: asked again next call)."""
_GENERATION = [0]
"""Bumped whenever the memo is cleared (a registration, a forked child): part of
:func:`token`, so launchers kept by callers (:func:`bind`) are not reused across it."""


def _forget() -> None:
    _SELECTED.clear()
    _GENERATION[0] += 1


# (a forked child selects again: a backend may not run there, see backends.numba_threads)
os.register_at_fork(after_in_child=_forget)
_local = threading.local()


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (by its ``name``; a later one replaces it)."""
    _BACKENDS[backend.name] = backend
    _forget()
    return backend


def _registry() -> dict[str, Backend]:
    if not _BACKENDS:
        from .backends import BACKENDS  # (numba, torch, triton, cusparse) imported on first use: numba is slow to import

        for b in BACKENDS:
            register_backend(b)
    return _BACKENDS


def available_backends() -> dict[str, str | None]:
    """``{name: None}`` for each backend usable on this machine, ``{name: reason}`` else."""
    return {name: b.unavailable() for name, b in _registry().items()}


_ENV_FORCED: list = []
"""``[$CORGNN_BACKEND or None]``, read at the process's first dispatch."""


def _forced() -> str | None:
    name = getattr(_local, "forced", None)
    if name is None:
        # NOTE (issue 21): the environment is read once per process, not per call:
        # os.environ.get costs ~1.3 us, paid by every product through token() (on
        # a mini-batch of small graphs each layer's few microseconds of Python are
        # what corgnn adds to PyG's time); use_backend() switches within a process.
        env = _ENV_FORCED
        if not env:
            env.append(os.environ.get(ENV_VAR) or None)
        name = env[0]
    return name


def _check_name(name: str) -> None:
    if name not in _registry():
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_registry())}")


@contextlib.contextmanager
def use_backend(name: str | None):
    """Force backend ``name`` for every sparse kernel run inside the block (this thread).

    ``None`` restores automatic dispatch inside the block (overriding
    ``$CORGNN_BACKEND`` too). Nesting works; the innermost wins.

    Raises:
        ValueError: unknown backend name (at entry); inside the block, any kernel
            the forced backend cannot run (listing every backend's reason).

    Example:
        >>> with corgnn.sparse.use_backend("torch"):
        ...     y = corgnn.sparse.spmm(A, B)
    """
    if name is not None:
        _check_name(name)
    old = getattr(_local, "forced", None)
    _local.forced = name if name is not None else ""
    try:
        yield
    finally:
        _local.forced = old


def _reason(b: Backend, case: Case) -> str | None:
    return b.reason(case)


def select(case: Case) -> Backend:
    """The backend that runs ``case``: the forced one, else the first in
    :data:`PRIORITY` for the device that supports it.

    Raises:
        ValueError: no backend (or not the forced one) can run ``case``; the
            message gives each backend's reason.
    """
    return _selected(case)[0]


def _selected(case: Case) -> tuple[Backend, Callable]:
    """``(backend, its kernel of case.op)`` for ``case``, memoized per (case, forced
    name): one dict lookup per kernel call once decided (the kernel callable too, not
    only the backend: on a mini-batch of small graphs a kernel runs in a few
    microseconds, and each Python call level of dispatch costs about one)."""
    forced = _forced()
    hit = _SELECTED.get((case, forced))
    if hit is None:
        b, transient = _select(case, forced)
        hit = (b, b.kernel(case.op))
        if not transient:
            _SELECTED[(case, forced)] = hit
    return hit


def _select(case: Case, forced: str | None) -> tuple[Backend, bool]:
    """The backend, and whether a backend before it declined for now only."""
    reg = _registry()
    if forced:
        _check_name(forced)
        b = reg[forced]
        why = _reason(b, case)
        if why is None or isinstance(why, TransientReason):
            return b, False  # (forced: one still starting runs now)
    else:
        transient = False
        for name in PRIORITY.get(case.device, ("torch",)):
            b = reg.get(name)
            if b is None:
                continue
            why = _reason(b, case)
            if why is None:
                return b, transient
            transient = transient or isinstance(why, TransientReason)
    why = "; ".join(f"{n}: {_reason(b, case) or 'supported'}" for n, b in reg.items())
    head = f"backend {forced!r} (forced by use_backend/${ENV_VAR}) cannot run" if forced else "no backend can run"
    raise ValueError(f"{head} {case}. Reasons: {why}")


def bind(case: Case, *args) -> Callable | None:
    """``case.op`` with its leading arguments ``args`` bound
    (:meth:`~corgnn.sparse.backends.base.Backend.bind`) by the backend :func:`select`
    picks, when that choice is final (not one made while a faster backend is still
    starting); else, or when the backend offers no launcher, None. A caller that
    keeps the launcher keys it on :func:`token` too.

    Raises:
        ValueError: as :func:`select`.
    """
    forced = _forced()
    hit = _SELECTED.get((case, forced))
    if hit is None:
        _selected(case)
        hit = _SELECTED.get((case, forced))
    return None if hit is None else hit[0].bind(case.op, *args)


def token() -> tuple:
    """What :func:`select`'s choices depend on beyond the case: the forced backend
    (:func:`use_backend`, ``$CORGNN_BACKEND``) and the registry's generation (new after
    a registration or in a forked child). Hashable; equal tokens, equal choices."""
    if not _BACKENDS:
        _registry()  # (the first use registers the backends: a generation of its own)
    return _forced(), _GENERATION[0]


def run(case: Case, *args):
    """Run ``case.op`` on ``args`` with the kernel of the backend :func:`select` picks."""
    return _selected(case)[1](*args)
