"""Numba's process-wide start for corgnn's kernels: a cheaper load of cached kernels,
a cheaper compile of uncached ones, vectorized (:func:`hook_compiles`), fast launches
of its threading layer, and a forked child that works.

:func:`load_target` runs before corgnn's first Numba kernel of a process (see its
note: cached kernels load without Numba's full CPU target). The rest of this module
is the threading layer.

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
import gc
import os
import sys
import threading

import numba
import torch
from numba.core import event

__all__ = ["load_target", "hook_compiles", "start_runtime", "runtime_cache_file", "cache_folder", "runtime_source", "launch", "launch_lock", "mark_launched", "serialised", "unusable_reason"]

_state = {"lock": threading.Lock(), "launched": False, "serial": True, "torch_omp": False, "layer": None, "unusable": None, "runtime": None, "compile_hook": None}
# ("runtime": how :func:`start_runtime` started Numba's runtime: "loaded" from disk, "compiled" and written, "numba"'s own start)


@functools.cache
def load_target() -> None:
    """Make Numba load corgnn's cached kernels without its full CPU target, once per
    process, before corgnn's first Numba kernel (every caller of a kernel calls this
    or :func:`launch` first).

    NOTE: to load a kernel from its on-disk cache, Numba first "refreshes" its CPU
    target: it imports ~70 modules of typing and lowering tables (``numba.np.arraymath``
    and ``arrayobj``, ``numba.cpython.unicode``, ``numba.typed``, ...) and installs
    them, which only compiling needs. That was most of a fresh process's first call
    with ``optimize()`` (measured, GIN, 128 molecule graphs, one forward/backward, warm
    cache, 2-core VM: 245-410 ms with the refresh, 125-150 ms without; PyG's own first
    step 35-57 ms). A cached kernel needs of Numba's start only its runtime (NRT: its
    allocator and reference counts, which cached code links against) and the
    environments its pickle names (imported by the unpickling itself). So for corgnn's
    kernels (functions of ``corgnn.*`` modules) the cache load initialises the runtime
    and loads; any other function, a cache miss (compiling refreshes as usual) and any
    exception of that load (then retried by Numba's own path, refresh first) are
    Numba's own. Installed only when this Numba has the cache internals it relies on;
    set ``CORGNN_NUMBA_FULL_START=1`` to keep Numba's own load for every kernel.

    Also sets how Numba compiles corgnn's kernels (:func:`hook_compiles`).
    """
    hook_compiles()
    if os.environ.get("CORGNN_NUMBA_FULL_START") == "1":
        return
    from numba.core import caching

    cache_class = caching.Cache
    numba_load = cache_class.load_overload
    if not all(hasattr(cache_class, name) for name in ("_load_overload", "_guard_against_spurious_io_errors")):
        return  # pragma: no cover - another Numba's internals: its own load

    def load_overload(self, sig, target_context):
        module = getattr(getattr(self, "_py_func", None), "__module__", None) or ""
        if not module.startswith("corgnn."):
            return numba_load(self, sig, target_context)
        try:
            start_runtime(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:
            return numba_load(self, sig, target_context)

    load_overload.__doc__ = numba_load.__doc__
    load_overload.corgnn_light = True
    cache_class.load_overload = load_overload


def hook_compiles() -> None:
    """From now on, while Numba compiles one of corgnn's kernels (a cache miss: the
    first use on a machine), nested compiles of its callees included: Python's cyclic
    garbage collector is paused, and for the kernels of a module that sets
    ``COMPILE_WITH_SLP = True`` (the attention kernels') LLVM's SLP vectorizer is on
    (``numba.config.SLP_VECTORIZE``, off by default in Numba); both are restored as
    they were when that compile ends. Called once per process before corgnn's first
    kernel (:func:`~corgnn.sparse.backends.numba_threads.load_target`) and when the
    kernel modules load; idempotent. Uses Numba's event API (``numba:compile``
    events, sent only when a kernel is compiled, not when it loads from the cache).

    NOTE (issue 21, cold start): Numba's compiler allocates millions of short-lived
    objects (IR, types, llvmlite values), so the collector runs full collections
    over the whole process (torch, PyG, the user's model) many times per kernel.
    Measured 2026-11-28, 2-core VM, empty cache, an ``optimize()``d 2-layer GCN's
    first training step on 32 small graphs: 2.47-2.73 s with the collector, 1.99-2.05
    s with it off during the compile (``gc.freeze()`` instead: 2.09-2.20 s). The
    garbage a compile leaves is collected by the next collection after it.

    NOTE (issue 25, SLP): the attention kernels' per-entry loops run over the heads,
    eight in the common case: too short for LLVM's loop vectorizer on an AVX-512 CPU
    (vector body 16 x 4 floats), so they ran scalar. Their eight-head paths
    (:data:`~corgnn.sparse.backends.numba_kernels.HEADS8`) hold the eight values in
    locals, which only the SLP vectorizer turns into one vector. Measured
    2026-11-28 (Zen 4 VM, 2 threads, Flickr's shape: 89k nodes, 893k entries, 8 heads
    of 8 channels): the transformer's forward kernel 51 -> 38 ms; the same
    eight-head code compiled without SLP took 76 ms (scalar, unrolled). Not on for
    every kernel: the CSR SpMM on an OGB-Arxiv-shaped graph at 128 columns read 3 %
    slower with it in three alternating pairs of processes (noise-sized, not needed:
    its loops are long), and the first step's compile was unchanged either way."""
    if _state["compile_hook"] is None:
        _state["compile_hook"] = _CompileSettings()
        event.register("numba:compile", _state["compile_hook"])


class _CompileSettings(event.Listener):
    """The ``numba:compile`` listener of :func:`hook_compiles` (its events come under
    Numba's compiler lock, so one compile at a time updates ``depth``)."""

    def __init__(self):
        self.depth = 0
        self.restore = None  # (while set: the collector's state and SLP_VECTORIZE before)

    def on_start(self, ev) -> None:
        if self.depth == 0 and _is_corgnn_kernel(ev.data):
            self.restore = (gc.isenabled(), numba.config.SLP_VECTORIZE)
            gc.disable()
            if getattr(sys.modules.get(_kernel_module(ev.data)), "COMPILE_WITH_SLP", False):
                numba.config.SLP_VECTORIZE = 1
        self.depth += 1

    def on_end(self, ev) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.restore is not None:
            enabled, numba.config.SLP_VECTORIZE = self.restore
            if enabled:
                gc.enable()
            self.restore = None


def _kernel_module(data) -> str:
    """The module of the function a ``numba:compile`` event's dispatcher compiles."""
    dispatcher = data.get("dispatcher") if isinstance(data, dict) else None
    return getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""


def _is_corgnn_kernel(data) -> bool:
    return _kernel_module(data).startswith("corgnn.")


def runtime_cache_file(codegen) -> str | None:
    """Where :func:`start_runtime` keeps the runtime's object code: :func:`cache_folder`
    (where Numba caches corgnn's kernels), named by everything the code depends on (Python, Numba
    and llvmlite versions, the target triple, CPU name and features, as Numba keys
    its own cache); None when no folder is writable."""
    import hashlib
    import sys

    import llvmlite

    key = repr((sys.version, numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
    folder = cache_folder()
    return None if folder is None else os.path.join(folder, f"corgnn-nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin")


def cache_folder() -> str | None:
    """Where corgnn keeps its own files beside Numba's cache of its kernels: Numba's
    cache directory (``NUMBA_CACHE_DIR``), this package's ``__pycache__``, or, when
    that is not writable (a read-only install, e.g. a system ``site-packages``), the
    user-wide folder Numba itself then caches these kernels in
    (:func:`_user_wide_folder`); None when none is writable."""
    for folder in (numba.config.CACHE_DIR or None, os.path.join(os.path.dirname(__file__), "__pycache__"), _user_wide_folder()):
        if folder:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError:
                continue
            if os.access(folder, os.W_OK):
                return folder
    return None


def _user_wide_folder() -> str | None:
    """The folder Numba's user-wide cache locator gives this module's functions
    (``numba.core.caching.UserWideCacheLocator``: the user's cache directory, e.g.
    ``~/.cache/numba``, plus a path made from this file's folder), the one Numba falls
    back to for corgnn's kernels when the package's ``__pycache__`` is read-only; None
    when this Numba has no such locator."""
    try:
        from numba.core.caching import UserWideCacheLocator

        return UserWideCacheLocator(cache_folder, __file__).get_cache_path()
    except Exception:  # (another Numba's internals: no fallback folder)
        return None


def start_runtime(target_context) -> None:
    """Numba's runtime (NRT) started as ``rtsys.initialize`` does, with its compiled
    library loaded from disk after the first process instead of compiled again.

    NOTE: ``rtsys.initialize`` compiles NRT's reference-count and allocation helpers
    with LLVM in every process: 23-24 ms of a fresh process's first call on the 2-core
    CI machine (a second compile in the same process still 17-20 ms: the work is the
    compile, not a one-time start). The first process compiles it here the same way
    with object caching on and writes the object code (and the bitcode other
    libraries link against) next to Numba's cache of corgnn's kernels; later ones
    load it as Numba loads a cached kernel. Any failure (no writable folder, an
    unreadable or foreign file, another Numba's internals) falls back to
    ``rtsys.initialize``."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import _nrt_python, nrtdynmod, rtsys

    if getattr(rtsys, "_init", True):  # (started, or another Numba: its own start below)
        return rtsys.initialize(target_context)
    how = "numba"
    try:
        import pickle

        from llvmlite import binding as ll

        with global_compiler_lock:
            if rtsys._init:
                return None
            codegen = target_context.codegen()
            path = runtime_cache_file(codegen)
            if path is None or numba.config.NRT_STATS:
                _state["runtime"] = how
                return rtsys.initialize(target_context)
            for py_name, address in _nrt_python.c_helpers.items():  # (as rtsys.initialize registers them)
                ll.add_symbol(py_name if py_name.startswith("_") else "NRT_" + py_name, address)
            if os.path.exists(path):
                try:
                    with open(path, "rb") as f:
                        library = codegen.unserialize_library(pickle.load(f))
                    how = "loaded"
                except Exception:
                    os.remove(path)  # (unreadable: the next process writes it again)
                    raise
            else:
                ir_mod, library = nrtdynmod.create_nrt_module(target_context)
                library.enable_object_caching()
                library.add_ir_module(ir_mod)
                library.finalize()
                how = "compiled"
            rtsys._library, rtsys._init = library, True
            if how == "compiled":
                tmp = f"{path}.{os.getpid()}.tmp"
                try:  # (written whole, then renamed: a concurrent process reads the old file or the new)
                    with open(tmp, "wb") as f:
                        pickle.dump(library.serialize_using_object_code(), f)
                    os.replace(tmp, path)
                except OSError:
                    pass  # (not kept: the next process compiles it again)
    except Exception:
        how = "numba"
        rtsys.initialize(target_context)
    _state["runtime"] = how
    return None


def runtime_source() -> str | None:
    """How this process started Numba's runtime (:func:`start_runtime`): "loaded" from
    disk, "compiled" (and written), "numba" (Numba's own start), or None (not yet, or
    started outside corgnn's kernel loads)."""
    return _state["runtime"]


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

    NOTE (2026-11-28, torch 2.13 CPU wheel, Numba 0.68, this project's VM): there the
    two do not share a runtime: Numba's ``omppool`` links ``libgomp.so.1.0.0`` (the
    system's), torch ships its own ``libgomp.so.1``, so two OpenMP pools run, and
    launching Numba's left ``torch.set_num_threads(1)`` at 1. The restore stays for
    builds where both resolve to one ``libgomp``.
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
