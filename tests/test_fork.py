"""Issue 23 item 6: a child forked after the parent used a corgnn model runs its
forward (it used to hang: Numba's OpenMP layer and torch's GNU OpenMP pool do not
survive fork): there the numba backend declines (the child's products run on the
torch backend) and torch runs on one thread; the parent's thread counts and Numba's
choice of layer are left as they are.

Each case runs in a fresh interpreter (the threading layer is process-wide and
chosen once), with timeouts so that a hang fails instead of blocking the suite.
"""

import os
import subprocess
import sys

import pytest

FORK = r"""
import multiprocessing as mp, sys
import torch, numba
torch.set_num_threads(2)
from corgnn.nn import GCNConv

torch.manual_seed(0)
n = 3000
ei = torch.randint(0, n, (2, 30000))
x = torch.randn(n, 16)
conv = GCNConv(16, 8)

def forward():
    with torch.no_grad():
        return conv(x, ei)

def child(q):
    import faulthandler
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails the child
    q.put(forward().sum().item())  # (Numba's OpenMP layer would terminate the child had a kernel run on it)

if __name__ == "__main__":
    ref = forward().sum().item()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    p.join(90)
    if p.is_alive():
        p.kill()
        print("HUNG")
        sys.exit(1)
    got = q.get(timeout=10)
    print("RESULT", p.exitcode, abs(got - ref) <= 1e-3 * max(1.0, abs(ref)), torch.get_num_threads(), numba.threading_layer())
"""


def _run(code: str, tmp_path, **env_over):
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "CORGNN_BACKEND", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_over)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_forked_child_runs_a_forward_after_the_parent_did(tmp_path):
    out = _run(FORK, tmp_path)
    lines = [x for x in out.stdout.splitlines() if x.startswith(("RESULT", "HUNG"))]
    assert lines and lines[-1].startswith("RESULT"), out.stdout + out.stderr
    exitcode, same, parent_threads, layer = lines[-1].split()[1:]
    assert exitcode == "0" and same == "True", out.stdout + out.stderr
    assert parent_threads == "2"  # the parent's torch thread count is the user's
    assert layer in ("omp", "tbb", "workqueue")  # (Numba's own choice: its kernels launch fast)


LAYER = r"""
import torch, numba
torch.set_num_threads(1)
from corgnn.graph import Graph
from corgnn.sparse import spmm, use_backend
A = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3).gcn_adjacency()
with use_backend("numba"):
    spmm(A, torch.ones(3, 4))
print("LAYER", numba.threading_layer(), torch.get_num_threads(), numba.get_num_threads())
"""


@pytest.mark.parametrize("chosen", [None, "omp", "workqueue"])
def test_threading_layer_is_fork_safe_unless_the_user_chose_one(tmp_path, chosen):
    out = _run(LAYER, tmp_path, **({} if chosen is None else {"NUMBA_THREADING_LAYER": chosen}))
    assert out.returncode == 0, out.stderr
    layer, torch_threads, numba_threads = [x for x in out.stdout.splitlines() if x.startswith("LAYER")][-1].split()[1:]
    assert layer == chosen if chosen else layer in ("omp", "tbb", "workqueue")
    assert (torch_threads, numba_threads) == ("1", "1")  # torch's count kept; Numba follows it


THREADS = r"""
import threading, torch
from corgnn.sparse import CSR, spmm
torch.manual_seed(0)
n = 20000
A = CSR.from_coo(torch.randint(0, n, (200000,)), torch.randint(0, n, (200000,)), None, (n, n))
B = torch.randn(n, 32)
ref = spmm(A, B)
errors = []
def work():
    try:
        for _ in range(20):
            assert torch.allclose(spmm(A, B), ref)
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))
ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("THREADS", len(errors))
"""


def test_concurrent_kernels_from_threads_do_not_abort(tmp_path):
    # the workqueue layer aborts the process on concurrent parallel launches: the
    # numba backend serialises them
    out = _run(THREADS, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [x for x in out.stdout.splitlines() if x.startswith("THREADS")][-1] == "THREADS 0"
