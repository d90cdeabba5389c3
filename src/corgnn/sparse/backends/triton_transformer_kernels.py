"""Triton kernels of graph dot-product attention (PyG's ``TransformerConv``), the GPU
twins of :mod:`.numba_transformer_kernels` (CPU tensors through Triton's interpreter
when ``TRITON_INTERPRET=1`` was set before this module was imported).

Raw kernels: no autograd, no validation, no allocation; the launchers in
:mod:`.triton_ops` allocate and launch them. Layout as :mod:`.triton_kernels`: a row
plan ``(ptr, idx, perm)``, ``Q (n, H, C)`` / ``K, V (n_src, H, C)`` addressed as
flat rows of ``H * C``, per-entry arrays ``(q, H)``; one program per (row, head), the
whole head width ``C`` in one block (``BLOCK_C >= C``), entries in blocks of
``BLOCK_E``; float32 accumulation (float64 for float64 inputs). Attention dropout:
:func:`.triton_kernels.keep_edge`, the mask every backend draws. ``consts`` is a
float64 tensor ``[scale, dropout scale]`` and ``seed`` an int64 tensor
``[seed_lo, seed_hi]`` (no host sync per call).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import keep_edge

__all__ = ["dot_attention_forward_kernel", "dot_attention_backward_rows_kernel", "dot_attention_backward_cols_kernel", "dot_attention_edge_grad_kernel"]


@triton.jit
def _entries(idx, perm, start, hi, HAS_PERM: tl.constexpr, BLOCK_E: tl.constexpr):
    """``(walk positions, mask, source/target ids, entry positions)`` of one block."""
    w = start + tl.arange(0, BLOCK_E)
    emask = w < hi
    c = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
    e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
    return w, emask, c, e


@triton.jit
def _rows(X, c, h, H, C, cs, emask, cmask, dt: tl.constexpr):
    """Rows ``X[c, h, :]`` of a block of entries, ``(BLOCK_E, BLOCK_C)`` (masked zeros)."""
    return tl.load(X + (c * H + h)[:, None] * C + cs[None, :], mask=emask[:, None] & cmask[None, :], other=0.0).to(dt)


@triton.jit
def _edge_rows(attr, e, F, fs, emask, fmask, dt: tl.constexpr):
    """Edge features ``attr[e, :]`` of a block of entries, ``(BLOCK_E, BLOCK_F)``."""
    return tl.load(attr + e[:, None] * F + fs[None, :], mask=emask[:, None] & fmask[None, :], other=0.0).to(dt)


@triton.jit
def dot_attention_forward_kernel(
    ptr, idx, perm, Q, K, V, Qe, attr, lse, alpha, out, Ae, H, C, F, consts, seed, thresh,
    HAS_PERM: tl.constexpr, WANT_ALPHA: tl.constexpr, DROP: tl.constexpr, HAS_EDGE: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """Fused attention for destination row ``program_id(0)``, head ``program_id(1)``
    (numba twin: ``dot_attention_forward_rows``): scores ``s = <Q_i, K_c> * scale``,
    online softmax (running max ``m`` and sum ``l``, the accumulator rescaled by
    ``exp(m_old - m_new)`` per block), dropout, ``out[i, h] = sum drop(alpha) V_c``,
    ``lse[i, h] = m + log(l)`` (0 for an empty row) and, when ``WANT_ALPHA``, ``alpha``
    before dropout (scores stored first, normalised in a second walk). ``HAS_EDGE``:
    edge features ``attr (q, F)``, the score gains ``<Qe[i, h], attr_e> * scale`` and
    ``Ae[i, h] = sum drop(alpha) attr_e`` is accumulated as ``out``."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    scale = tl.load(consts).to(dt)
    dscale = tl.load(consts + 1).to(dt)
    seed_lo = tl.load(seed)
    seed_hi = tl.load(seed + 1)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    q = tl.load(Q + (i * H + h) * C + cs, mask=cmask, other=0.0).to(dt)
    fs = tl.arange(0, BLOCK_F)
    fmask = fs < F
    if HAS_EDGE:
        qe = tl.load(Qe + (i * H + h) * F + fs, mask=fmask, other=0.0).to(dt)
    mx = tl.full([1], float("-inf"), dt)
    tot = tl.zeros([1], dt)
    acc = tl.zeros([BLOCK_C], dt)
    acc_e = tl.zeros([BLOCK_F], dt)
    for start in range(lo, hi, BLOCK_E):
        w, emask, c, e = _entries(idx, perm, start, hi, HAS_PERM, BLOCK_E)
        k = _rows(K, c, h, H, C, cs, emask, cmask, dt)
        s = tl.sum(k * q[None, :], axis=1)
        if HAS_EDGE:
            ea = _edge_rows(attr, e, F, fs, emask, fmask, dt)
            s += tl.sum(ea * qe[None, :], axis=1)
        s = s * scale
        s = tl.where(emask, s, float("-inf"))
        if WANT_ALPHA:
            tl.store(alpha + e * H + h, s.to(alpha.dtype.element_ty), mask=emask)
        new = tl.maximum(mx, tl.max(s, axis=0))  # finite: the block holds an entry
        r = tl.exp(mx - new)
        p = tl.exp(s - new)
        tot = tot * r + tl.sum(p, axis=0)
        if DROP:
            p = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), p * dscale, 0.0)
        v = _rows(V, c, h, H, C, cs, emask, cmask, dt)
        acc = acc * r + tl.sum(p[:, None] * v, axis=0)
        if HAS_EDGE:
            acc_e = acc_e * r + tl.sum(p[:, None] * ea, axis=0)
        mx = new
    has = tot > 0
    inv = 1.0 / tl.where(has, tot, 1.0)
    tl.store(out + (i * H + h) * C + cs, (acc * inv).to(out.dtype.element_ty), mask=cmask)
    if HAS_EDGE:
        tl.store(Ae + (i * H + h) * F + fs, (acc_e * inv).to(Ae.dtype.element_ty), mask=fmask)
    row_lse = tl.where(has, mx + tl.log(tl.where(has, tot, 1.0)), 0.0)
    tl.store(lse + i * H + h + tl.arange(0, 1), row_lse.to(lse.dtype.element_ty))
    if WANT_ALPHA:
        tl.debug_barrier()
        for start in range(lo, hi, BLOCK_E):
            w, emask, c, e = _entries(idx, perm, start, hi, HAS_PERM, BLOCK_E)
            s = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
            tl.store(alpha + e * H + h, tl.exp(s - row_lse).to(alpha.dtype.element_ty), mask=emask)


@triton.jit
def _attention_and_dalpha(
    idx, perm, K, V, attr, alpha, lse, q, g_i, qe, ge, i, h, H, C, F, cs, cmask, fs, fmask, start, hi, scale, dscale,
    seed_lo, seed_hi, thresh, dt: tl.constexpr, HAS_PERM: tl.constexpr, CACHED: tl.constexpr, DROP: tl.constexpr,
    HAS_EDGE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """One block of a row's entries in the backward: ``(e, emask, c, k, ea, a, g, ad)``
    with ``a`` the attention (read, or ``exp(s - lse)``), ``g = drop <G_i, V_c>`` (+ the
    edge term) its gradient ``dalpha`` and ``ad = drop a``; ``k`` the keys' rows and
    ``ea`` the edge features (``k`` when there are none)."""
    w, emask, c, e = _entries(idx, perm, start, hi, HAS_PERM, BLOCK_E)
    k = _rows(K, c, h, H, C, cs, emask, cmask, dt)
    ea = k
    if HAS_EDGE:
        ea = _edge_rows(attr, e, F, fs, emask, fmask, dt)
    if CACHED:
        a = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
    else:
        s = tl.sum(k * q[None, :], axis=1)
        if HAS_EDGE:
            s += tl.sum(ea * qe[None, :], axis=1)
        a = tl.where(emask, tl.exp(s * scale - tl.load(lse + i * H + h).to(dt)), 0.0)
    v = _rows(V, c, h, H, C, cs, emask, cmask, dt)
    g = tl.sum(v * g_i[None, :], axis=1)
    if HAS_EDGE:
        g += tl.sum(ea * ge[None, :], axis=1)
    ad = a
    if DROP:
        f = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), dscale, 0.0)
        g = g * f
        ad = a * f
    return e, emask, c, k, ea, a, g, ad


@triton.jit
def dot_attention_backward_rows_kernel(
    ptr, idx, perm, G, Q, K, V, Qe, Ge, attr, alpha, lse, de, alpha_d, dQ, dQe, H, GH, C, F, consts, seed, thresh,
    HAS_PERM: tl.constexpr, CACHED: tl.constexpr, DROP: tl.constexpr, WRITE_AD: tl.constexpr, HAS_EDGE: tl.constexpr,
    ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """Backward over destination row ``program_id(0)``, head ``program_id(1)`` (numba
    twin: ``dot_attention_backward_rows``): ``alpha`` read (``CACHED``) or
    ``exp(s - lse)``; ``dalpha = drop <G_i, V_c>`` (SDDMM); a first walk of the row
    sums ``D_i = sum alpha dalpha`` (``= <G_i, out_i>``), the second writes
    ``de = alpha (dalpha - D_i)`` into ``de (q, H)``, ``alpha_d = drop alpha`` when
    ``WRITE_AD`` and ``dQ[i, h] = scale * sum de K_c``; ``HAS_EDGE``: the score and
    ``dalpha`` gain the edge terms ``<Qe[i, h], attr_e>``, ``<Ge[i, h], attr_e>`` and
    ``dQe[i, h] = sum de attr_e`` (``dattr``: :func:`dot_attention_edge_grad_kernel`).
    ``G`` has ``GH`` heads: ``H``, or 1 (one gradient for every head)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    scale = tl.load(consts).to(dt)
    dscale = tl.load(consts + 1).to(dt)
    seed_lo = tl.load(seed)
    seed_hi = tl.load(seed + 1)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    base = (i * H + h) * C
    q = tl.load(Q + base + cs, mask=cmask, other=0.0).to(dt)
    g_i = tl.load(G + (i * GH + h % GH) * C + cs, mask=cmask, other=0.0).to(dt)
    fs = tl.arange(0, BLOCK_F)
    fmask = fs < F
    qe = q
    ge = q
    if HAS_EDGE:
        qe = tl.load(Qe + (i * H + h) * F + fs, mask=fmask, other=0.0).to(dt)
        ge = tl.load(Ge + (i * H + h) * F + fs, mask=fmask, other=0.0).to(dt)
    d_i = tl.zeros([BLOCK_E], dt)
    for start in range(lo, hi, BLOCK_E):
        _, _, _, _, _, a, g, _ = _attention_and_dalpha(
            idx, perm, K, V, attr, alpha, lse, q, g_i, qe, ge, i, h, H, C, F, cs, cmask, fs, fmask, start, hi, scale, dscale,
            seed_lo, seed_hi, thresh, dt, HAS_PERM, CACHED, DROP, HAS_EDGE, BLOCK_E,
        )
        d_i += a * g
    d_row = tl.sum(d_i, axis=0)
    acc = tl.zeros([BLOCK_C], dt)
    acc_e = tl.zeros([BLOCK_F], dt)
    for start in range(lo, hi, BLOCK_E):
        e, emask, c, k, ea, a, g, ad = _attention_and_dalpha(
            idx, perm, K, V, attr, alpha, lse, q, g_i, qe, ge, i, h, H, C, F, cs, cmask, fs, fmask, start, hi, scale, dscale,
            seed_lo, seed_hi, thresh, dt, HAS_PERM, CACHED, DROP, HAS_EDGE, BLOCK_E,
        )
        d = a * (g - d_row)
        tl.store(de + e * H + h, d.to(de.dtype.element_ty), mask=emask)
        if WRITE_AD:
            tl.store(alpha_d + e * H + h, ad.to(alpha_d.dtype.element_ty), mask=emask)
        acc += tl.sum((d * scale)[:, None] * k, axis=0)
        if HAS_EDGE:
            acc_e += tl.sum(d[:, None] * ea, axis=0)
    tl.store(dQ + base + cs, acc.to(dQ.dtype.element_ty), mask=cmask)
    if HAS_EDGE:
        tl.store(dQe + (i * H + h) * F + fs, acc_e.to(dQe.dtype.element_ty), mask=fmask)


@triton.jit
def dot_attention_backward_cols_kernel(
    ptr, idx, perm, G, Q, alpha_d, de, dK, dV, H, GH, C, consts,
    HAS_PERM: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Backward over source node ``program_id(0)`` (the transposed walk), head
    ``program_id(1)`` (numba twin: ``dot_attention_backward_cols``):
    ``dK[c, h] = scale * sum_e de_e Q_i`` and ``dV[c, h] = sum_e alpha_d_e G_i``
    (``G`` with ``GH`` heads: ``H``, or 1 for every head)."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    scale = tl.load(consts).to(dt)
    lo = tl.load(ptr + c).to(tl.int64)
    hi = tl.load(ptr + c + 1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cmask = cs < C
    acc_k = tl.zeros([BLOCK_C], dt)
    acc_v = tl.zeros([BLOCK_C], dt)
    for start in range(lo, hi, BLOCK_E):
        w, emask, i, e = _entries(idx, perm, start, hi, HAS_PERM, BLOCK_E)
        d = tl.load(de + e * H + h, mask=emask, other=0.0).to(dt) * scale
        ad = tl.load(alpha_d + e * H + h, mask=emask, other=0.0).to(dt)
        acc_k += tl.sum(d[:, None] * _rows(Q, i, h, H, C, cs, emask, cmask, dt), axis=0)
        acc_v += tl.sum(ad[:, None] * _rows(G, i, h % GH, GH, C, cs, emask, cmask, dt), axis=0)
    base = (c * H + h) * C
    tl.store(dK + base + cs, acc_k.to(dK.dtype.element_ty), mask=cmask)
    tl.store(dV + base + cs, acc_v.to(dV.dtype.element_ty), mask=cmask)


@triton.jit
def dot_attention_edge_grad_kernel(
    ptr, perm, Qe, Ge, de, ad, dattr, H, F, consts,
    HAS_PERM: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """Edge-feature gradient over destination row ``program_id(0)``, all heads in one
    program (so each entry's row of ``dattr`` has one writer, no atomics):
    ``dattr[e] = sum_h (scale de[e, h] Qe[i, h] + ad[e, h] Ge[i, h])`` (numba twin: inside
    ``dot_attention_backward_rows``)."""
    i = tl.program_id(0).to(tl.int64)
    dt = tl.float64 if ACC64 else tl.float32
    scale = tl.load(consts).to(dt)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    fs = tl.arange(0, BLOCK_F)
    fmask = fs < F
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
        acc = tl.zeros([BLOCK_E, BLOCK_F], dt)
        for h in range(H):
            qe = tl.load(Qe + (i * H + h) * F + fs, mask=fmask, other=0.0).to(dt)
            ge = tl.load(Ge + (i * H + h) * F + fs, mask=fmask, other=0.0).to(dt)
            d = tl.load(de + e * H + h, mask=emask, other=0.0).to(dt) * scale
            a = tl.load(ad + e * H + h, mask=emask, other=0.0).to(dt)
            acc += d[:, None] * qe[None, :] + a[:, None] * ge[None, :]
        tl.store(dattr + e[:, None] * F + fs[None, :], acc.to(dattr.dtype.element_ty), mask=emask[:, None] & fmask[None, :])
