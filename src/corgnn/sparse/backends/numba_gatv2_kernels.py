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
the same as the aggregation, so the forward computes it and aggregates in one walk
of the row with an online softmax (FlashAttention's running max and sum; the
accumulated row is rescaled when the max grows), reading each neighbour's ``XL``
row once. No ``(q, h, k)`` value is ever stored: PyG's layer materialises ``t``,
``LeakyReLU(t)`` and the messages per edge.

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

from .numba_gat_kernels import keep_edge
from .numba_kernels import gather_kernel, prefetch_gather

__all__ = ["gatv2_forward_rows", "gatv2_backward_rows", "gatv2_backward_cols"]

_JIT = dict(parallel=True, fastmath=True, cache=True, nogil=True)


@njit(inline="always", cache=True)
def _score(XL, XR, att, c, i, h, slope):
    """``sum_k att[h, k] LeakyReLU(XL[c, h, k] + XR[i, h, k])``."""
    K = XL.shape[2]
    sc = XL[c, h, 0] * 0
    for k in range(K):
        t = XL[c, h, k] + XR[i, h, k]
        if t <= 0:
            t *= slope
        sc += att[h, k] * t
    return sc


@gather_kernel(operand=4)
def gatv2_forward_rows(dist):
    @njit(**_JIT)
    def gatv2_forward_rows(ptr, idx, perm, chunks, XL, XR, att, slope, thresh, scale, seed_lo, seed_hi, alpha, lse, out):
        """Scores, online row softmax, attention dropout and semi-batched SpMM, fused.

        For row ``i``, head ``h``, entries ``e`` in walk order: ``s_e = _score(...)``; the
        running max ``mx`` and sum ``tot = sum exp(s - mx)``, the row accumulator
        rescaled by ``exp(mx_old - mx_new)`` when the max grows;
        ``out[i, h] = sum_e drop(exp(s_e - mx)) XL[c_e, h] / tot`` with
        ``drop(a) = a * scale if keep_edge(e*H+h) else 0`` (only when ``thresh > 0``);
        ``lse[i, h] = mx + log(tot)`` (0 for an empty row).

        ptr (n+1,), idx (q,), perm (q,) or empty; chunks (T+1,) row bounds of the
        parallel tasks; XL (n_src, H, K); XR (n, H, K); att (H, K); alpha (q, H) out:
        the softmax before dropout, or empty (not written); lse (n, H), out (n, H, K)
        overwritten (an empty row gives zeros).
        """
        H = XL.shape[1]
        K = XL.shape[2]
        has_perm = perm.shape[0] > 0
        want_alpha = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in prange(chunks.shape[0] - 1):
            mx = np.empty(H, dtype=XL.dtype)
            tot = np.empty(H, dtype=XL.dtype)
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                hi = ptr[i + 1]
                for h in range(H):
                    tot[h] = 0
                    for k in range(K):
                        out[i, h, k] = 0
                prefetch_gather(XL, idx, lo, hi, dist)
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        sc = _score(XL, XR, att, c, i, h, slope)
                        if want_alpha:
                            alpha[e, h] = sc
                        if j == lo:
                            mx[h] = sc
                        elif sc > mx[h]:  # a new row max: rescale what was summed
                            r = math.exp(mx[h] - sc)
                            tot[h] *= r
                            for k in range(K):
                                out[i, h, k] *= r
                            mx[h] = sc
                        w = math.exp(sc - mx[h])
                        tot[h] += w
                        if drop:  # branch-free: a dropped entry adds zeros
                            w *= scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero
                        for k in range(K):
                            out[i, h, k] += w * XL[c, h, k]
                for h in range(H):
                    if hi == lo:
                        lse[i, h] = 0
                        continue
                    inv = 1 / tot[h]
                    for k in range(K):
                        out[i, h, k] *= inv
                    ls = mx[h] + math.log(tot[h])
                    lse[i, h] = ls
                    if want_alpha:
                        for j in range(lo, hi):
                            e = perm[j] if has_perm else j
                            alpha[e, h] = math.exp(alpha[e, h] - ls)
    return gatv2_forward_rows


@gather_kernel(operand=5)
def gatv2_backward_rows(dist):
    @njit(**_JIT)
    def gatv2_backward_rows(ptr, idx, perm, chunks, G, XL, XR, att, alpha, lse, slope, thresh, scale, seed_lo, seed_hi, alpha_w, de, dXR, datt):
        """Backward over destination rows: SDDMM, dropout and softmax backward, ``dXR``, ``da``.

        Per row ``i``, head ``h``: pass 1 ``dalpha_e = <G[i, h], XL[c_e, h]> * keep * scale``
        and ``dot = sum_row alpha dalpha``, with ``alpha`` cached, or recomputed as
        ``exp(s_e - lse[i, h])`` (written to ``alpha_w``); pass 2
        ``de_e = alpha_e (dalpha_e - dot)`` and per channel ``t = XL[c] + XR[i]``:
        ``dXR[i, h, k] = sum_e de_e a[h, k] f'(t)``, ``datt[task, h, k] += de_e f(t)``.

        G (n, H, K); XL (n_src, H, K); XR (n, H, K); att (H, K); alpha (q, H) cached or
        empty (then ``lse (n, H)`` is read and ``alpha_w (q, H)`` written); de (q, H),
        dXR (n, H, K) overwritten; datt (T, H, K) one partial sum per task, overwritten.
        """
        H = XL.shape[1]
        K = XL.shape[2]
        has_perm = perm.shape[0] > 0
        cached = alpha.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in prange(chunks.shape[0] - 1):
            dot = np.empty(H, dtype=XL.dtype)
            for h in range(H):
                for k in range(K):
                    datt[t, h, k] = 0
            for i in range(chunks[t], chunks[t + 1]):
                lo = ptr[i]
                hi = ptr[i + 1]
                for h in range(H):
                    dot[h] = 0
                    for k in range(K):
                        dXR[i, h, k] = 0
                src = alpha if cached else alpha_w
                prefetch_gather(XL, idx, lo, hi, dist)
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        if not cached:
                            alpha_w[e, h] = math.exp(_score(XL, XR, att, c, i, h, slope) - lse[i, h])
                        g = G[i, h, 0] * XL[c, h, 0]
                        for k in range(1, K):
                            g += G[i, h, k] * XL[c, h, k]
                        if drop:
                            g *= scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero
                        de[e, h] = g
                        dot[h] += src[e, h] * g
                for j in range(lo, hi):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        v = src[e, h] * (de[e, h] - dot[h])
                        de[e, h] = v
                        for k in range(K):
                            tt = XL[c, h, k] + XR[i, h, k]
                            if tt > 0:
                                dXR[i, h, k] += v * att[h, k]
                                datt[t, h, k] += v * tt
                            else:
                                dXR[i, h, k] += v * slope * att[h, k]
                                datt[t, h, k] += v * slope * tt
    return gatv2_backward_rows


@gather_kernel(operand=5)
def gatv2_backward_cols(dist):
    @njit(**_JIT)
    def gatv2_backward_cols(ptr, idx, perm, chunks, G, XR, XL, att, alpha, de, slope, thresh, scale, seed_lo, seed_hi, dXL):
        """Backward over source nodes (the transposed walk): ``dXL``.

        For source ``c`` (entries ``e`` with destination ``i_e``), head ``h``, channel ``k``:
        ``dXL[c, h, k] = sum_e de_e a[h, k] f'(XL[c, h, k] + XR[i_e, h, k]) + drop(alpha_e) G[i_e, h, k]``.

        ptr (n_src+1,), idx (q,) destination of each walked entry, perm (q,) or empty;
        chunks (T+1,) column bounds of the parallel tasks; G, XR (n, H, K) (gathered);
        XL (n_src, H, K); att (H, K); alpha, de (q, H); dXL (n_src, H, K) overwritten.
        """
        H = XL.shape[1]
        K = XL.shape[2]
        has_perm = perm.shape[0] > 0
        drop = thresh > 0
        zero = scale * 0
        for t in prange(chunks.shape[0] - 1):
            for c in range(chunks[t], chunks[t + 1]):
                for h in range(H):
                    for k in range(K):
                        dXL[c, h, k] = 0
                prefetch_gather(XR, idx, ptr[c], ptr[c + 1], dist)
                for j in range(ptr[c], ptr[c + 1]):
                    i = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        a = alpha[e, h]
                        if drop:
                            a *= scale if keep_edge(e * H + h, seed_lo, seed_hi, thresh) else zero
                        v = de[e, h]
                        for k in range(K):
                            g = v * att[h, k]
                            if XL[c, h, k] + XR[i, h, k] <= 0:
                                g *= slope
                            dXL[c, h, k] += g + a * G[i, h, k]
    return gatv2_backward_cols
