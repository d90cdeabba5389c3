"""CPU kernels (Numba parallel JIT) over compressed rows.

Raw kernels: no autograd, no validation, no allocation of outputs; the wrappers in
:mod:`corgnn.sparse.ops` check arguments, allocate and dispatch.

Every kernel walks a *row plan* ``(ptr, idx, perm)``: the compressed-row arrays of
``op(A)`` (``A`` for a CSR, ``A^T`` read from a CSC, ...) and ``perm``, the position
of each walked entry in the caller's value order (an empty array = identity). So the
transposed product ``A^T B`` of a CSR matrix reads its cached CSC arrays and the
CSR-ordered values through ``perm``, and never materialises ``A^T`` values.

Parallel over rows (``prange``, all cores), inner loops over the contiguous feature
dimension so LLVM vectorises them; outputs are written once per row, so there are no
atomics and no ``(q x f)`` intermediates. Compiled code is cached on disk
(``cache=True``, in ``__pycache__`` or ``$NUMBA_CACHE_DIR``): the first call of each
kernel and dtype costs about 1-3 s of compilation once per machine, later processes
load it in milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = [
    "spmm_rows",
    "spmm_rows_heads",
    "sddmm_rows",
    "sddmm_rows_heads",
    "edge_softmax_rows",
]

_JIT = dict(parallel=True, fastmath=True, cache=True, nogil=True)


@njit(**_JIT)
def spmm_rows(ptr, idx, val, perm, B, out):
    """``out[i] = sum_j val[e_j] * B[idx[j]]`` over row ``i``'s entries.

    ptr (n+1,) int64; idx (nnz,) int64; val (nnz,) float or empty (= all ones);
    perm (nnz,) int64 or empty; B (m, f); out (n, f) overwritten.
    """
    n = ptr.shape[0] - 1
    f = B.shape[1]
    has_val = val.shape[0] > 0
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        for k in range(f):
            out[i, k] = 0
        for j in range(ptr[i], ptr[i + 1]):
            c = idx[j]
            if has_val:
                e = perm[j] if has_perm else j
                v = val[e]
                for k in range(f):
                    out[i, k] += v * B[c, k]
            else:
                for k in range(f):
                    out[i, k] += B[c, k]


@njit(**_JIT)
def spmm_rows_heads(ptr, idx, val, perm, B, out):
    """Semi-batched SpMM: ``out[i, h] = sum_j val[e_j, h] * B[idx[j], h]``.

    val (nnz, H); B (m, H, f); out (n, H, f) overwritten. The head dimension is the
    middle one so one neighbour's rows for all heads are contiguous (paper §Multi-head GAT).
    """
    n = ptr.shape[0] - 1
    H = B.shape[1]
    f = B.shape[2]
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        for h in range(H):
            for k in range(f):
                out[i, h, k] = 0
        for j in range(ptr[i], ptr[i + 1]):
            c = idx[j]
            e = perm[j] if has_perm else j
            for h in range(H):
                v = val[e, h]
                for k in range(f):
                    out[i, h, k] += v * B[c, h, k]


@njit(**_JIT)
def sddmm_rows(ptr, idx, val, perm, B, C, out):
    """``out[e_j] = val[e_j] * <B[i], C[idx[j]]>`` for each entry ``j`` of row ``i``.

    B (n, f) row operand; C (m, f) column operand (``C^T`` of the math, row-major);
    val (nnz,) or empty (= ones); out (nnz,) in the caller's entry order.
    """
    n = ptr.shape[0] - 1
    f = B.shape[1]
    has_val = val.shape[0] > 0
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        for j in range(ptr[i], ptr[i + 1]):
            c = idx[j]
            s = 0.0  # accumulate in float64
            for k in range(f):
                s += B[i, k] * C[c, k]
            e = perm[j] if has_perm else j
            if has_val:
                s *= val[e]
            out[e] = s


@njit(**_JIT)
def sddmm_rows_heads(ptr, idx, val, perm, B, C, out):
    """Semi-batched SDDMM: ``out[e_j, h] = val[e_j, h] * <B[i, h], C[idx[j], h]>``.

    B (n, H, f); C (m, H, f); val (nnz, H) or empty; out (nnz, H).
    """
    n = ptr.shape[0] - 1
    H = B.shape[1]
    f = B.shape[2]
    has_val = val.shape[0] > 0
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        for j in range(ptr[i], ptr[i + 1]):
            c = idx[j]
            e = perm[j] if has_perm else j
            for h in range(H):
                s = 0.0
                for k in range(f):
                    s += B[i, h, k] * C[c, h, k]
                if has_val:
                    s *= val[e, h]
                out[e, h] = s


@njit(**_JIT)
def edge_softmax_rows(ptr, perm, logits, out):
    """Softmax of ``logits (nnz, H)`` over each row's entries, max-subtracted.

    out (nnz, H) in the caller's entry order; an empty row writes nothing.
    """
    n = ptr.shape[0] - 1
    H = logits.shape[1]
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        lo = ptr[i]
        hi = ptr[i + 1]
        if hi == lo:
            continue
        mx = np.full(H, -np.inf, dtype=logits.dtype)
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                if logits[e, h] > mx[h]:
                    mx[h] = logits[e, h]
        s = np.zeros(H, dtype=logits.dtype)
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                v = math.exp(logits[e, h] - mx[h])
                out[e, h] = v
                s[h] += v
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                out[e, h] /= s[h]
