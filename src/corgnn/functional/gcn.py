"""GCN autograd Function with the paper's explicit backward (appendix "GCN Backward Pass").

``X' = A' X Θ + 1 b^T`` with ``Θ = weight^T`` (``weight (k, m)`` as in PyG's
``GCNConv.lin.weight``). Gradients, with ``G = dL/dX'``:

* ``dL/dΘ = X^T A'^T G``    (eq. gcn-bwd-weights)  -> ``dL/dweight = G^T (A' X)`` or ``(A'^T G)^T X``
* ``dL/db = G^T 1``          (eq. gcn-bwd-bias)
* ``dL/dX = A'^T G Θ^T``     (eq. gcn-bwd-x)

The scheme (see :mod:`corgnn.cost.gcn`) decides the association order of each product.
"""

from __future__ import annotations

import torch

from ..cost.gcn import GCNScheme
from ..sparse.formats import SparseFormat
from ..sparse.ops import spmm

__all__ = ["GCNFunction", "gcn_conv"]


class GCNFunction(torch.autograd.Function):
    """``X' = A' X Θ + b`` under one :class:`~corgnn.cost.gcn.GCNScheme`.

    Saved for backward (only what ``ctx.needs_input_grad`` requires):

    * ``weight`` when ``dL/dX`` is needed (``dX = (A'^T G) weight`` or ``A'^T (G weight)``);
    * for ``dL/dweight``: ``X`` (n, m) in every scheme without cache, or, in the
      cached scheme, ``A'X`` (n, m) *instead of* ``X``, so caching saves one SpMM in
      backward at no memory cost (appendix "No memory overhead with GCN caching").

    ``A'^T`` is never built: backward SpMMs use ``spmm(A, ., transpose=True)``, which
    walks the adjacency's cached CSC dual.

    Sparse input features: ``xs`` (a sparse ``(n, m)`` format with the values of
    ``X``, e.g. Planetoid's bag-of-words at ~1 % density) replaces the two dense
    GEMMs that read ``X`` (``X Θ`` forward, ``X^T P`` backward) by SpMMs over its
    non-zeros; ``x`` may then be ``None`` (no gradient for ``X``), which needs the
    transform-first+fused scheme (``A'X`` would be a sparse-sparse product).
    """

    @staticmethod
    def forward(ctx, x, weight: torch.Tensor, bias: torch.Tensor | None, A: SparseFormat, scheme: GCNScheme, xs: SparseFormat | None = None):
        if x is None and (xs is None or (scheme.forward, scheme.backward) != ("transform-first", "fused-propagate")):
            raise ValueError("sparse-only features need the transform-first+fused scheme")
        # NOTE: A'(XΘ) == (A'X)Θ by associativity; transform-first runs the SpMM on
        # k columns, propagate-first on m columns (paper Table 1).
        if scheme.forward == "transform-first":
            y = spmm(xs, weight.t()) if xs is not None else torch.mm(x, weight.t())
            out = spmm(A, y)
            if bias is not None:
                out += bias
            ax = None
        else:
            ax = spmm(A, x)
            out = torch.addmm(bias, ax, weight.t()) if bias is not None else torch.mm(ax, weight.t())
        need_x, need_w = ctx.needs_input_grad[:2]
        ctx.A, ctx.scheme, ctx.xs = A, scheme, None
        keep_feat = None
        if need_w:
            keep_feat = ax if scheme.cache else x
            if xs is not None and scheme.backward == "fused-propagate":
                ctx.xs, keep_feat = xs, None  # the sparse X serves dΘ = X^T P
        ctx.save_for_backward(keep_feat, weight if need_x else None)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        feat, weight = ctx.saved_tensors
        A, scheme = ctx.A, ctx.scheme
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_out = grad_out.contiguous()
        gx = gw = gb = None
        if need_b:
            gb = grad_out.sum(0)
        if scheme.backward == "fused-propagate":
            if need_x or need_w:
                # NOTE: one SpMM on k columns serves both gradients: P = A'^T G.
                p = spmm(A, grad_out, transpose=True)
                if need_w:
                    # NOTE: dweight = P^T X = (X^T P)^T; with sparse X that is a
                    # transposed SpMM over X's non-zeros instead of a dense GEMM.
                    gw = spmm(ctx.xs, p, transpose=True).t() if ctx.xs is not None else torch.mm(p.t(), feat)
                if need_x:
                    gx = torch.mm(p, weight)
        else:
            if need_w:
                # NOTE: dΘ = X^T A'^T G = (A'X)^T G; the cached A'X skips the recompute.
                ax = feat if scheme.cache else spmm(A, feat)
                gw = torch.mm(grad_out.t(), ax)
            if need_x:
                gx = spmm(A, torch.mm(grad_out, weight), transpose=True)
        return gx, gw, gb, None, None, None


def gcn_conv(x, weight: torch.Tensor, bias: torch.Tensor | None, A: SparseFormat, scheme: GCNScheme, xs: SparseFormat | None = None) -> torch.Tensor:
    """Functional GCN layer ``A' x weight^T + bias`` under ``scheme`` (no validation).

    Shapes: ``x (n, m)`` (or None with sparse ``xs (n, m)``), ``weight (k, m)``,
    ``bias (k,)`` or None, ``A (n, n)`` -> ``(n, k)``. Use :class:`corgnn.nn.GCNConv`
    for the validated, planned layer.
    """
    return GCNFunction.apply(x, weight, bias, A, scheme, xs)
