"""The ``triton`` backend: its kernels registered as ``triton_op``s, the split of
long rows, whole GCN and GAT layers against PyG on it (every scheme and caching
mode), half precision, the environment controls, and the compile-time
decomposition into a backend's traceable ops.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (conftest sets
``TRITON_INTERPRET=1``), one program at a time: the graphs here are tiny. The other
test modules run every op of every format on this backend too (``KERNEL_BACKENDS``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import HAS_TRITON, TRITON_ON_CPU, needs_triton_on_cpu

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="the triton package is not installed")

import test_gat  # noqa: E402
import test_gcn  # noqa: E402
from corgnn.sparse import dispatch, spmm, use_backend  # noqa: E402
from corgnn.sparse import library as L  # noqa: E402
from corgnn.sparse.dispatch import Case, select  # noqa: E402
from test_library import _op_samples  # noqa: E402
from test_sparse import build, dense, make_coo  # noqa: E402

F64 = torch.float64


@pytest.fixture
def triton_ops():
    from corgnn.sparse.backends import triton_ops

    return triton_ops


@pytest.mark.parametrize("name", sorted(L.OPS))
def test_kernels_are_triton_ops_with_the_library_fakes(name, triton_ops):
    from corgnn.sparse.backends.triton import TritonBackend

    if name not in TritonBackend.ops:  # (CPU only: spmm_scatter_rows, see test_library.test_spmm_scatter_path; spmm_coo, COO.spmm_kernel)
        assert name in ("spmm_scatter_rows", "spmm_coo") and name not in triton_ops.LAUNCHERS
        return
    if name in ("gat_node_scores", "gat_head_weighted_sums"):  # dense reductions: torch ops
        assert name not in triton_ops.TRACEABLE and name in triton_ops.LAUNCHERS
        return
    op = getattr(torch.ops.corgnn, f"triton_{name}")
    # eager runs the op's own launcher (no dispatcher round trip), compile traces the op:
    # the same function either way
    assert callable(triton_ops.TRACEABLE[name]) and triton_ops.LAUNCHERS[name].__wrapped__.__name__ == name
    # the interpreter runs kernels eagerly on real tensors only, so the checks that
    # trace the kernels themselves (aot_dispatch) need a GPU; schema + fake here
    for args in _op_samples()[name]:
        if not TRITON_ON_CPU:  # a GPU machine: the compiled kernels take CUDA tensors only
            args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
        if TRITON_ON_CPU:
            torch.testing.assert_close(triton_ops.LAUNCHERS[name](*args), op(*args), rtol=0, atol=0)


@needs_triton_on_cpu
def test_eager_launchers_call_the_kernels_without_the_higher_order_op(triton_ops, monkeypatch):
    # wrap_triton's higher-order-op dispatch costs about 1 ms of Python per launch (an
    # H200's GAT step, 2026-11-27): the eager launchers switch it off, as triton_op's
    # own eager path does, so wrap_triton hands back the bare kernel
    from torch._library.triton import is_wrap_triton_enabled

    seen = []
    wrap = triton_ops._wrap

    def spy(kernel):
        seen.append(is_wrap_triton_enabled())
        return wrap(kernel)

    monkeypatch.setattr(triton_ops, "_wrap", spy)
    samples = _op_samples()
    for name, launcher in triton_ops.LAUNCHERS.items():
        for args in samples[name]:
            launcher(*args)
    assert seen and not any(seen)
    assert is_wrap_triton_enabled()  # restored after the calls
    triton_ops.LAUNCHERS["spmm_rows"].__wrapped__(*samples["spmm_rows"][0])  # the op's function alone: HOP on
    assert seen[-1]


@needs_triton_on_cpu
@pytest.mark.parametrize("case", ["hub", "odd", "duplicates"])
@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("transpose", [False, True])
def test_long_rows_are_split_across_programs(case, heads, transpose, triton_ops, monkeypatch):
    monkeypatch.setattr(triton_ops, "SPLIT_CHUNK", 4)  # every row over 4 entries takes the chunk path
    row, col, val, shape = make_coo(case, F64)
    A = build("csr", row, col, val, shape)
    D = dense(A)
    n_in = shape[0] if transpose else shape[1]
    if heads is None:
        B = torch.randn(n_in, 5, dtype=F64)
        want = (D.t() if transpose else D) @ B
        vals = None
    else:
        B = torch.randn(n_in, heads, 5, dtype=F64)
        vals = torch.randn(A.nnz, heads, dtype=F64)
        Dh = dense(A, vals)
        want = torch.einsum("hij,jhk->ihk", Dh.transpose(1, 2) if transpose else Dh, B)
    with use_backend("triton"):
        got = spmm(A, B, transpose=transpose, values=vals)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@needs_triton_on_cpu
def test_padded_entry_arrays_of_the_compiled_adjacency(triton_ops, monkeypatch):
    """Per-entry arrays padded past ``ptr[-1]`` (``corgnn.graph`` compile path): the
    padding is never walked, padded per-entry outputs are 0."""
    monkeypatch.setattr(triton_ops, "SPLIT_CHUNK", 4)
    row, col, val, shape = make_coo("hub", F64)
    A = build("csr", row, col, val, shape)
    ptr, idx, _ = A.row_plan(False)
    pad = 9
    idx_p = torch.cat([idx, torch.zeros(pad, dtype=idx.dtype)])
    val_p = torch.cat([A.val, torch.full((pad,), 7.0, dtype=F64)])
    B, C = torch.randn(shape[1], 4, dtype=F64), torch.randn(shape[0], 4, dtype=F64)
    with use_backend("triton"):
        out = L.spmm_rows(ptr, idx_p, None, val_p, B)
        sd = L.sddmm_rows(ptr, idx_p, None, val_p, C, B)
        sm = L.edge_softmax_rows(ptr, None, torch.randn(idx_p.numel(), 2, dtype=F64))
    torch.testing.assert_close(out, dense(A) @ B)
    torch.testing.assert_close(sd[: A.nnz], A.val * (C[A.row()] * B[A.col]).sum(1))
    assert sd[A.nnz:].eq(0).all() and sm[A.nnz:].eq(0).all()


# ------------------------------------------------------------------ layers vs PyG
@needs_triton_on_cpu
@pytest.mark.parametrize("scheme", test_gcn.SCHEMES)
def test_gcn_layer_matches_pyg_on_triton(scheme):
    with use_backend("triton"):
        test_gcn.test_matches_pyg_float64(scheme, 6, 3, True, True)
        test_gcn.test_matches_pyg_float64(scheme, 3, 8, False, False)


@needs_triton_on_cpu
@pytest.mark.parametrize("cache", test_gat.SCHEMES)
def test_gat_layer_matches_pyg_on_triton(cache, monkeypatch):
    with use_backend("triton"):
        test_gat.test_matches_pyg_float64(cache, 3, True, monkeypatch)
        test_gat.test_matches_pyg_float64(cache, 1, False, monkeypatch)


@needs_triton_on_cpu
@pytest.mark.parametrize("fmt", ["coo", "csc", "ell", "hybrid"])
def test_gat_formats_on_triton(fmt):
    with use_backend("triton"):
        test_gat.test_formats_agree(fmt)


@needs_triton_on_cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_float32(dtype):
    """bfloat16/float16 operands: kernels accumulate in float32 (as cuSPARSE and PyG),
    so the result is the float32 product rounded once."""
    row, col, val, shape = make_coo("hub", torch.float32)
    A = build("csr", row, col, val, shape)
    B = torch.randn(shape[1], 6)
    Ah, Bh = A.with_values(A.val.to(dtype)), B.to(dtype)
    want = (dense(Ah).float() @ Bh.float()).to(dtype)
    with use_backend("triton"):
        got = spmm(Ah, Bh)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------- controls
def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)


def test_env_forced_triton_trains_gcn_and_gat_like_numba():
    """``CORGNN_BACKEND=triton TRITON_INTERPRET=1``: a GCN and a GAT step run every
    kernel on Triton and agree with the Numba kernels."""
    code = """
import torch, corgnn
from corgnn.sparse import use_backend
from corgnn.sparse.dispatch import select, Case
assert select(Case("spmm_rows", "cpu", torch.float32)).name == "triton"
torch.manual_seed(0)
ei = torch.randint(0, 30, (2, 120))
x = torch.randn(30, 5)
for model in (corgnn.nn.GCN(5, 8, 3), corgnn.nn.GAT(5, 4, 3, heads=2)):
    model.eval()
    res = []
    for be in ("triton", "numba"):
        with use_backend(be):
            model.zero_grad()
            out = model(x, ei)
            out.square().sum().backward()
            res.append([out.detach()] + [p.grad.clone() for p in model.parameters()])
    err = max(float((a - b).abs().max()) for a, b in zip(*res))
    assert err < 1e-4, err
print("ok")
"""
    out = _run(code, CORGNN_BACKEND="triton", TRITON_INTERPRET="1")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_cpu_tensors_without_the_interpreter_are_declined_with_the_reason():
    code = """
import torch
from corgnn.sparse.dispatch import select, Case
print(select(Case("spmm_rows", "cpu", torch.float32)).name)
try:
    print("cuda:", select(Case("spmm_rows", "cuda", torch.float32)).name)
except ValueError as e:
    print(e)
"""
    out = _run(code, CORGNN_BACKEND="", TRITON_INTERPRET="0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["numba", "cuda: cusparse"]  # CUDA's order: cusparse, triton, torch
    forced = _run(code.splitlines()[1] + "\n" + code.splitlines()[2] + "\nselect(Case('spmm_rows', 'cpu', torch.float32))", CORGNN_BACKEND="triton", TRITON_INTERPRET="0")
    assert forced.returncode != 0 and "TRITON_INTERPRET=1" in forced.stderr


@needs_triton_on_cpu
def test_compile_traces_a_backends_traceable_op(monkeypatch):
    """Under ``torch.compile`` a library op is replaced by the selected backend's
    traceable form (how Inductor sees the Triton kernels on a GPU; the interpreter
    cannot be traced, so a stand-in backend with a plain custom op is used here)."""
    from corgnn.sparse.backends import TorchBackend

    calls = []

    @torch.library.custom_op("corgnn_test::traced_spmm_rows", mutates_args=())
    def traced(ptr: torch.Tensor, idx: torch.Tensor, perm: torch.Tensor | None, val: torch.Tensor | None, B: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return TorchBackend().spmm_rows(ptr, idx, perm, val, B)

    traced.register_fake(L.spmm_rows.fake)

    class Traced(TorchBackend):
        name = "traced-test"

        def traceable(self, op):
            return traced if op == "spmm_rows" else None

    monkeypatch.setitem(dispatch._registry(), "traced-test", Traced())
    monkeypatch.setattr(dispatch, "_SELECTED", {})
    row, col, val, shape = make_coo("odd", torch.float32)
    A = build("csr", row, col, val, shape)
    B = torch.randn(shape[1], 4)
    fn = torch.compile(lambda B: spmm(A, B) * 2, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    with use_backend("traced-test"):
        got = fn(B)
    assert calls, "the traceable op was not used"
    torch.testing.assert_close(got, 2 * (dense(A) @ B))
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: host syncs exist on a GPU only")
def test_training_steps_make_no_host_sync_on_cuda():
    """After the first call (graph build, plans), a GCN and a GAT training step on
    CUDA make no host sync: each is a stall of the whole pipeline (on an H100 the
    GAT kernels' constants once cost 4 per step)."""
    torch.manual_seed(0)
    ei = torch.randint(0, 300, (2, 3000), device="cuda")
    x = torch.randn(300, 16, device="cuda")
    import corgnn

    for model in (corgnn.nn.GCN(16, 32, 4), corgnn.nn.GAT(16, 8, 4, heads=4)):
        model = model.cuda()
        for step in range(2):
            if step:
                torch.cuda.set_sync_debug_mode("error")
            try:
                model(x, ei).square().sum().backward()
            finally:
                torch.cuda.set_sync_debug_mode(0)
