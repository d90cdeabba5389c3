"""Fused CPU kernels (Numba parallel JIT) of the multi-head GATv2 layer.

Raw kernels: no autograd, no validation, no allocation of outputs; the wrappers in
:mod:`.numba_cpu` (the ``numba`` backend) allocate and call them.

GATv2 (Brody et al. 2022; PyG ``GATv2Conv``), for destination row ``i`` (a row of
the attention pattern), source ``c`` (a column), entry ``e`` (its position in the
caller's per-edge ``(q, h)`` arrays), head ``h`` and channel ``k``, with ``XL`` the
source side and ``XR`` the target side (``(n, h, k)`` each, head in the middle):

* ``t_e = XL[c] + XR[i]`` and the score ``s_e[h] = sum_k a[h, k] LeakyReLU(t_e[h, k])``
* ``alpha_e = softmax_row(s)``, ``out[i] = sum_e drop(alpha_e) XL[c]``.

Unlike GAT the score does not split into node terms: it is ``h k`` work per edge,
the same as the aggregation. Each row kernel holds a row's per-entry values in
``(degree, H)`` buffers and reads the gathered rows with heads last (``XLt``, ``XRt``,
``Gt``: ``(n, K, H)``, the wrapper's transposed copies), so that every per-entry loop
runs over heads in one vector; the forward's exps are
:func:`.numba_kernels.exp_shifted`'s vectorized polynomial. No ``(q, h, k)`` value is
ever stored: PyG's layer materialises ``t``, ``LeakyReLU(t)`` and the messages per edge.

Backward (``G = dL/dout`` as ``(n, h, k)``; ``f`` = LeakyReLU):

* ``dalpha_e = <G[i], XL[c]>`` per head (SDDMM), times the dropout keep and scale;
* ``de_e = alpha_e (dalpha_e - sum_row alpha dalpha)`` (softmax backward);
* per channel ``g = de_e a f'(t_e)``: ``dXR[i] += g``, ``da += de_e f(t_e)``
  (:func:`gatv2_backward_rows`, a walk of the destination rows), and
  ``dXL[c] += g + drop(alpha_e) G[i]`` (:func:`gatv2_backward_cols`, the transposed
  walk: per source column, so no atomics).

Parallel (``prange``) over chunks of rows with about equal work, like
:mod:`.numba_gat_kernels`; attention dropout draws the same counter-based mask
(:func:`.numba_gat_kernels.keep_edge`) as the GAT kernels. Accumulation is in the
operands' dtype (float32 stays float32).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .numba_gat_kernels import dropped_weights
from .numba_kernels import chunk_degree, copy_row, empty_array, exp_shifted, gather_kernel, head_axpy, head_dots, prefetch_gather, tiered_jit

__all__ = ["gatv2_forward_rows", "gatv2_backward_rows", "gatv2_backward_cols"]

COMPILE_WITH_SLP = True
"""This module's kernels compile with LLVM's SLP vectorizer on: the eight-head paths of
:mod:`.numba_kernels`' head helpers need it (:data:`.numba_kernels.HEADS8`,
:func:`.numba_threads.hook_compiles`)."""


@njit(inline="always")
def scores(XLt, c, XRt, att_t, slope, P, j):
    """``P[j, h] = sum_k att[h, k] LeakyReLU(XL[c, h, k] + XR[i, h, k])`` with ``XLt
    (n_src, K, H)``, and row ``i``'s ``XRt`` and ``att_t`` as ``(K, H)``: entry ``j``'s
    score per head, vectorized over heads."""
    H = P.shape[1]
    for h in range(H):
        P[j, h] = 0
    for k in range(XRt.shape[0]):
        for h in range(H):
            v = XLt[c, k, h] + XRt[k, h]
            if v <= 0:
                v *= slope
            P[j, h] += att_t[k, h] * v


@njit(inline="always")
def _transposed(att):
    """``att (H, K)`` as a new C-ordered ``(K, H)`` array: ``np.ascontiguousarray(att.T)``
    without NumPy's overload (see :func:`.numba_kernels.empty_array`)."""
    H, K = att.shape
    out = empty_array((K, H), att)
    for a in range(K):
        for h in range(H):
            out[a, h] = att[h, a]
    return out


@gather_kernel(operand=4, tiered=True)
def gatv2_forward_rows(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def gatv2_forward_rows(ptr, idx, perm, chunks, XLt, XRl, att, slope, thresh, scale, seed_lo, seed_hi, alpha, lse, out):
        """Scores, row softmax, attention dropout and semi-batched SpMM, fused.

        For row ``i``, three passes over its entries, held in a ``(degree, H)`` buffer
        per task: ``s_e = sum_k att[h, k] LeakyReLU(XL[c_e, h, k] + XR[i, h, k])`` and
        the row's max ``mx``; ``p_e = exp(s_e - mx)``, ``tot = sum p_e``
        (:func:`.numba_kernels.exp_shifted`); ``out[i, h] = sum_e drop(p_e) XL[c_e, h] / tot``
        with ``drop(a) = a * scale if keep_edge(e*H+h) else 0`` (only when ``thresh > 0``);
        ``lse[i, h] = mx + log(tot)`` (0 for an empty row).

        ptr (n+1,), idx (q,), perm (q,) or empty; chunks (T+1,) row bounds of the
        parallel tasks; ``XLt (n_src, K, H)``: ``XL`` with heads last (contiguous), so
        that the per-entry loops run over heads in one vector; ``XRl (n, K, H)``: ``XR``
        heads last too (its own row ``i`` read per row); att (H, K); alpha (q, H) out: the softmax before dropout, or empty (not written); lse
        (n, H), out (n, H, K) overwritten (an empty row gives zeros).

        NOTE: this replaced a one-pass online softmax with the head loop outermost per
        entry and a libm ``exp`` per score, as :func:`.numba_transformer_kernels.dot_attention_forward_rows`
        did (measured there: 30 -> 18 ms on a 20k-node, 200k-edge graph, 8 x 8, 1 thread).
        """
        H = XLt.shape[2]
        K = XLt.shape[1]
        has_perm = perm.shape[0] > 0
        want_alpha = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            P = empty_array((deg, H), XLt)
            W = empty_array((deg if drop else 0, H), XLt)
            T = empty_array((deg, H), np.float32)
            mx = empty_array(H, XLt)
            tot = empty_array(H, XLt)
            XRt = empty_array((K, H), XLt)
            att_t = _transposed(att)  # (K, H)
            acc = empty_array((K, H), XLt)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                m = ptr[i + 1] - lo
                for h in range(H):
                    lse[i, h] = 0
                    mx[h] = -np.inf
                    tot[h] = 0
                if m == 0:
                    for h in range(H):
                        for k in range(K):
                            out[i, h, k] = 0
                    continue
                copy_row(XRl, i, XRt)
                acc[:] = 0
                prefetch_gather(XLt, idx, lo, lo + m, dist)
                for j in range(m):
                    scores(XLt, idx[lo + j], XRt, att_t, slope, P, j)
                    for h in range(H):
                        mx[h] = max(mx[h], P[j, h])
                exp_shifted(P, T, m, mx, tot, unroll8)
                if drop:  # branch-free: a dropped entry adds zeros
                    dropped_weights(P, W, m, perm, lo, seed_lo, seed_hi, thresh, scale)
                w = W if drop else P
                for j in range(m):
                    head_axpy(acc, w, j, XLt, idx[lo + j], unroll8)
                for h in range(H):
                    lse[i, h] = mx[h] + math.log(tot[h])
                    tot[h] = 1 / tot[h]
                    for k in range(K):
                        out[i, h, k] = acc[k, h] * tot[h]
                if want_alpha:
                    for j in range(m):
                        e = perm[lo + j] if has_perm else lo + j
                        for h in range(H):
                            alpha[e, h] = P[j, h] * tot[h]
    return gatv2_forward_rows


@gather_kernel(operand=5, tiered=True)
def gatv2_backward_rows(dist, loop):
    unroll8 = loop is prange  # (the eight-head paths in parallel tiers only: see HEADS8)
    @njit(**tiered_jit(loop))
    def gatv2_backward_rows(ptr, idx, perm, chunks, Gl, XLt, XRl, att, alpha, lse, slope, thresh, scale, seed_lo, seed_hi, alpha_w, de, dXR, datt):
        """Backward over destination rows: SDDMM, dropout and softmax backward, ``dXR``, ``da``.

        Per row ``i``, head ``h``: pass 1 ``dalpha_e = <G[i, h], XL[c_e, h]> * keep * scale``
        and ``dot = sum_row alpha dalpha``, with ``alpha`` cached, or recomputed as
        ``exp(s_e - lse[i, h])`` (written to ``alpha_w``); pass 2
        ``de_e = alpha_e (dalpha_e - dot)`` and per channel ``t = XL[c] + XR[i]``:
        ``dXR[i, h, k] = sum_e de_e a[h, k] f'(t)``, ``datt[task, h, k] += de_e f(t)``.

        ``Gl (n, K, H)``: ``G`` with heads last; ``XLt (n_src, K, H)``: ``XL`` with heads last (contiguous;
        gathered), so that the per-entry loops run over heads in one vector, the row's
        values held in ``(degree, H)`` buffers per task; ``XRl (n, K, H)`` (heads last);
        att (H, K);
        alpha (q, H) cached or empty (then ``lse (n, H)`` is read and ``alpha_w (q, H)``
        written); de (q, H), dXR (n, H, K) overwritten; datt (T, H, K) one partial sum
        per task, overwritten.
        """
        K = XLt.shape[1]
        H = XLt.shape[2]
        has_perm = perm.shape[0] > 0
        cached = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            P = empty_array((deg, H), XLt)  # alpha
            Gd = empty_array((deg, H), XLt)  # dalpha, then de
            T = empty_array((deg, H), np.float32)
            tot = empty_array(H, XLt)
            shift = empty_array(H, XLt)
            dot = empty_array(H, XLt)
            att_t = _transposed(att)  # (K, H)
            XRt = empty_array((K, H), XLt)
            Gt = empty_array((K, H), XLt)
            acc = empty_array((K, H), XLt)
            dat = empty_array((K, H), XLt)
            dat[:] = 0
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                m = ptr[i + 1] - lo
                copy_row(XRl, i, XRt)
                copy_row(Gl, i, Gt)
                acc[:] = 0
                prefetch_gather(XLt, idx, lo, lo + m, dist)
                for j in range(m):  # pass 1: scores (recomputing) and dalpha
                    c = idx[lo + j]
                    head_dots(Gt, XLt, c, Gd, j, unroll8)
                    if not cached:
                        scores(XLt, c, XRt, att_t, slope, P, j)
                if cached:
                    for j in range(m):
                        e = perm[lo + j] if has_perm else lo + j
                        for h in range(H):
                            P[j, h] = alpha[e, h]
                else:
                    for h in range(H):
                        shift[h] = lse[i, h]
                    exp_shifted(P, T, m, shift, tot, unroll8)
                    for j in range(m):
                        e = perm[lo + j] if has_perm else lo + j
                        for h in range(H):
                            alpha_w[e, h] = P[j, h]
                if drop:
                    dropped_weights(Gd, Gd, m, perm, lo, seed_lo, seed_hi, thresh, scale)
                for h in range(H):
                    dot[h] = 0
                for j in range(m):
                    for h in range(H):
                        dot[h] += P[j, h] * Gd[j, h]
                for j in range(m):  # pass 2: de, dXR and datt
                    c = idx[lo + j]
                    e = perm[lo + j] if has_perm else lo + j
                    for h in range(H):
                        Gd[j, h] = P[j, h] * (Gd[j, h] - dot[h])
                        de[e, h] = Gd[j, h]
                    for k in range(K):
                        for h in range(H):
                            tt = XLt[c, k, h] + XRt[k, h]
                            v = Gd[j, h]
                            if tt <= 0:
                                v *= slope
                            acc[k, h] += v * att_t[k, h]
                            dat[k, h] += v * tt
                for h in range(H):
                    for k in range(K):
                        dXR[i, h, k] = acc[k, h]
            for h in range(H):
                for k in range(K):
                    datt[t, h, k] = dat[k, h]
    return gatv2_backward_rows


@gather_kernel(operand=5, tiered=True)
def gatv2_backward_cols(dist, loop):
    @njit(**tiered_jit(loop))
    def gatv2_backward_cols(ptr, idx, perm, chunks, Gt, XRt, XLl, att, alpha, de, slope, thresh, scale, seed_lo, seed_hi, dXL):
        """Backward over source nodes (the transposed walk): ``dXL``.

        For source ``c`` (entries ``e`` with destination ``i_e``), head ``h``, channel ``k``:
        ``dXL[c, h, k] = sum_e de_e a[h, k] f'(XL[c, h, k] + XR[i_e, h, k]) + drop(alpha_e) G[i_e, h, k]``.

        ptr (n_src+1,), idx (q,) destination of each walked entry, perm (q,) or empty;
        chunks (T+1,) column bounds of the parallel tasks; ``Gt, XRt (n, K, H)``: ``G``
        and ``XR`` with heads last (contiguous; gathered), so that the per-entry loop
        runs over heads in one vector; ``XLl (n_src, K, H)`` (heads last); att (H, K); alpha, de (q, H);
        dXL (n_src, H, K) overwritten.

        Per column, ``alpha_e`` and ``de_e`` are first gathered through ``perm`` into a
        ``(degree, H)`` buffer in a tight loop (many cache misses in flight), then read
        in sequence: no ``(q, h)`` copy in the walk's order, which raised GATv2's peak
        memory per step by 0.14x of compiled PyG's when it was tried.
        """
        K = XLl.shape[1]
        H = XLl.shape[2]
        has_perm = perm.shape[0] > 0
        drop = thresh > 0
        for t in loop(chunks.shape[0] - 1):
            deg = chunk_degree(ptr, chunks, t)
            Av = empty_array((deg, H), XLl)
            Dv = empty_array((deg, H), XLl)
            XLc = empty_array((K, H), XLl)
            att_t = _transposed(att)  # (K, H)
            acc = empty_array((K, H), XLl)
            for c in range(chunks[t], chunks[t + 1]):
                lo = ptr[c]
                m = ptr[c + 1] - lo
                copy_row(XLl, c, XLc)
                acc[:] = 0
                if has_perm:  # (the entries ``dist`` ahead, across columns: the reads below are at random)
                    prefetch_gather(alpha, perm, lo, lo + m, dist)
                    prefetch_gather(de, perm, lo, lo + m, dist)
                for j in range(m):
                    e = perm[lo + j] if has_perm else lo + j
                    for h in range(H):
                        Av[j, h] = alpha[e, h]
                        Dv[j, h] = de[e, h]
                if drop:
                    dropped_weights(Av, Av, m, perm, lo, seed_lo, seed_hi, thresh, scale)
                prefetch_gather(XRt, idx, lo, lo + m, dist)
                prefetch_gather(Gt, idx, lo, lo + m, dist)
                for j in range(m):
                    i = idx[lo + j]
                    for k in range(K):
                        for h in range(H):
                            g = Dv[j, h] * att_t[k, h]
                            if XLc[k, h] + XRt[i, k, h] <= 0:
                                g *= slope
                            acc[k, h] += g + Av[j, h] * Gt[i, k, h]
                for h in range(H):
                    for k in range(K):
                        dXL[c, h, k] = acc[k, h]
    return gatv2_backward_cols
