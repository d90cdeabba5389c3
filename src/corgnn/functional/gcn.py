"""GCN autograd Function with the paper's explicit backward (appendix "GCN Backward Pass").

``X' = A' X Θ + 1 b^T`` with ``Θ = weight^T`` (``weight (k, m)`` as in PyG's
``GCNConv.lin.weight``). Gradients, with ``G = dL/dX'``:

* ``dL/dΘ = X^T A'^T G``    (eq. gcn-bwd-weights)  -> ``dL/dweight = G^T (A' X)`` or ``(A'^T G)^T X``
* ``dL/db = G^T 1``          (eq. gcn-bwd-bias)
* ``dL/dX = A'^T G Θ^T``     (eq. gcn-bwd-x)
* ``dL/dA'_ij = <G_i, (XΘ)_j>`` at the stored entries of ``A'`` only (an SDDMM), when
  the values of ``A'`` are an input (learnable edge weights, explainer edge masks;
  :func:`gcn_values` chains it through PyG's normalisation to ``edge_weight``).

The scheme (see :mod:`corgnn.cost.gcn`) decides the association order of each product.

Second derivatives (``torch.autograd.grad(..., create_graph=True)``): the backward is
written with the differentiable public ops (:func:`~corgnn.sparse.spmm`,
:func:`~corgnn.sparse.sddmm`, which run their raw kernels when autograd is off) and
torch matmuls on saved *inputs*, so under ``create_graph=True`` it records its own
graph; no intermediate it reads is a constant cut off from the inputs (see
:class:`GCNFunction`).
"""

from __future__ import annotations

import torch

from ..cost.gcn import GCNScheme, parse_scheme
from ..graph import gcn_edge_weights
from ..sparse.formats import CSR, SparseFormat
from ..sparse.ops import sddmm, spmm

__all__ = ["GCNFunction", "gcn_conv", "COMPOSED_SCHEME", "runs_composed", "composed_first", "composes", "row_tails", "small_product", "gcn_edge_weights", "gcn_values", "entry_values", "feature_transform", "RowsLinear", "gradient_rows", "head_product", "ROWS_MIN_MACS", "SPMM_MAC_COST"]

ROWS_MIN_MACS = 1 << 22
"""Least multiply-adds of a weight gradient ``G^T F`` ``(n, k) x (n, m)`` for which the
backward looks for an all-zero tail of ``G``'s rows (:func:`gradient_rows`, ~50 us on
7,000 x 64): below it the GEMM is too short to win the look back."""

SPMM_MAC_COST = 8
"""Cost of one SpMM multiply-add in GEMM multiply-adds, for the choice of a weight
gradient's association order at backward time (CPU; measured 2026-11-28, 2-core VM,
a 7,063-node PubMed sample: an SpMM on 500 columns, 9.3 M multiply-adds, 0.67 ms; a
GEMM of 226 M, 2.44 ms: ~6.6x)."""


COMPOSED_SCHEME = parse_scheme("propagate-first+split+cache")
"""The scheme a layer may run as torch's own composition ``linear(spmm(A', X), W, b)``
(:func:`runs_composed`): ``A'X`` first, then a linear whose autograd keeps ``A'X``
for ``dW = G^T (A'X)`` and gives ``dX = A'^T (G W)``, the same products as
:class:`GCNFunction` under this scheme."""


def runs_composed(scheme: GCNScheme, x: torch.Tensor | None, weight: torch.Tensor, xs: SparseFormat | None, tails: bool = True) -> bool:
    """Whether a layer runs ``scheme`` as :data:`COMPOSED_SCHEME`'s composition
    instead of :class:`GCNFunction`: that scheme, on dense CPU ``x (n, m)`` (no
    sparse ``xs``), outside ``torch.compile``, where :func:`composes` (``tails``:
    see there) for a product ``x weight^T`` (``weight (k, m)``).

    NOTE (issue 21, measured 2026-11-28 on the 2-core VM, 5-layer GIN with a 2-layer
    MLP on mini-batches of 32 small graphs, ~780 nodes, 64 channels, the old and new
    rule interleaved in one process, four runs): on such small products torch's own
    autograd of the weight product (C++) beats :class:`GCNFunction`'s Python
    backward, which calls each product from Python: 4.33 / 4.65 / 4.53 / 4.66 ->
    4.17 / 4.50 / 4.37 / 4.46 ms per training step (3.3-4.2 % less; PyG 4.53-4.85
    ms); the 3-layer GCN on the same batches ~1 % less."""
    # (cache implies propagate-first+split, and reuse is never planned for a dense x
    # that needs this choice: two attribute reads instead of a dataclass comparison)
    return (
        scheme.cache and not scheme.reuse and xs is None and x is not None and x.device.type == "cpu"
        and composes(x.size(0), x.size(1), weight.size(0), tails) and not torch.compiler.is_compiling()
    )


def small_product(n: int, m: int, k: int) -> bool:
    """Whether an ``(n, m) x (m, k)`` product is shorter than :data:`ROWS_MIN_MACS`
    multiply-adds (where :class:`GCNFunction`'s backward does not look for the
    gradient's all-zero tail: :func:`gradient_rows`)."""
    return n * m * k < ROWS_MIN_MACS


def composes(n: int, m: int, k: int, tails: bool = True) -> bool:
    """Whether a layer runs :data:`COMPOSED_SCHEME` on an ``(n, m) x (m, k)`` product
    as torch's composition ``linear(spmm(A', X), W, b)`` (:func:`runs_composed`) and
    prefers that scheme on a tie (:func:`composed_first`): always, unless ``tails``
    (the call records a backward and ``A'`` is a CSR: ``GCNFunction``'s backward
    could then skip the all-zero tail of the output gradient's rows, which torch's
    linear cannot) and the product is not :func:`small_product`. A call without a
    backward, or on an edge list (:meth:`corgnn.Graph.aggr_adjacency` hands one out
    for a graph not built yet, whose backward keeps no row plan), loses nothing.

    NOTE (issue 21, measured 2026-11-29 on the 2-core VM, interleaved in one
    process): at 128 and 512 small graphs a batch (3,100 / 12,500 nodes, 64
    channels, 13-55 M multiply-adds a product, above :data:`ROWS_MIN_MACS`) the
    composition against ``GCNFunction`` on the same tie (m = k, transform-first+fused
    before): 5-layer GIN evaluation 6.9 % (128) and 2.8 % (512) less time a batch,
    training on the batches' edge lists 2.3-7.4 % (128) and 1.3 % (512) less; 3-layer
    GCN evaluation 10 % (128) and 1.4 % (512) less."""
    return not tails or n * m * k < ROWS_MIN_MACS


def row_tails(training: bool, A: SparseFormat) -> bool:
    """:func:`composes`' ``tails``: whether a call that records a backward
    (``training``) on matrix ``A`` could use the output gradient's all-zero tail."""
    return training and type(A) is CSR


def composed_first(candidates: tuple[GCNScheme, ...], n: int, m: int, k: int, tails: bool = True) -> tuple[GCNScheme, ...]:
    """``candidates`` with :data:`COMPOSED_SCHEME` first when an ``(n, m) x (m, k)``
    product would run composed (:func:`composes`; ``tails`` see there): a plan's tie
    between it and another scheme (equal estimated time, memory and SpMM count, e.g.
    transform-first+fused at ``m = k``) then goes to the composition."""
    if not composes(n, m, k, tails):
        return candidates
    hit = _COMPOSED_FIRST.get(id(candidates))
    if hit is None or hit[0] is not candidates:  # (one tuple per candidate set: the plan's memo then hits)
        first = (COMPOSED_SCHEME,) + tuple(s for s in candidates if s != COMPOSED_SCHEME) if COMPOSED_SCHEME in candidates else candidates
        hit = _COMPOSED_FIRST[id(candidates)] = (candidates, first)
    return hit[1]


_COMPOSED_FIRST: dict = {}


def gradient_rows(G: torch.Tensor, macs: int) -> int:
    """``h`` with ``G[h:]`` all zero (``G (n, k)``): ``n`` when the last row holds a
    non-zero (or NaN), when ``G`` is not a CPU tensor, while ``torch.compile`` traces,
    or when the product this serves is shorter than :data:`ROWS_MIN_MACS`
    multiply-adds. Reads back from the end in blocks of doubling size until a live
    row or ``n/8`` rows, then (a longer tail) the rest in one pass: a short tail (a
    scattered full-batch mask) costs a block or two, a long one a pass its skipped
    rows pay back.

    NOTE (issue 21): the loss of mini-batch node classification reads the seed nodes'
    rows only (``out[:batch_size]``), and neighbour samplers (PyG's ``NeighborLoader``,
    :mod:`corgnn.sampling`) number nodes hop by hop: so the gradient reaching the first
    layer is zero past the seeds and their sampled in-neighbours (a 512-seed, 10 x 10
    sample of PubMed: 1,906 of 7,063 rows; of the OGB-Arxiv stand-in 2,175 of 10,906),
    and the weight gradients ``G^T F`` need only ``G[:h]``, ``F[:h]`` (PyG's
    ``trim_to_layer`` trims the same rows when a user asks for it). A full-batch loss
    on a scattered train mask leaves a short tail: a block or two is read."""
    n = G.size(0)
    if macs < ROWS_MIN_MACS or G.device.type != "cpu" or n == 0 or torch.compiler.is_compiling() or bool(G[-1].ne(0).any()):
        return n  # (under torch.compile: no data-dependent branch in a traced backward)

    def last_live(a: int, b: int) -> int:  # (1 + the last live row of G[a:b], or a when none)
        rows = G[a:b].abs().amax(1).ne(0).nonzero()  # (a NaN propagates: NaN != 0, live)
        return a + int(rows[-1]) + 1 if rows.numel() else a

    end, size = n - 1, 64  # (G[end:] is zero)
    while end > 0 and n - end < n // 8:  # blocks of doubling size back from the end
        start = max(0, end - size)
        lo, hi = G[start:end].aminmax()  # (one pass, no temporary)
        if bool(lo != 0) or bool(hi != 0) or bool(lo != lo):  # (a NaN: live)
            return last_live(start, end)
        end, size = start, 2 * size
    return last_live(0, end)  # a tail of n/8 rows or more: one pass, paid back by the rows skipped


def head_product(G: torch.Tensor, weight: torch.Tensor, h: int) -> torch.Tensor:
    """``G weight`` ``(n, m)`` for ``G (n, k)`` with ``G[h:] = 0``: ``[G[:h] weight; 0]``
    when ``h <= n/2``, else the product on every row (which then beats zeroing and
    filling)."""
    n = G.size(0)
    if 2 * h > n:
        return torch.mm(G, weight)
    out = G.new_zeros(n, weight.size(1))
    out[:h] = torch.mm(G[:h], weight)
    return out


def feature_transform(x: torch.Tensor | None, weight: torch.Tensor, xs: SparseFormat | None, add: torch.Tensor | None = None) -> torch.Tensor:
    """``X Θ`` ``(n, k)`` (``+ add``, an ``(n, k)`` tensor, when given): a GEMM, or an
    SpMM over the non-zeros of sparse ``xs``; under autograd a GEMM of at least
    :data:`ROWS_MIN_MACS` multiply-adds on CPU is a :class:`RowsLinear` (its backward
    skips the output gradient's all-zero tail). A GEMM with ``add`` is one ``addmm``
    (no second pass over the output: SAGE's and GraphConv's root term, ~5 us a layer
    on a mini-batch of small graphs)."""
    if xs is not None:
        out = spmm(xs, weight.t())
    elif (
        torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad) and x.device.type == "cpu"
        and x.size(0) * x.size(1) * weight.size(0) >= ROWS_MIN_MACS
    ):
        out = RowsLinear.apply(x, weight)
    elif add is not None:
        return torch.addmm(add, x, weight.t())
    else:
        return torch.mm(x, weight.t())
    return out if add is None else add + out


class RowsLinear(torch.autograd.Function):
    """``x weight^T`` ``(n, k)`` (``x (n, m)``, ``weight (k, m)``) whose backward computes
    on the rows of the output gradient ``G`` before its all-zero tail only
    (:func:`gradient_rows`): ``dweight = G[:h]^T x[:h]``, ``dx = [G[:h] weight; 0]``.
    Exact: the skipped rows contribute zeros. The root term of SAGE / GraphConv on a
    neighbour-sampled batch (measured in the README's changing-graphs section)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return torch.mm(x, weight.t())

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad
        n, m, k = x.size(0), x.size(1), weight.size(0)
        h = gradient_rows(grad_out, n * m * k)
        gw = torch.mm(grad_out[:h].t(), x[:h]) if need_w else None
        gx = head_product(grad_out, weight, h) if need_x else None
        return gx, gw


def _fixed_values(A: SparseFormat, val: torch.Tensor | None) -> torch.Tensor | None:
    """The values the products use: ``val`` when given, else ``A.val`` as a constant
    (``None`` = ``A.val`` itself, the common case; detached only if it tracks a
    gradient, so that no backward ever differentiates into it behind the layer's back)."""
    if val is not None or A.val is None or not A.val.requires_grad:
        return val
    return A.val.detach()


class GCNFunction(torch.autograd.Function):
    """``X' = A' X Θ + b`` under one :class:`~corgnn.cost.gcn.GCNScheme`.

    ``apply(x, weight, bias, A, scheme, xs=None, val=None)``: ``val (nnz,)`` in ``A``'s
    entry order replaces ``A.val`` and gets the gradient ``dL/dA'`` (an SDDMM); without
    it ``A'`` is a constant.

    Saved for backward (only what ``ctx.needs_input_grad`` requires):

    * ``weight`` when ``dL/dX`` is needed (``dX = (A'^T G) weight`` or ``A'^T (G weight)``);
    * for ``dL/dweight``: ``X`` (n, m) in every scheme without cache, or, in the
      cached scheme, ``A'X`` (n, m) *instead of* ``X``, so caching saves one SpMM in
      backward at no memory cost (appendix "No memory overhead with GCN caching");
    * for ``dL/dval``: ``X`` (or the sparse ``xs``), ``weight`` and ``val``; backward
      recomputes ``XΘ`` (one GEMM) for the SDDMM.

    ``A'^T`` is never built: backward SpMMs use ``spmm(A, ., transpose=True)``, which
    walks the adjacency's cached CSC dual.

    Second derivatives: every tensor the backward reads is a saved input, or ``A'X``
    recomputed from them, except the cached ``A'X``; when ``X`` or ``val`` needs a
    gradient that one is computed under autograd (the public ``spmm``, which keeps no
    extra tensor), so ``dweight = (A'X)^T G`` stays differentiable w.r.t. them.

    Sparse input features: ``xs`` (a sparse ``(n, m)`` format with the values of
    ``X``, e.g. Planetoid's bag-of-words at ~1 % density) replaces the two dense
    GEMMs that read ``X`` (``X Θ`` forward, ``X^T P`` backward) by SpMMs over its
    non-zeros; ``x`` may then be ``None`` (no gradient for ``X``), which needs the
    transform-first+fused scheme (``A'X`` would be a sparse-sparse product).

    Reuse across calls (``scheme.reuse``, issue 12 lever 1): ``x`` *is* ``A'X``, kept
    by the caller from an earlier call on constant features
    (:class:`corgnn.nn.GCNConv`'s ``cache_propagation``); forward is ``(A'X)Θ + b``,
    backward ``dweight = G^T (A'X)``: no SpMM. It takes no gradient for ``x`` or
    ``val`` (the features and the adjacency are constants).
    """

    @staticmethod
    def forward(ctx, x, weight: torch.Tensor, bias: torch.Tensor | None, A: SparseFormat, scheme: GCNScheme, xs: SparseFormat | None = None, val: torch.Tensor | None = None):
        if x is None and (xs is None or (scheme.forward, scheme.backward) != ("transform-first", "fused-propagate")):
            raise ValueError("sparse-only features need the transform-first+fused scheme")
        need_x, need_w = ctx.needs_input_grad[:2]
        need_val = ctx.needs_input_grad[6]
        if scheme.reuse and (need_x or need_val or xs is not None):
            raise ValueError("the reuse scheme takes A'X of constant features: no gradient for x or the adjacency values, no sparse xs")
        values = _fixed_values(A, val)
        # NOTE: A'(XΘ) == (A'X)Θ by associativity; transform-first runs the SpMM on
        # k columns, propagate-first on m columns (paper Table 1).
        if scheme.forward == "transform-first":
            # NOTE: the bias is added by the SpMM as it writes each row (issue 12, lever 2)
            out = spmm(A, feature_transform(x, weight, xs), values=values, bias=bias)
            ax = None
        else:
            if scheme.reuse:
                ax = x  # A'X kept across calls by the caller
            elif scheme.cache and need_w and (need_x or need_val):
                # NOTE: the cached A'X is recorded by autograd when it depends on an
                # input needing a gradient: a double backward then reaches x / val
                # through dweight = (A'X)^T G. The record keeps no tensor beyond A'X.
                with torch.enable_grad():
                    ax = spmm(A, x, values=values)
            else:
                ax = spmm(A, x, values=values)
            out = torch.addmm(bias, ax, weight.t()) if bias is not None else torch.mm(ax, weight.t())
        ctx.A, ctx.scheme, ctx.xs = A, scheme, None
        keep_feat = None
        if need_w:
            keep_feat = ax if scheme.cache else x
            if xs is not None and scheme.backward == "fused-propagate":
                ctx.xs, keep_feat = xs, None  # the sparse X serves dΘ = X^T P
        if need_val:
            ctx.xs = xs  # XΘ for the SDDMM is recomputed from the sparse X when given
        ctx.save_for_backward(keep_feat, weight if need_x or need_val else None, x if need_val else None, val)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        feat, weight, x, val = ctx.saved_tensors
        A, scheme = ctx.A, ctx.scheme
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_val = ctx.needs_input_grad[6]
        values = _fixed_values(A, val)
        grad_out = grad_out.contiguous()
        gx = gw = gb = gval = None
        if need_b:
            gb = grad_out.sum(0)
        if need_w and not need_val and feat is not None and type(A) is CSR and (scheme.backward == "split-propagate" or not need_x):
            # NOTE: with G[h:] = 0 (gradient_rows) dweight = G[:h]^T (A'X)[:h]: the cached
            # A'X's first h rows, or A'[:h] X (an SpMM over those rows only) where that
            # beats the fused A'^T G (whose rows are all live: the sampled in-neighbours
            # of the live rows) followed by a full GEMM.
            n, m, k = feat.size(0), feat.size(1), grad_out.size(1)
            h = gradient_rows(grad_out, n * m * k)
            if 8 * h <= 7 * n:  # (a shorter tail saves less than A'[:h]'s walk costs to set up)
                cached = scheme.backward == "split-propagate" and scheme.cache
                q_h = 0 if cached else int(A.rowptr[h])
                if cached or scheme.backward == "split-propagate" or SPMM_MAC_COST * q_h * m + h * m * k < SPMM_MAC_COST * A.nnz * k + n * m * k:
                    ax = feat[:h] if cached else spmm(A.head(h), feat, values=None if values is None else values[:q_h])
                    gw = torch.mm(grad_out[:h].t(), ax)  # (dx, if needed, below: split-propagate's)
        if scheme.backward == "fused-propagate":
            if need_x or (need_w and gw is None):
                # NOTE: one SpMM on k columns serves both gradients: P = A'^T G.
                p = spmm(A, grad_out, transpose=True, values=values)
                # (P's live rows, as G's: dweight and dx on them only, see gradient_rows)
                m = (feat if feat is not None else weight).size(1) if need_x or feat is not None else 0
                h = gradient_rows(p, p.size(0) * m * p.size(1))
                if need_w and gw is None:
                    # NOTE: dweight = P^T X = (X^T P)^T; with sparse X that is a
                    # transposed SpMM over X's non-zeros instead of a dense GEMM.
                    gw = spmm(ctx.xs, p, transpose=True).t() if feat is None else torch.mm(p[:h].t(), feat[:h])
                if need_x:
                    gx = head_product(p, weight, h)
        else:
            if need_w and gw is None:
                # NOTE: dΘ = X^T A'^T G = (A'X)^T G; the cached A'X skips the recompute.
                ax = feat if scheme.cache else spmm(A, feat, values=values)
                gw = torch.mm(grad_out.t(), ax)
            if need_x:
                gx = spmm(A, torch.mm(grad_out, weight), transpose=True, values=values)
        if need_val:
            # NOTE: dL/dA'_ij = <G_i, (XΘ)_j> at A's entries: an SDDMM on k columns
            # over A's pattern (its values must not scale the result).
            gval = sddmm(A.with_values(None), grad_out, feature_transform(x, weight, ctx.xs).t())
        return gx, gw, gb, None, None, None, gval


def gcn_conv(x, weight: torch.Tensor, bias: torch.Tensor | None, A: SparseFormat, scheme: GCNScheme, xs: SparseFormat | None = None, values: torch.Tensor | None = None) -> torch.Tensor:
    """Functional GCN layer ``A' x weight^T + bias`` under ``scheme`` (no validation).

    Shapes: ``x (n, m)`` (or None with sparse ``xs (n, m)``), ``weight (k, m)``,
    ``bias (k,)`` or None, ``A (n, n)`` -> ``(n, k)``; optional ``values (nnz,)`` in
    ``A``'s entry order replace ``A.val`` and receive a gradient (see
    :func:`gcn_values`). Use :class:`corgnn.nn.GCNConv` for the validated, planned layer.
    """
    return GCNFunction.apply(x, weight, bias, A, scheme, xs, values)


def gcn_values(
    A: SparseFormat, edge_index: torch.Tensor, edge_weight: torch.Tensor | None, *,
    improved: bool = False, add_self_loops: bool = True, normalize: bool = True, loops: str = "remaining",
    positions: torch.Tensor | None = None, edge_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Values ``(nnz,)`` of the GCN propagation matrix ``A`` (as built by
    :meth:`corgnn.Graph.gcn_adjacency` from these edges and options, in any format)
    in ``A``'s entry order, differentiable w.r.t. ``edge_weight``.

    The normalisation is :func:`gcn_edge_weights` (PyG's ``gcn_norm``), then each
    edge's weight is added into the entry of ``A`` at (target, source), which sums
    duplicate edges as the coalesced ``A`` does. For :func:`gcn_conv`'s ``values``:
    the layer's gradient w.r.t. them chains through here to ``edge_weight``.
    ``loops``: the Graph's self-loop handling (:attr:`corgnn.Graph.loops`).
    ``positions ((q',) int64)``: the entry of ``A`` of each edge of
    :func:`gcn_edge_weights`' output when known (:meth:`corgnn.Graph.gcn_pattern`:
    computed once per graph, so no search per call). ``edge_mask`` (same length as
    that output): multiplies each edge's normalised weight (PyG's explain masks,
    applied to the messages after the normalisation).
    """
    n = A.shape[0]
    ei, ew = gcn_edge_weights(
        edge_index, edge_weight, n, improved=improved, add_self_loops=add_self_loops, normalize=normalize, dtype=A.val.dtype, loops=loops,
    )
    if edge_mask is not None:
        ew = ew * edge_mask.to(ew.dtype)
    if positions is not None:
        return ew.new_zeros(A.nnz).index_add(0, positions, ew)
    return entry_values(A, ei, ew)


def entry_values(A: SparseFormat, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
    """Values ``(nnz,)`` in the entry order of an ``(n, n)`` matrix ``A`` built from
    ``edge_index (2, q)``: each edge's weight ``(q,)`` added into an entry at (target,
    source), duplicates summed; differentiable w.r.t. ``edge_weight``. Where ``A``
    holds duplicate entries (corgnn's CPU builds keep them), all of a position's
    weights go to one of its entries and the others get 0: the same matrix."""
    n = A.shape[0]
    coo = A.to_coo()
    # NOTE: sorting A's keys once lets a binary search find an entry of every edge,
    # in any format's entry order.
    keys, order = torch.sort(coo.row * n + coo.col)
    pos = order[torch.searchsorted(keys, edge_index[1] * n + edge_index[0])]
    return edge_weight.new_zeros(A.nnz).index_add(0, pos, edge_weight)
