"""The operator layer: custom ops (opcheck), backend dispatch and its public controls,
and the differentiable public ops (gradcheck in float64, second derivatives), for
every format, single-head and semi-batched, on every backend that runs on CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from corgnn.graph import Graph
from corgnn.sparse import available_backends, edge_softmax, sddmm, spmm, use_backend
from corgnn.sparse import library as L
from corgnn.sparse.attention import DropoutSpec
from corgnn.sparse.dispatch import ENV_VAR, Case, select
from conftest import HAS_TRITON, KERNEL_BACKENDS
from test_sparse import FORMATS, build, dense, make_coo

F64 = torch.float64
CPU_BACKENDS = KERNEL_BACKENDS


# ------------------------------------------------------------------- dispatch controls
def automatic_dispatch(monkeypatch) -> None:
    """No forced backend, also in CI's forced-Triton pass: ``$CORGNN_BACKEND`` unset and
    dispatch's copy of it (read once per process, maybe by an earlier test) dropped."""
    from corgnn.sparse import dispatch

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "_ENV_FORCED", [])


def test_available_backends_lists_reasons():
    av = available_backends()
    assert av["numba"] is None and av["torch"] is None
    assert (av["triton"] is None) if HAS_TRITON else ("not installed" in av["triton"])


def test_cuda_dispatch_order_and_fallback_with_reason(monkeypatch):
    """CUDA: cuSPARSE for the single-head row-plan SpMM (measured faster than the
    Triton SpMM on an H100, benchmarks/results/gpu-h100-20261127), Triton for every
    other op, the torch gather fallback last."""
    automatic_dispatch(monkeypatch)
    from corgnn.sparse import dispatch
    from corgnn.sparse.backends import TritonBackend

    assert dispatch.PRIORITY["cuda"] == ("cusparse", "triton", "torch")
    assert select(Case("spmm_rows", "cuda", torch.float32)).name == "cusparse"
    if HAS_TRITON:
        assert select(Case("spmm_rows", "cuda", torch.bfloat16)).name == "triton"  # (cuSPARSE through torch: no bfloat16)
        assert select(Case("spmm_rows", "cuda", torch.float32, 4)).name == "triton"  # semi-batched
        assert select(Case("gat_attention", "cuda", torch.bfloat16, 8)).name == "triton"
    with pytest.raises(ValueError, match="triton: kernels take float32/float64/float16/bfloat16, got torch.complex64"):
        select(Case("spmm_rows", "cuda", torch.complex64))
    # a case the Triton kernels decline runs on the torch fallback
    monkeypatch.setattr(TritonBackend, "supports", lambda self, case: "declined for this test")
    monkeypatch.setattr(dispatch, "_SELECTED", {})
    assert select(Case("sddmm_rows", "cuda", torch.float32)).name == "torch"
    # the single-head SpMM still runs on cusparse, the semi-batched one on the fallback
    assert select(Case("spmm_rows", "cuda", torch.float32)).name == "cusparse"
    assert select(Case("spmm_rows", "cuda", torch.float32, 4)).name == "torch"
    with use_backend("triton"), pytest.raises(ValueError, match="triton: declined for this test"):
        select(Case("spmm_rows", "cuda", torch.float32))


def test_default_dispatch_and_forcing(monkeypatch):
    automatic_dispatch(monkeypatch)
    case = Case("spmm_rows", "cpu", torch.float32)
    assert select(case).name == "numba"
    with use_backend("torch"):
        assert select(case).name == "torch"
        with use_backend(None):  # automatic again inside
            assert select(case).name == "numba"
    assert select(Case("spmm_rows", "cpu", torch.bfloat16)).name == "torch"  # numba declines, says why
    assert select(Case("spmm_rows", "meta", torch.float32)).name == "torch"


def test_forced_backend_that_cannot_run_lists_every_reason():
    with use_backend("triton"):
        with pytest.raises(ValueError, match=r"backend 'triton'.*numba: runs on CPU tensors only.*triton: runs on CUDA tensors, got meta"):
            select(Case("spmm_rows", "meta", torch.float32))
    A = build("csr", *make_coo("odd"))
    with use_backend("numba"):
        with pytest.raises(ValueError, match="numba: kernels are compiled for float32/float64"):
            spmm(A.with_values(A.val.half()), torch.randn(7, 3).half())
    with pytest.raises(ValueError, match="unknown backend 'cuda-magic'"):
        with use_backend("cuda-magic"):
            pass


def test_env_var_forces_backend_process_wide():
    code = (
        "import torch; from corgnn.sparse.dispatch import select, Case; "
        "print(select(Case('spmm_rows', 'cpu', torch.float32)).name)"
    )
    env = dict(os.environ, **{ENV_VAR: "torch"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "torch"


def threads_after(first_call: str) -> list[str]:
    """``[torch threads, numba threads]`` printed by a fresh process that sets torch to
    1 thread, imports torch, numba and corgnn, then runs ``first_call`` (its first
    corgnn kernels)."""
    code = "import torch, numba, corgnn; torch.set_num_threads(1)\n" + first_call + "\nprint(torch.get_num_threads(), numba.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_numba_kernels_keep_the_users_torch_thread_count():
    """Numba's OpenMP layer, launched by the first kernel, used to reset torch's thread
    count (``torch.set_num_threads(1)`` became all cores); Numba now follows torch."""
    assert threads_after(
        "from corgnn.graph import Graph; from corgnn.sparse import spmm, use_backend\n"
        "A = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3).gcn_adjacency()\n"
        "with use_backend('numba'):\n"
        "    spmm(A, torch.ones(3, 4))"
    ) == ["1", "1"]


def test_a_sparse_feature_conversion_first_keeps_the_users_torch_thread_count():
    """The feature conversion kernels (parallel Numba) launched the threading layer on
    their own when a layer's first call converted sparse features before any SpMM
    (``GCNConv(normalize=False, add_self_loops=False)`` on bag-of-words): torch's
    thread count was reset the same way."""
    assert threads_after(
        "from torch_geometric.nn import GCNConv\n"
        "m = corgnn.optimize(GCNConv(8, 4, normalize=False, add_self_loops=False))\n"
        "x = torch.zeros(300, 8); x[::7, 3] = 1.0\n"
        "m(x, torch.randint(0, 300, (2, 900)))"
    ) == ["1", "1"]


FIRST_GIN_CALL = (
    "import sys, numpy as np, torch, numba, corgnn\n"
    "from torch_geometric.nn import GINConv\n"
    "torch.manual_seed(0)\n"
    "pyg = GINConv(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)))\n"
    "m = corgnn.optimize(GINConv(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))))\n"
    "m.load_state_dict(pyg.state_dict())\n"
    "x, ei = torch.randn(50, 8, requires_grad=True), torch.randint(0, 50, (2, 200))\n"
    "m(x, ei).square().sum().backward(); g = x.grad.clone(); x.grad = None\n"
    "pyg(x, ei).square().sum().backward()\n"
    "print('same_as_pyg', bool(torch.allclose(m(x, ei), pyg(x, ei), atol=1e-5) and torch.allclose(g, x.grad, atol=1e-4)))\n"
    "print('registries_after_first_call', 'numba.np.arraymath' in sys.modules or 'numba.np.arrayobj' in sys.modules)\n"
    "print('linalg_after_first_call', 'scipy.linalg' in sys.modules)\n"
)


def first_call_then(code: str, **env_extra: str) -> dict[str, str]:
    """``{key: value}`` printed by a fresh process that runs a GIN layer's first
    forward/backward under ``optimize()`` (its first Numba kernels; an earlier process
    ran the same, so they load from Numba's cache), then ``code``."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "CORGNN_NUMBA_FULL_START")}
    env.update(env_extra)
    subprocess.run([sys.executable, "-c", FIRST_GIN_CALL], env=env, capture_output=True, text=True, check=True)  # (warms the cache)
    out = subprocess.run([sys.executable, "-c", FIRST_GIN_CALL + code], env=env, capture_output=True, text=True, check=True)
    return dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())


def test_cached_kernels_load_without_numbas_registries_and_numba_still_compiles():
    """A fresh process loads corgnn's cached kernels without Numba's typing and lowering
    tables (``numba_threads.load_target``; neither ``numba.np.arraymath``/``arrayobj``
    nor ``scipy.linalg`` imported), with PyG's outputs and gradients; afterwards a
    user's own jitted function (Numba's full start, BLAS included) and SciPy work."""
    got = first_call_then(
        "f = numba.njit(lambda a, b: np.dot(a, b))\n"
        "a = np.arange(12.0).reshape(3, 4); b = np.ones((4, 2))\n"
        "print('jit_dot_ok', bool(np.allclose(f(a, b), a @ b)))\n"
        "import scipy.linalg\n"
        "print('solve_ok', bool(np.allclose(scipy.linalg.solve(np.eye(3) * 2, np.ones(3)), 0.5)))\n"
        "print('after', corgnn.optimize(GINConv(torch.nn.Linear(8, 8)))(x, ei).shape == (50, 8))\n"
    )
    assert got == {"same_as_pyg": "True", "registries_after_first_call": "False", "linalg_after_first_call": "False",
                   "jit_dot_ok": "True", "solve_ok": "True", "after": "True"}


@pytest.mark.parametrize("conv", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_kernels_load_without_numbas_array_registries(conv):
    """The attention layers' cached kernels (forward, backward, their per-task scratch
    arrays through ``empty_array``, the float32 exp's bit cast) load in a fresh process
    without ``numba.np.arrayobj`` (its import, ~50 ms, was most of a GAT model's extra
    first call), with PyG's outputs and input gradients (dropout off)."""
    code = (
        "import sys, torch, corgnn\n"
        f"from torch_geometric.nn import {conv} as Conv\n"
        "torch.manual_seed(0)\n"
        "pyg = Conv(8, 4, heads=2)\n"
        "m = corgnn.optimize(Conv(8, 4, heads=2)); m.load_state_dict(pyg.state_dict())\n"
        "x, ei = torch.randn(50, 8, requires_grad=True), torch.randint(0, 50, (2, 200))\n"
        "m(x, ei).square().sum().backward(); g = x.grad.clone(); x.grad = None\n"
        "pyg(x, ei).square().sum().backward()\n"
        "print('same_as_pyg', bool(torch.allclose(m(x, ei), pyg(x, ei), atol=1e-5) and torch.allclose(g, x.grad, atol=1e-4)))\n"
        "print('arrayobj_after_first_call', 'numba.np.arrayobj' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "CORGNN_NUMBA_FULL_START")}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)  # (warms the cache)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    got = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert got == {"same_as_pyg": "True", "arrayobj_after_first_call": "False"}


def test_numbas_runtime_loads_from_disk_after_the_first_process():
    """``numba_threads.start_runtime``: the first process compiles Numba's runtime
    library and writes it next to the kernels' cache, later ones load it (PyG's results,
    and a user's own jitted function that allocates, linking against that library,
    works afterwards); an unreadable file falls back to Numba's own start and is
    removed, so the next process writes it again."""
    from numba.core.registry import cpu_target

    from corgnn.sparse.backends.numba_threads import runtime_cache_file

    path = runtime_cache_file(cpu_target.target_context.codegen())
    assert path is not None
    after = (
        "from corgnn.sparse.backends import numba_threads\n"
        "print('runtime', numba_threads.runtime_source())\n"
        "print('user_jit', numba.njit(lambda n: np.ones(n).sum())(4) == 4.0)\n"
    )
    if os.path.exists(path):
        os.remove(path)
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "CORGNN_NUMBA_FULL_START")}

    def run():
        out = subprocess.run([sys.executable, "-c", FIRST_GIN_CALL + after], env=env, capture_output=True, text=True, check=True)
        return dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())

    first, second = run(), run()
    assert first["runtime"] == "compiled" and second["runtime"] == "loaded"
    for got in (first, second):
        assert got["same_as_pyg"] == "True" and got["user_jit"] == "True"
    with open(path, "wb") as f:
        f.write(b"not a runtime library")
    broken = run()
    assert broken["runtime"] == "numba" and broken["same_as_pyg"] == "True" and broken["user_jit"] == "True"
    assert not os.path.exists(path)
    assert run()["runtime"] == "compiled" and os.path.exists(path)


def test_numba_full_start_kept_on_request():
    """``CORGNN_NUMBA_FULL_START=1`` leaves Numba's own cache load (its full target first)."""
    got = first_call_then("", CORGNN_NUMBA_FULL_START="1")
    assert got["same_as_pyg"] == "True" and got["registries_after_first_call"] == "True"


def test_a_failing_light_cache_load_falls_back_to_numbas_own():
    """Any exception of the light load is retried by Numba's own path (full start
    first): the call still runs, with PyG's results."""
    patch = (
        "import numba.core.caching as C\n"
        "_load, failed = C.Cache._load_overload, []\n"
        "def _once(self, *a):\n"
        "    if not failed:\n"
        "        failed.append(1); raise RuntimeError('simulated')\n"
        "    return _load(self, *a)\n"
        "C.Cache._load_overload = _once\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "CORGNN_NUMBA_FULL_START")}
    subprocess.run([sys.executable, "-c", FIRST_GIN_CALL], env=env, capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, "-c", patch + FIRST_GIN_CALL + "print('failed', failed)\n"], env=env, capture_output=True, text=True, check=True)
    got = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert got["same_as_pyg"] == "True" and got["failed"] == "[1]" and got["registries_after_first_call"] == "True"


def test_half_precision_runs_on_torch_backend_in_float32():
    row, col, val, shape = make_coo("odd", F64)
    A = build("csr", row, col, val, shape)
    B = torch.randn(shape[1], 5, dtype=F64)
    for dt in (torch.bfloat16, torch.float16):
        out = spmm(A.with_values(A.val.to(dt)), B.to(dt))
        assert out.dtype == dt
        torch.testing.assert_close(out.double(), dense(A) @ B, rtol=2e-2, atol=5e-2)


# ------------------------------------------------------------------------------ opcheck
def _op_samples():
    """One realistic argument tuple per custom op (a CSR with empty rows and its CSC dual)."""
    row, col, val, shape = make_coo("empty-rows", torch.float32)
    csr = build("csr", row, col, val, shape)
    ptr, idx, _ = csr.row_plan(False)
    tptr, tidx, tperm = csr.row_plan(True)
    n, m, f, H = shape[0], shape[1], 3, 2
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads_last = lambda n, h, c: r(n, c, h).transpose(1, 2)  # noqa: E731  ((n, h, c) stored (n, c, h))
    ell = build("ell", row, col, val, shape)
    hyb = build("hybrid-t1", row, col, val, shape)
    seed = DropoutSpec(0.3, seed=5).seed
    vals3 = r(csr.nnz, H)
    return {
        "spmm_rows": [(ptr, idx, None, csr.val, r(m, f)), (tptr, tidx, tperm, csr.val, r(n, f)), (ptr, idx, None, vals3, r(m, H, f)), (ptr, idx, None, None, r(m, f)), (tptr, tidx, tperm, csr.val, r(n, f), r(f))],
        "spmm_scatter_rows": [(ptr, idx, None, csr.val, r(n, f), m), (tptr, tidx, tperm, csr.val, r(m, f), n), (ptr, idx, None, None, r(n, f), m)],
        "spmm_coo": [(row, col, val, n, r(m, f)), (col, row, None, m, r(n, f)), (row, col, None, n, r(m, H, f))],
        "spmm_ell": [(ell.col, ell.lengths, ell.values_padded(), r(m, f)), (ell.col, ell.lengths, None, r(m, H, f))],
        "spmm_hybrid": [(hyb.head.rowptr, hyb.head.col, hyb.tail.row, hyb.tail.col, hyb.val, r(m, f))],
        "sddmm_rows": [(ptr, idx, None, csr.val, r(n, f), r(m, f)), (tptr, tidx, tperm, None, r(m, H, f), r(n, H, f))],
        "sddmm_coo": [(row, col, val, r(n, f), r(m, f))],
        "sddmm_ell": [(ell.col, ell.lengths, csr.rowptr[:-1], None, r(n, f), r(m, f))],
        "edge_softmax_rows": [(ptr, None, r(csr.nnz, H)), (tptr, tperm, r(csr.nnz, 1))],
        "gat_node_scores": [(r(n, H, f), r(H, f), r(H, f))],
        "gat_attention": [(ptr, idx, None, r(n, H), r(n, H), r(n, H, f), 0.2, 0.0, seed, True), (ptr, idx, None, r(n, H), r(n, H), r(n, H, f), 0.2, 0.3, seed, False)],
        "gat_attention_backward": [
            (ptr, idx, None, tptr, tidx, tperm, r(n, H, f), r(n, H, f), r(H, f), r(H, f), None, None, r(n, H), r(n, H), 0.2, 0.3, seed),
        ],
        "gat_head_weighted_sums": [(r(n, H), r(n, H), r(n, H, f))],
        "gatv2_attention": [(ptr, idx, None, r(m, H, f), r(n, H, f), r(H, f), 0.2, 0.0, seed, True), (ptr, idx, None, r(m, H, f), r(n, H, f), r(H, f), 0.2, 0.3, seed, False)],
        "gatv2_attention_backward": [
            (ptr, idx, None, tptr, tidx, tperm, r(n, H, f), r(m, H, f), r(n, H, f), r(H, f), None, r(n, H), 0.2, 0.3, seed),
            (ptr, idx, None, tptr, tidx, tperm, r(n, H, f), r(m, H, f), r(n, H, f), r(H, f), r(csr.nnz, H).softmax(0), None, 0.2, 0.0, seed),
        ],
        "transformer_attention": [
            (ptr, idx, None, r(n, H, f), r(m, H, f), r(m, H, f), None, None, 0.5, 0.0, seed, True),
            (tptr, tidx, tperm, r(m, H, f), r(n, H, f), r(n, H, f), r(m, H, 2), r(csr.nnz, 2), 0.5, 0.3, seed, False),
            # (queries, keys and values stored heads-last, as the CPU projections make them)
            (ptr, idx, None, heads_last(n, H, f), heads_last(m, H, f), heads_last(m, H, f), None, None, 0.5, 0.0, seed, True),
        ],
        "transformer_attention_backward_rows": [
            (ptr, idx, None, r(n, H, f), r(n, H, f), r(m, H, f), r(m, H, f), None, None, None, None, r(n, H), 0.5, 0.3, seed),
            (ptr, idx, None, r(n, H, f), r(n, H, f), r(m, H, f), r(m, H, f), r(n, H, 2), r(n, H, 2), r(csr.nnz, 2), r(csr.nnz, H), None, 0.5, 0.0, seed),
            # (one gradient for every head, and the cached attention without dropout: no ad written)
            (ptr, idx, None, r(n, 1, f), r(n, H, f), r(m, H, f), r(m, H, f), None, None, None, r(csr.nnz, H), None, 0.5, 0.0, seed),
            (ptr, idx, None, r(n, H, f), heads_last(n, H, f), heads_last(m, H, f), heads_last(m, H, f), None, None, None, None, r(n, H), 0.5, 0.3, seed),
        ],
        "transformer_attention_backward_cols": [
            (tptr, tidx, tperm, r(n, H, f), r(n, H, f), r(csr.nnz, 2, H), None, 0.5),
            (tptr, tidx, tperm, r(n, 1, f), r(n, H, f), r(csr.nnz, 1, H), r(csr.nnz, H), 0.5),
            (tptr, tidx, tperm, heads_last(n, H, f), heads_last(n, H, f), r(csr.nnz, 2, H), None, 0.5),
        ],
    }


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(L.OPS))
def test_opcheck(name, backend):
    samples = _op_samples()
    assert set(samples) == set(L.OPS), "every custom op needs an opcheck sample"
    with use_backend(backend):
        if not L.can_run(name, *samples[name][0]):
            assert backend == "triton" and name in ("spmm_scatter_rows", "spmm_coo")  # (CPU ops: see test_spmm_scatter_path, COO.spmm_kernel)
            pytest.skip(f"Triton does not implement {name} (a GPU runs the transposed walk / the torch backend's index_add_)")
        for args in samples[name]:
            torch.library.opcheck(L.OPS[name], args)


# ---------------------------------------------------------------- autograd of public ops
def _mat(fmt, case="odd", seed=0):
    row, col, val, shape = make_coo(case, F64, seed)
    return build(fmt, row, col, val, shape)


def _gradcheck(backend, fn, args):
    """gradcheck; in fast mode (random projections, not every Jacobian entry) for
    the Triton interpreter, which runs each kernel program in Python."""
    return torch.autograd.gradcheck(fn, args, fast_mode=backend == "triton")


def _gradgradcheck(backend, fn, args):
    return torch.autograd.gradgradcheck(fn, args, fast_mode=backend == "triton")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [None, 2])
def test_spmm_gradcheck(fmt, heads, backend):
    A = _mat(fmt)
    n, m = A.shape
    g = torch.Generator().manual_seed(1)
    vshape = (A.nnz,) if heads is None else (A.nnz, heads)
    val = torch.randn(vshape, generator=g, dtype=F64, requires_grad=True)
    with use_backend(backend):
        for transpose in (False, True):
            rows_in = n if transpose else m
            B = torch.randn((rows_in, 3) if heads is None else (rows_in, heads, 3), generator=g, dtype=F64, requires_grad=True)
            assert _gradcheck(backend, lambda B, v: spmm(A, B, transpose=transpose, values=v), (B, val))
            assert _gradgradcheck(backend, lambda B, v: spmm(A, B, transpose=transpose, values=v), (B, val))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fmt", [f for f in FORMATS if not f.startswith("coo")])  # (a COO's A^T B scatters its entries: test_edge_list.py)
def test_spmm_scatter_path(fmt, backend, monkeypatch):
    """``A^T B`` by ``A``'s rows (``spmm_scatter_rows``, chosen by size on CPU) equals
    the transposed walk, with its gradients; a backend without it (Triton) walks ``A^T``."""
    from corgnn.sparse import ops

    A = _mat(fmt, "empty-rows")
    n, m = A.shape
    g = torch.Generator().manual_seed(2)
    B = torch.randn(n, 5, generator=g, dtype=F64, requires_grad=True)
    val = torch.randn(A.nnz, generator=g, dtype=F64, requires_grad=True)
    bias = torch.randn(5, generator=g, dtype=F64)
    calls = []
    real = L.spmm_scatter_rows
    monkeypatch.setattr(L, "spmm_scatter_rows", lambda *a: calls.append(1) or real(*a))
    with use_backend(backend):
        walked = spmm(A, B, transpose=True, values=val, bias=bias)
        assert not calls  # (B is tiny: the transposed walk)
        monkeypatch.setattr(ops, "SCATTER_MIN_BYTES", 0)
        scattered = spmm(A, B, transpose=True, values=val, bias=bias)
        assert bool(calls) == (backend != "triton")
        torch.testing.assert_close(scattered, walked)
        torch.testing.assert_close(scattered, dense(A, val.detach()).t() @ B.detach() + bias)
        assert _gradcheck(backend, lambda B, v: spmm(A, B, transpose=True, values=v), (B, val))
        monkeypatch.setattr(ops, "SCATTER_MAX_BYTES", 0)  # (accumulators over budget: the walk again)
        calls.clear()
        spmm(A, B, transpose=True, values=val)
        assert not calls


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fmt", ["csr", "ell", "hybrid"])  # the row kernel (A and A^T walks), ELL's, hybrid's
def test_spmm_bias_epilogue(fmt, backend):
    """``spmm(A, B, bias=b)`` = dense ``op(A) B + b`` in every format and backend (the
    row kernels add ``b`` as they write a row; ELL and hybrid add it after), and its
    gradients (``db`` = column sums of ``dL/dout``) pass gradcheck (both ``B`` and ``b``)."""
    A = _mat(fmt)
    g = torch.Generator().manual_seed(2)
    dense = A.to_dense()
    b = torch.randn(4, generator=g, dtype=F64, requires_grad=True)
    with use_backend(backend):
        for transpose in (False, True):
            op = dense.t() if transpose else dense
            B = torch.randn(op.size(1), 4, generator=g, dtype=F64, requires_grad=True)
            with torch.no_grad():  # the raw kernels (no autograd)
                torch.testing.assert_close(spmm(A, B, transpose=transpose, bias=b), op @ B + b)
        assert _gradcheck(backend, lambda B, b: spmm(A, B, transpose=transpose, bias=b), (B, b))


@pytest.mark.parametrize("fmt", FORMATS)
def test_spmm_binds_its_row_kernel_once_per_matrix_and_direction(fmt, monkeypatch):
    """``spmm`` with a matrix's own values (or its pattern) binds the row kernel once per
    matrix and direction (``ops._spmm_raw``, kept in ``A.plans``) and reuses it, forward
    and in the backward's transposed product; results and gradients equal the dense
    ones. New values written in place, a per-call ``values`` tensor, a forced backend
    and a forked child's dispatch (``dispatch.token``) each bypass or replace it."""
    from corgnn.sparse import dispatch

    A = _mat(fmt)
    n, m = A.shape
    g = torch.Generator().manual_seed(3)
    binds = []
    real = dispatch.bind
    def counted(case, *a):
        launch = real(case, *a)
        binds.append(launch is not None)
        return launch

    monkeypatch.setattr(dispatch, "bind", counted)
    automatic_dispatch(monkeypatch)
    D = dense(A)
    for _ in range(3):
        B = torch.randn(m, 4, generator=g, dtype=F64, requires_grad=True)
        G = torch.randn(n, 4, generator=g, dtype=F64)
        out = spmm(A, B)
        out.backward(G)
        torch.testing.assert_close(out, D @ B.detach())
        torch.testing.assert_close(B.grad, D.t() @ G)
    # one bind per direction (a format's own kernel too: False where the backend offers no
    # launcher for it, ELL's and hybrid's), then reused
    assert len(binds) == 2 and binds[-1] and binds[0] == (A.spmm_kernel(A.val, False) is None or fmt.startswith("coo"))
    kept = list(binds)
    for width in (1, 7, 33):  # (another width, with a bias: the same launcher)
        B, G, b = (torch.randn(m, width, generator=g, dtype=F64), torch.randn(n, width, generator=g, dtype=F64), torch.randn(width, generator=g, dtype=F64))
        torch.testing.assert_close(spmm(A, B, bias=b), D @ B + b)
        torch.testing.assert_close(spmm(A, G, transpose=True), D.t() @ G)
    assert binds == kept
    with torch.no_grad():
        A.val.mul_(2.0)  # (in place: a new version of the values)
    B, G = torch.randn(m, 4, generator=g, dtype=F64), torch.randn(n, 4, generator=g, dtype=F64)
    torch.testing.assert_close(spmm(A, G, transpose=True), 2.0 * D.t() @ G)  # (every format walks A^T by rows)
    binds.clear()
    spmm(A, B, values=torch.ones(A.nnz, dtype=F64))  # per-call values: the general path
    assert not binds
    with use_backend("torch"):  # (another dispatch token: the numba launcher is not reused)
        torch.testing.assert_close(spmm(A, G, transpose=True), 2.0 * D.t() @ G)
    assert binds == [False]  # (asked again under the new token; the torch backend offers no launcher: the op runs)
    token = dispatch.token()
    dispatch.register_backend(select(Case("spmm_rows", "cpu", F64)))  # (a new registry generation, as in a forked child)
    assert dispatch.token() != token
    binds.clear()
    spmm(A, G, transpose=True)
    assert binds == [True]  # (bound again)


def test_spmm_bias_is_validated():
    A = _mat("csr")
    B = torch.randn(A.shape[1], 4, dtype=F64)
    with pytest.raises(ValueError, match="bias must have shape"):
        spmm(A, B, bias=torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="bias must have shape"):
        spmm(A, B.unsqueeze(1), values=torch.ones(A.nnz, 1, dtype=F64), bias=torch.zeros(4, dtype=F64))
    with pytest.raises(TypeError, match="bias dtype"):
        spmm(A, B, bias=torch.zeros(4, dtype=torch.float32))
    with pytest.raises(TypeError, match="bias must be a floating tensor"):
        spmm(A, B, bias=torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [None, 2])
def test_sddmm_gradcheck(fmt, heads, backend):
    A = _mat(fmt)
    n, m = A.shape
    g = torch.Generator().manual_seed(2)
    if heads is None:
        B, C, vshape = torch.randn(n, 3, generator=g, dtype=F64), torch.randn(3, m, generator=g, dtype=F64), (A.nnz,)
    else:
        B, C, vshape = torch.randn(n, heads, 3, generator=g, dtype=F64), torch.randn(m, heads, 3, generator=g, dtype=F64), (A.nnz, heads)
    val = torch.randn(vshape, generator=g, dtype=F64)
    args = tuple(t.requires_grad_() for t in (B, C, val))
    with use_backend(backend):
        assert _gradcheck(backend, lambda B, C, v: sddmm(A, B, C, values=v), args)
        assert _gradgradcheck(backend, lambda B, C, v: sddmm(A, B, C, values=v), args)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads", [None, 3])
def test_edge_softmax_gradcheck(fmt, heads, backend):
    A = _mat(fmt, "empty-rows")
    g = torch.Generator().manual_seed(3)
    s = torch.randn((A.nnz,) if heads is None else (A.nnz, heads), generator=g, dtype=F64, requires_grad=True)
    with use_backend(backend):
        assert _gradcheck(backend, lambda s: edge_softmax(A, s), (s,))
        assert _gradgradcheck(backend, lambda s: edge_softmax(A, s), (s,))


def test_gradient_flows_to_format_values():
    """With ``values=None`` the matrix's own ``A.val`` is the differentiable value tensor."""
    row, col, val, shape = make_coo("duplicates", F64)
    val.requires_grad_()
    A = build("csr", row, col, val, shape)  # A.val is a differentiable function of val
    B = torch.randn(shape[1], 4, dtype=F64)
    spmm(A, B).sum().backward()
    coo = A.to_coo()
    want = B.sum(1).index_select(0, col)  # d/dval_e of sum(A B) = sum_k B[col_e, k]
    torch.testing.assert_close(val.grad, want)
    assert coo.nnz == val.numel()


def test_public_ops_on_gat_pattern_match_dense_autograd():
    ei = torch.tensor([[0, 1, 2, 3, 3], [1, 2, 0, 0, 1]])
    A = Graph(ei, num_nodes=4).gat_adjacency()
    s = torch.randn(A.nnz, 2, dtype=F64, requires_grad=True)
    alpha = edge_softmax(A, s)
    M = torch.randn(4, 2, 3, dtype=F64, requires_grad=True)
    out = spmm(A, M, values=alpha)
    (out ** 2).sum().backward()
    coo = A.to_coo()
    s2 = s.detach().clone().requires_grad_()
    M2 = M.detach().clone().requires_grad_()
    logits = torch.full((2, 4, 4), float("-inf"), dtype=F64).index_put((torch.arange(2).repeat_interleave(A.nnz), coo.row.repeat(2), coo.col.repeat(2)), s2.t().reshape(-1))
    ref = torch.einsum("hij,jhk->ihk", torch.nan_to_num(torch.softmax(logits, -1), nan=0.0), M2)
    (ref ** 2).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(s.grad, s2.grad)
    torch.testing.assert_close(M.grad, M2.grad)


def test_opcheck_graph_ops():
    """The compile path's graph ops (corgnn.graph): schema, fake shapes (padded to
    q + n entries), and the arrays equal the eager Graph's."""
    import corgnn.graph  # noqa: F401  (registers the ops)
    from conftest import make_graph

    ei, n = make_graph()
    ew = torch.rand(ei.size(1))
    torch.library.opcheck(torch.ops.corgnn.gcn_adjacency.default, (ei, ew, n, False, True, True, torch.float32))
    torch.library.opcheck(torch.ops.corgnn.gcn_adjacency.default, (ei, None, n, True, False, False, torch.float64))
    torch.library.opcheck(torch.ops.corgnn.gat_adjacency.default, (ei, n, True))
    rowptr, col, val, colptr, row, perm = torch.ops.corgnn.gcn_adjacency(ei, ew, n, False, True, True, torch.float32)
    A = Graph(ei, ew, n).gcn_adjacency()
    q = A.nnz
    assert col.numel() == ei.size(1) + n and int(rowptr[-1]) == q
    torch.testing.assert_close((rowptr, col[:q], val[:q]), (A.rowptr, A.col, A.val))
    torch.testing.assert_close((colptr, row[:q], perm[:q]), (A.to_csc().colptr, A.to_csc().row, A.to_csc().perm))
