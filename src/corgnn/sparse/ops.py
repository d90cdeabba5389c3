"""Sparse operators: one public entry per operation, dispatched by device and format.

* :func:`spmm`         ``C = op(A) @ B``, single-head or semi-batched (multi-head)
* :func:`sddmm`        ``D = A ⊙ (B C)`` sampled at ``A``'s pattern, single or semi-batched
* :func:`edge_softmax` softmax of per-entry scores over each row's entries

These are raw operators: they do not record autograd history (the autograd
Functions in :mod:`corgnn.functional` call them in both passes). On CPU they run the
Numba kernels of :mod:`corgnn.sparse.cpu`: ELL and hybrid (and COO for SDDMM) on
their own kernels, everything else (every ``A^T`` product, CSR, CSC, COO SpMM) on the
format's cached row plan, see "CPU dispatch" below. On other devices (CUDA) a torch
gather/index_add fallback over the same row plan serves every format (custom CUDA
kernels are future work); tests force it on CPU through ``_FORCE_TORCH``.

Paper: appendix "Common Sparse Operators" (Listings 1-2), §"Multi-head GAT".
"""

from __future__ import annotations

import numba
import torch

from . import cpu
from .formats import SparseFormat

__all__ = ["spmm", "sddmm", "edge_softmax"]

_EMPTY = {}


def _empty(device, dtype):
    key = (device, dtype)
    t = _EMPTY.get(key)
    if t is None:
        t = _EMPTY[key] = torch.empty(0, dtype=dtype, device=device)
    return t


def _np(t: torch.Tensor):
    return t.detach().numpy()


# Private switch for tests: run the torch fallback (the CUDA path) on CPU tensors too.
_FORCE_TORCH = False


def _native(t: torch.Tensor) -> bool:
    """Whether the Numba kernels run (CPU tensors, fallback not forced)."""
    return t.device.type == "cpu" and not _FORCE_TORCH


def _vals(A: SparseFormat, val: torch.Tensor | None, like: torch.Tensor):
    """Values for a kernel: ``val`` as an array, or an empty one (all-ones pattern)."""
    if val is None:
        return _np(_empty(A.device, like.dtype)).reshape((0,) * (like.dim() - 1))
    return _np(val)


def _chunks() -> int:
    """Entry chunks of the COO kernel: 8 per thread, so a slow thread is caught up."""
    return 8 * numba.get_num_threads()


# ----------------------------------------------------------------- CPU dispatch
# Format-native CPU kernels by format name, for ``A @ B`` (not transposed) and for
# SDDMM; every other case walks ``A.row_plan(transpose)`` (an SpMM kernel returning
# False declines, and the row plan runs). Each takes values in A's entry order (None =
# pattern or, for ELL, A.val's cached padding), ``B``/``C``/``out`` 2-D (single head)
# or 3-D (semi-batched), and picks the matching kernel.
#
# NOTE (measured on the synthetic OGB-Arxiv and PubMed stand-ins, f=64, 2 cores,
# output buffer reused): for a row-sorted COO the entry-balanced kernel
# cpu.spmm_coo takes 88 / 16 ms against 60 / 8 ms for the row plan, i.e. the CSR
# kernel over a row pointer built once from the sorted rows (it skips the per-entry
# row reads and chunk bookkeeping). Both give the same sums, so COO SpMM walks its
# row plan; spmm_coo serves the hybrid format's COO part, which must add into rows
# the CSR part already wrote. COO SDDMM runs per entry (cpu.sddmm_coo): as fast as
# the row walk and needs no sorted order.


ELL_KERNEL_MAX_PADDING = 4.0
"""ELL runs its own kernels up to this padding ratio ``n p / nnz``, the row plan above.

NOTE (measured, SpMM f=64, 2 cores, medians of 9): the ELL kernel's rows lie ``p``
slots apart, so with heavy padding every row starts on a fresh cache line and page:
native vs row plan was 134 vs 145 ms at padding 1.0 (a regular 200k-node graph),
164 vs 172 ms at 2.9, 158 vs 152 ms at 5.7, and 134 vs 106 ms at 62.7 (the
OGB-Arxiv stand-in); SDDMM alike. Both walk the same entries in the same order.
"""


def _spmm_ell(A, val, B, out) -> bool:
    if A.padding_ratio() > ELL_KERNEL_MAX_PADDING:
        return False
    heads = B.dim() == 3
    V = A.values_padded(None if val is A.val else val)
    Vn = _np(_empty(A.device, B.dtype)).reshape((0, 0, 1)[: 3 if heads else 2]) if V is None else _np(V)
    (cpu.spmm_ell_heads if heads else cpu.spmm_ell)(_np(A.col), _np(A.lengths), Vn, _np(B), _np(out))
    return True


def _spmm_hybrid(A, val, B, out):
    heads = B.dim() == 3
    q1 = A.head.nnz
    v = _vals(A, val, B)
    no_perm = _np(_empty(A.device, torch.long))
    (cpu.spmm_rows_heads if heads else cpu.spmm_rows)(_np(A.head.rowptr), _np(A.head.col), v[:q1], no_perm, _np(B), _np(out))
    (cpu.spmm_coo_heads if heads else cpu.spmm_coo)(_np(A.tail.row), _np(A.tail.col), v[q1:], _np(B), _np(out), _chunks(), True)
    return True


_SPMM_NATIVE = {"ell": _spmm_ell, "hybrid": _spmm_hybrid}


def _sddmm_rows(A, val, B, C, out):
    """Row-plan SDDMM. For a format whose transposed walk needs no permutation
    (CSC), walk that instead with the operands swapped, writing in its own order."""
    ptr, idx, perm = A.row_plan(False)
    if perm is not None:
        tptr, tidx, tperm = A.row_plan(True)
        if tperm is None:
            # NOTE: <B[i], C[j]> = <C[j], B[i]>: walking the columns of A (rows of A^T)
            # with B and C swapped visits the same entries and writes them in A's own
            # order, so no scattered writes through perm.
            ptr, idx, perm, B, C = tptr, tidx, None, C, B
    p = _np(perm) if perm is not None else _np(_empty(A.device, torch.long))
    kern = cpu.sddmm_rows_heads if B.dim() == 3 else cpu.sddmm_rows
    kern(_np(ptr), _np(idx), _vals(A, val, B), p, _np(B), _np(C), _np(out))


def _sddmm_ell(A, val, B, C, out):
    if A.padding_ratio() > ELL_KERNEL_MAX_PADDING:
        return _sddmm_rows(A, val, B, C, out)
    off = A.to_csr().rowptr[:-1]
    kern = cpu.sddmm_ell_heads if B.dim() == 3 else cpu.sddmm_ell
    kern(_np(A.col), _np(A.lengths), _np(off), _vals(A, val, B), _np(B), _np(C), _np(out))


def _sddmm_hybrid(A, val, B, C, out):
    heads = B.dim() == 3
    q1 = A.head.nnz
    v, o = _vals(A, val, B), _np(out)
    no_perm = _np(_empty(A.device, torch.long))
    (cpu.sddmm_rows_heads if heads else cpu.sddmm_rows)(_np(A.head.rowptr), _np(A.head.col), v[:q1], no_perm, _np(B), _np(C), o[:q1])
    (cpu.sddmm_coo_heads if heads else cpu.sddmm_coo)(_np(A.tail.row), _np(A.tail.col), v[q1:], _np(B), _np(C), o[q1:])


def _sddmm_coo(A, val, B, C, out):
    kern = cpu.sddmm_coo_heads if B.dim() == 3 else cpu.sddmm_coo
    kern(_np(A.row), _np(A.col), _vals(A, val, B), _np(B), _np(C), _np(out))


_SDDMM_NATIVE = {"ell": _sddmm_ell, "hybrid": _sddmm_hybrid, "coo": _sddmm_coo}


def _check_sparse(A):
    if not isinstance(A, SparseFormat):
        raise TypeError(f"A must be a corgnn sparse format (COO, CSR, CSC, ELL, Hybrid), got {type(A).__name__}")


def _values(A: SparseFormat, values, heads: int | None):
    """Entry values in ``A``'s order, validated; ``None`` = all-ones pattern."""
    val = A.val if values is None else values
    if val is None:
        return None
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        raise TypeError(f"values must be a floating tensor, got {getattr(val, 'dtype', type(val))}")
    want = (A.nnz,) if heads is None else (A.nnz, heads)
    if tuple(val.shape) != want:
        raise ValueError(f"values must have shape {want} (one per stored entry{', per head' if heads else ''}), got {tuple(val.shape)}")
    return val


def spmm(A: SparseFormat, B: torch.Tensor, *, values: torch.Tensor | None = None, transpose: bool = False) -> torch.Tensor:
    """Sparse-dense product ``op(A) @ B`` with ``op(A) = A^T if transpose else A``.

    Single-head: ``B (m, f)`` -> ``(n, f)`` with values ``(nnz,)``.
    Semi-batched (h heads sharing ``A``'s pattern): ``B (m, h, f)`` and values
    ``(nnz, h)`` -> ``(n, h, f)``; each head ``q`` computes ``A_q @ B[:, q]``.
    ``A^T B`` reads the transpose's cached compressed arrays (CSR/CSC duality) and
    ``A``'s values through a permutation; it never materialises ``A^T`` values.

    Args:
        A: sparse ``(n, m)`` matrix in any format.
        B: dense float32/float64 operand on ``A``'s device.
        values: per-entry values in ``A``'s entry order overriding ``A.val``
            (``None`` and no ``A.val``: an all-ones pattern).
        transpose: multiply by ``A^T`` (shape ``(m, n)``) instead.

    Returns:
        Dense tensor of ``B``'s dtype, ``(rows(op(A)), f)`` or ``(rows, h, f)``.

    Raises:
        TypeError: ``A`` not a sparse format; non-floating ``B``/values; dtype mismatch.
        ValueError: shape mismatches between ``A``, ``B`` and ``values``.
    """
    _check_sparse(A)
    if not isinstance(B, torch.Tensor) or not B.is_floating_point():
        raise TypeError(f"B must be a floating tensor, got {getattr(B, 'dtype', type(B))}")
    n, m = (A.shape[1], A.shape[0]) if transpose else A.shape
    if B.dim() not in (2, 3) or B.size(0) != m:
        raise ValueError(f"B must have shape ({m}, f) or ({m}, heads, f) to multiply op(A) of shape ({n}, {m}), got {tuple(B.shape)}")
    heads = B.size(1) if B.dim() == 3 else None
    val = _values(A, values, heads)
    if val is not None and val.dtype != B.dtype:
        raise TypeError(f"values dtype {val.dtype} does not match B dtype {B.dtype}")
    if B.device != A.device:
        raise ValueError(f"B is on {B.device} but A is on {A.device}")
    B = B.detach().contiguous()
    out = torch.empty((n,) + tuple(B.shape[1:]), dtype=B.dtype, device=B.device)
    # (A.val itself when no override, so ELL finds its cached padded matrix)
    if _native(B) and not transpose and A.name in _SPMM_NATIVE and _SPMM_NATIVE[A.name](A, None if val is None else val.contiguous(), B, out):
        return out
    if heads is not None and val is None:
        val = torch.ones(A.nnz, heads, dtype=B.dtype, device=B.device)
    ptr, idx, perm = A.row_plan(transpose)
    if _native(B):
        v = _np(val.detach().contiguous()) if val is not None else _np(_empty(B.device, B.dtype))
        p = _np(perm) if perm is not None else _np(_empty(B.device, torch.long))
        kern = cpu.spmm_rows if heads is None else cpu.spmm_rows_heads
        kern(_np(ptr), _np(idx), v, p, _np(B), _np(out))
        return out
    # torch fallback (CUDA and other devices)
    rows = _plan_rows(A, transpose, ptr)
    msg = B.index_select(0, idx)
    if val is not None:
        ev = val.detach() if perm is None else val.detach().index_select(0, perm)
        msg = msg * ev.unsqueeze(-1)
    out.zero_().index_add_(0, rows, msg)
    return out


def _plan_rows(A, transpose, ptr):
    key = ("rows", bool(transpose))
    rows = A._plans.get(key)
    if rows is None:
        counts = ptr[1:] - ptr[:-1]
        rows = A._plans[key] = torch.repeat_interleave(torch.arange(counts.numel(), device=ptr.device), counts)
    return rows


def sddmm(A: SparseFormat, B: torch.Tensor, C: torch.Tensor, *, values: torch.Tensor | None = None) -> torch.Tensor:
    """Sampled dense-dense product ``D = A ⊙ (B C)`` at ``A``'s stored entries.

    Single-head: ``B (n, f)``, ``C (f, m)`` (pass ``M.t()`` for a node matrix ``M (m, f)``;
    that view costs no copy) -> values ``(nnz,)``.
    Semi-batched: ``B (n, h, f)``, ``C (m, h, f)`` given row-wise per column node
    (``C[j, q]`` is column ``j`` of head ``q``'s right operand) -> ``(nnz, h)``.
    Entry ``e = (i, j)`` gets ``val[e] * <B[i], C[:, j]>`` (``val`` = ``values`` or
    ``A.val``; 1 for a pattern), in ``A``'s entry order.

    Raises:
        TypeError / ValueError: as :func:`spmm`, for ``B``, ``C`` and ``values``.
    """
    _check_sparse(A)
    for name, t in (("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {getattr(t, 'dtype', type(t))}")
    n, m = A.shape
    if B.dim() == 2:
        if C.dim() != 2 or B.size(0) != n or C.size(1) != m or B.size(1) != C.size(0):
            raise ValueError(f"sddmm needs B ({n}, f) and C (f, {m}); got B {tuple(B.shape)}, C {tuple(C.shape)}")
        Ct = C.t()
        heads = None
    elif B.dim() == 3:
        if C.dim() != 3 or B.size(0) != n or C.size(0) != m or B.shape[1:] != C.shape[1:]:
            raise ValueError(f"semi-batched sddmm needs B ({n}, h, f) and C ({m}, h, f); got B {tuple(B.shape)}, C {tuple(C.shape)}")
        Ct = C
        heads = B.size(1)
    else:
        raise ValueError(f"B must be 2-D (n, f) or 3-D (n, h, f), got {tuple(B.shape)}")
    if B.dtype != C.dtype:
        raise TypeError(f"B dtype {B.dtype} does not match C dtype {C.dtype}")
    val = _values(A, values, heads)
    if val is not None and val.dtype != B.dtype:
        raise TypeError(f"values dtype {val.dtype} does not match B dtype {B.dtype}")
    for name, t in (("B", B), ("C", C)):
        if t.device != A.device:
            raise ValueError(f"{name} is on {t.device} but A is on {A.device}")
    B = B.detach().contiguous()
    Ct = Ct.detach().contiguous()
    out = torch.empty((A.nnz,) if heads is None else (A.nnz, heads), dtype=B.dtype, device=B.device)
    if _native(B):
        val = None if val is None else val.contiguous()
        _SDDMM_NATIVE.get(A.name, _sddmm_rows)(A, val, B, Ct, out)
        return out
    ptr, idx, perm = A.row_plan(False)
    rows = _plan_rows(A, False, ptr)
    res = (B.index_select(0, rows) * Ct.index_select(0, idx)).sum(-1)
    if perm is not None:
        res = torch.empty_like(res).index_copy_(0, perm, res)
    if val is not None:
        res = res * val.detach()
    return res


def edge_softmax(A: SparseFormat, scores: torch.Tensor) -> torch.Tensor:
    """Softmax of per-entry ``scores`` over each row of ``A`` (numerically stable).

    For a GAT adjacency (rows = destination nodes) this normalises the attention
    logits of every node's incoming edges (paper eq. "GAT Forward Pass"):
    ``alpha_e = exp(s_e - max_row) / sum_row exp(s - max_row)``.

    Args:
        A: sparse pattern ``(n, m)``.
        scores: ``(nnz,)`` or ``(nnz, h)`` floating, in ``A``'s entry order.

    Returns:
        Tensor shaped like ``scores``; rows with no entries contribute nothing.
    """
    _check_sparse(A)
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got {getattr(scores, 'dtype', type(scores))}")
    if scores.dim() not in (1, 2) or scores.size(0) != A.nnz:
        raise ValueError(f"scores must have shape ({A.nnz},) or ({A.nnz}, h), got {tuple(scores.shape)}")
    s2 = scores.detach().reshape(A.nnz, -1).contiguous()
    ptr, idx, perm = A.row_plan(False)
    if _native(s2):
        out = torch.empty_like(s2)
        p = _np(perm) if perm is not None else _np(_empty(s2.device, torch.long))
        cpu.edge_softmax_rows(_np(ptr), p, _np(s2), _np(out))
        return out.view_as(scores)
    rows = _plan_rows(A, False, ptr)
    if perm is not None:
        inv = torch.empty_like(perm).index_copy_(0, perm, torch.arange(perm.numel(), device=perm.device))
        rows = rows.index_select(0, inv)
    n = A.shape[0]
    mx = torch.full((n, s2.size(1)), float("-inf"), dtype=s2.dtype, device=s2.device)
    mx = mx.scatter_reduce(0, rows.unsqueeze(1).expand_as(s2), s2, reduce="amax", include_self=True)
    ex = (s2 - mx.index_select(0, rows)).exp()
    den = torch.zeros_like(mx).index_add_(0, rows, ex)
    return (ex / den.index_select(0, rows)).view_as(scores)
