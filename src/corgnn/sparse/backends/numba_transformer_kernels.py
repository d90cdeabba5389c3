"""Fused CPU kernels (Numba parallel JIT) of graph dot-product attention
(PyG's ``TransformerConv``, Shi et al. 2021, "Masked Label Prediction", UniMP).

Raw kernels: no autograd, no validation, no allocation of outputs; the wrappers in
:mod:`.numba_cpu` (the ``numba`` backend) allocate and call them.

Notation: destination node ``i`` (a row of the attention pattern ``A``, rows =
targets), source node ``c`` (a column), entry ``e`` in ``A``'s own entry order (its
position in the caller's per-edge ``(q, h)`` arrays); queries ``Q (n_dst, H, C)``,
keys and values ``K, V (n_src, H, C)``; per head ``h`` the score
``s_e = <Q[i, h], K[c, h]> * scale`` (``scale = 1 / sqrt(C)``),
``alpha = softmax_row(s)``, ``out[i, h] = sum_e drop(alpha_e) V[c, h]``.

As :mod:`.numba_gat_kernels`: parallel (``prange``) over chunks of rows of about
equal work, each output row written by one thread (no atomics), and never a
``(q, h, C)`` intermediate (PyG's ``TransformerConv`` gathers ``query_i``, ``key_j``
and ``value_j`` per edge). The kernels read queries, keys and values (and the column kernel the output
gradient) with heads last, ``Ql (n, C, H)``, ``Kt, Vt (n_src, C, H)`` (stored so by
the CPU projections, else the wrapper's one transposed copy of each), and hold a
row's per-entry values in ``(degree, H)`` buffers, so that the dot products and
the ``axpy`` over a gathered row run over heads in one vector, and the exps over a
row's entries (:func:`exp_shifted`, a polynomial in float32). Attention dropout draws the counter-based mask of
:func:`.numba_gat_kernels.keep_edge` (entry ``e * H + h``, 64-bit seed), the same on
every backend.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .numba_gat_kernels import dropped_weights
from .numba_kernels import (
    chunk_degree, copy_row, empty_array, exp_shifted, gather_kernel, head_axpy, head_axpy_shared, head_dot_add, head_dots, head_gather, head_max, head_scatter,
    head_softmax_backward, prefetch_gather, tiered_jit, transpose_row,
)

__all__ = ["dot_attention_forward_rows", "dot_attention_backward_rows", "dot_attention_backward_cols"]

COMPILE_WITH_SLP = True
"""This module's kernels compile with LLVM's SLP vectorizer on: the eight-head paths of
:mod:`.numba_kernels`' head helpers need it (:data:`.numba_kernels.HEADS8`,
:func:`.numba_threads.hook_compiles`)."""


@gather_kernel(operand=5, tiered=True)
def dot_attention_forward_rows(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def dot_attention_forward_rows(ptr, idx, perm, chunks, Ql, Kt, Vt, Qe, attr, scale, thresh, dscale, seed_lo, seed_hi, lse, alpha, out, Ae):
        """Scores, row softmax, attention dropout and aggregation, fused.

        Per destination row ``i``, three passes over its entries, held in a
        ``(degree, H)`` buffer per task (never ``(q, H, C)``):
        ``s_e = <Q[i, h], K[c_e, h]> * scale`` and the row's max ``m``;
        ``p_e = exp(s_e - m)`` and ``l = sum p_e`` (:func:`exp_shifted`);
        ``out[i, h] = sum_e drop_e p_e V[c_e, h] / l`` and ``lse[i, h] = m + log(l)``;
        ``drop_e = dscale * keep_edge(e*H+h)`` when ``thresh > 0``, else 1.

        ptr (n+1,), idx (q,), perm (q,) or empty; chunks (T+1,) row bounds of the
        parallel tasks; ``Ql (n, C, H)``, ``Kt, Vt (n_src, C, H)``: queries, keys and values with
        heads last (``K.transpose(1, 2)``, contiguous), so that every per-entry loop
        runs over heads in one vector; lse (n, H) out (0 for an empty row); alpha
        (q, 1, H) out, the softmax before dropout, or empty (not written); out (n, H, C)
        overwritten (an empty row gives zeros). ``scale`` and ``dscale`` of ``Q``'s
        dtype keep float32 math float32.

        Edge features (``Ae`` non-empty): ``attr (q, F)`` in entry order and ``Qe (n, H, F)``;
        the score gains ``<Qe[i, h], attr[e]> * scale`` and ``Ae[i, h] = sum_e
        drop_e alpha_e attr[e]`` (n, H, F) is accumulated as ``out`` (the caller adds
        ``W_e Ae``: PyG adds ``W_e attr_e`` to every key and value).

        NOTE: this replaced a one-pass online softmax (FlashAttention's running max,
        rescaling the accumulator when it grows) with its head loop outermost per
        entry: 30 -> 15 ms on a 20k-node, 200k-edge graph (8 heads of 8 channels, 1
        thread), from vectorizing the dots over heads and the exps over entries.
        """
        H = Ql.shape[2]
        C = Ql.shape[1]
        Cv = Vt.shape[1]  # (values may be wider or narrower than queries and keys)
        F = attr.shape[1]
        has_edge = Ae.shape[0] > 0
        has_perm = perm.shape[0] > 0
        want_alpha = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            P = empty_array((deg, H), Ql)
            W = empty_array((deg if drop else 0, H), Ql)
            T = empty_array((deg, H), np.float32)
            mx = empty_array(H, Ql)
            tot = empty_array(H, Ql)
            Qt = empty_array((C, H), Ql)
            acc = empty_array((Cv, H), Ql)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                m = ptr[i + 1] - lo
                for h in range(H):
                    lse[i, h] = 0
                    mx[h] = -np.inf
                    tot[h] = 0
                    if has_edge:
                        for f in range(F):
                            Ae[i, h, f] = 0
                if m == 0:
                    for h in range(H):
                        for k in range(Cv):
                            out[i, h, k] = 0
                    continue
                copy_row(Ql, i, Qt, scale)
                acc[:] = 0
                prefetch_gather(Kt, idx, lo, lo + m, dist)
                for j in range(m):
                    head_dots(Qt, Kt, idx[lo + j], P, j, unroll8)
                    if has_edge:
                        e = perm[lo + j] if has_perm else lo + j
                        for h in range(H):
                            s = zero
                            for f in range(F):
                                s += Qe[i, h, f] * attr[e, f]
                            P[j, h] += s * scale
                    head_max(P, j, mx, unroll8)
                exp_shifted(P, T, m, mx, tot, unroll8)
                if drop:  # branch-free: a dropped entry adds zeros
                    dropped_weights(P, W, m, perm, lo, seed_lo, seed_hi, thresh, dscale)
                w = W if drop else P
                prefetch_gather(Vt, idx, lo, lo + m, dist)
                for j in range(m):
                    head_axpy(acc, w, j, Vt, idx[lo + j], unroll8)
                    if has_edge:
                        e = perm[lo + j] if has_perm else lo + j
                        for h in range(H):
                            for f in range(F):
                                Ae[i, h, f] += w[j, h] * attr[e, f]
                for h in range(H):
                    lse[i, h] = mx[h] + math.log(tot[h])
                    tot[h] = 1 / tot[h]
                    for k in range(Cv):
                        out[i, h, k] = acc[k, h] * tot[h]
                    if has_edge:
                        for f in range(F):
                            Ae[i, h, f] *= tot[h]
                if want_alpha:
                    for j in range(m):
                        head_scatter(alpha, perm[lo + j] if has_perm else lo + j, 0, P, j, tot, unroll8)
    return dot_attention_forward_rows


@gather_kernel(operand=6, tiered=True)
def dot_attention_backward_rows(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def dot_attention_backward_rows(ptr, idx, perm, chunks, G, Ql, Kt, Vt, Qe, Ge, attr, alpha, lse, scale, thresh, dscale, seed_lo, seed_hi, ea, dQ, dQe, dattr):
        """Backward over destination rows: SDDMM, dropout and softmax backward, ``dQ``.

        Per row ``i``, head ``h``, entry ``e``: ``alpha_e`` read from ``alpha`` or
        recomputed as ``exp(s_e - lse[i, h])``; ``dalpha_e = drop_e <G[i, h], V[c_e, h]>``;
        the softmax backward's row sum ``D = sum_e alpha_e dalpha_e`` (``= <G[i, h],
        out[i, h]>``, from the row's own entries: the caller keeps no ``out``);
        ``de_e = alpha_e (dalpha_e - D)`` (the score's gradient);
        ``dQ[i, h] = scale * sum_e de_e K[c_e, h]``. Two gathering passes over the
        row (dots, then ``dQ``), the entries' values held in ``(degree, H)`` buffers
        per task in between, every per-entry loop over heads in one vector as
        :func:`dot_attention_forward_rows`.

        Inputs: G (n, H, C), or (n, 1, C) for the same gradient in every head;
        ``Ql (n, C, H)``, ``Kt, Vt (n_src, C, H)`` (heads last); either ``alpha`` (q, 1, H) cached or empty and
        ``lse`` (n, H). Outputs:
        ``ea`` (q, 2, H) with ``ea[e, 0] = de_e`` and ``ea[e, 1] = drop_e * alpha_e``
        (the dropped attention), one cache line per entry at 8 float32 heads, for the
        transposed walk (:func:`dot_attention_backward_cols`), or ``ea`` (q, 1, H),
        ``de`` only, when that attention is the cached ``alpha`` (no dropout: issue 25,
        a ``(q, H)`` copy less at the step's peak of memory); ``dQ`` (n, H, C); all
        overwritten.

        Edge features (``dQe`` non-empty): ``Qe, Ge (n, H, F)`` (queries and ``G``
        projected on them), ``attr (q, F)``; the score gains ``<Qe[i, h], attr[e]>``,
        ``dalpha_e`` gains ``drop_e <Ge[i, h], attr[e]>``; outputs
        ``dQe[i, h] = sum_e de_e attr[e]`` and ``dattr[e] = sum_h (scale de_e Qe[i, h]
        + drop_e alpha_e Ge[i, h])`` (q, F) (each entry is walked once: no atomics).
        """
        H = Ql.shape[2]
        C = Ql.shape[1]
        F = attr.shape[1]
        has_edge = dQe.shape[0] > 0
        has_perm = perm.shape[0] > 0
        cached = alpha.shape[0] > 0
        drop = thresh > 0
        two = ea.shape[1] == 2
        zero = scale * 0
        one = zero + np.float32(1.0)
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            P = empty_array((deg, H), Ql)  # alpha
            Gd = empty_array((deg, H), Ql)  # <G_i, V_c>, then dalpha, then de * scale
            W = empty_array((deg if drop else 0, H), Ql)  # the dropped attention
            T = empty_array((deg, H), np.float32)
            tot = empty_array(H, Ql)
            shift = empty_array(H, Ql)
            D = empty_array(H, Ql)
            Qt = empty_array((C, H), Ql)
            Gt = empty_array((G.shape[2], H), Ql)  # (values' width)
            acc = empty_array((C, H), Ql)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                m = ptr[i + 1] - lo
                acc[:] = 0
                if has_edge:
                    for h in range(H):
                        for f in range(F):
                            dQe[i, h, f] = 0
                if G.shape[1] == H:
                    transpose_row(G, i, one, Gt)
                else:  # (one gradient for every head)
                    for k in range(G.shape[2]):
                        for h in range(H):
                            Gt[k, h] = G[i, 0, k]
                if not cached:
                    copy_row(Ql, i, Qt, scale)
                    for h in range(H):
                        shift[h] = lse[i, h]
                prefetch_gather(Vt, idx, lo, lo + m, dist)
                for j in range(m):
                    c = idx[lo + j]
                    e = perm[lo + j] if has_perm else lo + j
                    head_dots(Gt, Vt, c, Gd, j, unroll8)
                    if cached:
                        head_gather(P, j, alpha, e, 0, one, unroll8)
                    else:
                        head_dots(Qt, Kt, c, P, j, unroll8)
                    if has_edge:
                        for h in range(H):
                            s = zero
                            g = zero
                            for f in range(F):
                                s += Qe[i, h, f] * attr[e, f]
                                g += Ge[i, h, f] * attr[e, f]
                            Gd[j, h] += g
                            if not cached:
                                P[j, h] += s * scale
                if not cached:
                    exp_shifted(P, T, m, shift, tot, unroll8)
                if drop:  # dalpha and the dropped attention
                    dropped_weights(Gd, Gd, m, perm, lo, seed_lo, seed_hi, thresh, dscale)
                    dropped_weights(P, W, m, perm, lo, seed_lo, seed_hi, thresh, dscale)
                for h in range(H):
                    D[h] = zero
                for j in range(m):
                    head_dot_add(D, P, Gd, j, unroll8)
                for j in range(m):
                    e = perm[lo + j] if has_perm else lo + j
                    if not (has_edge or drop or two):  # (the common case: de alone, every head in one vector)
                        head_softmax_backward(Gd, P, j, D, ea, e, scale, unroll8)
                        continue
                    if has_edge:
                        for f in range(F):
                            dattr[e, f] = 0
                    for h in range(H):
                        a = P[j, h]
                        ad = W[j, h] if drop else a
                        v = a * (Gd[j, h] - D[h])
                        ea[e, 0, h] = v
                        if two:
                            ea[e, 1, h] = ad
                        if has_edge:
                            vs = v * scale
                            for f in range(F):
                                dQe[i, h, f] += v * attr[e, f]
                                dattr[e, f] += vs * Qe[i, h, f] + ad * Ge[i, h, f]
                        Gd[j, h] = v * scale
                prefetch_gather(Kt, idx, lo, lo + m, dist)
                for j in range(m):
                    head_axpy(acc, Gd, j, Kt, idx[lo + j], unroll8)
                for h in range(H):
                    for k in range(C):
                        dQ[i, h, k] = acc[k, h]
    return dot_attention_backward_rows


@gather_kernel(operand=5, tiered=True)
def dot_attention_backward_cols(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def dot_attention_backward_cols(ptr, idx, perm, chunks, Gt, Qt, ea, alpha, scale, dK, dV):
        """Backward over source nodes (the transposed walk): ``dK`` and ``dV``.

        For source ``c`` (entries ``e`` with destination ``i_e``):
        ``dK[c, h] = scale * sum_e de[e, h] Q[i_e, h]`` and
        ``dV[c, h] = sum_e alpha_d[e, h] G[i_e, h]`` (``A_alpha^T G``).

        ptr (n_src+1,), idx (q,) destination of each walked entry, perm (q,) the entry
        of each walked position or empty (identity); chunks (T+1,) column bounds of
        the parallel tasks; ``Qt (n, C, H)`` the queries heads last, ``Gt (n, Cv, H)``
        the output gradient heads last, or ``(n, Cv, 1)``: one gradient for every
        head; ``ea`` (q, 2, H) the ``(de, alpha_d)`` of
        :func:`dot_attention_backward_rows` in entry order, or ``ea (q, 1, H)`` (``de``)
        and the dropped attention read from ``alpha (q, 1, H)`` (the cached one, no
        dropout; empty otherwise); dK (n_src, H, C), dV (n_src, H, Cv) overwritten.

        Per column, the entries' ``ea`` rows are first gathered through ``perm`` into
        two ``(degree, H)`` buffers in a tight loop (many cache misses in flight),
        then read in sequence, as GATv2's column kernel does; the sums run in
        ``(C, H)`` buffers, every per-entry loop over heads in one vector (as the row
        kernels), written out once per column.

        NOTE: read through ``perm`` inside the long loop body instead, ``de`` and
        ``alpha_d`` cost this kernel 12 of its 20 ms on a 20k-node, 200k-edge graph
        (8 heads of 8 channels, 1 thread); a ``(q, 2, H)`` copy in this walk's order
        first (``index_select``) cost ~3.5 ms a layer at 2 threads there, and that
        copy's memory. Summed into ``dK[c]``, ``dV[c]`` directly with the channel
        loop innermost, the kernel took 65 ms at 7 channels (a 2-layer model's
        second layer: C = 7, one gradient for all heads) on Flickr's shape (89,250
        nodes, 900k entries, 8 heads, 2 threads): a 7-long loop runs scalar,
        reading and writing the sums in memory; 21 ms now (22.4 vs 23.8 ms at 8
        channels, plus 1.3 ms for the heads-last copy of ``G``).
        """
        H = Qt.shape[2]
        C = Qt.shape[1]
        Cv = Gt.shape[1]  # (values' width)
        per_head = Gt.shape[2] == H
        has_perm = perm.shape[0] > 0
        two = ea.shape[1] == 2
        one = scale * 0 + 1
        # (the dropped attention as (q, S, H) with its slot: ea's second, or the cached alpha's only one)
        ad, slot = (ea, 1) if two else (alpha, 0)
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            Ed = empty_array((deg, H), ea)  # de * scale
            Ea = empty_array((deg, H), ea)  # the dropped attention
            accK = empty_array((C, H), ea)
            accV = empty_array((Cv, H), ea)
            for c in range(chunks[t], chunks[t + 1]):
                lo = ptr[c]
                m = ptr[c + 1] - lo
                if has_perm:  # (the entries ``dist`` ahead, across columns: the reads below are at random)
                    prefetch_gather(ea, perm, lo, lo + m, dist)
                    if not two:
                        prefetch_gather(alpha, perm, lo, lo + m, dist)
                for j in range(m):
                    e = perm[lo + j] if has_perm else lo + j
                    head_gather(Ed, j, ea, e, 0, scale, unroll8)
                    head_gather(Ea, j, ad, e, slot, one, unroll8)
                accK[:] = 0
                accV[:] = 0
                prefetch_gather(Gt, idx, lo, lo + m, dist)
                prefetch_gather(Qt, idx, lo, lo + m, dist)
                for j in range(m):
                    i = idx[lo + j]
                    head_axpy(accK, Ed, j, Qt, i, unroll8)
                    if per_head:
                        head_axpy(accV, Ea, j, Gt, i, unroll8)
                    else:
                        head_axpy_shared(accV, Ea, j, Gt, i, unroll8)
                for h in range(H):
                    for k in range(C):
                        dK[c, h, k] = accK[k, h]
                    for k in range(Cv):
                        dV[c, h, k] = accV[k, h]
    return dot_attention_backward_cols
