"""Several projections of one input as one product (the attention layers' ``Q, K, V``
and GATv2's two sides).

``x W_1^T, ..., x W_s^T`` (+ biases) with the weights stacked ``(d_1 + ... + d_s, m)``: one GEMM
reads ``x (n, m)`` once instead of ``s`` times (PubMed's ``x``, 19717 x 500 floats, is
39 MB), and its backward is one GEMM for the stacked weight gradient ``dP^T x`` and
one for ``dP W`` (``dP`` the stacked output gradients). Sparse features ``xs`` (a
corgnn sparse matrix of ``x``'s non-zeros) take one SpMM ``xs [W_1; ...; W_s]^T``
and, backward, one transposed SpMM ``xs^T dP`` the same way.

NOTE (measured on PubMed's features, 19717 x 500 with 977k entries, 2 threads):
one SpMM at 192 columns costs what three at 64 do (8.8 vs 3 x 3.4 ms), but the
stacked transposed SpMM of the backward runs by ``A``'s rows
(:data:`corgnn.sparse.ops.SCATTER_MIN_BYTES`) in 8.1 ms against 3 x 3.7 ms.

The outputs are column blocks of the one product, each copied out contiguous once
(the fused kernels read contiguous operands).
"""

from __future__ import annotations

import torch

from ..sparse.formats import SparseFormat
from ..sparse.ops import spmm

__all__ = ["stacked_projections", "stacked_projection_grads", "STACK_MIN_FEATURES", "STACK_GRADS_MIN_BYTES"]


STACK_MIN_FEATURES = 128
"""Dense ``x`` with fewer columns than this is projected by one GEMM per weight,
each writing its block contiguous, instead of one stacked GEMM and a copy per block.

NOTE (2 threads, median of 15, blocks of 64 columns): 20000 x 64 into 3 blocks 5.1
(stacked and copied) vs 3.2 ms, into 2 blocks 2.6 vs 2.1; at 128 columns even (5.2
vs 5.2); at 500 (89250 rows, 2 blocks) stacked wins, 81 vs 94 ms: ``x`` read once."""


def stacked_projections(
    x: torch.Tensor | None, weights: tuple, biases: tuple, heads: int, xs: SparseFormat | None = None, heads_last: tuple[int, ...] = (),
    flat: tuple[int, ...] = (),
) -> tuple[torch.Tensor, ...]:
    """``(x W_i^T + b_i).unflatten(1, (heads, -1))`` for every ``W_i (d_i, m)`` of
    ``weights`` (one ``m``; the widths ``d_i`` may differ), biases ``(d_i,)`` or None
    (zeros in the product); one GEMM (one per weight below :data:`STACK_MIN_FEATURES`
    input columns), or one SpMM over the sparse features ``xs (n, m)`` when given
    (``x`` unread).

    The blocks ``i`` in ``heads_last`` come out stored heads-last: the
    ``(n, heads, d / heads)`` view (strides ``(d, 1, heads)``) of a contiguous
    ``(n, d / heads, heads)`` tensor, the layout the CPU attention kernels gather
    rows in (``numba_cpu._heads_last`` then copies nothing), by permuting those
    weights' rows before the product. Values are the same either way. The blocks
    ``i`` in ``flat`` come out ``(n, d_i)`` (e.g. a layer's root term)."""
    widths = [W.size(0) for W in weights]
    m = weights[0].size(1)
    starts = [sum(widths[:i]) for i in range(len(widths) + 1)]
    lay = lambda t, i: t.unflatten(0, (heads, -1)).transpose(0, 1).flatten(0, 1) if i in heads_last else t  # noqa: E731
    b = None
    if any(bi is not None for bi in biases):
        b = torch.cat([lay(bi, i) if bi is not None else weights[i].new_zeros(widths[i]) for i, bi in enumerate(biases)])
    # NOTE: W^T with every block's columns in place, written once: permuted copies,
    # their concatenation and the product's contiguous copy of its transpose were
    # 5.4 MB at CiteSeer's 3,703 features, the peak of a GATv2 step
    wt = weights[0].new_empty(m, starts[-1])
    cols = [slice(starts[i], starts[i + 1]) for i in range(len(widths))]
    for i, W in enumerate(weights):
        block = wt[:, cols[i]]
        if i in heads_last:  # (columns in (channel, head) order)
            block.view(m, -1, heads).copy_(W.unflatten(0, (heads, -1)).permute(2, 1, 0))
        else:
            block.copy_(W.t())
    if xs is None and x.size(1) < STACK_MIN_FEATURES:
        blocks = [x @ wt[:, c] if b is None else torch.addmm(b[c], x, wt[:, c]) for c in cols]
    else:
        out = spmm(xs, wt, bias=b) if xs is not None else torch.mm(x, wt) if b is None else torch.addmm(b, x, wt)
        del wt, b, block  # (freed before the copies: they are the projection's peak of memory)
        # (each block made contiguous once here: the kernels would copy a strided block per call)
        blocks = [out[:, c].contiguous() for c in cols]
    return tuple(
        p if i in flat else p.unflatten(1, (-1, heads)).transpose(1, 2) if i in heads_last else p.unflatten(1, (heads, -1))
        for i, p in enumerate(blocks)
    )


STACK_GRADS_MIN_BYTES = 8 << 20
"""The backward stacks the output gradients into one ``dP`` (a copy) only when ``x``
(or the sparse features' entries) holds at least this many bytes ...

NOTE (2 threads, min of 15, three blocks of 64 columns): while ``x`` sits in cache,
one product per block costs what the stacked one does (20000 x 64: 8.0 vs 8.3 ms,
19717 x 64 at 24 columns: 2.8 vs 2.9), and the stacked ``dP`` is one more
``(n, s * d)`` buffer at the step's peak of memory (GATv2 on CiteSeer: 1.2 of
7.1 MB); a large ``x`` read once per block costs more (89250 x 64: 46 vs 40 ms; the
transposed SpMM of PubMed's sparse features at 3 x 64 columns: 11.1 vs 8.1 ms)."""


def stacked_projection_grads(grads: list, x: torch.Tensor | None, weights: tuple, need_weights: bool, need_x: bool, need_biases: bool, xs: SparseFormat | None = None):
    """``(dWs, dbs, dx)`` of :func:`stacked_projections` for the output gradients in
    ``grads`` (each ``(n, d_i)``), with ``x`` or the sparse features ``xs`` (for the
    weight gradients; ``dx`` is never asked of constant sparse features): ``dWs`` and
    ``dbs`` tuples of ``W_i``'s and ``b_i``'s gradients, or None when not needed.

    With a large input (:data:`STACK_GRADS_MIN_BYTES`) the blocks are stacked into
    one ``dP`` for two products at most, and ``grads`` is emptied once they are: a
    caller that passes its only references frees them there. Else one product per
    block, and no stacked copy; with weight gradients ``grads`` is emptied too, each
    block as soon as its own weight gradient is computed."""
    size = x.numel() * x.element_size() if xs is None else xs.nnz * 12  # (sparse: ~a value and an index per entry)
    if size < STACK_GRADS_MIN_BYTES:
        dws = dx = None
        dbs = tuple(d.sum(0) for d in grads) if need_biases else None
        if need_x:
            dx = torch.mm(grads[0], weights[0])
            for d, w in zip(grads[1:], weights[1:]):
                dx.addmm_(d, w)
        if need_weights:
            # (each block dropped once its weight gradient exists: with the caller's
            # references gone, one block at a time is freed at the step's peak)
            dws = []
            while grads:
                d = grads.pop(0)
                dws.append(spmm(xs, d, transpose=True).t() if xs is not None else torch.mm(d.t(), x))
            dws = tuple(dws)
        return dws, dbs, dx
    if xs is None:
        return _stacked_by_row_chunks(grads, x, weights, need_weights, need_x, need_biases)
    widths = [d.size(1) for d in grads]
    dP = torch.cat(grads, dim=1)
    grads.clear()
    dws = dbs = None
    if need_weights:
        # NOTE: dW = dP^T X = (X^T dP)^T: with sparse X a transposed SpMM over its non-zeros
        dws = spmm(xs, dP, transpose=True).t().split(widths, dim=0)
    if need_biases:
        dbs = dP.sum(0).split(widths)
    dx = torch.mm(dP, torch.cat(weights)) if need_x else None
    return dws, dbs, dx


CHUNK_BYTES = 4 << 20
"""Rows of the stacked ``dP`` made at a time by :func:`_stacked_by_row_chunks`."""


def _stacked_by_row_chunks(grads: list, x: torch.Tensor, weights: tuple, need_weights: bool, need_x: bool, need_biases: bool):
    """The stacked products of dense ``x`` with ``dP``, ``dP`` made a chunk of rows at
    a time (:data:`CHUNK_BYTES`): ``x`` is still read once, and no ``(n, sum d_i)``
    copy of the gradients sits next to them. ``dW = sum_chunks dP_c^T x_c``;
    ``dx_c = dP_c W``. Measured against one stacked copy and product (2 threads,
    alternating processes, 2026-11-27): GATv2's step on Flickr's shape 482-535 ->
    453-461 ms, the transformer's 567-634 -> 538-570 ms (chunks of ``dP`` and ``x``
    stay in cache)."""
    widths = [d.size(1) for d in grads]
    n, total = x.size(0), sum(widths)
    rows = max(1, CHUNK_BYTES // max(1, total * grads[0].element_size()))
    dW = x.new_zeros(total, x.size(1)) if need_weights else None
    dx = x.new_empty(n, weights[0].size(1)) if need_x else None
    wcat = torch.cat(weights) if need_x else None
    for r0 in range(0, n, rows):
        dPc = torch.cat([d[r0 : r0 + rows] for d in grads], dim=1)
        if need_weights:
            dW.addmm_(dPc.t(), x[r0 : r0 + rows])
        if need_x:
            torch.mm(dPc, wcat, out=dx[r0 : r0 + rows])
    dbs = tuple(d.sum(0) for d in grads) if need_biases else None
    grads.clear()
    return (dW.split(widths, dim=0) if need_weights else None), dbs, dx
