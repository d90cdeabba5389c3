"""Fused CPU kernels (Numba parallel JIT) of the multi-head GAT layer.

Raw kernels: no autograd, no validation, no allocation of outputs; the wrappers in
:mod:`.numba_cpu` (the ``numba`` backend) allocate and call them.

Paper: appendix "GAT Forward Pass", "GAT Backward Pass", "GAT Caching"; §"Multi-head
GAT" (head dimension in the middle, ``(n, h, k)``, so one neighbour's values of all
heads share cache lines). Notation: destination node ``i`` (a row of the GAT
adjacency), source node ``c`` (a column), entry ``e`` in the adjacency's own entry
order (its position in the caller's per-edge ``(q, h)`` arrays), ``s (n, h)`` source
and ``d (n, h)`` destination node attention, ``y_e = s[c] + d[i]``, ``w = LeakyReLU(y)``,
``alpha = softmax_row(w)``.

Like :mod:`.numba_kernels`, every kernel walks a row plan ``(ptr, idx, perm)``
(``perm`` empty = identity), is parallel (``prange``) over chunks of rows with about
equal work (``chunks``: degrees are skewed), walks each row's entries with the head
and the contiguous feature loops inside (one neighbour's ``h * k`` values are
contiguous), writes each output row once (no atomics) and never builds a
``(q x h x k)`` intermediate: the per-edge messages of PyG's ``GATConv``
(``alpha_e * M[c]``) are accumulated straight into the output row.

Attention dropout uses a counter-based hash (:func:`keep_edge`) of the entry's flat
index ``e * h + head`` and a 64-bit seed instead of a stored mask, so the forward and
the backward kernels draw the same mask independently, in any thread order, and the
backward needs only the seed (8 bytes). :func:`corgnn.sparse.attention.dropout_keep_mask`
is the same function in torch ops (CUDA fallback, tests).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .numba_kernels import chunk_degree, empty_array, gather_kernel, head_axpy, prefetch_gather, tiered_jit, tiered_kernel

__all__ = [
    "keep_edge",
    "node_scores",
    "gat_forward_rows",
    "gat_backward_rows",
    "gat_backward_cols",
    "head_weighted_sums",
]

COMPILE_WITH_SLP = True
"""This module's kernels compile with LLVM's SLP vectorizer on: the eight-head paths of
:mod:`.numba_kernels`' head helpers need it (:data:`.numba_kernels.HEADS8`,
:func:`.numba_threads.hook_compiles`)."""

_M32 = 0xFFFFFFFF


@njit(inline="always", cache=True)
def _mix32(x):
    # integer hash of a 32-bit value (Mueller's "hash32" finaliser); x < 2**32 and the
    # multiplier < 2**27 keep every product below 2**59, so no int64 overflow.
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


@njit(inline="always", cache=True)
def keep_edge(flat, seed_lo, seed_hi, thresh):
    """True when entry ``flat = e * h + head`` survives dropout: a 32-bit hash of
    ``(flat, seed)`` is ``>= thresh = round(p * 2**32)`` (probability ``1 - p``)."""
    x = _mix32((flat & _M32) ^ seed_lo)
    x = _mix32(x ^ ((flat >> 32) & _M32) ^ seed_hi)
    return x >= thresh


@njit(inline="always")
def dropped_weights(P, W, m, perm, lo, seed_lo, seed_hi, thresh, scale):
    """``W[j, h] = P[j, h] * (scale if keep_edge((e_j) * H + h) else 0)`` for the ``m``
    entries of a row starting at walk position ``lo`` (``e_j = perm[lo + j]``, or
    ``lo + j`` with ``perm`` empty): a row's attention weights after dropout.
    P, W (degree, H)."""
    H = P.shape[1]
    has_perm = perm.shape[0] > 0
    zero = scale * 0
    for j in range(m):
        e = perm[lo + j] if has_perm else lo + j
        for h in range(H):
            W[j, h] = P[j, h] * (scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero)


@tiered_kernel(tasks=lambda args: args[0].shape[0])
def node_scores(loop):
    @njit(**tiered_jit(loop))
    def node_scores(M, a_src, a_dst, s, d):
        """``s[i, h] = <M[i, h], a_src[h]>``, ``d[i, h] = <M[i, h], a_dst[h]>``.

        M (n, H, K); a_src, a_dst (H, K); s, d (n, H) overwritten.
        """
        n = M.shape[0]
        H = M.shape[1]
        K = M.shape[2]
        for i in loop(n):
            for h in range(H):
                ss = 0.0
                dd = 0.0
                for k in range(K):
                    ss += M[i, h, k] * a_src[h, k]
                    dd += M[i, h, k] * a_dst[h, k]
                s[i, h] = ss
                d[i, h] = dd
    return node_scores


@njit(inline="always", cache=True)
def _row_softmax(i, lo, hi, idx, perm, has_perm, s, d, slope, mx, tot, buf, leaky, want_leaky):
    """Softmax numerators of row ``i``: ``buf[e, h] = exp(w_e - max_h)``, ``tot[h]`` their
    sum, ``leaky[e, h] = y_e > 0`` when ``want_leaky``; ``mx``, ``tot`` (H,) scratch."""
    H = s.shape[1]
    for h in range(H):
        mx[h] = -np.inf
        tot[h] = 0
    for j in range(lo, hi):
        c = idx[j]
        e = perm[j] if has_perm else j
        for h in range(H):
            y = s[c, h] + d[i, h]
            w = y if y > 0 else slope * y
            buf[e, h] = w
            if w > mx[h]:
                mx[h] = w
            if want_leaky:
                leaky[e, h] = y > 0
    for j in range(lo, hi):
        e = perm[j] if has_perm else j
        for h in range(H):
            ex = math.exp(buf[e, h] - mx[h])
            buf[e, h] = ex
            tot[h] += ex


@gather_kernel(operand=6, tiered=True)
def gat_forward_rows(dist, loop):
    @njit(**tiered_jit(loop))
    def gat_forward_rows(ptr, idx, perm, chunks, s, d, M, slope, thresh, scale, seed_lo, seed_hi, alpha, leaky, out):
        """Edge logits, LeakyReLU, row softmax, attention dropout and semi-batched SpMM, fused.

        For destination row ``i`` and head ``h``: ``y_e = s[c_e, h] + d[i, h]``,
        ``w_e = y_e if y_e > 0 else slope * y_e``, ``alpha_e = exp(w_e - max) / sum``,
        ``out[i, h] = sum_e drop(alpha_e) * M[c_e, h]`` with
        ``drop(a) = a * scale if keep_edge(e*H+h) else 0`` (only when ``thresh > 0``).

        ptr (n+1,), idx (q,), perm (q,) or empty; chunks (T+1,) row bounds of the
        parallel tasks (balanced on entries + rows); s, d (n, H); M (n, H, K);
        alpha (q, H) out: the softmax *before* dropout; leaky (q, H) bool out
        (``y_e > 0``) or empty (not written); out (n, H, K) overwritten (an empty row
        gives zeros). ``slope`` and ``scale`` of ``M``'s dtype keep float32 math float32.
        """
        H = M.shape[1]
        K = M.shape[2]
        has_perm = perm.shape[0] > 0
        want_leaky = leaky.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in loop(chunks.shape[0] - 1):
            mx = empty_array(H, M)
            tot = empty_array(H, M)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                hi = ptr[i + 1]
                for h in range(H):
                    for k in range(K):
                        out[i, h, k] = 0
                if hi == lo:
                    continue
                _row_softmax(i, lo, hi, idx, perm, has_perm, s, d, slope, mx, tot, alpha, leaky, want_leaky)
                for h in range(H):
                    tot[h] = 1 / tot[h]
                prefetch_gather(M, idx, lo, hi, dist)
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        a = alpha[e, h] * tot[h]
                        alpha[e, h] = a
                        if drop:  # branch-free: a dropped entry adds zeros
                            a *= scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero
                        for k in range(K):
                            out[i, h, k] += a * M[c, h, k]
    return gat_forward_rows


@gather_kernel(operand=5, tiered=True)
def gat_backward_rows(dist, loop):
    @njit(**tiered_jit(loop))
    def gat_backward_rows(ptr, idx, perm, chunks, G, M, alpha, leaky, s, d, slope, thresh, scale, seed_lo, seed_hi, alpha_d, dy, dd):
        """Backward over destination rows: SDDMM, dropout, softmax and LeakyReLU backward.

        Per row ``i``, head ``h`` (paper appendix "GAT Backward Pass"):
        ``g_e = <G[i, h], M[c_e, h]>`` (semi-batched SDDMM, the gradient of the dropped
        attention), ``dalpha_e = g_e * scale * keep_e`` (dropout backward),
        ``dw_e = alpha_e (dalpha_e - sum_row alpha * dalpha)`` (softmax backward),
        ``dy_e = dw_e * (1 if y_e > 0 else slope)`` (LeakyReLU backward) and
        ``dd[i, h] = sum_row dy`` (``y_e = s[c] + d[i]``, so ``d``'s gradient is a row sum).

        Inputs: chunks (T+1,) row bounds of the parallel tasks; G (n, H, K) gradient of
        the aggregated output; M (n, H, K); either ``alpha`` (q, H) and ``leaky`` (q, H)
        bool cached, or both empty and recomputed from ``s, d (n, H)``.
        Outputs: ``alpha_d`` (q, H) the dropped attention ``scale * keep * alpha`` for
        the transposed SpMM (empty = not written: no dropout and ``alpha`` cached, the
        caller reads ``alpha``), ``dy`` (q, H), ``dd`` (n, H); all overwritten.
        """
        H = M.shape[1]
        K = M.shape[2]
        has_perm = perm.shape[0] > 0
        cached = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in loop(chunks.shape[0] - 1):
            mx = empty_array(H, M)
            inv = empty_array(H, M)
            dot = empty_array(H, M)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                hi = ptr[i + 1]
                for h in range(H):
                    dd[i, h] = 0
                    dot[h] = 0
                if hi == lo:
                    continue
                src = alpha
                if not cached:
                    # recompute the softmax (schemes none/features/node_attention) into alpha_d
                    _row_softmax(i, lo, hi, idx, perm, has_perm, s, d, slope, mx, inv, alpha_d, leaky, False)
                    for h in range(H):
                        inv[h] = 1 / inv[h]
                    for j in range(lo, hi):
                        e = perm[j] if has_perm else j
                        for h in range(H):
                            alpha_d[e, h] *= inv[h]
                    src = alpha_d
                # pass 1: g_e (into dy) and the row dot sum(alpha * dalpha)
                prefetch_gather(M, idx, lo, hi, dist)
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        g = G[i, h, 0] * M[c, h, 0]
                        for k in range(1, K):
                            g += G[i, h, k] * M[c, h, k]
                        if drop:
                            g *= scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero
                        dy[e, h] = g
                        dot[h] += src[e, h] * g
                # pass 2: dy_e, the row sum, the dropped attention
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        a = src[e, h]
                        if cached:
                            pos = leaky[e, h]
                        else:
                            pos = s[c, h] + d[i, h] > 0
                        v = a * (dy[e, h] - dot[h])
                        if not pos:
                            v *= slope
                        dy[e, h] = v
                        dd[i, h] += v
                        if drop:
                            alpha_d[e, h] = a * (scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero)
    return gat_backward_rows


@gather_kernel(operand=4, tiered=True)
def gat_backward_cols(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def gat_backward_cols(ptr, idx, perm, chunks, Gt, alpha_d, dy, dd, a_src, a_dst, dM, ds):
        """Backward over source nodes (the transposed walk): ``ds`` and ``dL/dM``.

        For source ``c`` (entries ``e`` with destination ``i_e``):
        ``ds[c, h] = sum_e dy[e, h]`` (``y_e = s[c] + d[i]``: a column sum) and
        ``dM[c, h] = sum_e alpha_d[e, h] G[i_e, h] + ds[c, h] a_src[h] + dd[c, h] a_dst[h]``
        (``A^T G`` with the dropped attention, plus the node-attention terms).

        ptr (n+1,), idx (q,) destination of each walked entry, perm (q,) or empty: entry
        position; chunks (T+1,) column bounds of the parallel tasks; ``Gt (n, K, H)``
        the output gradient with heads last (gathered: every per-entry loop runs over
        heads in one vector); alpha_d, dy (q, H); dd (n, H); a_src, a_dst (H, K);
        dM (n, H, K), ds (n, H) overwritten.

        Per column, the entries' ``alpha_d`` rows are first gathered through ``perm``
        into a ``(degree, H)`` buffer in a tight loop (many cache misses in flight),
        then read in sequence; the sums run in a ``(K, H)`` buffer, written out once.

        NOTE: summed into ``dM[c]`` directly with ``G`` heads first and the channel
        loop innermost, this kernel took 35 ms at 8 channels and 62 ms at 7 (a
        2-layer model's second layer) on Flickr's shape (89,250 nodes, 900k entries,
        8 heads, 2 threads): a 7-long loop runs scalar, reading and writing the sums
        in memory (the transformer's column kernel had the same shape and cost).
        """
        K = Gt.shape[1]
        H = Gt.shape[2]
        has_perm = perm.shape[0] > 0
        for t in loop(chunks.shape[0] - 1):
            Av = empty_array((chunk_degree(ptr, chunks, t), H), Gt)
            acc = empty_array((K, H), Gt)
            col = empty_array(H, Gt)
            for c in range(chunks[t], chunks[t + 1]):
                lo = ptr[c]
                m = ptr[c + 1] - lo
                if has_perm:  # (the entries ``dist`` ahead, across columns: the reads below are at random)
                    prefetch_gather(alpha_d, perm, lo, lo + m, dist)
                    prefetch_gather(dy, perm, lo, lo + m, dist)
                for h in range(H):
                    col[h] = 0
                for j in range(m):
                    e = perm[lo + j] if has_perm else lo + j
                    for h in range(H):
                        Av[j, h] = alpha_d[e, h]
                        col[h] += dy[e, h]
                acc[:] = 0
                prefetch_gather(Gt, idx, lo, lo + m, dist)
                for j in range(m):
                    head_axpy(acc, Av, j, Gt, idx[lo + j], unroll8)
                for h in range(H):
                    ds[c, h] = col[h]
                    dc = dd[c, h]
                    for k in range(K):
                        dM[c, h, k] = acc[k, h] + col[h] * a_src[h, k] + dc * a_dst[h, k]
    return gat_backward_cols


@tiered_kernel(tasks=lambda args: args[3].shape[0])
def head_weighted_sums(loop):
    @njit(**tiered_jit(loop))
    def head_weighted_sums(w1, w2, M, part1, part2, out1, out2):
        """``out1[h] = sum_i w1[i, h] M[i, h]`` and ``out2`` likewise (attention gradients).

        w1, w2 (n, H); M (n, H, K); part1, part2 (T, H, K) scratch, one slice per chunk
        of rows (chunks run in parallel, then the T partial sums are added);
        out1, out2 (H, K) overwritten.
        """
        n = M.shape[0]
        H = M.shape[1]
        K = M.shape[2]
        T = part1.shape[0]
        step = (n + T - 1) // T
        for t in loop(T):
            for h in range(H):
                for k in range(K):
                    part1[t, h, k] = 0
                    part2[t, h, k] = 0
            for i in range(t * step, min(n, (t + 1) * step)):
                for h in range(H):
                    u = w1[i, h]
                    v = w2[i, h]
                    for k in range(K):
                        part1[t, h, k] += u * M[i, h, k]
                        part2[t, h, k] += v * M[i, h, k]
        for h in range(H):
            for k in range(K):
                a = 0.0
                b = 0.0
                for t in range(T):
                    a += part1[t, h, k]
                    b += part2[t, h, k]
                out1[h, k] = a
                out2[h, k] = b
    return head_weighted_sums
