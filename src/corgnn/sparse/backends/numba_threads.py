"""Numba's process-wide start for corgnn's kernels: a cheaper load of its CPU target,
fast launches of its threading layer, and a forked child that works.

:func:`load_target` runs before corgnn's first Numba kernel of a process (see its
note: it keeps ``scipy.linalg`` out of Numba's start-up). The rest of this module is
the threading layer.

Issue 23 item 6: after a parent process ran corgnn's parallel kernels, a child made
by ``fork`` (``multiprocessing``'s default on Linux) hung in its first forward.
Numba picks its OpenMP layer by default, and a GNU OpenMP thread pool does not
survive ``fork``: Numba's own OpenMP layer then stops the child ("fork() called from
a process already using GNU OpenMP, this is unsafe"), and torch's own parallel
regions (also GNU OpenMP in the CPU wheels) hang in it, corgnn or not.

NOTE: Numba's fork-safe ``workqueue`` layer was tried as the default and dropped:
its launches cost about 150 us each on this 2-core VM (a CSR SpMM of an 800-node,
64-column mini-batch took 187-207 us under it, 40-53 us under OpenMP), 3-5x the
product itself on the small graphs of mini-batch training. So corgnn keeps Numba's
own choice of layer (OpenMP where available) and, in a forked child
(:func:`os.register_at_fork`):

* when the parent ran corgnn's kernels on Numba's OpenMP layer, the ``numba``
  backend declines every case in the child (:func:`unusable_reason`), so its
  products run on the ``torch`` backend (same results, slower) instead of aborting;
* when torch runs on OpenMP with more than one thread, torch on one thread, as
  PyTorch's own DataLoader sets its workers (otherwise torch's next parallel op
  hangs in the child). The parent's thread counts are never changed;
* a fresh launch lock.

``workqueue`` (chosen by the user with ``NUMBA_THREADING_LAYER=workqueue``) must not
run two parallel kernels at once (the kernels release the GIL, so two Python
threads could; Numba then aborts the process): under it every kernel launch of the
``numba`` backend takes :func:`launch_lock`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
import types

import numba
import torch

__all__ = ["load_target", "launch", "launch_lock", "mark_launched", "serialised", "unusable_reason"]

_state = {"lock": threading.Lock(), "launched": False, "serial": True, "torch_omp": False, "layer": None, "unusable": None}


_BLAS_PROBE = "scipy.linalg.cython_blas"


@functools.cache
def load_target() -> None:
    """Import Numba's NumPy array support (``numba.np.arraymath``, part of its CPU
    target) once, before corgnn's first Numba kernel in this process (every caller of a
    kernel calls this or :func:`launch` first), without importing ``scipy.linalg``.

    NOTE: at import, ``numba.np.arraymath`` probes for BLAS by importing
    ``scipy.linalg.cython_blas``, and importing ``scipy.linalg`` (SciPy 1.17) costs
    150-180 ms on the 2-core CI machine (its ``array_api_compat`` clones ``numpy``,
    which imports ``numpy.f2py``: ~110 ms alone): half of a fresh process's first
    call with ``optimize()`` (measured: GIN, one forward/backward, 289-354 ms with the
    probe, 140-170 ms without). corgnn's kernels call no BLAS. So while Numba imports
    that module, and only when ``scipy.linalg`` is not imported yet and SciPy is
    installed, the probe is answered by an empty placeholder module, removed right
    after the import. Numba then records BLAS as available (as the real probe would,
    and it checks SciPy's integer width as usual) and imports the real
    ``scipy.linalg.cython_blas`` the first time a jitted function needs BLAS
    (``np.dot``, ``np.linalg``); ``import scipy.linalg`` afterwards is the real one
    (``tests/test_library.py`` checks both in a fresh process).

    The placeholder is visible to other threads for the length of that import (~20-40 ms):
    a thread importing a SciPy Cython module that uses BLAS in exactly that window would
    fail with an ImportError. Set ``CORGNN_NUMBA_BLAS_PROBE=1`` to keep Numba's own probe.
    """
    if "numba.np.arraymath" in sys.modules or _BLAS_PROBE in sys.modules or os.environ.get("CORGNN_NUMBA_BLAS_PROBE") == "1":
        return
    if "scipy" not in sys.modules and importlib.util.find_spec("scipy") is None:
        return
    placeholder = types.ModuleType(_BLAS_PROBE, "corgnn's stand-in for Numba's BLAS probe at start-up (removed after it)")
    sys.modules[_BLAS_PROBE] = placeholder
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(_BLAS_PROBE) is placeholder:
            del sys.modules[_BLAS_PROBE]


@functools.cache
def launch() -> None:
    """Launch Numba's threading layer once, before corgnn's first parallel kernel
    (every caller of a parallel Numba kernel calls this first: the backend's
    dispatch and the feature conversions of :mod:`corgnn.nn.base`), keeping torch's
    CPU thread count, and run the kernels on as many threads as torch uses.

    NOTE: Numba's OpenMP threading layer shares the OpenMP runtime with torch, and
    launching it (on the first parallel kernel) resets the thread count torch reads:
    a user's earlier ``torch.set_num_threads(1)`` silently became "all cores" after
    corgnn's first SpMM (or first sparse-feature conversion, which launched the layer
    on its own until this was one function). Launching it here and restoring torch's
    setting keeps the user's choice, and Numba follows it (capped at
    ``NUMBA_NUM_THREADS``).
    """
    load_target()
    threads = torch.get_num_threads()
    numba.get_num_threads()  # launches the threading layer
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    mark_launched()


def mark_launched() -> None:
    """Record that Numba's threads run (call after the first launch): launches are
    serialised unless the layer is thread-safe (``omp``, ``tbb``)."""
    _state["launched"] = True
    _state["torch_omp"] = "OpenMP" in torch.__config__.parallel_info()
    try:
        _state["layer"] = numba.threading_layer()
    except ValueError:  # pragma: no cover - threads not launched after all
        _state["layer"] = None
    _state["serial"] = _state["layer"] in (None, "workqueue")


def unusable_reason() -> str | None:
    """Why the ``numba`` backend cannot run in this process (None: it can)."""
    return _state["unusable"]


def serialised() -> bool:
    """Whether kernel launches take :func:`launch_lock` (the ``workqueue`` layer)."""
    return _state["serial"]


def launch_lock() -> threading.Lock:
    """The process-wide lock around parallel kernel launches (fresh in a forked child)."""
    return _state["lock"]


def _after_fork_in_child() -> None:
    _state["lock"] = threading.Lock()
    if _state["launched"] and _state["layer"] == "omp":
        _state["unusable"] = (
            "this process was forked from one whose Numba OpenMP threads ran corgnn's kernels, and GNU OpenMP does not "
            "survive fork: the child runs them on the torch backend (start it with the 'spawn' or 'forkserver' method, "
            "or set NUMBA_THREADING_LAYER=workqueue, to keep the Numba kernels)"
        )
    if _state["launched"] and _state["torch_omp"] and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


os.register_at_fork(after_in_child=_after_fork_in_child)
