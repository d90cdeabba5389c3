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
from corgnn.sparse.backends import numba_warmup
from corgnn.sparse.backends.base import Case, TransientReason
from corgnn.sparse.backends.torch_ref import TorchBackend

CASE = Case("spmm_rows", "cpu", torch.float32)


def _env(tmp_path, **extra) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), **extra)
    for name in ("CORGNN_BACKEND", "TRITON_INTERPRET", numba_warmup.ENV_VAR):
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
from corgnn.sparse.backends import numba_warmup
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
from corgnn.sparse.backends import numba_warmup
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
