"""Cold start: an empty Numba cache, ``corgnn warm``, and the opt-in background
warm-up (``CORGNN_NUMBA_WARMUP=background``).

Numba compiles a kernel on its first call and keeps it in an on-disk cache (Numba's
``NUMBA_CACHE_DIR``, else the ``__pycache__`` folders beside corgnn's sources). A
fresh install starts with that cache empty, and compiling is slow.

NOTE (measured 2026-11-28, 2-core VM, empty cache, a batch of 32 small graphs, 64
channels): the first training step of an ``optimize()``d 2-layer GCN took 2.9 s and
of a 3-layer GIN 3.0 s, against 30 ms with the cache warm: all but those 30 ms was
Numba compiling (the adjacency build 1.8 s, the compiler's own start included; the
SpMM row kernel 0.9 s). Issue 21 asks for under 1.5 s. Three changes brought it to
1.04-1.13 s for both (same VM, same step, several runs; each step's share measured
alone): the collector paused while Numba compiles corgnn's kernels
(:func:`~corgnn.sparse.backends.numba_threads.hook_compiles`, 2.5-2.9 -> 2.0-2.15 s), the changing-graph build
kernel written flat (:mod:`corgnn.sparse.build`'s NOTE, -> 1.70-1.85 s), and the CSR
SpMM's serial first tier (:class:`Tier`, -> 1.04-1.13 s).

``corgnn warm`` (:func:`warm`) compiles the kernels GCN, GIN, SAGE, GraphConv and
GAT models need in float32 (:func:`compile_common`: training and inference, dense and
sparse features, a repeated and a fresh graph; ~10 s of compiling on that VM) into
the cache and writes a marker (:func:`marker_path`): run it once after installing (a
Docker build step, a job's setup) and no process of that machine pays the compile
(a GAT's first training step: 7.3 s with the cache empty before its kernels had a
serial tier, 3.5-4.0 s since, 63 ms after ``corgnn warm``).

With ``CORGNN_NUMBA_WARMUP=background``, a process that finds no marker runs its
first calls on torch (the ``numba`` backend and corgnn's Numba graph builds decline
with a :class:`~corgnn.sparse.backends.base.TransientReason`: the ``torch`` backend
and the torch builds run, the same results up to rounding) while one background
process (a lock file keeps it to one per machine) runs :func:`compile_common`; it
looks for the marker at most every :data:`POLL_S` seconds and from then on runs on
Numba (a forced ``numba`` backend runs, and compiles, at once). Not the default: on the 2-core VM it took the GIN step above from 2.9 s to
24-27 ms, but while the compiler held a core the torch path's steps took ~7 ms (PyG's
1.25, corgnn's warm 1.45) for the ~11 s the warm-up took, so any script longer than
about 3 s finished later than with the compile in the first call (at ``nice`` 10 or
19 the warm-up starved for over 15 s instead; in a session of its own, as
``start_new_session`` makes it, the scheduler's autogroups gave it half the machine
whatever its nice value, and the caller's steps took ~1 s each).
"""

from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import os
import subprocess
import sys
import time

from .base import TransientReason

__all__ = ["ENV_VAR", "POLL_S", "GIVE_UP_S", "TIER_UP_S", "TIER_ENV_VAR", "Tier", "tiers", "cold_reason", "marker_path", "compile_common", "warm", "is_marked", "background_main"]

ENV_VAR = "CORGNN_NUMBA_WARMUP"
"""``background``: the background warm-up above; anything else (the default): kernels
compile in the calling process on first use."""

POLL_S = 0.2
"""Seconds between two looks for the marker while the cache is cold."""

GIVE_UP_S = 300.0
"""A cold process stops waiting after this many seconds (then compiles on first use)."""

_REASON = TransientReason(
    "Numba is compiling corgnn's kernels in a background process (empty Numba cache: the first use on this machine, "
    "or corgnn or Numba changed; `corgnn warm` compiles them up front); the torch backend runs until it is done"
)

_state: dict = {"cold": None, "marker": None, "lock": None, "proc": None, "since": 0.0, "next": 0.0, "tier_up": False}
# cold: None (not decided yet), True (waiting), False (warm or given up: Numba runs);
# tier_up: every Tier runs its parallel kernel (set by compile_common, which compiles them)


TIER_UP_S = 1.0
"""Seconds a machine's processes run a :class:`Tier`'s serial kernel on products of
more than one task before the parallel kernel compiles: about what compiling it
costs (0.9 s for the CSR SpMM on the 2-core VM). Overridden by the environment
variable :data:`TIER_ENV_VAR`."""

TIER_ENV_VAR = "CORGNN_TIER_UP_S"
"""Environment variable overriding :data:`TIER_UP_S` (``0``: the parallel kernels from
the first call, as ``corgnn bench`` sets it)."""


class Tier:
    """A parallel kernel with a serial first tier, as a JIT compiler tiers code: on a
    machine whose Numba cache does not hold the parallel kernel, calls run the serial
    kernel (it compiles in ~0.2 s; the parallel one in ~0.9 s, most of a cold start)
    until they have spent :data:`TIER_UP_S` seconds in products the parallel kernel
    would split into several tasks, counted over this machine's processes (each
    process adds its time to a file beside the cache when it exits, the next starts
    from it); then the parallel kernel compiles (at the next call, or at the first
    call of the next process) and a marker file (:func:`marker_path` ``(name)``) tells
    every later process to use it from its first call, as :func:`warm`'s marker does.
    Products of one task run serially either way (same sums: equal results).

    The rule is the ski-rental one: on ``p`` threads the serial kernel takes at most
    ``p`` times as long, so the time lost to staying serial is below the time spent
    in it, and a machine pays at most about twice the compile it would have paid at
    the first call; short scripts (a test, a notebook cell, a small training) do not
    pay the parallel compile. Measured on the 2-core VM: an empty cache's first GCN or
    GIN training step on 32 small graphs 1.65-1.9 s -> 1.0-1.13 s; the serial tier's
    steps 0.83-0.88 ms (GCN) and 1.53-1.55 ms (GIN) against 0.75 and 1.41-1.46 on the
    parallel kernel (``benchmarks/results/cold-start-20261128-tiers``).

    ``name`` names the marker (one per kernel and dtype)."""

    def __init__(self, name: str):
        self.name = name
        self._parallel: bool | None = None  # (None: not decided in this process)
        self._spent = 0.0  # (serial seconds counted, this machine's earlier processes included)
        self._carried = 0.0  # (of which earlier processes')

    def parallel(self) -> bool:
        """Whether calls run the parallel kernel now (decided at the first call)."""
        p = self._parallel
        if p is None:
            p = self._parallel = self._decide()
        return p

    def _decide(self) -> bool:
        if _state["tier_up"]:
            return True
        try:
            own, common = marker_path(self.name), marker_path()
        except Exception:  # pragma: no cover - an unreadable source tree: the parallel kernel, as before tiers
            return True
        if any(m is not None and is_marked(m) for m in (own, common)):
            return True
        self._spent = self._carried = _read_seconds(self._spent_path())
        if self._spent >= _tier_up_s():
            self.tier_up()
            return True
        atexit.register(self._save_spent)
        return False

    def _spent_path(self) -> str | None:
        marker = marker_path(self.name)
        return None if marker is None else marker[: -len(".ok")] + ".spent"

    def _save_spent(self) -> None:
        """Add this process's serial time to the machine's count (at exit; a race with
        another process exiting at once loses one of the two additions)."""
        path = self._spent_path()
        if path is None or self._parallel or self._spent <= self._carried:
            return
        total = _read_seconds(path) + self._spent - self._carried
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(repr(total))
            os.replace(tmp, path)
            self._carried = self._spent
        except OSError:
            pass

    def run(self, parallel, serial, args: tuple, tasks: int) -> None:
        """``parallel(*args)`` when :meth:`parallel`, else ``serial(*args)`` (:meth:`serial`):
        two kernels of the same arguments and results; ``tasks`` the parallel
        kernel's task count for these arguments (1: no gain from threads)."""
        if self.parallel():
            parallel(*args)
        else:
            self.serial(serial, args, tasks)

    def serial(self, kernel, args: tuple, tasks: int) -> None:
        """Run the serial ``kernel(*args)``, timing products of ``tasks > 1`` (the
        call that compiles ``kernel`` is not counted); past :data:`TIER_UP_S` the next
        call runs the parallel kernel."""
        if tasks <= 1:
            kernel(*args)
            return
        # NOTE: len(overloads), not len(signatures): that lists the overloads' keys,
        # and iterating an OrderedDict hashes each key, here tuples of Numba types
        # with Python-level hashes: 2.1 vs 0.08 us per read with one overload, twice
        # per product (~0.04 ms of a ~2.3 ms GIN step on 32 small graphs)
        compiled = len(kernel.overloads)
        t0 = time.perf_counter()
        kernel(*args)
        if len(kernel.overloads) == compiled:
            self._spent += time.perf_counter() - t0
            if self._spent >= _tier_up_s():
                self.tier_up()

    def tier_up(self) -> None:
        """From now on the parallel kernel; the marker written (its compile follows at
        the next call: a marker whose compile was cut short costs a later process only
        that compile, at its first call)."""
        self._parallel = True
        marker = marker_path(self.name)
        if marker is not None and not is_marked(marker):
            try:
                _write(marker)
            except OSError:
                pass


def _read_seconds(path: str | None) -> float:
    try:
        with open(path) as f:
            return max(0.0, float(f.read().strip() or 0))
    except (OSError, TypeError, ValueError):
        return 0.0


def tiers(kernel: str) -> dict:
    """``{dtype: Tier}`` of ``kernel`` for float32 and float64 (a marker each: the
    parallel kernel is compiled, and cached, per dtype)."""
    import torch

    return {dt: Tier(f"tier-{kernel}-{str(dt).removeprefix('torch.')}") for dt in (torch.float32, torch.float64)}


def _tier_up_s() -> float:
    try:
        return float(os.environ.get(TIER_ENV_VAR, TIER_UP_S))
    except ValueError:
        return TIER_UP_S


def cold_reason() -> TransientReason | None:
    """Why corgnn's Numba kernels should not run yet in this process (the cache is cold
    and a background process is compiling them), or None: they run."""
    cold = _state["cold"]
    if cold is False:
        return None
    if cold is None:
        _decide()
    elif time.monotonic() >= _state["next"]:
        _poll()
    return _REASON if _state["cold"] else None


def marker_path(kind: str = "warm") -> str | None:
    """The file that says this machine's Numba cache holds corgnn's common kernels
    (``kind="warm"``, written by :func:`warm`; other kinds: one kernel, :class:`Tier`):
    in the folder where corgnn keeps Numba's runtime next to its kernels
    (:func:`~corgnn.sparse.backends.numba_threads.cache_folder`), named by Python,
    Numba, llvmlite, the CPU (name and features, as Numba keys its cache) and every
    kernel source file's size and modification time (Numba invalidates a kernel's
    cache when its source changes, so this process's code is what it loaded). None
    when no folder is writable."""
    from .numba_threads import cache_folder

    folder = cache_folder()
    return None if folder is None else os.path.join(folder, f"corgnn-{kind}-{_stamp()}.ok")


@functools.cache
def _stamp() -> str:
    """The hash of :func:`marker_path`'s key (once per process: ~0.5 ms)."""
    import llvmlite
    import numba
    from llvmlite import binding as ll

    sparse = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = sorted(glob.glob(os.path.join(sparse, "*.py")) + glob.glob(os.path.join(sparse, "backends", "*.py")))
    stamps = []
    for f in sources:
        st = os.stat(f)
        stamps.append((os.path.basename(f), st.st_size, st.st_mtime_ns))
    key = repr((sys.version, numba.__version__, llvmlite.__version__, ll.get_host_cpu_name(), ll.get_host_cpu_features().flatten(), stamps))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def is_marked(marker: str) -> bool:
    """Whether ``marker`` (:func:`marker_path`) exists: the cache is warm."""
    return os.path.exists(marker)


def _decide() -> None:
    _state["cold"] = False
    if os.environ.get(ENV_VAR, "") != "background":
        return
    try:
        marker = marker_path()
    except Exception:  # pragma: no cover - an unreadable source tree: the old behaviour
        return
    if marker is None or is_marked(marker):
        return
    lock = marker[: -len(".ok")] + ".lock"
    _state.update(marker=marker, lock=lock, since=time.monotonic(), next=time.monotonic() + POLL_S, cold=True)
    if _take_lock(lock):
        # one thread; the caller's session (its autogroup: see the NOTE above)
        env = dict(os.environ, **{ENV_VAR: "", "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        env.pop("CORGNN_BACKEND", None)
        try:
            _state["proc"] = subprocess.Popen(
                [sys.executable, "-c", f"import sys; from {__name__} import background_main; sys.exit(background_main(*sys.argv[1:]))", marker, lock], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0,
            )
            with open(lock, "w") as f:  # (the compiling process holds the lock: it may outlive this one)
                f.write(str(_state["proc"].pid))
        except OSError:
            _release(lock)
            _state["cold"] = False


def _take_lock(lock: str) -> bool:
    """Create ``lock`` holding this process's pid (then the warm-up's); a lock whose
    process is gone is taken over. False: a live process holds it (that one compiles)."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _holder_alive(lock):
                return False
            _release(lock)  # stale: its process died
            continue
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _holder_alive(lock: str) -> bool:
    """Whether the process whose pid ``lock`` holds is running."""
    try:
        with open(lock) as f:
            pid = int(f.read().strip() or 0)
        os.kill(pid, 0)
        return pid > 0
    except (OSError, ValueError):
        return False


def _release(lock: str) -> None:
    try:
        os.remove(lock)
    except OSError:
        pass


def _poll() -> None:
    now = time.monotonic()
    _state["next"] = now + POLL_S
    if is_marked(_state["marker"]):
        _state["cold"] = False
        return
    proc = _state["proc"]
    ended = proc.poll() is not None if proc is not None else not _holder_alive(_state["lock"])
    if ended or now - _state["since"] > GIVE_UP_S:
        _state["cold"] = False  # the warm-up failed (or another process's ended unmarked) or takes too long: compile on first use


def _after_fork_in_child() -> None:
    _state["proc"] = None  # (the parent's child: only the marker tells the child)


os.register_at_fork(after_in_child=_after_fork_in_child)


def compile_common(progress=None) -> None:
    """Compile (or load from the cache) the kernels of GCN, GIN, SAGE, GraphConv and
    GAT models in float32 by running small ``optimize()``d PyG models on them (in a process
    not waiting for a warm-up): training and inference steps, dense and sparse
    (bag-of-words) features, the same graph again and a fresh one. ``progress(str)``:
    called before each model."""
    import torch
    from torch_geometric.nn import GATConv, GCNConv, GINConv, GraphConv, SAGEConv

    import corgnn

    _state["tier_up"] = True  # (the parallel kernels are what the marker promises)
    gen = torch.Generator().manual_seed(0)
    n, q, m = 200, 800, 300
    edge_index = torch.randint(0, n, (2, q), generator=gen)
    dense = torch.randn(n, m, generator=gen)
    sparse = (torch.rand(n, m, generator=gen) < 0.01).float()
    layers = {  # name: (first layer m -> 16, second 16 -> 4)
        "GCN": (GCNConv(m, 16), GCNConv(16, 4)),
        "GIN": tuple(GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o)), train_eps=True) for i, o in ((m, 16), (16, 4))),
        "SAGE": (SAGEConv(m, 16), SAGEConv(16, 4)),
        "GraphConv": (GraphConv(m, 16), GraphConv(16, 4)),
        "GAT": (GATConv(m, 8, heads=2, dropout=0.5), GATConv(16, 4)),  # multi-head concat with attention dropout, then one head
    }
    for name, (first, second) in layers.items():
        if progress is not None:
            progress(name)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = first, second

            def forward(self, x, edge_index):
                return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

        model = corgnn.optimize(Model())
        for x in (dense, sparse):
            for ei in (edge_index, edge_index, edge_index.clone()):
                model(x, ei).square().sum().backward()
            with torch.no_grad():
                model(x, edge_index.clone())


def warm(progress=None) -> str | None:
    """Compile the common kernels in this process now (:func:`compile_common`) and
    write the marker, so later processes start on Numba; returns the marker's path
    (None: no writable cache folder, the kernels are compiled but not marked)."""
    _state["cold"] = False  # (this process compiles: on Numba, even where it found the cache cold)
    compile_common(progress)
    marker = marker_path()
    if marker is not None:
        _write(marker)
    return marker


def _write(marker: str) -> None:
    tmp = f"{marker}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write("corgnn's common Numba kernels are in this cache\n")
    os.replace(tmp, marker)


def background_main(marker: str, lock: str) -> int:
    """The background warm-up process: :func:`compile_common`, then the ``marker``;
    the ``lock`` is released either way."""
    try:
        compile_common()
        _write(marker)
    finally:
        _release(lock)
    return 0
