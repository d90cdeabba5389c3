"""Multi-head GATv2 autograd Function with an explicit backward and caching schemes.

Forward (Brody et al. 2022, PyG ``GATv2Conv`` semantics), weights laid out as PyG's
``lin_l.weight``/``lin_r.weight (h*k, m)``:

* ``XL = x_l W_l^T + b_l``, ``XR = x_r W_r^T + b_r``, viewed ``(n, h, k)`` (``XR = XL``
  with ``share_weights`` on one input)
* ``s_e = <a, LeakyReLU(XL[j] + XR[i])>`` per head for edge ``j -> i``,
  ``alpha = softmax`` over each destination's incoming edges, attention dropout in
  training, ``out[i] = sum_e alpha_e XL[j]`` (fused per destination row,
  :func:`corgnn.sparse.attention.gatv2_attention_forward`), concatenated to
  ``(n, h*k)`` or averaged over heads, plus ``bias``.

Backward (derived as the paper's appendix "GAT Backward Pass" does for GAT), ``G =
dL/dout`` as ``(n, h, k)``: ``dalpha = <G_i, XL_j>`` (SDDMM), ``de = alpha (dalpha -
sum_row alpha dalpha)``, per edge and channel ``t = XL_j + XR_i``, ``g = de a f'(t)``:
``dXR_i += g``, ``dXL_j += g + alpha G_i``, ``da += de f(t)``
(:func:`corgnn.sparse.attention.gatv2_attention_backward`); then ``dW_l = dXL^T x_l``,
``db_l = dXL^T 1``, ``dx_l = dXL W_l`` (and the same for ``r``), ``dbias = G^T 1``.
No autograd inside.
"""

from __future__ import annotations

import torch

from ..cost.gatv2 import parse_gatv2_cache
from ..sparse.attention import DropoutSpec, gatv2_attention_backward, gatv2_attention_forward
from ..sparse.formats import SparseFormat
from ..sparse.ops import edge_softmax, spmm
from .gat import entry_endpoints
from .projection import stacked_projection_grads, stacked_projections

__all__ = ["GATv2Function", "gatv2_conv", "gatv2_attention"]


def _stacked(x_r, w_r) -> bool:
    """Whether ``XL, XR`` come from one product with ``w_l, w_r`` stacked
    (:func:`~corgnn.functional.projection.stacked_projections`, ``x`` or its sparse
    features read once): one input, two weights."""
    return x_r is None and w_r is not None


def _sides(x_l, x_r, w_l, b_l, w_r, b_r, heads, xs=None):
    """``(XL, XR)``, each ``x W^T + b`` viewed ``(n, heads, k)`` (an SpMM over the sparse
    features ``xs`` when given, then ``x`` is not read).

    NOTE: on CPU both come out stored heads-last, the layout the Numba kernels gather
    and read them in: no transposed copies of ``XL`` and ``XR`` (3 per layer and step,
    ~0.5 ms each at 20k x 8 x 8, and at the peak of a step's memory on PubMed); Triton
    reads them heads-first."""
    last = (0, 1) if w_l.device.type == "cpu" else ()
    if _stacked(x_r, w_r):
        return stacked_projections(x_l, (w_l, w_r), (b_l, b_r), heads, xs, heads_last=last)
    one = lambda x, w, b: stacked_projections(x, (w,), (b,), heads, xs, heads_last=last[:1])[0]  # noqa: E731
    XL = one(x_l, w_l, b_l)
    return XL, XL if w_r is None else one(x_l if x_r is None else x_r, w_r, b_r)


def _weight_grad(dX: torch.Tensor, x: torch.Tensor | None, xs: SparseFormat | None) -> torch.Tensor:
    """``dX^T x``; with sparse ``xs`` a transposed SpMM over its non-zeros."""
    # NOTE: dW = dX^T X = (X^T dX)^T: with sparse X a transposed SpMM instead of a dense GEMM.
    return spmm(xs, dX, transpose=True).t() if xs is not None else torch.mm(dX.t(), x)


def _finish(out3: torch.Tensor, concat: bool, bias: torch.Tensor | None) -> torch.Tensor:
    out = out3.flatten(1) if concat else out3.mean(1)
    return out if bias is None else out + bias


class GATv2Function(torch.autograd.Function):
    """Multi-head GATv2 layer under one caching scheme (:mod:`corgnn.cost.gatv2`).

    ``apply(x_l, x_r, w_l, b_l, w_r, b_r, att, bias, seed, A, heads, concat, negative_slope, p, cache)``
    with ``x_l (n_src, m_l)`` the source features and ``x_r (n_dst, m_r)`` the target
    features, or ``x_r=None``: the same tensor as ``x_l`` (one graph; its gradient
    then sums both sides); ``w_l (h*k, m_l)``, ``b_l (h*k,)`` or None, likewise ``w_r``,
    ``b_r``, or ``w_r=None`` (``share_weights`` on one input: ``XR = XL``, computed
    once); ``att (1, h, k)``; ``bias (h*k,)``/``(k,)`` or None; ``A`` the attention
    pattern ``(n_dst, n_src)``; ``p`` the attention dropout probability and ``seed``
    its ``(1,)`` int64 seed (:class:`~corgnn.sparse.attention.DropoutSpec`).

    Saved for backward, by ``cache`` (the parameters always, which cost nothing):

    * ``"none"``: the inputs and ``lse (n_dst, h)``; backward recomputes ``XL``,
      ``XR`` (GEMMs) and ``alpha = exp(s - lse)``.
    * ``"features"``: ``XL``, ``XR (n, h, k)`` and ``lse``; recomputes ``alpha``.
    * ``"edge_weights"``: ``XL``, ``XR`` and ``alpha (q, h)`` (before dropout).

    The inputs ``x_l``/``x_r`` are kept when a weight gradient needs them (and by
    "none"). The dropout mask is never stored: backward redraws it from the seed.

    Sparse input features: ``xs`` (a sparse ``(n, m)`` format holding the one input's
    values, e.g. Planetoid's bag-of-words; ``x_l`` and ``x_r`` are then None and get
    no gradient) replaces the GEMMs that read ``x`` by SpMMs over its non-zeros, and
    is kept instead of ``x``.
    """

    @staticmethod
    def forward(ctx, x_l, x_r, w_l, b_l, w_r, b_r, att, bias, seed, A: SparseFormat, heads: int, concat: bool, negative_slope: float, p: float, cache: str, xs: SparseFormat | None = None):
        drop = DropoutSpec(p, seed)
        XL, XR = _sides(x_l, x_r, w_l, b_l, w_r, b_r, heads, xs)
        out3, alpha, lse = gatv2_attention_forward(A, XL, XR, att, negative_slope, drop, want_alpha=cache == "edge_weights")
        ctx.A, ctx.heads, ctx.concat, ctx.slope, ctx.p, ctx.cache = A, heads, concat, negative_slope, p, cache
        need_wl, need_wr = ctx.needs_input_grad[2], ctx.needs_input_grad[4]
        keep_xl = x_l if (cache == "none" or need_wl or (x_r is None and need_wr)) else None
        keep_xr = x_r if (x_r is not None and (cache == "none" or need_wr)) else None
        keep_side = (None, None) if cache == "none" else (XL, None if XR is XL else XR)
        keep_row = (alpha, None) if cache == "edge_weights" else (None, lse)
        ctx.shared = XR is XL
        ctx.same_x = x_r is None
        ctx.stacked = _stacked(x_r, w_r)
        ctx.xs = xs if (cache == "none" or need_wl or need_wr) else None
        ctx.save_for_backward(keep_xl, keep_xr, w_l, b_l, w_r, b_r, att, *keep_side, *keep_row, seed)
        return _finish(out3, concat, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x_l, x_r, w_l, b_l, w_r, b_r, att, XL, XR, alpha, lse, seed = ctx.saved_tensors
        need = ctx.needs_input_grad
        heads = ctx.heads
        gxl = gxr = gwl = gbl = gwr = gbr = gatt = gb = None
        if need[7]:
            gb = grad_out.sum(0)
        if any(need[:7]):
            n = grad_out.size(0)
            if ctx.concat:
                G = grad_out.unflatten(1, (heads, -1))
            else:
                # NOTE: out = mean_h out3, so dL/dout3[:, h] = G / heads for every head.
                G = (grad_out / heads).unsqueeze(1).expand(n, heads, grad_out.size(1))
            if XL is None:  # "none": recompute XL, XR
                XL, XR = _sides(x_l, x_r, w_l, b_l, w_r, b_r, heads, ctx.xs)
            elif ctx.shared:
                XR = XL
            dXL, dXR, datt = gatv2_attention_backward(ctx.A, G, XL, XR, att, ctx.slope, DropoutSpec(ctx.p, seed), alpha=alpha, lse=lse)
            if need[6]:
                gatt = datt.view_as(att)
            if ctx.shared:
                dXL = dXL + dXR
            dXL = dXL.flatten(1)
            if ctx.stacked:
                blocks = [dXL, dXR.flatten(1)]  # (the only references once these go: freed when stacked)
                del dXL, dXR, XL, XR, G
                dws, dbs, gxl = stacked_projection_grads(blocks, x_l, (w_l, w_r), need[2] or need[4], need[0], need[3] or need[5], ctx.xs)
                gwl, gwr = (dws[0] if need[2] else None), (dws[1] if need[4] else None)
                gbl, gbr = (dbs[0] if need[3] else None), (dbs[1] if need[5] else None)
                return gxl, gxr, gwl, gbl, gwr, gbr, gatt, gb, None, None, None, None, None, None, None, None
            xr_eff = x_l if ctx.same_x else x_r
            if need[2]:
                gwl = _weight_grad(dXL, x_l, ctx.xs)
            if need[3]:
                gbl = dXL.sum(0)
            if need[0]:
                gxl = torch.mm(dXL, w_l)
            if not ctx.shared:
                dXR = dXR.flatten(1)
                if need[4]:
                    gwr = _weight_grad(dXR, xr_eff, ctx.xs)
                if need[5]:
                    gbr = dXR.sum(0)
                if need[1] or (ctx.same_x and need[0]):
                    gx = torch.mm(dXR, w_r)
                    if ctx.same_x:
                        gxl = gxl + gx
                    else:
                        gxr = gx
        return gxl, gxr, gwl, gbl, gwr, gbr, gatt, gb, None, None, None, None, None, None, None, None


def gatv2_conv(
    x_l: torch.Tensor,
    x_r: torch.Tensor | None,
    w_l: torch.Tensor,
    b_l: torch.Tensor | None,
    w_r: torch.Tensor | None,
    b_r: torch.Tensor | None,
    att: torch.Tensor,
    bias: torch.Tensor | None,
    A: SparseFormat,
    heads: int,
    *,
    concat: bool = True,
    negative_slope: float = 0.2,
    dropout: float | DropoutSpec = 0.0,
    training: bool = False,
    cache: str = "edge_weights",
    return_attention_weights: bool = False,
    xs: SparseFormat | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Functional multi-head GATv2 layer (no validation; :class:`corgnn.nn.GATv2Conv` validates).

    Shapes: ``x_l (n_src, m_l)``, ``x_r (n_dst, m_r)`` or None (= ``x_l``, one graph),
    ``w_l (heads*k, m_l)``, ``b_l (heads*k,)`` or None, ``w_r``/``b_r`` likewise or
    ``w_r=None`` (shared weights on one input), ``att (1, heads, k)``, ``bias
    (heads*k,)`` (concat) or ``(k,)`` or None, ``A`` the attention pattern ``(n_dst,
    n_src)`` -> ``(n_dst, heads*k)`` if ``concat`` else ``(n_dst, k)``. ``xs``: sparse
    ``(n, m)`` input features used instead of ``x_l`` (then None; one graph only).

    ``dropout`` applies to the attention coefficients when ``training`` (a float draws
    a fresh seed from torch's generator; a :class:`DropoutSpec` fixes it). ``cache`` is
    one of "none", "features", "edge_weights". Without autograd the forward runs
    directly and keeps nothing.

    ``return_attention_weights=True`` returns ``(out, alpha)``, ``alpha (nnz, heads)``
    after dropout in ``A``'s entry order: from the fused forward without autograd and
    dropout, else through :func:`gatv2_attention` (differentiable, as PyG's).
    """
    cache = parse_gatv2_cache(cache)
    if isinstance(dropout, DropoutSpec):
        drop = dropout if training else DropoutSpec(0.0, device=w_l.device)
    else:
        drop = DropoutSpec(dropout if training else 0.0, device=w_l.device)
    tensors = (x_l, x_r, w_l, b_l, w_r, b_r, att, bias)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if return_attention_weights and (grad or drop.active):
        XL, XR = _sides(x_l, x_r, w_l, b_l, w_r, b_r, heads, xs)
        out3, alpha = gatv2_attention(XL, XR, att, A, negative_slope=negative_slope, dropout=drop.p, training=True)
        return _finish(out3, concat, bias), alpha
    if grad:
        return GATv2Function.apply(x_l, x_r, w_l, b_l, w_r, b_r, att, bias, drop.seed, A, heads, concat, negative_slope, drop.p, cache, xs)
    with torch.no_grad():
        XL, XR = _sides(x_l, x_r, w_l, b_l, w_r, b_r, heads, xs)
        out3, alpha, _ = gatv2_attention_forward(A, XL, XR, att, negative_slope, drop, want_alpha=return_attention_weights)
        out = _finish(out3, concat, bias)
    return (out, alpha) if return_attention_weights else out


def gatv2_attention(
    XL: torch.Tensor,
    XR: torch.Tensor,
    att: torch.Tensor,
    A: SparseFormat,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GATv2 attention and aggregation from corgnn's differentiable public ops (autograd
    through :func:`~corgnn.sparse.edge_softmax` and :func:`~corgnn.sparse.spmm`), PyG
    ``GATv2Conv``'s computation step by step, for what the fused
    :class:`GATv2Function` does not serve (attention weights that need gradients). It
    builds the ``(nnz, h, k)`` per-edge values, as PyG does.

    Args:
        XL: ``(n_src, h, k)`` source side; XR: ``(n_dst, h, k)`` target side.
        att: ``(1, h, k)`` attention vector.
        A: ``(n_dst, n_src)`` attention pattern, any format.

    Returns:
        ``(out (n_dst, h, k), alpha (nnz, h))``, ``alpha`` after dropout (torch's), in
        ``A``'s entry order.
    """
    H, K = XL.shape[1:]
    row, col = entry_endpoints(A)
    t = torch.nn.functional.leaky_relu(XL[col] + XR[row], negative_slope)
    s = (t * att.reshape(1, H, K)).sum(-1)
    alpha = edge_softmax(A, s) if A.nnz else s
    alpha = torch.nn.functional.dropout(alpha, dropout, training)
    return spmm(A, XL, values=alpha), alpha
