"""Triton kernels of the fused multi-head GATv2 layer (the ``triton`` backend; the
Numba twins are :mod:`.numba_gatv2_kernels`, whose docstring has the maths).

One program per (destination row, head) in the row walks and per (source column,
head) in the transposed walk, a whole head's ``k`` channels in one tile
(``BLOCK_K >= k``), ``BLOCK_E`` entries per step, float32 accumulation (float64 for
float64 operands), masked tails. No ``(q, h, k)`` value is stored: each step forms
``t = XL[c] + XR[i]`` for its ``BLOCK_E`` entries in registers.

* :func:`gatv2_forward_kernel`: scores, online softmax (running max and sum, the
  accumulator rescaled as the max grows), dropout, ``out[i, h]``, ``lse[i, h]`` and
  optionally ``alpha`` (a second walk of the row: ``exp(s - lse)``).
* :func:`gatv2_backward_rows_kernel`: ``dalpha`` (SDDMM), softmax backward into
  ``de (q, h)``, ``dXR[i, h]`` and the row's share of ``da`` (``datt_rows (n, h, k)``,
  summed by the launcher: no atomics).
* :func:`gatv2_backward_cols_kernel`: ``dXL[c, h]`` over the transposed walk.

Attention dropout draws :func:`.triton_kernels.keep_edge`, the GAT kernels' mask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import keep_edge

__all__ = ["gatv2_forward_kernel", "gatv2_backward_rows_kernel", "gatv2_backward_cols_kernel"]


@triton.jit
def _constants(consts, seed, dt: tl.constexpr):
    """``(negative_slope, dropout scale, seed_lo, seed_hi)`` from the float64 ``[slope,
    scale]`` tensor and the int64 seed tensor (as the GAT kernels read them)."""
    sd = tl.load(seed)
    hi = sd >> 32
    return tl.load(consts).to(dt), tl.load(consts + 1).to(dt), sd - (hi << 32), hi - ((hi >> 32) << 32)


@triton.jit
def _edges(idx, perm, w, emask, HAS_PERM: tl.constexpr):
    """``(c, e)``: the other endpoint and the entry position of walk positions ``w``."""
    c = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
    e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
    return c, e


@triton.jit
def _scores(XL, c, xr, a, emask, kmask, h, H, K, ks, slope, dt: tl.constexpr):
    """``(xl (BLOCK_E, BLOCK_K), t = xl + xr, s = sum_k a LeakyReLU(t))`` of one step."""
    m2 = emask[:, None] & kmask[None, :]
    xl = tl.load(XL + (c * H + h)[:, None] * K + ks[None, :], mask=m2, other=0.0).to(dt)
    t = xl + xr[None, :]
    s = tl.sum(tl.where(t > 0, t, t * slope) * a[None, :], axis=1)
    return xl, t, s


@triton.jit
def gatv2_forward_kernel(
    ptr, idx, perm, XL, XR, att, alpha, lse, out, H, K, consts, seed, thresh,
    HAS_PERM: tl.constexpr, WANT_ALPHA: tl.constexpr, DROP: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Fused GATv2 forward of destination row ``program_id(0)``, head ``program_id(1)``
    (numba twin: ``gatv2_forward_rows``)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    slope, scale, seed_lo, seed_hi = _constants(consts, seed, dt)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    xr = tl.load(XR + (i * H + h) * K + ks, mask=kmask, other=0.0).to(dt)
    a = tl.load(att + h * K + ks, mask=kmask, other=0.0).to(dt)
    mx = tl.full([1], float("-inf"), dt)
    tot = tl.zeros([1], dt)
    acc = tl.zeros([BLOCK_K], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        c, e = _edges(idx, perm, w, emask, HAS_PERM)
        xl, t, s = _scores(XL, c, xr, a, emask, kmask, h, H, K, ks, slope, dt)
        s = tl.where(emask, s, float("-inf"))
        if WANT_ALPHA:
            tl.store(alpha + e * H + h, s.to(alpha.dtype.element_ty), mask=emask)
        new = tl.maximum(mx, tl.max(s, axis=0))
        r = tl.exp(mx - new)
        pw = tl.exp(s - new)
        tot = tot * r + tl.sum(pw, axis=0)
        if DROP:
            pw = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), pw * scale, 0.0)
        acc = acc * r + tl.sum(pw[:, None] * xl, axis=0)
        mx = new
    empty = tot == 0
    inv = 1.0 / tl.where(empty, 1.0, tot)
    tl.store(out + (i * H + h) * K + ks, (acc * inv).to(out.dtype.element_ty), mask=kmask)
    ls = tl.where(empty, 0.0, mx + tl.log(tl.where(empty, 1.0, tot)))
    tl.store(lse + i * H + h + tl.arange(0, 1), ls.to(lse.dtype.element_ty))
    if WANT_ALPHA:
        tl.debug_barrier()
        for start in range(lo, hi, BLOCK_E):
            w = start + tl.arange(0, BLOCK_E)
            emask = w < hi
            _, e = _edges(idx, perm, w, emask, HAS_PERM)
            s = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
            tl.store(alpha + e * H + h, tl.exp(s - ls).to(alpha.dtype.element_ty), mask=emask)


@triton.jit
def gatv2_backward_rows_kernel(
    ptr, idx, perm, G, XL, XR, att, alpha, lse, de, dXR, datt_rows, H, K, consts, seed, thresh,
    HAS_PERM: tl.constexpr, CACHED: tl.constexpr, DROP: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GATv2 backward over destination row ``program_id(0)``, head ``program_id(1)``
    (numba twin: ``gatv2_backward_rows``): ``de (q, H)``, ``dXR[i, h]`` and
    ``datt_rows[i, h] = sum_e de_e LeakyReLU(t_e)``. ``CACHED``: read ``alpha``,
    else recompute ``exp(s - lse[i, h])`` and write it to ``alpha`` (a scratch buffer then)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    slope, scale, seed_lo, seed_hi = _constants(consts, seed, dt)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    xr = tl.load(XR + (i * H + h) * K + ks, mask=kmask, other=0.0).to(dt)
    a = tl.load(att + h * K + ks, mask=kmask, other=0.0).to(dt)
    gi = tl.load(G + (i * H + h) * K + ks, mask=kmask, other=0.0).to(dt)
    if not CACHED:
        li = tl.load(lse + i * H + h).to(dt)
    dot = tl.zeros([1], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        c, e = _edges(idx, perm, w, emask, HAS_PERM)
        xl, t, s = _scores(XL, c, xr, a, emask, kmask, h, H, K, ks, slope, dt)
        if CACHED:
            al = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
        else:
            al = tl.where(emask, tl.exp(s - li), 0.0)
            tl.store(alpha + e * H + h, al.to(alpha.dtype.element_ty), mask=emask)
        g = tl.sum(xl * gi[None, :], axis=1)
        if DROP:
            g = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), g * scale, 0.0)
        tl.store(de + e * H + h, g.to(de.dtype.element_ty), mask=emask)
        dot += tl.sum(tl.where(emask, al * g, 0.0), axis=0)
    tl.debug_barrier()
    dxr = tl.zeros([BLOCK_K], dt)
    da = tl.zeros([BLOCK_K], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        c, e = _edges(idx, perm, w, emask, HAS_PERM)
        m2 = emask[:, None] & kmask[None, :]
        t = tl.load(XL + (c * H + h)[:, None] * K + ks[None, :], mask=m2, other=0.0).to(dt) + xr[None, :]
        al = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
        g = tl.load(de + e * H + h, mask=emask, other=0.0).to(dt)
        v = tl.where(emask, al * (g - dot), 0.0)
        tl.store(de + e * H + h, v.to(de.dtype.element_ty), mask=emask)
        pos = t > 0
        dxr += tl.sum(tl.where(pos, v[:, None], v[:, None] * slope), axis=0)
        da += tl.sum(v[:, None] * tl.where(pos, t, t * slope), axis=0)
    tl.store(dXR + (i * H + h) * K + ks, (dxr * a).to(dXR.dtype.element_ty), mask=kmask)
    tl.store(datt_rows + (i * H + h) * K + ks, da.to(datt_rows.dtype.element_ty), mask=kmask)


@triton.jit
def gatv2_backward_cols_kernel(
    ptr, idx, perm, G, XL, XR, att, alpha, de, dXL, H, K, consts, seed, thresh,
    HAS_PERM: tl.constexpr, DROP: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GATv2 backward over source node ``program_id(0)`` (the transposed walk), head
    ``program_id(1)`` (numba twin: ``gatv2_backward_cols``):
    ``dXL[c, h] = sum_e de_e a f'(XL[c] + XR[i_e]) + drop(alpha_e) G[i_e]``."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    slope, scale, seed_lo, seed_hi = _constants(consts, seed, dt)
    lo = tl.load(ptr + c).to(tl.int64)
    hi = tl.load(ptr + c + 1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    xl = tl.load(XL + (c * H + h) * K + ks, mask=kmask, other=0.0).to(dt)
    a = tl.load(att + h * K + ks, mask=kmask, other=0.0).to(dt)
    acc = tl.zeros([BLOCK_K], dt)
    sg = tl.zeros([BLOCK_K], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        i, e = _edges(idx, perm, w, emask, HAS_PERM)
        m2 = emask[:, None] & kmask[None, :]
        rows = (i * H + h)[:, None] * K + ks[None, :]
        t = tl.load(XR + rows, mask=m2, other=0.0).to(dt) + xl[None, :]
        gr = tl.load(G + rows, mask=m2, other=0.0).to(dt)
        al = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
        if DROP:
            al = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), al * scale, 0.0)
        v = tl.load(de + e * H + h, mask=emask, other=0.0).to(dt)
        sg += tl.sum(tl.where(t > 0, v[:, None], v[:, None] * slope), axis=0)
        acc += tl.sum(al[:, None] * gr, axis=0)
    tl.store(dXL + (c * H + h) * K + ks, (acc + sg * a).to(dXL.dtype.element_ty), mask=kmask)
