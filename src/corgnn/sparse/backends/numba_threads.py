"""Numba's threading layer for corgnn's kernels: fork-safe, launches serialised.

Issue 23 item 6: after a parent process ran corgnn's parallel kernels, a child made
by ``fork`` (``multiprocessing``'s default on Linux) hung in its first forward.
Numba picks its OpenMP layer by default, and a GNU OpenMP thread pool does not
survive ``fork``: Numba's own OpenMP layer then stops the child ("fork() called from
a process already using GNU OpenMP, this is unsafe"), and torch's own parallel
regions (also GNU OpenMP in the CPU wheels) hang in it, corgnn or not.

So, before the first parallel kernel launches:

* :func:`choose_layer` selects Numba's ``workqueue`` layer, which resets its
  threads in a forked child, unless the user chose a layer
  (``NUMBA_THREADING_LAYER`` or ``numba.config.THREADING_LAYER``); ``tbb`` would
  also be fork-safe, but is not installed with corgnn.
* ``workqueue`` must not run two parallel kernels at once (the kernels release the
  GIL, so two Python threads could; Numba then aborts the process): every kernel
  launch of the ``numba`` backend takes :func:`launch_lock` (each kernel uses every
  thread anyway, so serialising costs nothing).
* In a forked child (:func:`os.register_at_fork`): a fresh lock (the parent's
  may have been held by another thread at the fork), and, when the parent launched
  corgnn's kernels and torch runs on OpenMP with more than one thread, torch on
  one thread, as PyTorch's own DataLoader sets its workers: otherwise torch's next
  parallel op hangs in the child. The parent's thread counts are never changed.
"""

from __future__ import annotations

import os
import threading

import numba
import torch

__all__ = ["FORK_SAFE_LAYER", "choose_layer", "launch_lock", "mark_launched", "serialised"]

FORK_SAFE_LAYER = "workqueue"

_state = {"lock": threading.Lock(), "launched": False, "serial": True, "torch_omp": False}


def choose_layer() -> str:
    """Select :data:`FORK_SAFE_LAYER` unless the user chose a layer; return the
    configured layer. Called when the kernels module is imported (before any
    corgnn kernel launches; a layer Numba already launched stays)."""
    if not os.environ.get("NUMBA_THREADING_LAYER") and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = FORK_SAFE_LAYER
    return numba.config.THREADING_LAYER


def mark_launched() -> None:
    """Record that Numba's threads run (call after the first launch): launches are
    serialised unless the layer is thread-safe (``omp``, ``tbb``)."""
    _state["launched"] = True
    _state["torch_omp"] = "OpenMP" in torch.__config__.parallel_info()
    try:
        _state["serial"] = numba.threading_layer() == "workqueue"
    except ValueError:  # pragma: no cover - threads not launched after all
        _state["serial"] = True


def serialised() -> bool:
    """Whether kernel launches take :func:`launch_lock` (the ``workqueue`` layer)."""
    return _state["serial"]


def launch_lock() -> threading.Lock:
    """The process-wide lock around parallel kernel launches (fresh in a forked child)."""
    return _state["lock"]


def _after_fork_in_child() -> None:
    _state["lock"] = threading.Lock()
    if _state["launched"] and _state["torch_omp"] and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


os.register_at_fork(after_in_child=_after_fork_in_child)
