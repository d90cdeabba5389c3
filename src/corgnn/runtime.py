"""Process-level CPU settings that training speed depends on (issue 12, lever 4).

:func:`reuse_freed_memory` keeps the memory of freed tensors in the process for the
next allocation instead of handing it back to the operating system.

Why. PyTorch's CPU tensors come from ``malloc``. glibc serves blocks above its mmap
threshold (128 KiB, raised dynamically up to 32 MiB) with a fresh ``mmap`` and
unmaps them on ``free``, so every training step maps its large activations and
gradients anew and pays a page fault per 4 KiB page on first touch, 10-16 ms for a
43 MB tensor on this project's machine (about 4 GB/s, slower than the copy itself).
Measured on the synthetic OGB-Arxiv stand-in (2-layer GCN, hidden 256, 2 threads,
one process): corgnn's training step took 196k minor page faults (765 MiB of 4 KiB
pages) and 529 ms; with this setting 0 faults and 295 ms. PyG's CSR GCN took 417k
faults; with the setting, none. Details in ``benchmarks/README.md`` ("Issue 12, lever
4").

The setting is a process-wide ``mallopt``: large blocks come from the heap and freed
memory stays there (the process's resident size stays at its peak instead of falling
between steps). That is what training loops want, and what the caching allocators of
PyTorch's GPU backend and of jemalloc/tcmalloc do; a library should not decide it
silently, so ``import corgnn`` and :func:`corgnn.optimize` never call it. The
``corgnn`` command turns it on for its own process (``train``, ``bench``, ...; set
``CORGNN_REUSE_FREED_MEMORY=0`` to keep glibc's defaults); in your own scripts call
``corgnn.reuse_freed_memory()`` once at start-up.

A related setting that must be made before ``import torch``: ``THP_MEM_ALLOC_ENABLE=1``
in the environment makes PyTorch ask for transparent huge pages for its large CPU
tensors (fewer page faults and TLB misses). On top of this setting it measured
within this machine's noise on the step above (corgnn 293 -> 291 ms at hidden 256,
66 -> 59 ms at hidden 16; PyG alike), so corgnn does not ask for it; it cannot be set
from inside a process once torch is loaded anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import warnings

__all__ = ["reuse_freed_memory", "reuses_freed_memory", "allocator_label"]

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_DEFAULT_THRESHOLD = 128 * 1024  # glibc's initial value of both thresholds
_KEEP = 2**30
"""Threshold with the setting on: blocks up to 1 GiB come from the heap, and up to
1 GiB of free heap top is kept. Larger blocks are still mapped (and unmapped) one by
one (glibc refuses a higher mmap threshold on some versions)."""

_active = False


@functools.cache
def _glibc():
    """The C library if it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


def reuse_freed_memory(enabled: bool = True) -> bool:
    """Keep freed CPU memory in the process for reuse (``enabled=True``), or go back
    to glibc's thresholds (``enabled=False``).

    On: ``mallopt(M_MMAP_THRESHOLD, 1 GiB)`` and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)``,
    so tensors up to 1 GiB are carved from the heap and a freed tensor's pages are
    reused by the next step without page faults. Off: both thresholds back to 128 KiB
    (glibc's initial values; its dynamic raising of the mmap threshold stays off) and
    ``malloc_trim(0)`` returns the free heap to the system now.

    Args:
        enabled: turn the setting on (default) or off.

    Returns:
        Whether the setting is on after the call. ``False`` with a ``RuntimeWarning``
        where the C library is not glibc (macOS, Windows, musl): there it does
        nothing.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    global _active
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    libc = _glibc()
    if libc is None:
        if enabled:
            warnings.warn("reuse_freed_memory: the C library is not glibc; nothing changed", RuntimeWarning, stacklevel=2)
        _active = False
        return False
    value = _KEEP if enabled else _DEFAULT_THRESHOLD
    ok = libc.mallopt(_M_MMAP_THRESHOLD, value) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, value) == 1
    if not enabled:
        libc.malloc_trim(0)
    elif not ok:  # pragma: no cover - glibc versions that cap the mmap threshold
        warnings.warn("reuse_freed_memory: glibc refused the thresholds; nothing changed", RuntimeWarning, stacklevel=2)
        libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT_THRESHOLD)
    _active = enabled and ok
    return _active


def reuses_freed_memory() -> bool:
    """Whether :func:`reuse_freed_memory` is on in this process."""
    return _active


def allocator_label() -> str:
    """``"reuse-freed"`` while :func:`reuse_freed_memory` is on, else ``"default"``
    (the ``allocator`` field of benchmark results)."""
    return "reuse-freed" if _active else "default"
