"""The ``cusparse`` backend (single-head SpMM through torch's sparse CSR tensors),
forced on CPU tensors, where the same ``torch.sparse.mm`` / ``torch.addmm`` calls run
PyTorch's CPU CSR kernels: equal to the other backends on every format that walks a
row plan, with and without values, transposed, with the bias epilogue, gradients
through the public :func:`corgnn.sparse.spmm`; the cases it declines say why; its
per-plan cache dies with the plan. On a CUDA machine the same tests run on CUDA
tensors too (float16 included)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

from corgnn.sparse import dispatch, sddmm, spmm, use_backend
from corgnn.sparse.backends import CuSparseBackend
from corgnn.sparse.dispatch import Case, select
from test_sparse import TOL, build, dense, make_coo

ROW_PLAN_FORMATS = ["csr", "csc", "coo", "coo-unsorted"]
"""Formats whose SpMM walks a row plan (ELL and hybrid run their own ops)."""
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ROW_PLAN_FORMATS)
@pytest.mark.parametrize("case", ["odd", "empty-rows", "nnz1", "nnz0", "hub", "duplicates"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("transpose", [False, True])
def test_spmm_equals_the_other_backends(device, fmt, case, dtype, transpose):
    row, col, val, shape = make_coo(case, dtype)
    A = build(fmt, row, col, val, shape)
    n_in = shape[0] if transpose else shape[1]
    B = torch.randn(5, n_in, dtype=dtype).t()  # non-contiguous operand
    ref = (dense(A).t() if transpose else dense(A)) @ B
    with use_backend("numba"):
        numba = spmm(A, B, transpose=transpose)
    if device == "cuda":
        A, B = build(fmt, row.cuda(), col.cuda(), val.cuda(), shape), B.cuda()
    with use_backend("cusparse"):
        assert select(Case("spmm_rows", device, dtype)).name == "cusparse"
        out = spmm(A, B, transpose=transpose)
    assert out.dtype == dtype and out.shape == ref.shape and out.device.type == device
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    torch.testing.assert_close(out.cpu(), numba, **TOL[dtype])


@pytest.mark.parametrize("fmt", ROW_PLAN_FORMATS)
@pytest.mark.parametrize("transpose", [False, True])
def test_pattern_values_override_and_bias(fmt, transpose):
    row, col, _, shape = make_coo("hub")
    A = build(fmt, row, col, None, shape)  # pattern only: the cached all-ones values
    n_in = shape[0] if transpose else shape[1]
    B = torch.randn(n_in, 4, dtype=torch.float64)
    D = dense(A)
    Dt = D.t() if transpose else D
    vals = torch.randn(A.nnz, 2, dtype=torch.float64)[:, 1]  # non-contiguous values
    Dv = dense(A, vals)
    bias = torch.randn(4, dtype=torch.float64)
    with use_backend("cusparse"):
        torch.testing.assert_close(spmm(A, B, transpose=transpose), Dt @ B)
        torch.testing.assert_close(spmm(A, B, transpose=transpose), Dt @ B)  # cached pattern again
        torch.testing.assert_close(spmm(A, B, values=vals, transpose=transpose), (Dv.t() if transpose else Dv) @ B)
        torch.testing.assert_close(spmm(A, B, bias=bias, transpose=transpose), Dt @ B + bias)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_gradients_through_public_spmm(fmt):
    row, col, val, shape = make_coo("odd")
    A = build(fmt, row, col, val, shape)
    B = torch.randn(shape[1], 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    G = torch.randn(shape[0], 3, dtype=torch.float64)
    with use_backend("numba"):
        ref = torch.autograd.grad((spmm(A, B, bias=bias) * G).sum(), (B, bias))
    with use_backend("cusparse"):
        out = spmm(A, B, bias=bias)
        got = torch.autograd.grad((out * G).sum(), (B, bias))
        # dB = A^T G: the transposed row plan, on this backend too
        torch.autograd.gradcheck(lambda B, b: spmm(A, B, bias=b), (B, bias))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)


def test_declines_with_reasons():
    b = CuSparseBackend()
    assert b.supports(Case("spmm_rows", "cuda", torch.float16)) is None
    assert b.supports(Case("spmm_rows", "cpu", torch.float32)) is None
    assert "semi-batched" in b.supports(Case("spmm_rows", "cuda", torch.float32, 4))
    for op in ("sddmm_rows", "spmm_ell", "spmm_hybrid", "gat_attention", "gat_attention_backward", "edge_softmax_rows"):
        assert "no cuSPARSE call" in b.supports(Case(op, "cuda", torch.float32))
    assert "got torch.bfloat16" in b.supports(Case("spmm_rows", "cuda", torch.bfloat16))
    assert "got torch.float16" in b.supports(Case("spmm_rows", "cpu", torch.float16))
    assert "got meta" in b.supports(Case("spmm_rows", "meta", torch.float32))
    # automatic dispatch on CPU never picks it; forcing it on a case it declines raises with the reason
    assert "cusparse" not in dispatch.PRIORITY["cpu"]
    assert dispatch.PRIORITY["cuda"].index("cusparse") < dispatch.PRIORITY["cuda"].index("triton")  # measured on an H100
    row, col, val, shape = make_coo("odd")
    A = build("csr", row, col, val, shape)
    with use_backend("cusparse"):
        with pytest.raises(ValueError, match="backend 'cusparse'.*cusparse: torch.sparse.mm takes 2-D dense operands"):
            spmm(build("csr", row, col, None, shape), torch.randn(shape[1], 2, 3, dtype=torch.float64))
        with pytest.raises(ValueError, match="cusparse: runs the single-head row-plan SpMM only"):
            sddmm(A, torch.randn(shape[0], 3, dtype=torch.float64), torch.randn(3, shape[1], dtype=torch.float64))
        # (a format's own kernel the forced backend lacks: the product walks the row plan it runs)
        E, B = build("ell", row, col, val, shape), torch.randn(shape[1], 3, dtype=torch.float64)
        torch.testing.assert_close(spmm(E, B), E.to_dense() @ B)


def test_plan_cache_dies_with_the_plan():
    """The per-plan state (q, the all-ones values) is held weakly: the plan's tensors
    are freed with the matrix."""
    row, col, _, shape = make_coo("odd")
    A = build("csr", row, col, None, shape)
    B = torch.randn(shape[1], 2)
    with use_backend("cusparse"):
        first = spmm(A, B)
        torch.testing.assert_close(spmm(A, B), first)  # second call: the cached pattern
    ptr = weakref.ref(A.row_plan(False)[0])
    del A
    gc.collect()
    assert ptr() is None


def test_env_var_selects_it():
    code = (
        "import torch; from corgnn.sparse import spmm, CSR; from corgnn.sparse.dispatch import Case, select\n"
        "assert select(Case('spmm_rows', 'cpu', torch.float32)).name == 'cusparse'\n"
        "A = CSR.from_coo(torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]), None, (2, 2))\n"
        "print(spmm(A, torch.eye(2)).tolist())\n"
    )
    env = dict(os.environ, CORGNN_BACKEND="cusparse")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0.0, 1.0], [1.0, 1.0]]"
