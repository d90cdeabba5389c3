"""Triton kernels of the ``triton`` backend (GPU; CPU tensors through Triton's
interpreter when ``TRITON_INTERPRET=1`` was set before this module was imported).

Raw kernels: no autograd, no validation, no allocation; the launchers in
:mod:`.triton` allocate and launch them. Every kernel reads float32/float64 or
bfloat16/float16 operands, accumulates in float32 (float64 for float64 inputs) and
stores in the operand's dtype; index arrays may be int32 or int64.

Layout conventions (as :mod:`.numba_kernels`): a *row plan* ``(ptr, idx, perm)``
walks the rows of ``op(A)``; ``perm`` (``HAS_PERM``) maps a walk position to the
entry's position in the format's own order, where per-entry values and outputs
live. Dense operands are contiguous; a semi-batched ``(rows, H, K)`` operand is
addressed as ``(rows, H*K)`` and its per-entry values as ``(q, H)``, so one kernel
serves single-head (``H = 1``) and multi-head products.

Load balancing (SpMM, issue "GPU backend"): one program per output row and
feature tile, except rows longer than ``chunk`` entries (the hubs of power-law
graphs). The entry array is cut into fixed chunks of ``chunk`` positions;
:func:`spmm_chunks_kernel` gives each chunk one program that sums the pieces of the
(at most two) long rows overlapping it into a ``(chunks, 2, F)`` partial buffer
(slot 0: the row holding the chunk's first position; slot 1: the row holding its
last, when different), and :func:`spmm_rows_kernel` then adds a long row's partials
instead of walking its entries. A long row spans more than one chunk, so no third
long row fits inside one; no atomics, deterministic, and the grid depends on the
shapes only (so ``torch.compile`` can trace the launchers).

Attention dropout: :func:`keep_edge` is the counter-based hash of
:func:`corgnn.sparse.backends.numba_gat_kernels.keep_edge` (same mask on every
backend), in int64 arithmetic (a 32-bit value times a 27-bit constant fits).

Paper: appendix "Common Sparse Operators" (Listings 1-2), "GAT Forward Pass",
"GAT Backward Pass"; §"Multi-head GAT".
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "spmm_chunks_kernel",
    "spmm_rows_kernel",
    "sddmm_kernel",
    "edge_softmax_kernel",
    "gat_forward_kernel",
    "gat_backward_rows_kernel",
    "gat_backward_cols_kernel",
]


@triton.jit
def _find_row(ptr, pos, n, iters):
    """Largest row ``r < n`` with ``ptr[r] <= pos`` (the row holding position ``pos``
    when ``pos < ptr[n]``), by ``iters >= ceil(log2(n)) + 1`` bisection steps;
    ``pos`` a scalar or a vector."""
    lo = pos * 0
    hi = lo + n
    for _ in range(iters):
        mid = (lo + hi) // 2
        right = tl.load(ptr + mid) <= pos
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit
def _gather_rows(idx, perm, val, B, w, emask, cols, cmask, F, K, H, acc, HAS_PERM: tl.constexpr, HAS_VAL: tl.constexpr, MULTI_HEAD: tl.constexpr):
    """``acc + sum_w val[e_w] * B[idx[w], cols]`` over the walk positions ``w``."""
    j = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
    m2 = emask[:, None] & cmask[None, :]
    b = tl.load(B + j[:, None] * F + cols[None, :], mask=m2, other=0.0).to(acc.dtype)
    if HAS_VAL:
        if HAS_PERM:
            e = tl.load(perm + w, mask=emask, other=0).to(tl.int64)
        else:
            e = w.to(tl.int64)
        if MULTI_HEAD:
            v = tl.load(val + e[:, None] * H + (cols // K)[None, :], mask=m2, other=0.0).to(acc.dtype)
            b = b * v
        else:
            v = tl.load(val + e, mask=emask, other=0.0).to(acc.dtype)
            b = b * v[:, None]
    return acc + tl.sum(b, axis=0)


@triton.jit
def spmm_chunks_kernel(
    ptr, idx, perm, val, B, part, n, F, K, H, chunk, iters,
    HAS_PERM: tl.constexpr, HAS_VAL: tl.constexpr, MULTI_HEAD: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """Partial sums of the long rows (``> chunk`` entries) over entry chunk
    ``program_id(0)`` and feature tile ``program_id(1)``: ``part[c, slot, cols]``."""
    c = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    cmask = cols < F
    total = tl.load(ptr + n)
    lo = c.to(tl.int64) * chunk
    hi = tl.minimum(lo + chunk, total)
    if lo < total:
        r0 = _find_row(ptr, lo, n, iters)
        r1 = _find_row(ptr, hi - 1, n, iters)
        for slot in tl.static_range(2):
            r = r0 if slot == 0 else r1
            rlo = tl.load(ptr + r)
            rhi = tl.load(ptr + r + 1)
            ok = rhi - rlo > chunk
            if slot == 1:
                ok = ok & (r1 != r0)
            if ok:
                acc = tl.zeros([BLOCK_F], dtype=tl.float64 if ACC64 else tl.float32)
                for start in range(tl.maximum(lo, rlo), tl.minimum(hi, rhi), BLOCK_E):
                    w = start + tl.arange(0, BLOCK_E)
                    emask = w < tl.minimum(hi, rhi)
                    acc = _gather_rows(idx, perm, val, B, w, emask, cols, cmask, F, K, H, acc, HAS_PERM, HAS_VAL, MULTI_HEAD)
                tl.store(part + (c.to(tl.int64) * 2 + slot) * F + cols, acc, mask=cmask)


@triton.jit
def spmm_rows_kernel(
    ptr, idx, perm, val, B, part, out, bias, n, F, K, H, chunk, ell_width,
    HAS_PERM: tl.constexpr, HAS_VAL: tl.constexpr, MULTI_HEAD: tl.constexpr, ACC64: tl.constexpr,
    ELL: tl.constexpr, SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
):
    """``out[r, cols] (+)= sum_{w in row r} val[e_w] B[idx[w], cols] (+ bias[cols])``
    for row ``program_id(0)`` and feature tile ``program_id(1)``.

    ``ELL``: ``ptr`` is ``lengths`` and row ``r`` walks slots ``r*ell_width ..``;
    ``SPLIT``: rows longer than ``chunk`` add their partials from ``part``;
    ``ACCUMULATE``: add to ``out``'s current value (the COO part of hybrid)."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    cmask = cols < F
    if ELL:
        lo = r * ell_width
        hi = lo + tl.load(ptr + r)
    else:
        lo = tl.load(ptr + r).to(tl.int64)
        hi = tl.load(ptr + r + 1).to(tl.int64)
    acc = tl.zeros([BLOCK_F], dtype=tl.float64 if ACC64 else tl.float32)
    if SPLIT:
        long = hi - lo > chunk
    else:
        long = hi < lo
    if long:
        for c in range(lo // chunk, (hi - 1) // chunk + 1):
            slot = tl.where(lo <= c * chunk, 0, 1)
            acc += tl.load(part + (c * 2 + slot) * F + cols, mask=cmask, other=0.0)
    else:
        for start in range(lo, hi, BLOCK_E):
            w = start + tl.arange(0, BLOCK_E)
            acc = _gather_rows(idx, perm, val, B, w, w < hi, cols, cmask, F, K, H, acc, HAS_PERM, HAS_VAL, MULTI_HEAD)
    if ACCUMULATE:
        acc += tl.load(out + r * F + cols, mask=cmask, other=0.0).to(acc.dtype)
    if HAS_BIAS:  # the bias epilogue: added as the row is stored, no second pass
        acc += tl.load(bias + cols, mask=cmask, other=0.0).to(acc.dtype)
    tl.store(out + r * F + cols, acc.to(out.dtype.element_ty), mask=cmask)


@triton.jit
def sddmm_kernel(
    rows, idx, perm, val, B, C, out, slots, n, H, K, iters, ell_width,
    MODE: tl.constexpr, HAS_PERM: tl.constexpr, HAS_VAL: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``out[e, h] = val[e, h] <B[r, h], C[c, h]>`` for the ``BLOCK_E`` walk positions
    of ``program_id(0)`` and head ``program_id(1)``; ``B (n, H, K)``, ``C (m, H, K)``.

    ``MODE`` 0 (row plan): ``rows`` is ``ptr``, ``r`` found by bisection, entry
    ``e = perm[w]``; positions past ``ptr[n]`` (padding) get 0. ``MODE`` 1 (COO):
    ``rows`` is the row array, ``e = w``. ``MODE`` 2 (ELLPACK slots ``w = r *
    ell_width + s``, ``idx`` the column matrix, padding ``< 0``): ``rows`` is the
    row offsets, ``e = rows[r] + s``."""
    w = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    h = tl.program_id(1)
    inside = w < slots
    if MODE == 2:
        r = w // ell_width
        c = tl.load(idx + w, mask=inside, other=-1).to(tl.int64)
        emask = inside & (c >= 0)
        e = tl.load(rows + r, mask=emask, other=0).to(tl.int64) + w % ell_width
    else:
        if MODE == 0:
            emask = inside & (w < tl.load(rows + n))
            r = _find_row(rows, w, n, iters)
        else:
            emask = inside
            r = tl.load(rows + w, mask=emask, other=0).to(tl.int64)
        c = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
        if HAS_PERM:
            e = tl.load(perm + w, mask=emask, other=0).to(tl.int64)
        else:
            e = w
    acc = tl.zeros([BLOCK_E], dtype=tl.float64 if ACC64 else tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        m2 = emask[:, None] & (ks < K)[None, :]
        b = tl.load(B + (r * H + h)[:, None] * K + ks[None, :], mask=m2, other=0.0).to(acc.dtype)
        cc = tl.load(C + (c * H + h)[:, None] * K + ks[None, :], mask=m2, other=0.0).to(acc.dtype)
        acc += tl.sum(b * cc, axis=1)
    if HAS_VAL:
        acc *= tl.load(val + e * H + h, mask=emask, other=0.0).to(acc.dtype)
    tl.store(out + e * H + h, acc.to(out.dtype.element_ty), mask=emask)
    if MODE == 0:  # zero the padding positions (walk position = format position there)
        tl.store(out + w * H + h, tl.zeros_like(acc).to(out.dtype.element_ty), mask=inside & ~emask)


@triton.jit
def edge_softmax_kernel(ptr, perm, scores, out, H, HAS_PERM: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """Softmax of ``scores (q, H)`` over the entries of row ``program_id(0)``, every
    head at once: one online pass for the max and the sum, one to write."""
    r = tl.program_id(0).to(tl.int64)
    lo = tl.load(ptr + r).to(tl.int64)
    hi = tl.load(ptr + r + 1).to(tl.int64)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < H
    dt = tl.float64 if ACC64 else tl.float32
    mx = tl.full([BLOCK_H], float("-inf"), dt)
    tot = tl.zeros([BLOCK_H], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
        m2 = emask[:, None] & hmask[None, :]
        x = tl.load(scores + e[:, None] * H + hs[None, :], mask=m2, other=float("-inf")).to(dt)
        new = tl.maximum(mx, tl.max(x, axis=0))
        safe = tl.where(new == float("-inf"), 0.0, new)
        tot = tot * tl.exp(mx - safe) + tl.sum(tl.exp(x - safe[None, :]), axis=0)
        mx = new
    inv = 1.0 / tl.where(tot == 0, 1.0, tot)  # empty row: nothing reads it
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
        m2 = emask[:, None] & hmask[None, :]
        x = tl.load(scores + e[:, None] * H + hs[None, :], mask=m2, other=0.0).to(dt)
        y = tl.exp(x - mx[None, :]) * inv[None, :]
        tl.store(out + e[:, None] * H + hs[None, :], y.to(out.dtype.element_ty), mask=m2)


# ------------------------------------------------------------------------------ GAT


@triton.jit
def _lo32(x):
    """``x & 0xFFFFFFFF`` of a non-negative int64 (a 2**32 literal would be typed int32)."""
    return x - ((x >> 32) << 32)


@triton.jit
def _mix32(x):
    x = _lo32(((x >> 16) ^ x) * 0x45D9F3B)
    x = _lo32(((x >> 16) ^ x) * 0x45D9F3B)
    return (x >> 16) ^ x


@triton.jit
def keep_edge(flat, seed_lo, seed_hi, thresh):
    """True where entry ``flat = e * H + h`` (int64) survives attention dropout."""
    x = _mix32(_lo32(flat) ^ seed_lo)
    x = _mix32(x ^ _lo32(flat >> 32) ^ seed_hi)
    return x >= thresh


@triton.jit
def _scalars(consts, seed, dt: tl.constexpr):
    """``(negative_slope, dropout scale, seed_lo, seed_hi)``: the float constants from
    a float64 tensor (exact in float64 math) and the 64-bit seed's halves from its
    int64 tensor (no host sync per call)."""
    sd = tl.load(seed)
    return tl.load(consts).to(dt), tl.load(consts + 1).to(dt), _lo32(sd), _lo32(sd >> 32)


@triton.jit
def _logits(idx, perm, s, w, emask, di, h, H, slope, HAS_PERM: tl.constexpr, dt: tl.constexpr):
    """``(c, e, y, LeakyReLU(y))`` of walk positions ``w`` (masked logits ``-inf``)."""
    c = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
    e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
    y = tl.load(s + c * H + h, mask=emask, other=0.0).to(dt) + di
    lr = tl.where(emask, tl.where(y > 0, y, y * slope), float("-inf"))
    return c, e, y, lr


@triton.jit
def _row_max_sum(idx, perm, s, lo, hi, di, h, H, slope, HAS_PERM: tl.constexpr, dt: tl.constexpr, BLOCK_E: tl.constexpr):
    """Online max and sum of ``exp(LeakyReLU(y) - max)`` over a row, one head."""
    mx = tl.full([1], float("-inf"), dt)
    tot = tl.zeros([1], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        _, _, _, lr = _logits(idx, perm, s, w, w < hi, di, h, H, slope, HAS_PERM, dt)
        new = tl.maximum(mx, tl.max(lr, axis=0))
        tot = tot * tl.exp(mx - new) + tl.sum(tl.exp(lr[:, None] - new[None, :]), axis=0)
        mx = new
    return mx, tot


@triton.jit
def gat_forward_kernel(
    ptr, idx, perm, s, d, M, alpha, leaky, out, H, K, consts, seed, thresh,
    HAS_PERM: tl.constexpr, WANT_LEAKY: tl.constexpr, DROP: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Fused GAT forward for destination row ``program_id(0)``, head ``program_id(1)``,
    feature tile ``program_id(2)``: logits ``y = s[c] + d[i]``, LeakyReLU, row softmax
    ``alpha`` (written by tile 0, before dropout, with ``leaky = y > 0``), dropout,
    and ``out[i, h, tile] = sum drop(alpha_e) M[c_e, h, tile]`` (numba twin:
    ``gat_forward_rows``)."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kt = tl.program_id(2)
    dt = tl.float64 if ACC64 else tl.float32
    slope, scale, seed_lo, seed_hi = _scalars(consts, seed, dt)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    di = tl.load(d + i * H + h).to(dt)
    mx, tot = _row_max_sum(idx, perm, s, lo, hi, di, h, H, slope, HAS_PERM, dt, BLOCK_E)
    inv = 1.0 / tl.where(tot == 0, 1.0, tot)  # empty row: nothing reads it
    ks = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = ks < K
    acc = tl.zeros([BLOCK_K], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        c, e, y, lr = _logits(idx, perm, s, w, emask, di, h, H, slope, HAS_PERM, dt)
        a = tl.exp(lr - mx) * inv
        first = emask & ((w * 0 + kt) == 0)  # (a scalar mask operand breaks the interpreter)
        tl.store(alpha + e * H + h, a.to(alpha.dtype.element_ty), mask=first)
        if WANT_LEAKY:
            tl.store(leaky + e * H + h, y > 0, mask=first)
        if DROP:
            a = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), a * scale, 0.0)
        m = tl.load(M + (c * H + h)[:, None] * K + ks[None, :], mask=emask[:, None] & kmask[None, :], other=0.0).to(dt)
        acc += tl.sum(a[:, None] * m, axis=0)
    tl.store(out + (i * H + h) * K + ks, acc.to(out.dtype.element_ty), mask=kmask)


@triton.jit
def gat_backward_rows_kernel(
    ptr, idx, perm, G, M, alpha, leaky, s, d, alpha_d, dy, dd, H, K, consts, seed, thresh,
    HAS_PERM: tl.constexpr, CACHED: tl.constexpr, DROP: tl.constexpr, WRITE_AD: tl.constexpr, ACC64: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GAT backward over destination row ``program_id(0)``, head ``program_id(1)``
    (numba twin: ``gat_backward_rows``): ``g_e = <G[i, h], M[c_e, h]>`` (SDDMM),
    dropout backward, softmax backward ``dw = alpha (g - sum alpha g)``, LeakyReLU
    backward into ``dy (q, H)``, ``dd[i, h] = sum dy``; ``alpha_d`` (the dropped
    attention) written when ``WRITE_AD``. ``CACHED``: read ``alpha``/``leaky``
    (Table 4's edge caching) instead of recomputing them from ``s``, ``d``."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = tl.float64 if ACC64 else tl.float32
    slope, scale, seed_lo, seed_hi = _scalars(consts, seed, dt)
    lo = tl.load(ptr + i).to(tl.int64)
    hi = tl.load(ptr + i + 1).to(tl.int64)
    if not CACHED:
        di = tl.load(d + i * H + h).to(dt)
        mx, tot = _row_max_sum(idx, perm, s, lo, hi, di, h, H, slope, HAS_PERM, dt, BLOCK_E)
        inv = 1.0 / tl.where(tot == 0, 1.0, tot)  # empty row: nothing reads it
    dot = tl.zeros([1], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        if CACHED:
            c = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
            e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
            a = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
        else:
            c, e, y, lr = _logits(idx, perm, s, w, emask, di, h, H, slope, HAS_PERM, dt)
            a = tl.exp(lr - mx) * inv
        g = tl.zeros([BLOCK_E], dt)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            gi = tl.load(G + (i * H + h) * K + ks, mask=kmask, other=0.0).to(dt)
            m = tl.load(M + (c * H + h)[:, None] * K + ks[None, :], mask=emask[:, None] & kmask[None, :], other=0.0).to(dt)
            g += tl.sum(m * gi[None, :], axis=1)
        if DROP:
            g = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), g * scale, 0.0)
        tl.store(dy + e * H + h, g.to(dy.dtype.element_ty), mask=emask)
        dot += tl.sum(tl.where(emask, a * g, 0.0), axis=0)
    tl.debug_barrier()
    acc = tl.zeros([1], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        if CACHED:
            e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
            a = tl.load(alpha + e * H + h, mask=emask, other=0.0).to(dt)
            pos = tl.load(leaky + e * H + h, mask=emask, other=0) != 0
        else:
            c, e, y, lr = _logits(idx, perm, s, w, emask, di, h, H, slope, HAS_PERM, dt)
            a = tl.exp(lr - mx) * inv
            pos = y > 0
        g = tl.load(dy + e * H + h, mask=emask, other=0.0).to(dt)
        v = a * (g - dot)
        v = tl.where(pos, v, v * slope)
        tl.store(dy + e * H + h, v.to(dy.dtype.element_ty), mask=emask)
        acc += tl.sum(tl.where(emask, v, 0.0), axis=0)
        if WRITE_AD:
            if DROP:
                a = tl.where(keep_edge(e * H + h, seed_lo, seed_hi, thresh), a * scale, 0.0)
            tl.store(alpha_d + e * H + h, a.to(alpha_d.dtype.element_ty), mask=emask)
    tl.store(dd + i * H + h + tl.arange(0, 1), acc.to(dd.dtype.element_ty))


@triton.jit
def gat_backward_cols_kernel(
    ptr, idx, perm, G, alpha_d, dy, dd, a_src, a_dst, dM, ds, H, K,
    HAS_PERM: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """GAT backward over source node ``program_id(0)`` (the transposed walk), head
    ``program_id(1)``, feature tile ``program_id(2)`` (numba twin:
    ``gat_backward_cols``): ``ds[c, h] = sum_e dy[e, h]`` and ``dM[c, h] = sum_e
    alpha_d[e, h] G[i_e, h] + ds[c, h] a_src[h] + dd[c, h] a_dst[h]``."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kt = tl.program_id(2)
    dt = tl.float64 if ACC64 else tl.float32
    lo = tl.load(ptr + c).to(tl.int64)
    hi = tl.load(ptr + c + 1).to(tl.int64)
    ks = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = ks < K
    acc = tl.zeros([BLOCK_K], dt)
    dsum = tl.zeros([1], dt)
    for start in range(lo, hi, BLOCK_E):
        w = start + tl.arange(0, BLOCK_E)
        emask = w < hi
        i = tl.load(idx + w, mask=emask, other=0).to(tl.int64)
        e = tl.load(perm + w, mask=emask, other=0).to(tl.int64) if HAS_PERM else w
        ad = tl.load(alpha_d + e * H + h, mask=emask, other=0.0).to(dt)
        dsum += tl.sum(tl.load(dy + e * H + h, mask=emask, other=0.0).to(dt), axis=0)
        g = tl.load(G + (i * H + h)[:, None] * K + ks[None, :], mask=emask[:, None] & kmask[None, :], other=0.0).to(dt)
        acc += tl.sum(ad[:, None] * g, axis=0)
    ddc = tl.load(dd + c * H + h).to(dt)
    src = tl.load(a_src + h * K + ks, mask=kmask, other=0.0).to(dt)
    dst = tl.load(a_dst + h * K + ks, mask=kmask, other=0.0).to(dt)
    acc += dsum * src + ddc * dst
    tl.store(dM + (c * H + h) * K + ks, acc.to(dM.dtype.element_ty), mask=kmask)
    tl.store(ds + c * H + h + tl.arange(0, 1), dsum.to(ds.dtype.element_ty), mask=(tl.arange(0, 1) + kt) == 0)
