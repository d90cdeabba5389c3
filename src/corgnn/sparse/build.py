"""Building compressed formats from an edge list in O(q): counting sorts, no ``unique``.

A graph that changes every call (mini-batches of small graphs, sampled subgraphs, a
fresh ``edge_index``) pays its format construction on every call, so construction must
cost about what one pass over the edges costs. The kernels here (Numba, CPU) do it in
one serial pass each:

- :func:`coo_to_csr`: COO -> CSR by a counting sort on the row, then each row's
  entries sorted by column (insertion sort; rows are short) and, optionally,
  duplicates summed. The result is exactly what ``CSR.from_coo`` documents
  (row-major, columns ascending, stable for equal keys), plus ``entry (q,)``: the CSR
  position of every input entry (the inverse of the sort; for a coalesced matrix,
  the entry each input was summed into).
- :func:`adjacency_csr`: the propagation matrices of the layers straight from
  ``edge_index``: the self-loop handling of PyG's ``add_remaining_self_loops`` or an
  added zero diagonal (GIN), the mean or the symmetric GCN normalisation
  (``gcn_norm``), fused into the sort.
- :func:`csr_to_csc`: the CSC dual of a CSR (its ``A^T`` row plan) with the
  permutation back to CSR entry order, by a counting sort on the column.

NOTE: replaces ``torch.unique`` (sort-based, O(q log q)) and ``argsort`` in graph
construction. Measured (2-core CPU): building the GCN ``A'`` of a batch of 128
graphs of ~25 nodes took 0.35 ms with ``unique`` + PyG's ``gcn_norm``, see the
README's "changing graphs" numbers for the kernels here.

Other devices, and dtypes Numba does not take, use the torch path of the callers.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .backends.numba_threads import load_target

__all__ = ["coo_to_csr", "adjacency_csr", "csr_to_csc", "LOOPS_KEEP", "LOOPS_REMAINING", "LOOPS_DIAGONAL", "LOOPS_REPLACE",
           "NORM_NONE", "NORM_SYMMETRIC", "NORM_MEAN", "supported"]

LOOPS_KEEP, LOOPS_REMAINING, LOOPS_DIAGONAL, LOOPS_REPLACE = 0, 1, 2, 3
"""Self-loop handling of :func:`adjacency_csr`: keep the edges as they are; PyG's
``add_remaining_self_loops`` (existing loops removed, one loop per node appended with
the weight of the node's last existing loop, else ``fill``); a loop per node of
weight ``fill`` appended to the edges (GIN's diagonal; summed with existing loops
when coalescing); existing loops removed and one per node appended (GAT's pattern)."""

NORM_NONE, NORM_SYMMETRIC, NORM_MEAN = 0, 1, 2
"""Normalisation of :func:`adjacency_csr`: none; ``D^-1/2 A D^-1/2`` with ``D`` the
row (target) sums, as PyG's ``gcn_norm``; each weight over its target's edge count
(duplicates counted, at least 1) before any diagonal is added, as PyG's mean
aggregation."""

_NUMBA_DTYPES = (torch.float32, torch.float64)
_JIT = dict(cache=True, nogil=True)


def supported(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether these kernels build for ``device`` and value ``dtype`` (None: a pattern)."""
    return device.type == "cpu" and (dtype is None or dtype in _NUMBA_DTYPES)


@njit(**_JIT)
def _merge_row(col, val, has_val, order, a, b, tc, tv, to):
    """Stable bottom-up merge sort of ``col[a:b]`` (carrying ``val``, ``order``), with
    scratch arrays ``tc, tv, to`` of at least ``b - a`` entries.

    NOTE: written out instead of ``np.argsort(kind="mergesort")`` plus fancy indexing,
    which made this module's cold compile (empty Numba cache) 3.5 s longer: their
    error paths compile Numba's string formatting."""
    d = b - a
    width = 1
    while width < d:
        for lo in range(0, d, 2 * width):
            mid = min(lo + width, d)
            hi = min(lo + 2 * width, d)
            i, j, k = lo, mid, lo
            while k < hi:
                if j >= hi or (i < mid and col[a + i] <= col[a + j]):
                    src = a + i
                    i += 1
                else:
                    src = a + j
                    j += 1
                tc[k] = col[src]
                to[k] = order[src]
                if has_val:
                    tv[k] = val[src]
                k += 1
        for k in range(d):
            col[a + k] = tc[k]
            order[a + k] = to[k]
            if has_val:
                val[a + k] = tv[k]
        width *= 2


@njit(**_JIT)
def _sort_rows(rowptr, col, val, has_val, order, tc, tv, to):
    """Sort each row's entries by column, stably (insertion sort on short rows,
    a merge sort on long ones, with the scratch ``tc, tv, to`` of the longest row's
    length, empty when no row has more than 32 entries), carrying ``val`` and ``order``."""
    n = rowptr.shape[0] - 1
    for i in range(n):
        a, b = rowptr[i], rowptr[i + 1]
        if b - a <= 32:
            for p in range(a + 1, b):
                c, o = col[p], order[p]
                v = val[p] if has_val else 0
                j = p - 1
                while j >= a and col[j] > c:
                    col[j + 1] = col[j]
                    order[j + 1] = order[j]
                    if has_val:
                        val[j + 1] = val[j]
                    j -= 1
                col[j + 1] = c
                order[j + 1] = o
                if has_val:
                    val[j + 1] = v
        else:
            _merge_row(col, val, has_val, order, a, b, tc, tv, to)


def _merge_scratch(longest: int, val_dtype):
    """``(tc, tv, to)`` for :func:`_sort_rows`: the longest row's length when it is
    merge-sorted (over 32 entries), else empty."""
    size = longest if longest > 32 else 0
    return np.empty(size, dtype=np.int64), np.empty(size, dtype=val_dtype), np.empty(size, dtype=np.int64)


@njit(**_JIT)
def _coalesce(rowptr, col, val, has_val, order, entry):
    """Sum equal columns within each (sorted) row, in place: ``rowptr`` becomes the
    compacted row pointer, the first ``rowptr[-1]`` entries of ``col``/``val`` the
    compacted entries, and ``entry[e]`` the position input entry ``e = order[p]``
    was summed into (ids ``>= entry.shape[0]``, appended loops, are not recorded)."""
    n = rowptr.shape[0] - 1
    q_in = entry.shape[0]
    w = 0
    a = rowptr[0]
    for i in range(n):
        b = rowptr[i + 1]
        start = w
        for p in range(a, b):
            if w > start and col[w - 1] == col[p]:
                if has_val:
                    val[w - 1] += val[p]
            else:
                col[w] = col[p]
                if has_val:
                    val[w] = val[p]
                w += 1
            if order[p] < q_in:
                entry[order[p]] = w - 1
        a = b
        rowptr[i + 1] = w


@njit(**_JIT)
def _entries(order, entry, count):
    """``entry[order[p]] = p`` for ``p < count`` and the recorded ids ``order[p] < entry.shape[0]``."""
    q = entry.shape[0]
    for p in range(count):
        if order[p] < q:
            entry[order[p]] = p


# NOTE: the kernels below allocate nothing: every array is made by the caller (NumPy)
# and passed in, and a size known only after a pass over the edges (the entries kept,
# the longest row) is returned by a first call of the same kernel (``fill=False``).
# A kernel that allocates (``np.empty``, ``np.zeros``, ``.copy()``) links NumPy
# support whose pickled environments make a fresh process import ``numba.np.arrayobj``
# and ``numba.cpython.unicode`` (~20-30 ms with their imports) when it loads the kernel
# from the cache (measured: a cached kernel calling ``np.empty`` loads in 65-111 ms, one
# without allocation in 43 ms, Numba's runtime start included).


@njit(**_JIT)
def _coo_to_csr_kernel(fill, row, col, val, has_val, n, coalesce, rowptr, nxt, out_col, out_val, order, entry, tc, tv, to):
    """``fill=False``: ``rowptr (n+1,)`` of the rows ``row (q,)``; returns the longest
    row's length. ``fill=True``: the rest of :func:`coo_to_csr` into ``out_col,
    out_val, order (q,)``, ``entry (q,)`` (all -1 on entry), with the cursor ``nxt
    (n,)`` and :func:`_merge_scratch`; returns the entry count."""
    q = row.shape[0]
    if not fill:
        for i in range(n + 1):
            rowptr[i] = 0
        for e in range(q):
            rowptr[row[e] + 1] += 1
        longest = 0
        for i in range(n):
            longest = max(longest, rowptr[i + 1])
            rowptr[i + 1] += rowptr[i]
        return longest
    for i in range(n):
        nxt[i] = rowptr[i]
    for e in range(q):
        p = nxt[row[e]]
        nxt[row[e]] = p + 1
        out_col[p] = col[e]
        order[p] = e
        if has_val:
            out_val[p] = val[e]
    _sort_rows(rowptr, out_col, out_val, has_val, order, tc, tv, to)
    if coalesce:
        _coalesce(rowptr, out_col, out_val, has_val, order, entry)
    else:
        _entries(order, entry, q)
    return rowptr[n]


def coo_to_csr(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor | None, n: int, *, coalesce: bool):
    """``(rowptr (n+1,), col (nnz,), val (nnz,) or None, entry (q,))`` of the CSR of the
    COO entries ``row, col (q,)`` int64 (CPU, values float32/float64 or None).

    Entries sorted by row, then column, stably; ``coalesce`` sums duplicates (a
    pattern, ``val=None``, stays a pattern: the caller handles multiplicities).
    ``entry[e]``: CSR position of input entry ``e``. O(q + n) (rows longer than 32
    entries are sorted by a merge sort). No validation: ``0 <= row < n``.
    """
    load_target()
    has_val = val is not None
    r, c = row.contiguous().numpy(), col.contiguous().numpy()
    v = val.detach().contiguous().numpy() if has_val else np.empty(0, dtype=np.float32)
    q = r.shape[0]
    rowptr, nxt = np.empty(n + 1, dtype=np.int64), np.empty(n, dtype=np.int64)
    out_col, order, entry = np.empty(q, dtype=np.int64), np.empty(q, dtype=np.int64), np.full(q, -1, dtype=np.int64)
    out_val = np.empty(q if has_val else 0, dtype=v.dtype)
    args = [r, c, v, has_val, n, coalesce, rowptr, nxt, out_col, out_val, order, entry]
    longest = _coo_to_csr_kernel(False, *args, *_merge_scratch(0, v.dtype))
    nnz = int(_coo_to_csr_kernel(True, *args, *_merge_scratch(int(longest), v.dtype)))
    return torch.from_numpy(rowptr), torch.from_numpy(out_col[:nnz]), torch.from_numpy(out_val[:nnz]) if has_val else None, torch.from_numpy(entry)


@njit(**_JIT)
def _adjacency_kernel(fill_entries, src, dst, w, has_w, n, loops, norm, coalesce, counts, loopw, rowptr, col, val, order, entry, tc, tv, to, dinv):
    """``fill_entries=False``: ``counts (n,)`` (zero on entry: kept edges per target),
    ``loopw (n,)`` (the loop weights, ``fill`` on entry; empty without appended loops)
    and ``rowptr (n+1,)``; returns ``(entries, longest row)``. ``fill_entries=True``:
    the rest of :func:`adjacency_csr` into ``col, val, order (entries,)``, ``entry``
    (all -1 on entry), with ``counts`` as the cursor, :func:`_merge_scratch` and
    ``dinv (n,)`` (symmetric normalisation, else empty); returns ``(nnz, 0)``."""
    q = src.shape[0]
    add = loops != LOOPS_KEEP
    drop = loops == LOOPS_REMAINING or loops == LOOPS_REPLACE
    extra = 1 if add else 0
    if not fill_entries:
        kept = 0
        for e in range(q):
            if drop and src[e] == dst[e]:
                if loops == LOOPS_REMAINING:
                    loopw[src[e]] = w[e] if has_w else 1.0
                continue
            counts[dst[e]] += 1
            kept += 1
        rowptr[0] = 0
        longest = 0
        for i in range(n):
            d = counts[i] + extra
            rowptr[i + 1] = rowptr[i] + d
            longest = max(longest, d)
        return rowptr[n], longest
    for i in range(n):
        counts[i] = rowptr[i]
    for e in range(q):
        if drop and src[e] == dst[e]:
            continue
        i = dst[e]
        p = counts[i]
        counts[i] = p + 1
        col[p] = src[e]
        order[p] = e
        x = w[e] if has_w else 1.0
        if norm == NORM_MEAN:
            x = x / max(rowptr[i + 1] - rowptr[i] - extra, 1)
        val[p] = x
    if add:
        for i in range(n):
            p = counts[i]
            counts[i] = p + 1
            col[p] = i
            order[p] = q + i
            val[p] = loopw[i]
    _sort_rows(rowptr, col, val, True, order, tc, tv, to)
    if coalesce:
        _coalesce(rowptr, col, val, True, order, entry)
    else:
        _entries(order, entry, rowptr[n])
    if norm == NORM_SYMMETRIC:
        for i in range(n):
            d = 0.0
            for p in range(rowptr[i], rowptr[i + 1]):
                d += val[p]
            dinv[i] = 0.0 if d == 0 else 1.0 / np.sqrt(d)  # (PyG: deg^-0.5, inf -> 0; negative -> nan)
        for i in range(n):
            for p in range(rowptr[i], rowptr[i + 1]):
                val[p] = dinv[i] * val[p] * dinv[col[p]]
    return rowptr[n], rowptr[0]


def adjacency_csr(
    edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int, *, dtype: torch.dtype,
    loops: int, fill: float = 1.0, norm: int = NORM_NONE, coalesce: bool = True,
):
    """A propagation matrix of ``edge_index (2, q)`` (row 0 = source, row 1 = target)
    as CSR arrays, in one pass: ``(rowptr (n+1,), col (nnz,), val (nnz,) dtype, entry
    (q,))``, rows = targets, columns = sources, sorted by (target, source).

    ``loops`` one of :data:`LOOPS_KEEP`, ``LOOPS_REMAINING`` (PyG's
    ``add_remaining_self_loops(fill_value=fill)``, which, as PyG's, gives new loops
    weight 1 whatever ``fill`` when ``edge_weight`` is None), ``LOOPS_DIAGONAL`` (``fill`` added
    on the diagonal), ``LOOPS_REPLACE``; ``norm`` one of :data:`NORM_NONE`,
    ``NORM_SYMMETRIC`` (``gcn_norm``; zero degree -> 0, as PyG's ``inf -> 0``),
    ``NORM_MEAN``. Weights are ``edge_weight`` (1 when None) in ``dtype``.
    ``coalesce`` sums duplicate (target, source) entries (the matrix is the same
    either way; summation order differs from PyG's scatter by float rounding).
    ``entry ((q + n,) when loops are appended, else (q,))``: ``entry[e]`` the CSR
    position of edge ``e`` (-1 for a self-loop dropped by ``LOOPS_REMAINING`` /
    ``LOOPS_REPLACE``), ``entry[q + v]`` that of node ``v``'s appended loop.

    CPU, ``dtype`` float32/float64 (:func:`supported`); no validation (ids in
    range: the caller's :class:`corgnn.Graph` checked them).
    """
    load_target()
    n, npd = num_nodes, _np_dtype(dtype)
    ei = edge_index.contiguous().numpy()
    q = ei.shape[1]
    w = edge_weight.detach().to(dtype).contiguous().numpy() if edge_weight is not None else np.empty(0, dtype=npd)
    add = loops != LOOPS_KEEP
    if loops == LOOPS_REMAINING and edge_weight is None:
        fill = 1.0  # (PyG's add_remaining_self_loops ignores fill_value without edge weights)
    counts, loopw, rowptr = np.zeros(n, dtype=np.int64), np.full(n if add else 0, fill, dtype=npd), np.empty(n + 1, dtype=np.int64)
    head = [ei[0], ei[1], w, edge_weight is not None, n, loops, norm, coalesce, counts, loopw, rowptr]
    none_i, none_v = np.empty(0, dtype=np.int64), np.empty(0, dtype=npd)
    total, longest = _adjacency_kernel(False, *head, none_i, none_v, none_i, none_i, *_merge_scratch(0, npd), none_v)
    col, val, order = np.empty(total, dtype=np.int64), np.empty(total, dtype=npd), np.empty(total, dtype=np.int64)
    entry = np.full(q + (n if add else 0), -1, dtype=np.int64)
    dinv = np.empty(n if norm == NORM_SYMMETRIC else 0, dtype=npd)
    nnz = int(_adjacency_kernel(True, *head, col, val, order, entry, *_merge_scratch(int(longest), npd), dinv)[0])
    return torch.from_numpy(rowptr), torch.from_numpy(col[:nnz]), torch.from_numpy(val[:nnz]), torch.from_numpy(entry)


def _np_dtype(dtype: torch.dtype):
    return np.float32 if dtype == torch.float32 else np.float64


@njit(**_JIT)
def _csr_to_csc_kernel(rowptr, col, colptr, nxt, row, perm):
    """Counting sort of the CSR entries ``rowptr, col`` by column into ``colptr
    (m+1,)``, ``row, perm (nnz,)``, with the cursor ``nxt (m,)``; returns nnz."""
    n = rowptr.shape[0] - 1
    m = nxt.shape[0]
    nnz = rowptr[n]
    for c in range(m + 1):
        colptr[c] = 0
    for p in range(nnz):
        colptr[col[p] + 1] += 1
    for c in range(m):
        colptr[c + 1] += colptr[c]
        nxt[c] = colptr[c]
    for i in range(n):
        for p in range(rowptr[i], rowptr[i + 1]):
            c = col[p]
            t = nxt[c]
            nxt[c] = t + 1
            row[t] = i
            perm[t] = p
    return nnz


def csr_to_csc(rowptr: torch.Tensor, col: torch.Tensor, num_cols: int):
    """``(colptr (m+1,), row (nnz,), perm (nnz,))`` int64 of the CSC of a CSR pattern
    (CPU): column-major, rows ascending within a column; ``perm[t]`` the CSR position
    of CSC entry ``t``. One counting sort, O(nnz + n + m)."""
    load_target()
    rp = rowptr.contiguous().numpy()
    nnz = int(rp[-1])
    colptr, nxt = np.empty(num_cols + 1, dtype=np.int64), np.empty(num_cols, dtype=np.int64)
    row, perm = np.empty(nnz, dtype=np.int64), np.empty(nnz, dtype=np.int64)
    _csr_to_csc_kernel(rp, col.contiguous().numpy(), colptr, nxt, row, perm)
    return torch.from_numpy(colptr), torch.from_numpy(row), torch.from_numpy(perm)
