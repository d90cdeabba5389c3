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
``spmm_scatter_rows``       ``A^T B`` by ``A``'s rows: ``out[idx[w]] += val[perm[w]] B[i]`` (2-D)
``spmm_coo``                unsorted COO: ``out[row[e]] += val[e] B[col[e]]`` (no row plan)
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
``gatv2_attention``         fused GATv2 forward: scores, softmax (online), dropout, SpMM
``gatv2_attention_backward``  its backward (every caching scheme of :mod:`corgnn.cost.gatv2`)
==========================  ==============================================================

``transformer_attention`` is the fused dot-product attention of ``TransformerConv``
(scores ``<Q_i, K_j> * scale``, online row softmax, dropout, SpMM with ``V``);
``transformer_attention_backward_rows`` its backward's row walk (``dQ`` and the
per-entry ``de``, the dropped attention) and ``transformer_attention_backward_cols``
its column walk (``dK, dV``): two ops, so that a caller can drop ``K`` and ``V``
between them (:mod:`corgnn.sparse.attention_dot`).

Paper: appendix "Common Sparse Operators" (Listings 1-2), "GAT Forward Pass",
"GAT Backward Pass"; §"Multi-head GAT" (semi-batched layout).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.library import custom_op

from .backends.base import KERNEL_OPS, OpSpec
from . import dispatch
from .dispatch import run, select

__all__ = [
    "spmm_rows",
    "spmm_scatter_rows",
    "spmm_coo",
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
    "gatv2_attention",
    "gatv2_attention_backward",
    "transformer_attention",
    "transformer_attention_backward_rows",
    "transformer_attention_backward_cols",
    "OPS",
    "can_run",
    "bind",
]


OPS: dict = {}
"""Every custom op by its short name (``torch.ops.corgnn.<name>``)."""


def _register(spec: OpSpec):
    """Register ``spec`` (its typed signature and fake, :data:`KERNEL_OPS`) as the
    custom op ``corgnn::<name>`` (its implementation runs the kernel of the backend
    dispatch picks for the call) and return a caller that runs the op when traced by
    ``torch.compile`` and the implementation itself in eager.

    NOTE: in eager the dispatcher round trip of a custom op costs about 9 µs per
    call (measured: 18.7 vs 9.8 µs for a tiny SpMM, 2-core CPU); a Cora training
    step makes ~20 kernel calls in ~1.5 ms, so that would be an estimated ~10 %.
    Both paths run the same implementation.

    Under ``torch.compile`` dynamo sees the op; when AOTAutograd traces it, a
    backend that offers a traceable form (:meth:`Backend.traceable`: the Triton
    kernels registered with ``torch.library.triton_op``, which Inductor can see
    into) replaces it (:func:`_decompose`, the backend chosen at trace time); any
    other backend runs inside the opaque op, chosen when it runs. The caller's ``.op``
    is the registered op, ``.fake`` its fake implementation, ``.signature`` the
    op's typed signature.
    """
    name, sig, case_of = spec.name, spec.signature, spec.case

    @functools.wraps(sig)
    def impl(*args):
        return run(case_of(*args), *args)

    op = custom_op(f"corgnn::{name}", mutates_args=())(impl)
    op.register_torch_dispatch(FunctionalTensorMode, functools.partial(_decompose, case_of, name))
    op.register_fake(spec.fake)
    OPS[name] = op
    CASE_OF[name] = case_of

    def call(*args):
        if torch.compiler.is_compiling():
            return op(*args)
        return run(case_of(*args), *args)

    call.__name__, call.__doc__, call.op, call.fake = name, sig.__doc__, op, spec.fake
    call.signature = inspect.signature(sig)
    return call


CASE_OF: dict = {}
"""Per op, ``args -> Case``: what dispatch needs to know about one call."""


def can_run(name: str, *args) -> bool:
    """Whether a backend (the forced one, if any) runs op ``name`` on ``args``: for a
    caller choosing between two ops that compute the same (memoized: a dict lookup)."""
    try:
        select(CASE_OF[name](*args))
    except ValueError:
        return False
    return True


def bind(name: str, *args):
    """Op ``name`` with its leading arguments ``args`` bound (the dense operand among
    them stands for the later calls' dtype and layout): the launcher of the backend
    dispatch picks (:func:`corgnn.sparse.dispatch.bind`), or None (run the op). Eager
    use only: ``torch.compile`` traces the op itself."""
    return dispatch.bind(CASE_OF[name](*args), *args)


def _decompose(case_of, name, mode, op, types, args, kwargs):
    """The op under ``FunctionalTensorMode`` (AOTAutograd tracing a compiled graph):
    replaced by the selected backend's traceable form when it has one (as
    ``torch.library.triton_op`` decomposes itself, so Inductor sees the Triton
    kernels), else kept as the opaque op. Runs as plain Python at trace time, so
    dynamo never traces the dispatch code."""
    case = case_of(*args)
    if not isinstance(case.heads, (int, type(None))):  # a symbolic head count (dynamic shapes)
        case = case._replace(heads=None)  # no backend decides on it; keeps Case hashable
    traced = select(case).traceable(name)
    if traced is None:
        return mode.__torch_dispatch__(op, types, args, kwargs)
    with mode:
        return traced(*args, **kwargs)


# One caller per op of :data:`corgnn.sparse.backends.base.KERNEL_OPS` (signatures,
# fakes and docstrings live there, shared with the backends).
spmm_rows = _register(KERNEL_OPS["spmm_rows"])
spmm_scatter_rows = _register(KERNEL_OPS["spmm_scatter_rows"])
spmm_coo = _register(KERNEL_OPS["spmm_coo"])
spmm_ell = _register(KERNEL_OPS["spmm_ell"])
spmm_hybrid = _register(KERNEL_OPS["spmm_hybrid"])
sddmm_rows = _register(KERNEL_OPS["sddmm_rows"])
sddmm_coo = _register(KERNEL_OPS["sddmm_coo"])
sddmm_ell = _register(KERNEL_OPS["sddmm_ell"])
edge_softmax_rows = _register(KERNEL_OPS["edge_softmax_rows"])
gat_node_scores = _register(KERNEL_OPS["gat_node_scores"])
gat_attention = _register(KERNEL_OPS["gat_attention"])
gat_attention_backward = _register(KERNEL_OPS["gat_attention_backward"])
gat_head_weighted_sums = _register(KERNEL_OPS["gat_head_weighted_sums"])
gatv2_attention = _register(KERNEL_OPS["gatv2_attention"])
gatv2_attention_backward = _register(KERNEL_OPS["gatv2_attention_backward"])
transformer_attention = _register(KERNEL_OPS["transformer_attention"])
transformer_attention_backward_rows = _register(KERNEL_OPS["transformer_attention_backward_rows"])
transformer_attention_backward_cols = _register(KERNEL_OPS["transformer_attention_backward_cols"])
assert set(OPS) == set(KERNEL_OPS), "every declared kernel op has a caller here"
