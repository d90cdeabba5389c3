"""Graph dot-product attention (PyG's ``TransformerConv``; Shi et al. 2021, UniMP) as an
autograd Function with an explicit backward and caching schemes.

Forward, with PyG's ``lin_query``/``lin_key``/``lin_value`` weights ``(h*c, m)`` and
biases ``(h*c,)`` (``x_dst = x_src`` for one node set):

* ``Q = x_dst W_q^T + b_q``, ``K = x_src W_k^T + b_k``, ``V = x_src W_v^T + b_v``,
  each viewed ``(n, h, c)``
* ``s_e = <Q_i, K_j> / sqrt(c)`` per head for edge ``e = j -> i``;
  ``alpha = softmax`` over each destination's incoming edges ``(q, h)``; attention
  dropout in training
* ``out_i = sum_e alpha_e V_j`` ``(n, h, c)``, concatenated to ``(n, h*c)`` or
  averaged over heads to ``(n, c)``.

All of the attention runs in one fused row kernel (:func:`~corgnn.sparse.attention_dot.dot_attention_forward`:
scores, row softmax, dropout, aggregation), never storing PyG's per-edge ``(q, h, c)`` messages.

Backward (derived as the paper's appendix "GAT Backward Pass" does for GAT), with
``G = dL/dout`` as ``(n, h, c)`` (for the head mean ``G / h`` per head) and ``drop_e``
the dropout factor (0 or ``1/(1-p)``; 1 without dropout):

* ``dalpha_e = drop_e <G_i, V_j>``                                  (SDDMM)
* ``de_e = alpha_e (dalpha_e - sum_{e' in row i} alpha_e' dalpha_e')``  (softmax backward)
  where the row sum equals ``D_i = <G_i, out_i>`` (since ``out_i = sum_e drop_e alpha_e V_j``),
  a dense per-node product: no second pass over the row when ``out`` is kept
* ``dQ_i = sum_{e in row i} de_e K_j / sqrt(c)``                   (row walk)
* ``dK_j = sum_{e in column j} de_e Q_i / sqrt(c)``                (transposed walk)
* ``dV_j = sum_{e in column j} drop_e alpha_e G_i``                (transposed walk, ``A_alpha^T G``)
* ``dW_q = dQ^T x_dst``, ``db_q = dQ^T 1``, likewise ``K``, ``V`` from ``x_src``;
  ``dx_src = dK W_k + dV W_v (+ dQ W_q for one node set)``, ``dx_dst = dQ W_q`` (GEMMs).

No autograd inside: each step is a kernel of :mod:`corgnn.sparse.attention_dot` or a GEMM.
"""

from __future__ import annotations

import math

import torch

from ..cost.transformer import parse_transformer_cache
from ..sparse.attention_dot import dot_attention_backward_cols, dot_attention_backward_rows, dot_attention_forward
from ..sparse.formats import SparseFormat
from ..sparse.ops import edge_softmax, sddmm, spmm
from ..sparse.rng import DropoutSpec
from .projection import stacked_projection_grads, stacked_projections

__all__ = ["TransformerFunction", "transformer_conv", "dot_attention", "project_heads"]


def project_heads(x: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, heads: int, xs: SparseFormat | None = None) -> torch.Tensor:
    """``x weight^T + bias`` viewed ``(n, heads, c)`` (PyG's ``Linear`` then ``view(-1, H, C)``);
    an SpMM over the non-zeros of the sparse features ``xs`` when given (``x`` unread)."""
    if xs is not None:
        P = spmm(xs, weight.t(), bias=bias)
    elif bias is not None:
        P = torch.addmm(bias, x, weight.t())
    else:
        P = torch.mm(x, weight.t())
    return P.unflatten(1, (heads, -1))  # (not view(n, heads, -1): ambiguous when n = 0)


def _qkv(x_src, x_dst, wq, bq, wk, bk, wv, bv, heads, xs, ws=None, bs=None):
    """``(Q, K, V)``, plus the root term ``x_src ws^T + bs (n, d)`` with ``ws`` (one
    node set only: a fourth block of the one product)."""
    if x_dst is None:  # one node set: one product, X read once (:mod:`corgnn.functional.projection`)
        # NOTE: on CPU queries, keys and values come out heads-last, as the Numba
        # kernels read them: no transposed copies of Q, K and V per forward and
        # backward (7 per layer, ~0.7 ms each at 20k x 8 x 8, 2 threads); Triton reads
        # them heads-first.
        last = (0, 1, 2) if wq.device.type == "cpu" else ()
        weights, biases = ((wq, wk, wv), (bq, bk, bv)) if ws is None else ((wq, wk, wv, ws), (bq, bk, bv, bs))
        return stacked_projections(x_src, weights, biases, heads, xs, heads_last=last, flat=(3,))
    # (two node sets: dense features, queries from x_dst)
    return project_heads(x_dst, wq, bq, heads), project_heads(x_src, wk, bk, heads), project_heads(x_src, wv, bv, heads)


def _saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are set (``torch.autograd.graph.saved_tensors_hooks``:
    ``save_on_cpu``, checkpointing); True where this torch cannot say."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return True if top is None else top(False) is not None


def _graph_kept() -> bool:
    """Whether the running backward keeps the graph for another (``retain_graph``,
    ``create_graph``); True where this torch cannot say (nothing is dropped then)."""
    kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if kept is None else bool(kept())


def _combine(out3: torch.Tensor, concat: bool) -> torch.Tensor:
    return out3.flatten(1) if concat else out3.mean(1)


def _edge_weight(we: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """PyG's ``lin_edge.weight (h*c, f)`` as ``(h, c, f)``: head ``h``'s ``W_e``."""
    return None if we is None else we.unflatten(0, (heads, -1))


def _attend(A, Q, K, V, We3, attr, scale, drop, want_alpha=False):
    """The fused forward with optional edge features: ``(out (n, h, c) with W_e Ae added,
    lse, alpha or None, Ae or None)``.

    NOTE: PyG adds ``E_e = W_e attr_e`` (q, h, c) to every key and value; here
    ``<Q_i, K_j + E_e> = <Q_i, K_j> + <W_e^T Q_i, attr_e>`` (``Qe = W_e^T Q``, (n, h, f)) and
    ``sum_e alpha_e (V_j + E_e) = sum_e alpha_e V_j + W_e sum_e alpha_e attr_e``, so the
    kernels read ``attr (q, f)`` and never build the ``(q, h, c)`` edge messages.
    """
    Qe = None if We3 is None else torch.einsum("nhc,hcf->nhf", Q, We3)
    out3, lse, alpha, Ae = dot_attention_forward(A, Q, K, V, scale, drop, want_alpha=want_alpha, Qe=Qe, attr=attr)
    if Ae is not None:
        out3 = out3 + torch.einsum("nhf,hcf->nhc", Ae, We3)
    return out3, lse, alpha, Ae


class TransformerFunction(torch.autograd.Function):
    """The attention part of ``TransformerConv`` under one caching scheme
    (:mod:`corgnn.cost.transformer`).

    ``apply(x_src, x_dst, wq, bq, wk, bk, wv, bv, attr, we, seed, A, heads, concat, p, cache, xs, ws, bs)``
    with ``x_src (n_src, m_src)`` (or None with sparse features ``xs``), ``x_dst
    (n_dst, m_dst)`` or None (one node set: queries from ``x_src``), weights
    ``(h*c, m)`` and biases ``(h*c,)`` or None as PyG's ``lin_query``/``lin_key``/
    ``lin_value``, edge features ``attr (q, f)`` in ``A``'s entry order with PyG's
    ``lin_edge.weight`` ``we (h*c, f)`` (both or None), ``seed`` the ``(1,)`` int64 attention-dropout seed
    (:class:`~corgnn.sparse.rng.DropoutSpec`), ``A`` the ``(n_dst, n_src)`` pattern
    (rows = destinations), ``p`` the dropout probability, ``cache`` a scheme name.
    Returns ``(n_dst, h*c)`` if ``concat`` else ``(n_dst, c)``; with the root term's
    ``ws (d, m_src)`` and ``bs (d,)`` or None (PyG's ``lin_skip``, one node set only)
    also ``x_r = x_src ws^T + bs (n, d)``, a fourth block of the ``Q, K, V`` product.

    Saved for backward, by ``cache`` (beyond the parameters, which cost nothing):

    * ``"none"``: only the inputs; backward recomputes ``Q, K, V`` (GEMMs) and runs
      the forward kernel again for the row log-sum-exp ``lse``.
    * ``"features"``: ``Q, K, V``; backward reruns the forward kernel.
    * ``"row_stats"``: ``Q, K, V`` and ``lse (n, h)`` (FlashAttention's statistic);
      backward recomputes ``alpha_e = exp(s_e - lse_i)`` per edge.
    * ``"edge_weights"``: ``Q, K, V`` and ``alpha (q, h)`` (before dropout).

    No scheme keeps ``out (n, h, c)``: the softmax backward's row sums
    ``D_i = <G_i, out_i> = sum_e alpha_e dalpha_e`` come from each row's own entries in
    the backward kernel, which has them at hand (issue 25: ``out`` was one
    ``(n, h*c)`` tensor per layer at a step's peak of memory).

    With edge features "row_stats" and "edge_weights" also keep
    ``Ae = sum_e drop_e alpha_e attr_e (n, h, f)`` (for ``dW_e``), and every scheme the
    input ``attr``. Edge-feature gradients: ``dalpha_e += drop_e <W_e^T G_i, attr_e>``,
    ``dQ_i += W_e sum_e de_e attr_e / sqrt(c)``, ``dW_e = sum_i (Q_i (sum_e de_e attr_e)^T / sqrt(c)
    + G_i Ae_i^T)`` per head, ``dattr_e = sum_h W_e^T (de_e Q_i / sqrt(c) + drop_e alpha_e G_i)``.

    ``x_src``/``x_dst`` are kept when a weight gradient needs them (or by "none").
    The dropout mask is not stored: the kernels redraw it from the seed.
    """

    @staticmethod
    def forward(
        ctx, x_src, x_dst, wq, bq, wk, bk, wv, bv, attr, we, seed, A: SparseFormat, heads: int, concat: bool, p: float, cache: str,
        xs: SparseFormat | None = None, ws: torch.Tensor | None = None, bs: torch.Tensor | None = None,
    ):
        drop = DropoutSpec(p, seed)
        Q, K, V, *root = _qkv(x_src, x_dst, wq, bq, wk, bk, wv, bv, heads, xs, ws, bs)
        scale = 1.0 / math.sqrt(Q.size(2))
        out3, lse, alpha, Ae = _attend(A, Q, K, V, _edge_weight(we, heads), attr, scale, drop, want_alpha=cache == "edge_weights")
        need = ctx.needs_input_grad
        need_w = need[2] or need[4] or need[6] or need[17]
        ctx.A, ctx.heads, ctx.concat, ctx.p, ctx.cache, ctx.scale = A, heads, concat, p, cache, scale
        ctx.one_set = x_dst is None
        ctx.xs = xs if (need_w or cache == "none") else None
        keep_x = need_w or cache == "none"
        keep_src = x_src if keep_x and xs is None else None
        keep_dst = x_dst if (need[2] or cache == "none") else None
        # NOTE: the kept intermediates (Q, K, V, lse, alpha, Ae) live on ctx, not in
        # save_for_backward: a backward that frees the graph drops them as soon as it
        # has used them (K and V before dK and dV are made, the rest before the weight
        # gradients' products), where saved tensors would live until the node's
        # backward returns (issue 25: they were at the step's peak of memory). A
        # backward that keeps the graph (retain_graph=True, create_graph, gradcheck)
        # keeps them for the next. Under saved-tensor hooks (save_on_cpu, activation
        # checkpointing, offloading) they are saved tensors, as those hooks expect.
        kept = None if cache == "none" else [Q, K, V, lse if cache == "row_stats" else None, alpha, Ae if cache in ("row_stats", "edge_weights") else None]
        hooked = _saved_tensor_hooks_active()
        ctx.cached = None if hooked else kept
        ctx.save_for_backward(keep_src, keep_dst, wq, bq, wk, bk, wv, bv, attr, we, seed, ws, *(kept if hooked and kept else [None] * 6))
        return (_combine(out3, concat), root[0]) if root else _combine(out3, concat)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_root=None):
        x_src, x_dst, wq, bq, wk, bk, wv, bv, attr, we, seed, ws, Q, K, V, lse, alpha, Ae = ctx.saved_tensors
        if ctx.cached is not None:
            Q, K, V, lse, alpha, Ae = ctx.cached
            if not _graph_kept():
                ctx.cached = None  # (each dropped below once used)
        need = ctx.needs_input_grad
        heads, drop, xs = ctx.heads, DropoutSpec(ctx.p, seed), ctx.xs
        We3 = _edge_weight(we, heads)
        grads = [None] * 19
        if not (any(need[:10]) or any(need[17:])):
            return tuple(grads)
        n = grad_out.size(0)
        if ctx.concat:
            G = grad_out.unflatten(1, (heads, -1))
        else:
            # NOTE: out = mean_h out3, so dL/dout3[:, h] = G / heads for every head:
            # (n, 1, c), read by the kernels for every head (no (n, h, c) copy)
            G = (grad_out / heads).unsqueeze(1)
        if Q is None:  # "none": recompute Q, K, V
            Q, K, V = _qkv(x_src, x_dst, wq, bq, wk, bk, wv, bv, heads, xs)
        if ctx.cache in ("none", "features"):  # the forward kernel again, for lse (and Ae)
            _, lse, _, Ae = _attend(ctx.A, Q, K, V, We3, attr, ctx.scale, drop)
        Qe = Ge = None
        if We3 is not None:
            Qe, Ge = torch.einsum("nhc,hcf->nhf", Q, We3), torch.einsum("nhc,hcf->nhf", G.expand(n, heads, -1), We3)
        ea, dQ, dQe, dattr = dot_attention_backward_rows(ctx.A, G, Q, K, V, ctx.scale, drop, alpha=alpha, lse=lse, Qe=Qe, Ge=Ge, attr=attr)
        # NOTE: K and V are read by the row walk only; with the cache dropped (above)
        # these are their last references: freed before dK, dV are made.
        del K, V, lse
        dK, dV = dot_attention_backward_cols(ctx.A, G, Q, ea, alpha, ctx.scale)
        del ea, alpha
        if We3 is not None:
            dQ = dQ + ctx.scale * torch.einsum("nhf,hcf->nhc", dQe, We3)
            if need[9]:
                gwe = ctx.scale * torch.einsum("nhc,nhf->hcf", Q, dQe) + torch.einsum("nhc,nhf->hcf", G.expand(n, heads, -1), Ae)
                grads[9] = gwe.flatten(0, 1)
            if need[8]:
                grads[8] = dattr
        dQ, dK, dV = dQ.flatten(1), dK.flatten(1), dV.flatten(1)
        if ctx.one_set:
            # (the root term's gradient is one more block of the stacked product's)
            blocks, weights, slots = [dQ, dK, dV], (wq, wk, wv), (2, 4, 6)
            if ws is not None:
                blocks, weights, slots = blocks + [grad_root.contiguous()], weights + (ws,), slots + (17,)
            del dQ, dK, dV, Q, Ae, G, Qe, Ge, grad_root  # (the only references once these go: freed when stacked)
            dws, dbs, grads[0] = stacked_projection_grads(
                blocks, x_src, weights, any(need[s] for s in slots), need[0], any(need[s + 1] for s in slots), xs,
            )
            for i, slot in enumerate(slots):
                grads[slot] = dws[i] if need[slot] else None
                grads[slot + 1] = dbs[i] if need[slot + 1] else None
            return tuple(grads)
        # (two node sets, dense features: queries from x_dst)
        for slot, d, x in ((2, dQ, x_dst), (4, dK, x_src), (6, dV, x_src)):
            if need[slot]:
                grads[slot] = torch.mm(d.t(), x)
            if need[slot + 1]:
                grads[slot + 1] = d.sum(0)
        if need[0]:
            grads[0] = torch.mm(dK, wk).addmm_(dV, wv)
        if need[1]:
            grads[1] = torch.mm(dQ, wq)
        return tuple(grads)


def transformer_conv(
    x_src: torch.Tensor | None,
    x_dst: torch.Tensor | None,
    wq: torch.Tensor,
    bq: torch.Tensor | None,
    wk: torch.Tensor,
    bk: torch.Tensor | None,
    wv: torch.Tensor,
    bv: torch.Tensor | None,
    A: SparseFormat,
    heads: int,
    *,
    concat: bool = True,
    dropout: float | DropoutSpec = 0.0,
    training: bool = False,
    cache: str = "edge_weights",
    xs: SparseFormat | None = None,
    edge_attr: torch.Tensor | None = None,
    edge_weight: torch.Tensor | None = None,
    root_weight: torch.Tensor | None = None,
    root_bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Functional attention part of ``TransformerConv`` (no validation:
    :class:`corgnn.nn.TransformerConv` validates), fused (:class:`TransformerFunction`).

    Shapes: ``x_src (n_src, m_src)`` (or None with sparse features ``xs (n_src, m_src)``),
    ``x_dst (n_dst, m_dst)`` or None (one node set), ``wq (h*c, m_dst)``,
    ``wk``/``wv (h*c, m_src)``, biases ``(h*c,)`` or None, ``A (n_dst, n_src)`` ->
    ``(n_dst, h*c)`` if ``concat`` else ``(n_dst, c)``. Edge features (PyG's
    ``edge_dim``): ``edge_attr (q, f)`` in ``A``'s entry order and ``edge_weight``
    PyG's ``lin_edge.weight (h*c, f)``, both or neither.

    The root (skip) term, one node set only: with ``root_weight (d, m_src)`` (PyG's
    ``lin_skip.weight``) and ``root_bias (d,)`` or None, returns ``(out, x_r)`` with
    ``x_r = x_src root_weight^T + root_bias (n, d)`` computed as one more block of the
    ``Q, K, V`` product (``x`` read once, forward and backward; one input gradient).

    ``dropout`` applies to the attention coefficients when ``training`` (a float
    draws a fresh seed from torch's generator; a :class:`DropoutSpec` fixes it).
    ``cache``: "none", "features", "row_stats" or "edge_weights". Without autograd
    the forward runs directly and keeps nothing.
    """
    cache = parse_transformer_cache(cache)
    if isinstance(dropout, DropoutSpec):
        drop = dropout if training else DropoutSpec(0.0, device=wq.device)
    else:
        drop = DropoutSpec(dropout if training else 0.0, device=wq.device)
    if root_weight is not None and x_dst is not None:
        raise ValueError("root_weight: the fused root term needs one node set (x_dst None)")
    tensors = (x_src, x_dst, wq, bq, wk, bk, wv, bv, edge_attr, edge_weight)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors + (root_weight, root_bias)):
        return TransformerFunction.apply(*tensors, drop.seed, A, heads, concat, drop.p, cache, xs, root_weight, root_bias)
    with torch.no_grad():
        Q, K, V, *root = _qkv(x_src, x_dst, wq, bq, wk, bk, wv, bv, heads, xs, root_weight, root_bias)
        out3 = _attend(A, Q, K, V, _edge_weight(edge_weight, heads), edge_attr, 1.0 / math.sqrt(Q.size(2)), drop)[0]
        return (_combine(out3, concat), root[0]) if root else _combine(out3, concat)


def dot_attention(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, A: SparseFormat, *, dropout: float = 0.0, training: bool = False,
    E: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Graph dot-product attention built from corgnn's differentiable public ops
    (:func:`~corgnn.sparse.sddmm`, :func:`~corgnn.sparse.edge_softmax`,
    :func:`~corgnn.sparse.spmm`), for what the fused :class:`TransformerFunction`
    does not serve: attention weights returned with gradients. PyG
    ``TransformerConv.message`` step by step: ``alpha = softmax_row(<Q_i, K_j> / sqrt(c))``,
    ``torch.nn.functional.dropout`` of it, ``out_i = sum_e alpha_e V_j``.

    Args:
        Q: ``(n_dst, h, c)``; K, V: ``(n_src, h, c)``; A: ``(n_dst, n_src)`` pattern.
        E: ``(q, h, c)`` edge terms added to each entry's key and value (PyG's
            ``lin_edge(edge_attr)``, in ``A``'s entry order), or None.

    Returns:
        ``(out (n_dst, h, c), alpha (q, h))``, ``alpha`` before dropout (as PyG
        returns it), in ``A``'s entry order.
    """
    scores = sddmm(A, Q, K)
    if E is not None:
        row = A.to_coo().row  # (the destination of each entry, in A's order)
        scores = scores + (Q[row] * E).sum(-1)
    scores = scores / math.sqrt(Q.size(2))
    alpha = edge_softmax(A, scores) if A.nnz else scores
    dropped = torch.nn.functional.dropout(alpha, dropout, training)
    out = spmm(A, V, values=dropped)
    if E is not None:
        out = out.index_add(0, row, dropped.unsqueeze(-1) * E)
    return out, alpha
