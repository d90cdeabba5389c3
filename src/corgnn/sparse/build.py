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
- :func:`mean_weights`: the mean aggregation's weight of each edge (``1 / in-degree``
  of its target, times its weight) in edge order, for a mini-batch's edge list that
  is not built at all (:meth:`corgnn.Graph.aggr_adjacency`).

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

from .._validate import check_edge_index, check_edge_weight, index_stats, validate_compressed
from .backends.numba_kernels import empty_array
from .backends.numba_threads import load_target
from .backends.numba_warmup import cold_reason

__all__ = ["coo_to_csr", "adjacency_csr", "csr_to_csc", "LOOPS_KEEP", "LOOPS_REMAINING", "LOOPS_DIAGONAL", "LOOPS_REPLACE",
           "NORM_NONE", "NORM_SYMMETRIC", "NORM_MEAN", "supported", "mean_weights"]

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
# NOTE: the kernels' helpers are inlined into their callers (``inline="always"``, at
# Numba's IR level): each separately compiled helper cost 55-80 ms of an empty cache's
# first call (a pipeline and an LLVM module each). Measured 2026-11-28, 2-core VM, a
# 3-layer GIN's first training step on 32 small graphs, empty cache, two runs each:
# 2.76-2.84 s -> 2.44-2.52 s (the build kernel's compile 1.83-1.85 -> 1.22-1.25 s); the
# warm build of that batch 24.1-24.4 -> 22.9-23.4 us (alternating processes). The
# large helpers were then written out flat (see the NOTE above the unsorted kernel).


def supported(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether these kernels build for ``device`` and value ``dtype`` (None: a pattern),
    now: not while Numba compiles them in the background (a cold cache,
    :mod:`corgnn.sparse.backends.numba_warmup`; the torch path builds meanwhile)."""
    return device.type == "cpu" and (dtype is None or dtype in _NUMBA_DTYPES) and cold_reason() is None


@njit(inline="always", **_JIT)
def _filled(size, like, value):
    """``np.full(size, value, dtype=like.dtype)`` in a kernel (see
    :func:`~corgnn.sparse.backends.numba_kernels.empty_array`)."""
    out = empty_array(size, like)
    for i in range(size):
        out[i] = value
    return out


@njit(inline="always", **_JIT)
def _head(a, size):
    """A new copy of ``a[:size]`` (see :func:`_filled`)."""
    out = empty_array(size, a)
    for i in range(size):
        out[i] = a[i]
    return out


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
def _sort_rows(rowptr, col, val, has_val, order):
    """Sort each row's entries by column, stably (insertion sort on short rows,
    a merge sort on long ones), carrying ``val`` and ``order`` along."""
    n = rowptr.shape[0] - 1
    longest = 0
    for i in range(n):
        longest = max(longest, rowptr[i + 1] - rowptr[i])
    tc = empty_array(longest if longest > 32 else 0, col)
    to = empty_array(tc.shape[0], order)
    tv = empty_array(tc.shape[0] if has_val else 0, val)
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


@njit(inline="always", **_JIT)
def _entries(order, entry):
    """``entry[order[p]] = p`` for the recorded ids ``order[p] < entry.shape[0]``."""
    q = entry.shape[0]
    for p in range(order.shape[0]):
        if order[p] < q:
            entry[order[p]] = p


@njit(inline="always", **_JIT)
def _pointer(index, count, size):
    """Compressed pointer ``(size+1,)`` of the ids ``index[:count]`` (any order): counts,
    then their running sum."""
    ptr = _filled(size + 1, index, 0)
    for e in range(count):
        ptr[index[e] + 1] += 1
    for i in range(size):
        ptr[i + 1] += ptr[i]
    return ptr


@njit(**_JIT)
def _coo_to_csr_kernel(row, col, val, has_val, n, coalesce):
    q = row.shape[0]
    rowptr = _pointer(row, q, n)
    nxt = _head(rowptr, n)
    out_col = empty_array(q, row)
    out_val = empty_array(q if has_val else 0, val)
    order = empty_array(q, row)
    for e in range(q):
        p = nxt[row[e]]
        nxt[row[e]] = p + 1
        out_col[p] = col[e]
        order[p] = e
        if has_val:
            out_val[p] = val[e]
    _sort_rows(rowptr, out_col, out_val, has_val, order)
    entry = _filled(q, row, -1)
    if coalesce:
        _coalesce(rowptr, out_col, out_val, has_val, order, entry)
    else:
        _entries(order, entry)
    return rowptr, out_col, out_val, entry


def coo_to_csr(row: torch.Tensor, col: torch.Tensor, val: torch.Tensor | None, n: int, *, coalesce: bool, check: bool = True):
    """``(rowptr (n+1,), col (nnz,), val (nnz,) or None, entry (q,))`` of the CSR of the
    COO entries ``row, col (q,)`` int64 (CPU, values float32/float64 or None).

    Entries sorted by row, then column, stably; ``coalesce`` sums duplicates (a
    pattern, ``val=None``, stays a pattern: the caller handles multiplicities).
    ``entry[e]``: CSR position of input entry ``e``. O(q + n) (rows longer than 32
    entries are sorted by a merge sort).

    ``check`` (default True) reads the arrays first: ``row`` in ``[0, n)``, ``col``
    non-negative, matching lengths; ``check=False`` is for the library's own callers,
    whose formats validated them.

    Raises:
        TypeError / ValueError: with ``check``, an argument of another type, shape or range.
    """
    if check:
        _check_entries("coo_to_csr", row, col, val, n)
    load_target()
    has_val = val is not None
    v = val.detach().contiguous().numpy() if has_val else np.empty(0, dtype=np.float32)
    ptr, c, w, entry = _coo_to_csr_kernel(row.contiguous().numpy(), col.contiguous().numpy(), v, has_val, n, coalesce)
    nnz = int(ptr[-1])
    return torch.from_numpy(ptr), torch.from_numpy(c[:nnz]), torch.from_numpy(w[:nnz]) if has_val else None, torch.from_numpy(entry)


@njit(inline="always", **_JIT)
def _csc(rowptr, col, m):
    """``(colptr, row, perm)`` of :func:`csr_to_csc` (inlined into the adjacency
    kernels: a separately compiled callee cost ~0.08 s more of a cold start)."""
    n = rowptr.shape[0] - 1
    nnz = rowptr[n]
    colptr = _pointer(col, nnz, m)
    nxt = _head(colptr, m)
    row = empty_array(nnz, col)
    perm = empty_array(nnz, col)
    for i in range(n):
        for p in range(rowptr[i], rowptr[i + 1]):
            c = col[p]
            t = nxt[c]
            nxt[c] = t + 1
            row[t] = i
            perm[t] = p
    return colptr, row, perm


@njit(**_JIT)
def _csr_to_csc_kernel(rowptr, col, m):
    return _csc(rowptr, col, m)


@njit(inline="always", **_JIT)
def _finish(rowptr, col, val, norm, transposed):
    """``NORM_SYMMETRIC`` applied to ``val`` in place, and with ``transposed`` the CSC
    dual ``(colptr, row, perm)`` (else three empty arrays)."""
    n = rowptr.shape[0] - 1
    if norm == NORM_SYMMETRIC:
        dinv = empty_array(n, val)
        for i in range(n):
            d = 0.0
            for p in range(rowptr[i], rowptr[i + 1]):
                d += val[p]
            dinv[i] = 0.0 if d == 0 else 1.0 / np.sqrt(d)  # (PyG: deg^-0.5, inf -> 0; negative -> nan)
        for i in range(n):
            for p in range(rowptr[i], rowptr[i + 1]):
                val[p] = dinv[i] * val[p] * dinv[col[p]]
    if transposed:
        return _csc(rowptr, col, n)
    return empty_array(0, col), empty_array(0, col), empty_array(0, col)


# NOTE (cold start, issue 21): the unsorted kernel, the changing-graph path of every
# layer, is written out flat: Numba's IR-level inlining (``inline="always"``) copies
# the callee's IR block by block, each copy deep-copying the callee's whole variable
# scope, so a large inlined helper cost more to compile than the code itself. Measured
# 2026-11-28 (2-core VM, empty cache, Python's collector paused): compiling it with its
# edge count and sort in a helper took 0.85-1.02 s, flat 0.63-0.65 s. Only small
# helpers (:func:`_filled`, :func:`_finish`) stay inlined. The sorted kernel, rare
# (coalescing, a sorted CSR), calls this one (an ordinary call: compiled and cached once).
@njit(**_JIT)
def _adjacency_unsorted_kernel(src, dst, w, has_w, n, loops, fill, norm, transposed, out_dtype_val):
    """The edges counting-sorted on their target (stable: each row in edge order),
    self-loops handled by ``loops`` (appended loops last in their rows), weights
    (``NORM_MEAN`` applied, then :func:`_finish`): ``(rowptr (n+1,), col, val, entry,
    colptr, row, perm)`` as :func:`adjacency_csr` documents them."""
    q = src.shape[0]
    add = 1 if loops != LOOPS_KEEP else 0
    drop = loops == LOOPS_REMAINING or loops == LOOPS_REPLACE
    if loops == LOOPS_REMAINING and not has_w:
        fill = 1.0  # (PyG's add_remaining_self_loops ignores fill_value without edge weights)
    loopw = _filled(n * add, out_dtype_val, fill)
    rowptr = _filled(n + 1, src, 0)  # (first the kept in-edges of row i at i + 1)
    for e in range(q):
        if drop and src[e] == dst[e]:
            if loops == LOOPS_REMAINING:
                loopw[src[e]] = w[e] if has_w else 1.0
            continue
        rowptr[dst[e] + 1] += 1
    nxt = empty_array(n, src)
    for i in range(n):
        nxt[i] = rowptr[i]  # (the running sum so far: row i's first entry)
        rowptr[i + 1] += rowptr[i] + add
    col = empty_array(rowptr[n], src)
    val = empty_array(rowptr[n], out_dtype_val)
    entry = _filled(q + n * add, src, -1)
    for e in range(q):
        if drop and src[e] == dst[e]:
            continue
        i = dst[e]
        p = nxt[i]
        nxt[i] = p + 1
        col[p] = src[e]
        entry[e] = p
        x = w[e] if has_w else 1.0
        if norm == NORM_MEAN:
            x = x / max(rowptr[i + 1] - rowptr[i] - add, 1)
        val[p] = x
    if add:
        for i in range(n):
            p = nxt[i]
            col[p] = i
            entry[q + i] = p
            val[p] = loopw[i]
    colptr, trow, tperm = _finish(rowptr, col, val, norm, transposed)
    return rowptr, col, val, entry, colptr, trow, tperm


@njit(**_JIT)
def _adjacency_sorted_kernel(src, dst, w, has_w, n, loops, fill, norm, coalesce, transposed, out_dtype_val):
    rowptr, col, val, entry, _, _, _ = _adjacency_unsorted_kernel(
        src, dst, w, has_w, n, loops, fill, NORM_MEAN if norm == NORM_MEAN else NORM_NONE, False, out_dtype_val,
    )
    order = empty_array(col.shape[0], src)  # (input edge, or q + v for node v's loop, of each entry)
    for e in range(entry.shape[0]):
        if entry[e] >= 0:
            order[entry[e]] = e
    _sort_rows(rowptr, col, val, True, order)
    if coalesce:
        _coalesce(rowptr, col, val, True, order, entry)
    else:
        _entries(order, entry)
    colptr, trow, tperm = _finish(rowptr, col, val, NORM_NONE if norm == NORM_MEAN else norm, transposed)
    return rowptr, col, val, entry, colptr, trow, tperm


def adjacency_csr(
    edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int, *, dtype: torch.dtype,
    loops: int, fill: float = 1.0, norm: int = NORM_NONE, coalesce: bool = True, sort: bool = True, transposed: bool = False,
    check: bool = True,
):
    """A propagation matrix of ``edge_index (2, q)`` (row 0 = source, row 1 = target)
    as CSR arrays, in one pass: ``(rowptr (n+1,), col (nnz,), val (nnz,) dtype, entry
    (q,))``, rows = targets, columns = sources; with ``sort`` (the default) each row's
    entries sorted by source, stably, else in edge order (the counting sort on the
    target is stable) with the appended loops last: an SpMM needs no order within a
    row, and the per-row sorts are most of the build's time (a batch of 32 small
    graphs, ~4,200 entries: 81 -> 14 us without sorting or coalescing).
    ``transposed=True`` appends the CSC dual of the result, as :func:`csr_to_csc`
    returns it (``colptr (n+1,), row (nnz,), perm (nnz,)``: the walk of ``A^T`` a
    backward takes), computed in the same kernel call.

    ``loops`` one of :data:`LOOPS_KEEP`, ``LOOPS_REMAINING`` (PyG's
    ``add_remaining_self_loops(fill_value=fill)``, which, as PyG's, gives new loops
    weight 1 whatever ``fill`` when ``edge_weight`` is None), ``LOOPS_DIAGONAL`` (``fill`` added
    on the diagonal), ``LOOPS_REPLACE``; ``norm`` one of :data:`NORM_NONE`,
    ``NORM_SYMMETRIC`` (``gcn_norm``; zero degree -> 0, as PyG's ``inf -> 0``),
    ``NORM_MEAN``. Weights are ``edge_weight`` (1 when None) in ``dtype``.
    ``coalesce`` (needs ``sort``; implies it) sums duplicate (target, source)
    entries; without it duplicates are separate entries, which every product sums
    (the matrix is the same either way; summation order differs from PyG's scatter by
    float rounding).
    ``entry ((q + n,) when loops are appended, else (q,))``: ``entry[e]`` the CSR
    position of edge ``e`` (-1 for a self-loop dropped by ``LOOPS_REMAINING`` /
    ``LOOPS_REPLACE``), ``entry[q + v]`` that of node ``v``'s appended loop.

    CPU, ``dtype`` float32/float64 (:func:`supported`). ``check`` (default True)
    validates ``edge_index`` (ids in ``[0, num_nodes)``), ``edge_weight``, ``dtype``,
    ``loops`` and ``norm`` first; ``check=False`` is for :class:`corgnn.Graph`, which
    checked them when it was made.

    Raises:
        TypeError / ValueError: with ``check``, an argument of another type, shape or range.
    """
    if check:
        check_edge_index(edge_index, num_nodes)
        check_edge_weight(edge_weight, edge_index.size(1))
        if dtype not in _NUMBA_DTYPES:
            raise TypeError(f"adjacency_csr: dtype must be torch.float32 or torch.float64, got {dtype}")
        if loops not in (LOOPS_KEEP, LOOPS_REMAINING, LOOPS_DIAGONAL, LOOPS_REPLACE) or norm not in (NORM_NONE, NORM_SYMMETRIC, NORM_MEAN):
            raise ValueError(f"adjacency_csr: loops must be one of the LOOPS_* and norm one of the NORM_* constants, got loops={loops!r}, norm={norm!r}")
    load_target()
    ei = edge_index.contiguous().numpy()
    w = edge_weight.detach().to(dtype).contiguous().numpy() if edge_weight is not None else np.empty(0, dtype=_np_dtype(dtype))
    proto = np.empty(0, dtype=_np_dtype(dtype))
    if sort or coalesce:
        ptr, col, val, entry, colptr, row, perm = _adjacency_sorted_kernel(
            ei[0], ei[1], w, edge_weight is not None, num_nodes, loops, fill, norm, coalesce, transposed, proto,
        )
    else:
        ptr, col, val, entry, colptr, row, perm = _adjacency_unsorted_kernel(
            ei[0], ei[1], w, edge_weight is not None, num_nodes, loops, fill, norm, transposed, proto,
        )
    nnz = int(ptr[-1])
    out = (torch.from_numpy(ptr), torch.from_numpy(col[:nnz]), torch.from_numpy(val[:nnz]), torch.from_numpy(entry))
    if transposed:
        out += (torch.from_numpy(colptr), torch.from_numpy(row), torch.from_numpy(perm))
    return out


@njit(**_JIT)
def _mean_weights_kernel(target, w, has_w, n, proto):
    q = target.shape[0]
    count = _filled(n, target, 0)  # (counted exactly, then cast: torch's bincount(...).to(dtype))
    for e in range(q):
        count[target[e]] += 1
    deg = empty_array(n, proto)
    for i in range(n):
        deg[i] = count[i]
    out = empty_array(q, proto)
    for e in range(q):
        out[e] = w[e] if has_w else 1.0
    for e in range(q):  # (both in the values' dtype: the quotient rounds as torch's)
        out[e] /= deg[target[e]]
    return out


def mean_weights(target: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int, *, dtype: torch.dtype, check: bool = True) -> torch.Tensor:
    """PyG's mean aggregation as one weight per edge, in one pass: ``(q,)`` of ``dtype``,
    ``edge_weight[e]`` (1 when None) over the number of edges into ``target[e]``
    (duplicates counted), exactly :func:`corgnn.graph.aggr_edge_weights`'s ``"mean"``
    (the count is held in ``dtype``, as there, so the quotients round alike), without
    its gradient: ``edge_weight`` is read as a constant.

    ``target (q,)`` int64 ids in ``[0, num_nodes)`` (``edge_index[1]``), CPU, ``dtype``
    float32/float64 (:func:`supported`). ``check`` (default True) validates them
    first; ``check=False`` is for :class:`corgnn.Graph`, which checked its edges when
    it was made.

    NOTE (issue 21, measured 2026-11-29, 2-core VM): torch's ops for the same weights
    (``ones``, ``bincount``, ``clamp_min``, a cast, a gather and a division) took
    ~30 us on a mini-batch of 32 small graphs (3,400 edges) alone and ~50 us inside a
    training loop, on every new batch a SAGE layer's edge list (the mean
    aggregation) is made for.

    Raises:
        TypeError / ValueError: with ``check``, an argument of another type, shape or range.
    """
    if check:
        if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() or target.dtype == torch.bool or target.dim() != 1:
            raise TypeError(f"mean_weights: target must be a 1-D integer tensor, got {getattr(target, 'dtype', type(target).__name__)} {tuple(getattr(target, 'shape', ()))}")
        if target.device.type != "cpu":
            raise ValueError(f"mean_weights: target must be on the CPU, got {target.device}")
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
            raise ValueError(f"mean_weights: num_nodes must be a non-negative int, got {num_nodes!r}")
        if target.numel():
            lo, hi = index_stats(*torch.aminmax(target))
            if lo < 0 or hi >= num_nodes:
                raise ValueError(f"mean_weights: target must lie in [0, {num_nodes}), found {lo if lo < 0 else hi}")
        check_edge_weight(edge_weight, target.numel())
        if dtype not in _NUMBA_DTYPES:
            raise TypeError(f"mean_weights: dtype must be torch.float32 or torch.float64, got {dtype}")
    load_target()
    proto = np.empty(0, dtype=_np_dtype(dtype))
    w = edge_weight.detach().to(dtype).contiguous().numpy() if edge_weight is not None else proto
    return torch.from_numpy(_mean_weights_kernel(target.long().contiguous().numpy(), w, edge_weight is not None, num_nodes, proto))


def _np_dtype(dtype: torch.dtype):
    return np.float32 if dtype == torch.float32 else np.float64


def csr_to_csc(rowptr: torch.Tensor, col: torch.Tensor, num_cols: int, *, check: bool = True):
    """``(colptr (m+1,), row (nnz,), perm (nnz,))`` int64 of the CSC of a CSR pattern
    (CPU): column-major, rows ascending within a column; ``perm[t]`` the CSR position
    of CSC entry ``t``. One counting sort, O(nnz + n + m).

    ``check`` (default True) validates the pattern first as the CSR constructor does
    (``rowptr`` from 0 to ``nnz``, non-decreasing; ``col`` in ``[0, num_cols)``);
    ``check=False`` is for a CSR's own arrays, checked when it was made.

    Raises:
        TypeError / ValueError: with ``check``, an argument of another type, shape or range.
    """
    if check:
        validate_compressed(rowptr, col, (rowptr.numel() - 1, num_cols), "csr_to_csc", "rowptr", "col", check=True)
    load_target()
    colptr, row, perm = _csr_to_csc_kernel(rowptr.contiguous().numpy(), col.contiguous().numpy(), num_cols)
    return torch.from_numpy(colptr), torch.from_numpy(row), torch.from_numpy(perm)


def _check_entries(what: str, row: torch.Tensor, col: torch.Tensor, val: torch.Tensor | None, n: int) -> None:
    """:func:`coo_to_csr`'s checks: integer ``row, col (q,)``, ``val`` None or ``(q,)``,
    ``row`` in ``[0, n)``, ``col`` non-negative (its kernel indexes by ``row`` only)."""
    for name, t in (("row", row), ("col", col)):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.dim() != 1:
            raise TypeError(f"{what}: {name} must be a 1-D integer tensor, got {getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if col.numel() != row.numel() or (val is not None and tuple(val.shape) != (row.numel(),)):
        raise ValueError(f"{what}: row, col and val must hold one value per entry, got {row.numel()}, {col.numel()}, {None if val is None else tuple(val.shape)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{what}: n must be a non-negative int, got {n!r}")
    if row.numel():
        lo, hi, low_col = index_stats(*torch.aminmax(row), col.min())
        if lo < 0 or hi >= n:
            raise ValueError(f"{what}: row must lie in [0, {n}), found {lo if lo < 0 else hi}")
        if low_col < 0:
            raise ValueError(f"{what}: col must be non-negative, found {low_col}")
