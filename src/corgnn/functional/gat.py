"""Multi-head GAT autograd Function with the paper's explicit backward and caching schemes.

Forward (paper appendix "GAT Forward Pass", PyG ``GATConv`` semantics), with
``weight (h*k, m)`` laid out as PyG's ``GATConv.lin.weight`` and ``Θ = weight^T``:

* ``M = X Θ`` viewed ``(n, h, k)``
* ``s = <M, a_src>``, ``d = <M, a_dst>`` per node and head ``(n, h)`` (appendix "GAT
  Operator Reordering": the per-edge ``a^T [m_i || m_j]`` split into node terms)
* ``y_e = s[src_e] + d[dst_e]``, ``w = LeakyReLU(y)``, ``alpha = softmax`` over each
  destination's incoming edges ``(q, h)``, then attention dropout in training
* ``out = A_alpha M`` (semi-batched SpMM) ``(n, h, k)``, concatenated to ``(n, h*k)``
  or averaged over heads to ``(n, k)``, plus ``bias``.

Backward (appendix "GAT Backward Pass"), ``G = dL/dout`` as ``(n, h, k)``:
``dalpha = SDDMM(G, M)``, softmax and LeakyReLU backward per destination row, ``dd``
a row sum, ``ds`` a column sum, ``dL/da_src = M^T ds``, ``dL/da_dst = M^T dd``,
``dM = ds a_src + dd a_dst + A_alpha^T G``, ``dL/dweight = dM^T X``, ``dL/dX = dM weight``,
``dL/dbias = G^T 1``. No autograd inside: every step is a kernel of
:mod:`corgnn.sparse.attention` or a GEMM.
"""

from __future__ import annotations

import torch

from ..cost.gat import parse_cache
from ..sparse.attention import DropoutSpec, attention_backward, attention_forward, head_weighted_sums, node_scores
from ..sparse.formats import SparseFormat
from ..sparse.ops import edge_softmax, spmm

__all__ = ["GATFunction", "gat_conv", "gat_attention", "head_transform", "entry_endpoints"]


def head_transform(x: torch.Tensor | None, weight: torch.Tensor, heads: int, xs: SparseFormat | None = None) -> torch.Tensor:
    """``M = x weight^T`` viewed ``(n, heads, k)``; an SpMM over the non-zeros of the
    sparse features ``xs`` when given (then ``x`` is not read)."""
    M = spmm(xs, weight.t()) if xs is not None else torch.mm(x, weight.t())
    return M.unflatten(1, (heads, -1))  # (not view(n, heads, -1): ambiguous when n = 0)


def _forward(x, weight, att_src, att_dst, bias, A, heads, concat, negative_slope, drop, want_leaky, xs=None):
    """The forward pass; returns the output and every intermediate a scheme may cache."""
    M = head_transform(x, weight, heads, xs)
    s, d = node_scores(M, att_src, att_dst)
    out3, alpha, leaky = attention_forward(A, s, d, M, negative_slope, drop, want_leaky=want_leaky)
    out = out3.flatten(1) if concat else out3.mean(1)
    if bias is not None:
        out += bias
    return out, M, s, d, alpha, leaky


class GATFunction(torch.autograd.Function):
    """Multi-head GAT layer under one caching scheme (paper Table 4).

    ``apply(x, weight, att_src, att_dst, bias, seed, A, heads, concat, negative_slope, p, cache)``
    with ``x (n, m)``, ``weight (h*k, m)``, ``att_src``/``att_dst (1, h, k)``, ``bias``
    ``(h*k,)`` / ``(k,)`` or None, ``A`` the GAT adjacency (rows = destinations),
    ``p`` the attention dropout probability and ``seed`` its ``(1,)`` int64 seed tensor
    (see :class:`~corgnn.sparse.attention.DropoutSpec`; a tensor argument so that
    ``torch.compile`` traces it as a graph input), ``cache`` a scheme name.

    Saved for backward, by ``cache`` (beyond ``att_src``/``att_dst``, which every
    scheme needs for ``dM``, and only what ``ctx.needs_input_grad`` requires):

    * ``"none"``: only the inputs ``x`` and ``weight``; backward recomputes
      ``M = XΘ``, ``s, d``, ``alpha`` and the LeakyReLU mask.
    * ``"features"``: ``M (n, h, k)``; recomputes ``s, d``, ``alpha``, the mask.
    * ``"node_attention"``: ``M`` and ``s, d (n, h)``; recomputes ``alpha`` and the
      mask from them (one extra max/sum walk per destination row).
    * ``"edge_weights"``: ``M``, ``alpha (q, h)`` (before dropout) and the LeakyReLU
      mask ``(q, h)`` bool; recomputes nothing.

    ``x`` is kept when ``dL/dweight`` is needed (or by "none" to recompute ``M``),
    ``weight`` when ``dL/dx`` is needed (or by "none").

    Sparse input features: ``xs`` (a sparse ``(n, m)`` format holding ``X``'s values,
    e.g. Planetoid's bag-of-words at ~1 % density; ``x`` is then ``None`` and gets no
    gradient) replaces the two dense GEMMs that read ``X`` (``XΘ`` forward,
    ``X^T dM`` backward) by SpMMs over its non-zeros, and is kept instead of ``x``.

    Attention dropout: the mask is not stored; it is a counter-based hash of the
    entry index and the 8-byte seed in ``drop`` (kept on ``ctx``), which the
    backward kernels redraw per entry at no memory cost (see
    :func:`corgnn.sparse.attention.dropout_keep_mask`). So every scheme's memory is
    exactly Table 4's, with or without dropout.
    """

    @staticmethod
    def forward(ctx, x, weight, att_src, att_dst, bias, seed, A: SparseFormat, heads: int, concat: bool, negative_slope: float, p: float, cache: str, xs: SparseFormat | None = None):
        drop = DropoutSpec(p, seed)
        out, M, s, d, alpha, leaky = _forward(x, weight, att_src, att_dst, bias, A, heads, concat, negative_slope, drop, cache == "edge_weights", xs)
        need_x, need_w = ctx.needs_input_grad[:2]
        ctx.A, ctx.heads, ctx.concat, ctx.slope, ctx.p, ctx.cache = A, heads, concat, negative_slope, p, cache
        need_feat = need_w or cache == "none"
        ctx.xs = xs if need_feat else None
        keep_x = x if (need_feat and xs is None) else None
        keep_w = weight if (need_x or cache == "none") else None
        keep_m = None if cache == "none" else M
        keep_sd = (s, d) if cache == "node_attention" else (None, None)
        keep_edge = (alpha, leaky) if cache == "edge_weights" else (None, None)
        ctx.save_for_backward(keep_x, keep_w, att_src, att_dst, keep_m, *keep_sd, *keep_edge, seed)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, weight, att_src, att_dst, M, s, d, alpha, leaky, seed = ctx.saved_tensors
        need_x, need_w, need_as, need_ad, need_b = ctx.needs_input_grad[:5]
        heads, cache = ctx.heads, ctx.cache
        gx = gw = gas = gad = gb = None
        if need_b:
            gb = grad_out.sum(0)
        if need_x or need_w or need_as or need_ad:
            n = grad_out.size(0)
            if ctx.concat:
                G = grad_out.unflatten(1, (heads, -1))
            else:
                # NOTE: out = mean_h out3, so dL/dout3[:, h] = G / heads for every head.
                G = (grad_out / heads).unsqueeze(1).expand(n, heads, grad_out.size(1))
            if M is None:  # "none": recompute M = XΘ
                M = head_transform(x, weight, heads, ctx.xs)
            if cache in ("none", "features"):
                s, d = node_scores(M, att_src, att_dst)
            dM, ds, dd = attention_backward(ctx.A, G, M, att_src, att_dst, ctx.slope, DropoutSpec(ctx.p, seed), alpha=alpha, leaky=leaky, s=s, d=d)
            if need_as or need_ad:
                gas, gad = head_weighted_sums(ds, dd, M)
                gas, gad = gas.view_as(att_src), gad.view_as(att_dst)
            dM = dM.flatten(1)
            if need_w:
                # NOTE: dweight = dM^T X = (X^T dM)^T; with sparse X a transposed SpMM
                # over X's non-zeros instead of a dense GEMM.
                gw = spmm(ctx.xs, dM, transpose=True).t() if ctx.xs is not None else torch.mm(dM.t(), x)
            if need_x:
                gx = torch.mm(dM, weight)
        return gx, gw, gas, gad, gb, None, None, None, None, None, None, None, None


def gat_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    att_src: torch.Tensor,
    att_dst: torch.Tensor,
    bias: torch.Tensor | None,
    A: SparseFormat,
    heads: int,
    *,
    concat: bool = True,
    negative_slope: float = 0.2,
    dropout: float | DropoutSpec = 0.0,
    training: bool = False,
    cache: str = "edge_weights",
    xs: SparseFormat | None = None,
    return_attention_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Functional multi-head GAT layer (no validation; :class:`corgnn.nn.GATConv` validates).

    Shapes: ``x (n, m)`` (or None with sparse features ``xs (n, m)``), ``weight (heads*k, m)``, ``att_src``/``att_dst (1, heads, k)``,
    ``bias (heads*k,)`` (concat) or ``(k,)`` or None, ``A`` the GAT adjacency
    ``(n, n)`` -> ``(n, heads*k)`` if ``concat`` else ``(n, k)``.

    ``dropout`` applies to the attention coefficients when ``training`` (a float
    draws a fresh seed from torch's generator; a :class:`DropoutSpec` fixes it).
    ``cache`` is one of "none", "features", "node_attention", "edge_weights".
    Without autograd (``torch.no_grad()`` or no input requiring a gradient) the
    forward runs directly and keeps nothing.

    ``return_attention_weights=True`` returns ``(out, alpha)``, ``alpha (nnz, heads)``
    the attention coefficients (after dropout) in ``A``'s entry order. Without
    autograd and dropout they come from the fused forward; otherwise the layer runs
    :func:`gat_attention` (corgnn's differentiable sparse ops), so that ``alpha``
    carries gradients as PyG's does.
    """
    cache = parse_cache(cache)
    if isinstance(dropout, DropoutSpec):
        drop = dropout if training else DropoutSpec(0.0, device=weight.device)
    else:
        drop = DropoutSpec(dropout if training else 0.0, device=weight.device)
    tensors = (x, weight, att_src, att_dst, bias)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if return_attention_weights:
        if grad or drop.active:
            M = head_transform(x, weight, heads, xs)  # (differentiable: torch.mm, or corgnn's spmm)
            out3, alpha = gat_attention(M, M, att_src, att_dst, A, negative_slope=negative_slope, dropout=drop.p, training=True)
            out = out3.flatten(1) if concat else out3.mean(1)
            return (out if bias is None else out + bias), alpha
        with torch.no_grad():
            out, _, _, _, alpha, _ = _forward(x, weight, att_src, att_dst, bias, A, heads, concat, negative_slope, drop, False, xs)
        return out, alpha
    if grad:
        return GATFunction.apply(x, weight, att_src, att_dst, bias, drop.seed, A, heads, concat, negative_slope, drop.p, cache, xs)
    with torch.no_grad():
        return _forward(x, weight, att_src, att_dst, bias, A, heads, concat, negative_slope, drop, False, xs)[0]


def entry_endpoints(A: SparseFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, col)`` ``(nnz,)`` int64 of every entry of ``A`` in ``A``'s own entry order
    (the order of per-entry arrays such as the attention coefficients)."""
    ptr, idx, perm = A.row_plan(False)
    rows = torch.repeat_interleave(torch.arange(A.shape[0], device=ptr.device), ptr[1:] - ptr[:-1])
    if perm is None:
        return rows, idx
    row, col = torch.empty_like(rows), torch.empty_like(idx)  # the row walk's entries back in A's own order
    row[perm], col[perm] = rows, idx
    return row, col


def gat_attention(
    M_src: torch.Tensor,
    M_dst: torch.Tensor | None,
    att_src: torch.Tensor,
    att_dst: torch.Tensor,
    A: SparseFormat,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    training: bool = False,
    alpha_edge: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAT attention and aggregation built from corgnn's differentiable public ops
    (autograd through :func:`~corgnn.sparse.edge_softmax` and
    :func:`~corgnn.sparse.spmm`), for what the fused :class:`GATFunction` does not
    serve: bipartite graphs (separate source and target features), edge features,
    attention weights that need gradients. PyG ``GATConv``'s computation step by step:

    ``y_e = <M_src[j], a_src> + <M_dst[i], a_dst> (+ alpha_edge_e)`` for entry
    ``e = (i, j)`` of ``A`` (row ``i`` = target, column ``j`` = source),
    ``alpha = dropout(softmax_row(LeakyReLU(y)))``, ``out[i] = sum_e alpha_e M_src[j]``.

    Args:
        M_src: ``(n_src, h, k)`` transformed source features.
        M_dst: ``(n_dst, h, k)`` transformed target features, or None (no target term).
        att_src, att_dst: ``(1, h, k)`` (or ``(h, k)``) attention vectors.
        A: ``(n_dst, n_src)`` attention pattern, any format.
        alpha_edge: optional ``(nnz, h)`` per-entry logit term (edge features), in
            ``A``'s entry order.

    Returns:
        ``(out (n_dst, h, k), alpha (nnz, h))``, ``alpha`` after dropout, in ``A``'s
        entry order.
    """
    H, K = M_src.shape[1:]
    row, col = entry_endpoints(A)
    y = (M_src * att_src.reshape(1, H, K)).sum(-1)[col]
    if M_dst is not None:
        y = y + (M_dst * att_dst.reshape(1, H, K)).sum(-1)[row]
    if alpha_edge is not None:
        y = y + alpha_edge
    alpha = edge_softmax(A, torch.nn.functional.leaky_relu(y, negative_slope)) if A.nnz else y
    alpha = torch.nn.functional.dropout(alpha, dropout, training)
    return spmm(A, M_src, values=alpha), alpha
