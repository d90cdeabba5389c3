"""The kernels as PyTorch custom ops (``torch.ops.corgnn.*``).

Each op is registered with ``torch.library.custom_op`` and a fake (meta)
implementation, so ``torch.compile`` treats it as one opaque op with known output
shapes instead of tracing into Numba, and ``torch.library.opcheck`` passes for
each (``tests/test_library.py``). Its real implementation picks a backend at run
time (:mod:`corgnn.sparse.dispatch`); when the selected backend has a traceable
form of the op (the Triton kernels' ``triton_op``), AOTAutograd traces that instead
(:func:`_decompose`).

These are raw kernels: tensors in, tensors out, no autograd (the differentiable
public ops are :mod:`corgnn.sparse.ops`; the paper's hand-written backward passes
are :mod:`corgnn.functional`), no validation beyond what the callers did. Index
tensors are int64; value tensors share the dense operand's dtype.

Row plans. Most ops walk a *row plan* ``(ptr, idx, perm)``: the compressed-row
arrays of ``op(A)`` (``A`` or ``A^T``) and ``perm``, the position of each walked
entry in the format's own value order (``None`` = identity); see
:meth:`corgnn.sparse.SparseFormat.row_plan`. Per-entry outputs (SDDMM, softmax,
attention) are written in the format's order. Values ``val=None`` mean all ones.

==========================  ==============================================================
op                          computes (``B``/``C``/``M`` 2-D ``(rows, f)`` or semi-batched 3-D ``(rows, h, f)``)
==========================  ==============================================================
``spmm_rows``               ``out[i] = sum_{w in row i} val[perm[w]] B[idx[w]] (+ bias)``
``spmm_ell``                ELLPACK: ``out[i] = sum_{s < lengths[i]} V[i, s] B[col[i, s]]``
``spmm_hybrid``             CSR part rows, then the row-sorted COO part added in
``sddmm_rows``              ``out[perm[w]] = val[perm[w]] <B[i], C[idx[w]]>``
``sddmm_coo``               ``out[e] = val[e] <B[row[e]], C[col[e]]>``
``sddmm_ell``               as ``sddmm_rows`` over ELLPACK slots (``offsets`` = row starts)
``edge_softmax_rows``       softmax of ``scores (nnz, h)`` over each row's entries
``gat_node_scores``         ``s = <M, a_src>``, ``d = <M, a_dst>`` per node and head
``gat_attention``           fused GAT forward: logits, LeakyReLU, softmax, dropout, SpMM
``gat_attention_backward``  its backward (every caching scheme of Table 4)
``gat_head_weighted_sums``  ``(sum_i w1[i,h] M[i,h], sum_i w2[i,h] M[i,h])``
==========================  ==============================================================

Paper: appendix "Common Sparse Operators" (Listings 1-2), "GAT Forward Pass",
"GAT Backward Pass"; §"Multi-head GAT" (semi-batched layout).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
from torch import Tensor
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.library import custom_op

from .dispatch import Case, run, select

__all__ = [
    "spmm_rows",
    "spmm_ell",
    "spmm_hybrid",
    "sddmm_rows",
    "sddmm_coo",
    "sddmm_ell",
    "edge_softmax_rows",
    "gat_node_scores",
    "gat_attention",
    "gat_attention_backward",
    "gat_head_weighted_sums",
    "OPS",
]


OPS: dict = {}
"""Every custom op by its short name (``torch.ops.corgnn.<name>``)."""


def _kernel_op(dense: int, semi_batched: bool = False):
    """Register the decorated signature as the custom op ``corgnn::<name>`` (its
    implementation runs the kernel of the backend dispatch picks for the call) and
    return a caller that runs the op when traced by ``torch.compile`` and the
    implementation itself in eager.

    ``dense``: position of the dense operand whose device and dtype decide the
    backend; ``semi_batched``: the op always has a head dimension (``dense.size(1)``),
    else it has one when ``dense`` is 3-D.

    NOTE: in eager the dispatcher round trip of a custom op costs about 9 µs per
    call (measured: 18.7 vs 9.8 µs for a tiny SpMM, 2-core CPU); a Cora training
    step makes ~20 kernel calls in ~1.5 ms, so that would be an estimated ~10 %.
    Both paths run the same implementation.

    Under ``torch.compile`` dynamo sees the op; when AOTAutograd traces it, a
    backend that offers a traceable form (:meth:`Backend.traceable`: the Triton
    kernels registered with ``torch.library.triton_op``, which Inductor can see
    into) replaces it (:func:`_decompose`, the backend chosen at trace time); any
    other backend runs inside the opaque op, chosen when it runs. The caller's ``.op`` is the registered op, ``.fake`` its fake
    implementation (set by :func:`_fake`).
    """

    def register(sig):
        name = sig.__name__

        def case_of(*args) -> Case:
            D = args[dense]
            return Case(name, D.device.type, D.dtype, D.size(1) if semi_batched or D.dim() == 3 else None)

        @functools.wraps(sig)
        def impl(*args):
            return run(name, case_of(*args), *args)

        op = custom_op(f"corgnn::{name}", mutates_args=())(impl)
        op.register_torch_dispatch(FunctionalTensorMode, functools.partial(_decompose, case_of, name))
        OPS[name] = op
        CASE_OF[name] = case_of

        def call(*args):
            return op(*args) if torch.compiler.is_compiling() else impl(*args)

        call.__name__, call.__doc__, call.op, call.fake = name, sig.__doc__, op, None
        call.signature = inspect.signature(sig)
        return call

    return register


CASE_OF: dict = {}
"""Per op, ``args -> Case``: what dispatch needs to know about one call."""


def _decompose(case_of, name, mode, op, types, args, kwargs):
    """The op under ``FunctionalTensorMode`` (AOTAutograd tracing a compiled graph):
    replaced by the selected backend's traceable form when it has one (as
    ``torch.library.triton_op`` decomposes itself, so Inductor sees the Triton
    kernels), else kept as the opaque op. Runs as plain Python at trace time, so
    dynamo never traces the dispatch code."""
    case = case_of(*args)
    if not isinstance(case.heads, (int, type(None))):  # a symbolic head count (dynamic shapes)
        case = dataclasses.replace(case, heads=None)  # no backend decides on it; keeps Case hashable
    traced = select(case).traceable(name)
    if traced is None:
        return mode.__torch_dispatch__(op, types, args, kwargs)
    with mode:
        return traced(*args, **kwargs)


def _fake(call):
    """Register the decorated function as ``call``'s fake implementation (``call.fake``)."""

    def register(fake):
        call.op.register_fake(fake)
        call.fake = fake
        return fake

    return register


def _out_rows(B: Tensor, rows) -> Tensor:
    return B.new_empty((rows,) + tuple(B.shape[1:]))


def _entries(B: Tensor, nnz) -> Tensor:
    return B.new_empty((nnz,) if B.dim() == 2 else (nnz, B.shape[1]))


# ----------------------------------------------------------------------------- SpMM


@_kernel_op(4)
def spmm_rows(ptr: Tensor, idx: Tensor, perm: Tensor | None, val: Tensor | None, B: Tensor, bias: Tensor | None = None) -> Tensor:
    """``bias`` (``B.shape[1:]``, or None): added to every output row as it is written
    (the epilogue of issue 12, lever 2: no second pass over the output)."""


@_fake(spmm_rows)
def _(ptr, idx, perm, val, B, bias=None):
    return _out_rows(B, ptr.shape[0] - 1)


@_kernel_op(3)
def spmm_ell(col: Tensor, lengths: Tensor, V: Tensor | None, B: Tensor) -> Tensor:
    ...


@_fake(spmm_ell)
def _(col, lengths, V, B):
    return _out_rows(B, col.shape[0])


@_kernel_op(5)
def spmm_hybrid(head_ptr: Tensor, head_col: Tensor, tail_row: Tensor, tail_col: Tensor, val: Tensor | None, B: Tensor) -> Tensor:
    ...


@_fake(spmm_hybrid)
def _(head_ptr, head_col, tail_row, tail_col, val, B):
    return _out_rows(B, head_ptr.shape[0] - 1)


# ---------------------------------------------------------------------------- SDDMM


@_kernel_op(4)
def sddmm_rows(ptr: Tensor, idx: Tensor, perm: Tensor | None, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake(sddmm_rows)
def _(ptr, idx, perm, val, B, C):
    return _entries(B, idx.shape[0])


@_kernel_op(3)
def sddmm_coo(row: Tensor, col: Tensor, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake(sddmm_coo)
def _(row, col, val, B, C):
    return _entries(B, row.shape[0])


@_kernel_op(4)
def sddmm_ell(col: Tensor, lengths: Tensor, offsets: Tensor, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake(sddmm_ell)
def _(col, lengths, offsets, val, B, C):
    ctx = torch.library.get_ctx()
    return _entries(B, ctx.new_dynamic_size())  # nnz = lengths.sum(), data-dependent


# ---------------------------------------------------------------------- edge softmax


@_kernel_op(2, semi_batched=True)
def edge_softmax_rows(ptr: Tensor, perm: Tensor | None, scores: Tensor) -> Tensor:
    ...


@_fake(edge_softmax_rows)
def _(ptr, perm, scores):
    return torch.empty_like(scores)


# ------------------------------------------------------------------------------ GAT


@_kernel_op(0, semi_batched=True)
def gat_node_scores(M: Tensor, a_src: Tensor, a_dst: Tensor) -> tuple[Tensor, Tensor]:
    ...


@_fake(gat_node_scores)
def _(M, a_src, a_dst):
    return M.new_empty(M.shape[:2]), M.new_empty(M.shape[:2])


@_kernel_op(5, semi_batched=True)
def gat_attention(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, s: Tensor, d: Tensor, M: Tensor,
    negative_slope: float, p: float, seed: Tensor, want_leaky: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake(gat_attention)
def _(ptr, idx, perm, s, d, M, negative_slope, p, seed, want_leaky):
    q, H = idx.shape[0], M.shape[1]
    leaky = M.new_empty((q if want_leaky else 0, H), dtype=torch.bool)
    return M.new_empty((ptr.shape[0] - 1,) + tuple(M.shape[1:])), M.new_empty((q, H)), leaky


@_kernel_op(7, semi_batched=True)
def gat_attention_backward(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, tptr: Tensor, tidx: Tensor, tperm: Tensor | None,
    G: Tensor, M: Tensor, a_src: Tensor, a_dst: Tensor,
    alpha: Tensor | None, leaky: Tensor | None, s: Tensor | None, d: Tensor | None,
    negative_slope: float, p: float, seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake(gat_attention_backward)
def _(ptr, idx, perm, tptr, tidx, tperm, G, M, a_src, a_dst, alpha, leaky, s, d, negative_slope, p, seed):
    return torch.empty_like(M), M.new_empty(M.shape[:2]), M.new_empty(M.shape[:2])


@_kernel_op(2, semi_batched=True)
def gat_head_weighted_sums(w1: Tensor, w2: Tensor, M: Tensor) -> tuple[Tensor, Tensor]:
    ...


@_fake(gat_head_weighted_sums)
def _(w1, w2, M):
    return M.new_empty(M.shape[1:]), M.new_empty(M.shape[1:])
