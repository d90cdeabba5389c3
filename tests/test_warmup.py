"""Cold start (:mod:`corgnn.sparse.backends.numba_warmup`): ``corgnn warm`` fills an
empty Numba cache and marks it; with ``CORGNN_NUMBA_WARMUP=background`` a process that
finds it cold runs on torch while a background process compiles, then on Numba;
dispatch does not memoize a selection made past a transient reason."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from corgnn.sparse import dispatch
from corgnn.sparse.backends import numba_threads, numba_warmup
from corgnn.sparse.backends.base import Case, TransientReason
from corgnn.sparse.backends.torch_ref import TorchBackend

CASE = Case("spmm_rows", "cpu", torch.float32)


def _env(tmp_path, **extra) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), **extra)
    for name in ("CORGNN_BACKEND", "TRITON_INTERPRET", numba_warmup.ENV_VAR, numba_warmup.TIER_ENV_VAR):
        env.pop(name, None)
    env.update(extra)
    return env


def _python(code: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cold(monkeypatch, tmp_path):
    """This process made to look cold (a marker that does not exist, no warm-up
    process, no polling for a while)."""
    monkeypatch.setitem(numba_warmup._state, "cold", True)
    monkeypatch.setitem(numba_warmup._state, "marker", str(tmp_path / "absent.ok"))
    monkeypatch.setitem(numba_warmup._state, "proc", None)
    lock = tmp_path / "absent.lock"
    lock.write_text(str(os.getpid()))  # a live process holds the warm-up's lock
    monkeypatch.setitem(numba_warmup._state, "lock", str(lock))
    monkeypatch.setitem(numba_warmup._state, "since", time.monotonic())
    monkeypatch.setitem(numba_warmup._state, "next", time.monotonic() + 3600)
    monkeypatch.setattr(dispatch, "_SELECTED", {})
    return tmp_path / "absent.ok"


def test_a_transient_reason_is_not_memoized(monkeypatch):
    answers = [TransientReason("starting"), None]

    class Starting(TorchBackend):
        name = "starting-test"

        def supports(self, case):
            return answers.pop(0) if answers else None

    monkeypatch.setitem(dispatch._registry(), "starting-test", Starting())
    monkeypatch.setitem(dispatch.PRIORITY, "cpu", ("starting-test", "torch"))
    monkeypatch.setattr(dispatch, "_SELECTED", {})
    assert dispatch.select(CASE).name == "torch"  # declined for now: the next one
    assert dispatch.select(CASE).name == "starting-test"  # asked again, and memoized from then on
    assert not answers and dispatch.select(CASE).name == "starting-test"


def test_a_cold_process_runs_torch_and_its_results(cold):
    from corgnn.sparse import build
    from corgnn.sparse.formats import CSR
    from test_sparse import dense, make_coo

    assert numba_warmup.cold_reason() is not None
    assert dispatch.select(CASE).name == "torch"
    assert not build.supported(torch.device("cpu"), torch.float32)
    row, col, val, shape = make_coo("duplicates", torch.float32)
    A = CSR.from_coo(row, col, val, shape)  # the torch path's sort
    ref = torch.zeros(shape, dtype=torch.float32).index_put_((row, col), val, accumulate=True)
    torch.testing.assert_close(dense(A), ref)
    with dispatch.use_backend("numba"):  # forced: runs (compiles) now
        assert dispatch.select(CASE).name == "numba"
    cold.write_text("")  # the warm-up's marker appears: the next poll switches to Numba
    numba_warmup._state["next"] = 0.0
    assert numba_warmup.cold_reason() is None and numba_warmup._state["cold"] is False
    assert dispatch.select(CASE).name == "numba"


def _dead_pid() -> str:
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path):
    lock = tmp_path / "w.lock"
    lock.write_text(str(os.getpid()))  # alive: another process compiles
    assert not numba_warmup._take_lock(str(lock))
    lock.write_text(_dead_pid())
    assert numba_warmup._take_lock(str(lock)) and lock.read_text() == str(os.getpid())


def test_marker_folder_falls_back_to_numbas_user_wide_cache_when_the_package_is_read_only(monkeypatch, tmp_path):
    """A read-only install (no NUMBA_CACHE_DIR, the package's __pycache__ not writable):
    corgnn's markers go where Numba then caches the kernels of this package, its
    user-wide folder (under XDG_CACHE_HOME here), not nowhere."""
    from numba.core.caching import UserWideCacheLocator

    monkeypatch.setattr(numba_threads.numba.config, "CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tree = os.path.join(os.path.dirname(numba_threads.__file__), "__pycache__")
    assert numba_threads.cache_folder() == tree  # (writable here: the package's own folder, as before)
    real = os.access
    monkeypatch.setattr(numba_threads.os, "access", lambda path, mode: False if path == tree else real(path, mode))
    folder = numba_threads.cache_folder()
    assert folder is not None and folder.startswith(str(tmp_path)) and os.path.isdir(folder)
    assert folder == UserWideCacheLocator(test_marker_folder_falls_back_to_numbas_user_wide_cache_when_the_package_is_read_only, numba_threads.__file__).get_cache_path()
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-folder")  # (nothing writable: none)
    assert numba_threads.cache_folder() is None


def test_a_warm_up_that_died_unmarked_ends_the_wait(cold, tmp_path):
    assert numba_warmup.cold_reason() is not None
    numba_warmup._state["next"] = 0.0
    assert numba_warmup.cold_reason() is not None  # its holder alive: still waiting
    (tmp_path / "absent.lock").write_text(_dead_pid())  # another process's warm-up died without the marker
    numba_warmup._state["next"] = 0.0
    assert numba_warmup.cold_reason() is None and dispatch.select(CASE).name == "numba"  # compiles here now


def test_warm_command_fills_an_empty_cache_and_a_later_process_starts_on_numba(tmp_path):
    env = _env(tmp_path, **{numba_warmup.ENV_VAR: "background"})  # (warm compiles here all the same)
    out = subprocess.run([sys.executable, "-m", "corgnn.cli", "warm"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compiling GIN kernels" in out.stderr and "marker" in out.stdout
    cached = os.listdir(tmp_path / "numba-cache")
    assert any(name.startswith("corgnn-warm-") and name.endswith(".ok") for name in cached)
    assert not any(name.endswith(".lock") for name in cached)  # no background warm-up started
    kernels = [f for _, _, files in os.walk(tmp_path / "numba-cache") for f in files if f.endswith(".nbi")]
    assert any(f.startswith("numba_kernels.spmm_rows") for f in kernels) and any(f.startswith("build._adjacency") for f in kernels)
    assert any(f.startswith("numba_gat_kernels.") for f in kernels)
    code = """
import torch
from corgnn.sparse.backends import numba_threads, numba_warmup
from corgnn.sparse.dispatch import select, Case
assert numba_warmup.cold_reason() is None
print(select(Case("spmm_rows", "cpu", torch.float32)).name)
"""
    later = _python(code, _env(tmp_path, **{numba_warmup.ENV_VAR: "background"}))
    assert later.returncode == 0 and later.stdout.split() == ["numba"], later.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "corgnn.cli", "warm", "--status"], env=env, capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout.splitlines()[-1] == "warm"


def test_background_warmup_runs_torch_until_the_kernels_are_compiled(tmp_path):
    code = """
import time, torch
from torch_geometric.nn import GINConv
import corgnn
from corgnn.sparse.backends import numba_threads, numba_warmup
from corgnn.sparse.dispatch import select, Case, use_backend
torch.manual_seed(0)
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GINConv(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)))

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)

layer = corgnn.optimize(Model())
x, ei = torch.randn(50, 8), torch.randint(0, 50, (2, 200))
first = layer(x, ei)
case = Case("spmm_rows", "cpu", torch.float32)
print(select(case).name)
deadline = time.monotonic() + 240
while numba_warmup.cold_reason() is not None and time.monotonic() < deadline:
    time.sleep(0.2)
print(select(case).name)
later = layer(x, ei.clone())
torch.testing.assert_close(first, later, rtol=1e-5, atol=1e-5)
print(numba_warmup.is_marked(numba_warmup.marker_path()))
"""
    out = _python(code, _env(tmp_path, **{numba_warmup.ENV_VAR: "background"}))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["torch", "numba", "True"]
    assert not any(name.endswith(".lock") for name in os.listdir(tmp_path / "numba-cache"))  # released


def _compiling(module: str) -> dict:
    """The data of a ``numba:compile`` event for a function of ``module``."""
    import types

    return {"dispatcher": types.SimpleNamespace(py_func=types.SimpleNamespace(__module__=module))}


def test_gc_is_paused_while_a_corgnn_kernel_compiles_and_restored_after():
    """The ``numba:compile`` listener (sent by Numba around each compile): the
    collector is off inside a compile of a corgnn kernel, nested compiles included,
    and back as it was after; other functions' compiles leave it alone."""
    import gc

    from numba.core import event

    numba_threads.hook_compiles()
    ours, theirs = _compiling("corgnn.sparse.build"), _compiling("user_module")
    was = gc.isenabled()
    try:
        gc.enable()
        with event.trigger_event("numba:compile", data=theirs):
            assert gc.isenabled()
        with event.trigger_event("numba:compile", data=ours):
            assert not gc.isenabled()
            with event.trigger_event("numba:compile", data=theirs):  # a callee
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(ValueError), event.trigger_event("numba:compile", data=ours):
            raise ValueError("a failed compile")
        assert gc.isenabled()
        gc.disable()  # a user who turned it off keeps it off
        with event.trigger_event("numba:compile", data=ours):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_slp_is_on_while_an_attention_kernel_module_compiles_and_only_then():
    """The SLP vectorizer (``numba.config.SLP_VECTORIZE``) is on inside a compile of a
    kernel of a module that sets ``COMPILE_WITH_SLP`` (the attention kernels, whose
    eight-head paths need it), callees included, and back as it was after; other
    corgnn kernels and the user's functions compile as Numba's setting says."""
    import numba
    from numba.core import event

    import corgnn.sparse.backends.numba_transformer_kernels  # noqa: F401 - in sys.modules, as when Numba compiles it

    numba_threads.hook_compiles()
    was = numba.config.SLP_VECTORIZE
    try:
        numba.config.SLP_VECTORIZE = 0
        with event.trigger_event("numba:compile", data=_compiling("corgnn.sparse.backends.numba_transformer_kernels")):
            assert numba.config.SLP_VECTORIZE == 1
            with event.trigger_event("numba:compile", data=_compiling("corgnn.sparse.build")):  # a callee
                assert numba.config.SLP_VECTORIZE == 1
        assert numba.config.SLP_VECTORIZE == 0
        for module in ("corgnn.sparse.build", "corgnn.sparse.backends.numba_kernels", "user_module"):
            with event.trigger_event("numba:compile", data=_compiling(module)):
                assert numba.config.SLP_VECTORIZE == 0
        with pytest.raises(ValueError), event.trigger_event("numba:compile", data=_compiling("corgnn.sparse.backends.numba_gat_kernels")):
            raise ValueError("a failed compile")
        assert numba.config.SLP_VECTORIZE == 0
    finally:
        numba.config.SLP_VECTORIZE = was


def test_every_kernel_module_using_the_eight_head_helpers_compiles_with_slp():
    """The helpers' eight-head paths run scalar, slower than their loops, unless the
    SLP vectorizer compiles them: every backend module that imports one sets
    ``COMPILE_WITH_SLP = True``."""
    import importlib
    import pkgutil

    import corgnn.sparse.backends as backends
    from corgnn.sparse.backends import numba_kernels as k

    helpers = {id(getattr(k, name)) for name in dir(k) if name.startswith("head_") or name == "exp_shifted"}
    assert len(helpers) >= 9
    users = []
    for info in pkgutil.iter_modules(backends.__path__):
        if info.name == "numba_kernels" or not info.name.startswith("numba"):
            continue
        module = importlib.import_module(f"corgnn.sparse.backends.{info.name}")
        if any(id(v) in helpers for v in vars(module).values()):
            users.append(info.name)
            assert getattr(module, "COMPILE_WITH_SLP", False) is True, info.name
    assert {"numba_gat_kernels", "numba_gatv2_kernels", "numba_transformer_kernels"} <= set(users)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_serial_spmm_kernel_equals_the_parallel_one(dtype):
    from corgnn.sparse.backends import numba_kernels as k

    gen = torch.Generator().manual_seed(3)
    n, q, f = 300, 2000, 19
    row = torch.randint(0, n, (q,), generator=gen).sort().values
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(row, minlength=n).cumsum(0)]).numpy()
    idx = torch.randint(0, n, (q,), generator=gen).numpy()
    B = torch.randn(n, f, generator=gen, dtype=dtype).numpy()
    val = torch.rand(q, generator=gen, dtype=dtype).numpy()
    perm = torch.randperm(q, generator=gen).numpy()
    bias = torch.randn(f, generator=gen, dtype=dtype).numpy()
    chunks = torch.tensor([0, 70, 150, 151, n]).numpy()
    empty_i, empty_v = perm[:0], val[:0]
    for v, pm, b in ((val, empty_i, empty_v), (empty_v, empty_i, empty_v), (val, perm, empty_v), (val, empty_i, bias)):
        a = torch.full((n, f), float("nan"), dtype=dtype).numpy()
        s = a.copy()
        k.spmm_rows(ptr, idx, v, pm, chunks, B, a, b)
        k.spmm_rows_serial(ptr, idx, v, pm, chunks, B, s, b)
        assert not torch.isnan(torch.from_numpy(s)).any()
        assert torch.equal(torch.from_numpy(a), torch.from_numpy(s))  # the same sums in the same order


def test_tier_runs_serial_until_its_time_is_spent_then_marks_the_parallel_kernel(monkeypatch, tmp_path):
    import numba
    import numpy as np

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(numba_warmup._state, "tier_up", False)
    monkeypatch.setenv(numba_warmup.TIER_ENV_VAR, "1e-9")
    calls = []

    @numba.njit(cache=False)
    def kernel(a):  # (a fresh dispatcher: its first call compiles)
        a[0] += 1.0

    def run(tier, tasks):
        a = np.zeros(1)
        tier.serial(kernel, (a,), tasks)
        calls.append(a[0])

    tier = numba_warmup.Tier("tier-test")
    assert not tier.parallel()
    run(tier, 4)  # compiles: not counted
    assert not tier.parallel()
    run(tier, 1)  # one task: the serial kernel is the fast one, not counted
    assert not tier.parallel() and not os.path.exists(numba_warmup.marker_path("tier-test"))
    run(tier, 4)
    assert tier.parallel() and calls == [1.0, 1.0, 1.0]
    assert os.path.exists(numba_warmup.marker_path("tier-test"))
    assert numba_warmup.Tier("tier-test").parallel()  # a later process: parallel from its first call
    assert not numba_warmup.Tier("tier-other").parallel()
    monkeypatch.setenv(numba_warmup.TIER_ENV_VAR, "0")
    assert numba_warmup.Tier("tier-other").parallel()
    assert os.path.exists(numba_warmup.marker_path("tier-other"))  # (forced: marked too)


def test_tier_counts_serial_time_over_the_machines_processes(monkeypatch, tmp_path):
    """Many short processes add up: each one's serial time is carried to the next
    (the ski-rental bound holds per machine, not per process)."""
    import numba
    import numpy as np

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(numba_warmup._state, "tier_up", False)
    monkeypatch.setattr(numba_warmup.atexit, "register", lambda fn: None)  # (the test plays the exits)

    @numba.njit(cache=False)
    def kernel(a):
        a[0] += 1.0

    kernel(np.zeros(1))
    monkeypatch.setenv(numba_warmup.TIER_ENV_VAR, "3600")
    first = numba_warmup.Tier("tier-carry")
    assert not first.parallel()
    first.serial(kernel, (np.zeros(1),), 2)
    spent = first._spent
    assert 0 < spent < 1
    first._save_spent()  # the process exits
    second = numba_warmup.Tier("tier-carry")
    assert not second.parallel() and second._spent == pytest.approx(spent)
    second.serial(kernel, (np.zeros(1),), 2)
    second._save_spent()
    second._save_spent()  # (an exit saves once: nothing new to add)
    monkeypatch.setenv(numba_warmup.TIER_ENV_VAR, repr(second._spent * 0.999))
    third = numba_warmup.Tier("tier-carry")
    assert third.parallel()  # the machine's serial time is past the threshold
    assert os.path.exists(numba_warmup.marker_path("tier-carry"))


def test_a_cold_process_trains_on_the_serial_spmm_and_tiers_up(tmp_path):
    """End to end, in fresh processes on an empty cache: an optimize()d GCN's steps on a
    batch of small graphs run the serial SpMM (the parallel one not compiled), past
    ``CORGNN_TIER_UP_S`` the parallel one, with equal outputs; a later process starts
    on the parallel kernel."""
    code = """
import sys, torch
from torch_geometric.nn import GCNConv
import corgnn
from corgnn.sparse.backends import numba_kernels as k
torch.manual_seed(0)
conv = corgnn.optimize(GCNConv(16, 16))
ei = torch.cat([torch.randint(0, 25, (2, 60)) + 25 * i for i in range(32)], 1)
x = torch.randn(800, 16)
outs = []
for _ in range(int(sys.argv[1])):
    out = conv(x.clone(), ei.clone())  # (a new x each step: the same x on the graph of the same contents would reuse A'X, no SpMM)
    out.sum().backward()
    outs.append(out.detach())
for o in outs[1:]:
    torch.testing.assert_close(o, outs[0], rtol=0, atol=0)
print(len(k.spmm_rows_serial.signatures), len(k.spmm_rows.plain.signatures))
"""
    env = _env(tmp_path, **{numba_warmup.TIER_ENV_VAR: "1e-9"})
    first = subprocess.run([sys.executable, "-c", code, "1"], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and first.stdout.split() == ["1", "0"], first.stderr[-3000:]
    tiered = subprocess.run([sys.executable, "-c", code, "4"], env=env, capture_output=True, text=True, timeout=300)
    assert tiered.returncode == 0 and tiered.stdout.split() == ["1", "1"], tiered.stderr[-3000:]
    assert any(name.startswith("corgnn-tier-spmm_rows-float32-") for name in os.listdir(tmp_path / "numba-cache"))
    later = subprocess.run([sys.executable, "-c", code, "2"], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert later.returncode == 0 and later.stdout.split() == ["0", "1"], later.stderr[-3000:]


def test_a_cold_process_runs_the_serial_attention_kernels_and_tiers_up(tmp_path):
    """The tiered attention kernels (GAT's, GATv2's, the transformer's): in fresh
    processes on an empty cache, an optimize()d GATConv's steps run the serial
    compilations (the parallel ones not compiled), past ``CORGNN_TIER_UP_S`` the
    parallel ones, with bit-identical outputs and gradients; a later process starts
    on the parallel kernels."""
    code = """
import sys, torch
from torch_geometric.nn import GATConv
import corgnn
from corgnn.sparse.backends import numba_gat_kernels as gk
torch.manual_seed(0)
conv = corgnn.optimize(GATConv(16, 8, heads=4))
ei = torch.cat([torch.randint(0, 25, (2, 60)) + 25 * i for i in range(32)], 1)
x = torch.randn(800, 16)
outs = []
for _ in range(int(sys.argv[1])):
    out = conv(x, ei.clone())
    grads = torch.autograd.grad(out.square().sum(), list(conv.parameters()))
    outs.append((out.detach(), grads))
for o, g in outs[1:]:
    torch.testing.assert_close(o, outs[0][0], rtol=0, atol=0)
    torch.testing.assert_close(g, outs[0][1], rtol=0, atol=0)
kernels = (gk.node_scores, gk.gat_forward_rows, gk.gat_backward_rows, gk.gat_backward_cols, gk.head_weighted_sums)
print(*(sum(len(c.signatures) for k in kernels for c in k.compilations(parallel)) for parallel in (False, True)))
"""
    # (one step: each kernel's one call compiles it, and compiling is not counted)
    first = subprocess.run([sys.executable, "-c", code, "1"], env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and first.stdout.split() == ["5", "0"], first.stderr[-3000:]
    env = _env(tmp_path, **{numba_warmup.TIER_ENV_VAR: "1e-9"})
    tiered = subprocess.run([sys.executable, "-c", code, "3"], env=env, capture_output=True, text=True, timeout=600)
    assert tiered.returncode == 0 and tiered.stdout.split() == ["5", "5"], tiered.stderr[-3000:]
    assert any(name.startswith("corgnn-tier-gat_forward_rows-float32-") for name in os.listdir(tmp_path / "numba-cache"))
    later = subprocess.run([sys.executable, "-c", code, "2"], env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert later.returncode == 0 and later.stdout.split() == ["0", "5"], later.stderr[-3000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_serial_feature_conversion_kernels_equal_the_parallel_ones(dtype):
    from corgnn.sparse.backends import numba_kernels as k

    gen = torch.Generator().manual_seed(4)
    X = (torch.rand(97, 53, generator=gen, dtype=dtype) < 0.1) * torch.randn(97, 53, generator=gen, dtype=dtype)
    X[5] = 0  # an empty row
    counts, counts_s = torch.full((97,), -1), torch.full((97,), -1)
    k.dense_row_counts(X.numpy(), counts.numpy())
    k.dense_row_counts_serial(X.numpy(), counts_s.numpy())
    assert torch.equal(counts, counts_s) and torch.equal(counts, torch.count_nonzero(X, dim=1))
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    nnz = int(ptr[-1])
    col, col_s = torch.full((nnz,), -1), torch.full((nnz,), -1)
    val, val_s = torch.zeros(nnz, dtype=dtype), torch.zeros(nnz, dtype=dtype)
    k.dense_to_csr_fill(X.numpy(), ptr.numpy(), col.numpy(), val.numpy())
    k.dense_to_csr_fill_serial(X.numpy(), ptr.numpy(), col_s.numpy(), val_s.numpy())
    ref = X.to_sparse_csr()
    assert torch.equal(col, col_s) and torch.equal(val, val_s)
    assert torch.equal(col, ref.col_indices()) and torch.equal(val, ref.values())
