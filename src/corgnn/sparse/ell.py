"""ELLPACK (ELL) and hybrid CSR+COO formats.

Paper appendix "Sparse Formats" (§ELLPACK Format, §Hybrid Formats). Both are built
from a CSR (``from_csr``, reached through :func:`corgnn.sparse.convert` or
``Graph.gcn_adjacency(format="ell" | "hybrid")``, which caches the result per graph),
and convert back with ``to_csr()`` / ``to_coo()``.

ELL
    ``col (n, p)`` int32 column matrix, ``p`` = the longest row; the padded value
    matrix ``V (n, p)`` (:meth:`ELL.values_padded`, built once and cached);
    ``lengths (n,)`` int64 entries per row. Padding is always a row's tail: padding
    slots hold column ``-1`` and value ``0`` and kernels stop at ``lengths[i]``, so
    they never read it. Indices are int32 (4 bytes, as in the paper's I/O model)
    because ``n * p`` is the dominant storage: the synthetic OGB-Arxiv stand-in has
    ``p`` = 493, i.e. 83 M slots for 1.3 M entries.

Hybrid CSR+COO
    The first ``t`` entries of each row in a CSR part (:attr:`Hybrid.head`), the
    rest in a row-sorted COO part (:attr:`Hybrid.tail`). ``t`` =
    :func:`hybrid_threshold`: the 90th percentile of the row lengths (at least 1),
    so 90 % of the rows lie wholly in the CSR part, which is then balanced (no row
    holds more than ``t`` entries), and only the long rows' tails go to the COO
    part, whose kernel splits entries, not rows, evenly over threads.

Entry order (the order of ``val`` and of per-entry values given to or returned by
:func:`corgnn.sparse.spmm` / :func:`corgnn.sparse.sddmm`)
    ELL: row-major over the stored (non-padding) slots, i.e. exactly the order of
    the CSR it came from (``ELL.val`` *is* that CSR's ``val``, no copy).
    Hybrid: the CSR part's entries (row-major), then the COO part's (row-major);
    ``csr_pos[e]`` is the CSR position of hybrid entry ``e``.

Both formats reuse the CSR's compressed-row plans (:meth:`SparseFormat.row_plan`)
for the products they cannot walk themselves (``A^T B``, edge softmax): the plan's
permutation is composed with the entry-order map, so ``A^T`` is never materialised.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, InitVar, dataclass, field

import torch

from .._validate import check_index, check_shape, index_stats
from .formats import COO, CSR, SparseFormat, cache_entry, cached_for, check_values, nbytes_of, ptr_from_sorted

__all__ = ["ELL", "Hybrid", "hybrid_threshold", "HYBRID_PERCENTILE"]

#: Percentile of the row lengths used as the hybrid CSR-part width ``t``.
HYBRID_PERCENTILE = 90.0

ELL_KERNEL_MAX_PADDING = 4.0
"""ELL runs its own kernels up to this padding ratio ``n p / nnz``, the row plan above
(:attr:`ELL.kernel_max_padding`).

NOTE (measured, SpMM f=64, 2 cores, medians of 9): the ELL kernel's rows lie ``p``
slots apart, so with heavy padding every row starts on a fresh cache line and page:
native vs row plan was 134 vs 145 ms at padding 1.0 (a regular 200k-node graph),
164 vs 172 ms at 2.9, 158 vs 152 ms at 5.7, and 134 vs 106 ms at 62.7 (the
OGB-Arxiv stand-in); SDDMM alike. Both walk the same entries in the same order.
"""


def hybrid_threshold(degrees: torch.Tensor, percentile: float = HYBRID_PERCENTILE) -> int:
    """Width ``t`` of the hybrid format's CSR part: the nearest-rank ``percentile``
    of the row lengths ``degrees (n,)``, at least 1 (0 for a matrix without entries).

    Raises:
        ValueError: ``percentile`` outside ``[0, 100]``.
    """
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    n = degrees.numel()
    if n == 0 or int(degrees.max()) == 0:
        return 0
    rank = max(1, math.ceil(percentile / 100.0 * n))  # nearest-rank percentile
    t = int(torch.sort(degrees.flatten()).values[rank - 1])
    return max(1, t)


def _slots(csr: CSR) -> torch.Tensor:
    """Slot (position within its row) of every CSR entry, ``(nnz,)`` int64."""
    row = csr.row()
    return torch.arange(csr.nnz, device=csr.device) - csr.rowptr[:-1].index_select(0, row)


@dataclass(eq=False, repr=False)
class ELL(SparseFormat):
    """ELLPACK: ``col (n, p)`` int32 (padding ``-1``), ``lengths (n,)`` int64, ``val``.

    ``val`` is ``(nnz,)`` / ``(nnz, h)`` in row-major slot order (the source CSR's
    order) or ``None``; the padded value matrix is :meth:`values_padded`.
    """

    col: torch.Tensor
    lengths: torch.Tensor
    val: torch.Tensor | None
    shape: tuple[int, int]
    _: KW_ONLY
    check: InitVar[bool] = True
    _csr: "CSR | None" = field(default=None, init=False)
    _padded: tuple | None = field(default=None, init=False)  # (cache_entry of values_padded())
    _plans: dict = field(default_factory=dict, init=False)

    name = "ell"
    kernel_max_padding = ELL_KERNEL_MAX_PADDING
    """Padding ratio up to which :meth:`spmm_kernel` / :meth:`sddmm_kernels` pick the
    ELL kernels (above it the row plan runs)."""

    def __post_init__(self, check: bool):
        self.shape = n, m = check_shape(self.shape, "ELL")
        check_index(self.col, "col", "ELL", dim=2, dtype=torch.int32)
        check_index(self.lengths, "lengths", "ELL", device=self.col.device)
        if self.col.size(0) != n:
            raise ValueError(f"ELL: col must have shape ({n}, p), got {tuple(self.col.shape)}")
        if self.lengths.shape != (n,):
            raise ValueError(f"ELL: lengths must have shape ({n},), got {tuple(self.lengths.shape)}")
        if check and not torch.compiler.is_compiling() and self.col.device.type != "meta":
            # every row: its first lengths[i] slots hold columns in [0, m), the rest -1
            p = self.col.size(1)
            stored = torch.arange(p, device=self.col.device) < self.lengths.unsqueeze(1)
            lo_len, hi_len, bad_pad, bad_col, nnz = index_stats(
                *(torch.aminmax(self.lengths) if n else (torch.zeros((), dtype=torch.long, device=self.col.device),) * 2),
                (self.col[~stored] != -1).sum(),
                ((self.col < 0) | (self.col >= m))[stored].sum(),
                self.lengths.sum(),
            )
            if lo_len < 0 or hi_len > p:
                raise ValueError(f"ELL: lengths must lie in [0, p] = [0, {p}], found {lo_len if lo_len < 0 else hi_len}")
            if bad_col:
                raise ValueError(f"ELL: col must lie in [0, {m}) in each row's first lengths[i] slots ({bad_col} entries outside)")
            if bad_pad:
                raise ValueError(f"ELL: col must hold -1 in the padding slots past lengths[i] ({bad_pad} slots differ)")
            check_values(self.val, nnz, "ELL")
        elif self.val is not None and self.val.dim() not in (1, 2):
            raise ValueError(f"ELL: values must have shape (nnz,) or (nnz, heads), got {tuple(self.val.shape)}")

    @staticmethod
    def from_csr(csr: CSR) -> "ELL":
        """ELL of ``csr`` (entries in CSR order; duplicates stay separate slots)."""
        n = csr.shape[0]
        lengths = csr.degrees()
        p = int(lengths.max()) if n else 0
        col = torch.full((n, p), -1, dtype=torch.int32, device=csr.device)
        if csr.nnz:
            col[csr.row(), _slots(csr)] = csr.col.to(torch.int32)
        out = ELL(col, lengths.contiguous(), csr.val, csr.shape, check=False)
        out._csr = csr
        return out

    @classmethod
    def from_format(cls, A):
        return cls.from_csr(A.to_csr())

    @property
    def nnz(self) -> int:
        return self.to_csr().nnz

    @property
    def width(self) -> int:
        """``p``: slots per row (the longest row's length)."""
        return self.col.size(1)

    def padding_ratio(self) -> float:
        """Stored slots per entry, ``n * p / nnz`` (1.0 = no padding)."""
        return self.col.numel() / max(self.nnz, 1)

    def index_tensors(self):
        return (self.col, self.lengths)

    def nbytes(self) -> int:
        """Bytes of ``Col (n, p)``, ``lengths (n,)`` and, with values, the padded
        ``V (n, p[, h])`` (the paper's ELL storage plus the row lengths)."""
        vb = 0 if self.val is None else self.col.numel() * self.val.element_size() * (self.val.size(1) if self.val.dim() == 2 else 1)
        return nbytes_of(self.col, self.lengths) + vb

    def values_padded(self, val: torch.Tensor | None = None) -> torch.Tensor | None:
        """Padded value matrix ``V (n, p)`` (or ``(n, p, h)``), zeros in the padding.

        ``val=None`` gives ``self.val``'s matrix, built once and cached; other
        per-entry values (in ELL order) are padded afresh (``n * p`` writes: the
        format's cost on graphs with hubs, paper §ELLPACK).
        """
        if val is None:
            if self.val is None:
                return None
            padded = cached_for(self._padded, self.val)
            if padded is None:
                padded = self._pad(self.val)
                self._padded = cache_entry(self.val, padded)
            return padded
        return self._pad(val)

    def _pad(self, val: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((self.shape[0], self.width) + tuple(val.shape[1:]), dtype=val.dtype, device=val.device)
        if self.nnz:
            slots = self._plans.get("slots")
            if slots is None:  # (row, slot) of every entry, pattern-only: cached
                csr = self.to_csr()
                slots = self._plans["slots"] = (csr.row(), _slots(csr))
            out[slots] = val
        return out

    def to_csr(self) -> CSR:
        if self._csr is None:
            mask = self.col >= 0  # row-major boolean indexing keeps ELL order
            rowptr = torch.zeros(self.shape[0] + 1, dtype=torch.long, device=self.device)
            torch.cumsum(self.lengths, 0, out=rowptr[1:])
            self._csr = CSR(rowptr, self.col[mask].long(), self.val, self.shape, check=False)
        return self._csr

    def to_coo(self) -> COO:
        return self.to_csr().to_coo()

    def _make_row_plan(self, transpose: bool):
        return self.to_csr().row_plan(transpose)  # same entry order as the CSR

    def _kernels_pay(self) -> bool:
        return self.padding_ratio() <= self.kernel_max_padding

    def spmm_kernel(self, val, transpose):
        if transpose or not self._kernels_pay():
            return None
        V = None if val is None else self.values_padded(None if val is self.val else val)
        return "spmm_ell", (self.col, self.lengths, V)

    def sddmm_kernels(self, val):
        if not self._kernels_pay():
            return None
        return [("sddmm_ell", (self.col, self.lengths, self.to_csr().rowptr[:-1], val))]

    def with_values(self, val) -> "ELL":
        """Same pattern (and plans) with other values in ELL entry order."""
        out = ELL(self.col, self.lengths, val, self.shape, check=False)
        out._csr = self.to_csr().with_values(val)
        out._plans = self._plans
        return out


@dataclass(eq=False, repr=False)
class Hybrid(SparseFormat):
    """Hybrid CSR+COO: ``head`` (CSR, first ``t`` entries of each row) and ``tail``
    (row-sorted COO, the rest). ``val`` = ``cat(head.val, tail.val)`` (views of it).

    ``csr_pos (nnz,)`` int64: CSR position of each hybrid entry (for conversions and
    to read hybrid-ordered values in the CSR's plans).
    """

    head: CSR
    tail: COO
    t: int
    csr_pos: torch.Tensor
    val: torch.Tensor | None
    shape: tuple[int, int]
    _: KW_ONLY
    check: InitVar[bool] = True
    _csr: tuple | None = field(default=None, init=False)  # (cache_entry of the CSR)
    _plans: dict = field(default_factory=dict, init=False)

    name = "hybrid"

    def __post_init__(self, check: bool):
        self.shape = check_shape(self.shape, "Hybrid")
        if not isinstance(self.head, CSR) or not isinstance(self.tail, COO):
            raise TypeError(f"Hybrid: head must be a CSR and tail a COO, got {type(self.head).__name__} and {type(self.tail).__name__}")
        if isinstance(self.t, bool) or not isinstance(self.t, int) or self.t < 0:
            raise ValueError(f"Hybrid: t must be an int >= 0, got {self.t!r}")
        check_index(self.csr_pos, "csr_pos", "Hybrid", device=self.head.device)
        if self.tail.device != self.head.device:
            raise ValueError(f"Hybrid: tail is on {self.tail.device} but head is on {self.head.device}")
        if self.head.shape != self.shape or self.tail.shape != self.shape:
            raise ValueError(f"Hybrid: head {self.head.shape} and tail {self.tail.shape} must both have shape {self.shape}")
        if self.csr_pos.shape != (self.head.nnz + self.tail.nnz,):
            raise ValueError(f"Hybrid: csr_pos must have shape ({self.head.nnz + self.tail.nnz},), got {tuple(self.csr_pos.shape)}")
        check_values(self.val, self.csr_pos.numel(), "Hybrid")
        # head and tail validated themselves (a hand-built tail must be row-sorted: COO(..., sorted=True))
        if not self.tail.sorted:
            raise ValueError("Hybrid: tail must be a row-sorted COO (built with sorted=True)")
        q = self.csr_pos.numel()
        if check and q and not torch.compiler.is_compiling() and self.csr_pos.device.type != "meta":
            lo, hi = index_stats(*torch.aminmax(self.csr_pos))
            if lo < 0 or hi >= q:
                raise ValueError(f"Hybrid: csr_pos must lie in [0, {q}), found {lo if lo < 0 else hi}")

    @staticmethod
    def from_csr(csr: CSR, t: int | None = None) -> "Hybrid":
        """Split ``csr`` at width ``t`` (default :func:`hybrid_threshold`).

        Raises:
            ValueError: negative ``t``.
        """
        deg = csr.degrees()
        if t is None:
            t = hybrid_threshold(deg)
        if t < 0:
            raise ValueError(f"t must be >= 0, got {t}")
        in_head = _slots(csr) < t
        head_pos = torch.nonzero(in_head).flatten()
        tail_pos = torch.nonzero(~in_head).flatten()
        csr_pos = torch.cat([head_pos, tail_pos])
        row = csr.row()
        n = csr.shape[0]
        head_row = row.index_select(0, head_pos)
        head = CSR(ptr_from_sorted(head_row, n), csr.col.index_select(0, head_pos), None, csr.shape, check=False)
        head._row = head_row
        tail = COO(row.index_select(0, tail_pos), csr.col.index_select(0, tail_pos), None, csr.shape, sorted=True, check=False)
        val = None if csr.val is None else csr.val.index_select(0, csr_pos)
        out = Hybrid(head, tail, int(t), csr_pos, None, csr.shape, check=False).with_values(val)
        out._plans["csr"] = csr.with_values(None)
        out._csr = cache_entry(out.val, csr)
        return out

    @classmethod
    def from_format(cls, A):
        return cls.from_csr(A.to_csr())

    @property
    def nnz(self) -> int:
        return self.csr_pos.numel()

    def index_tensors(self):
        return (*self.head.index_tensors(), *self.tail.index_tensors())

    def nbytes(self) -> int:
        """Bytes of both parts' index and value arrays (``csr_pos`` excluded: a conversion cache)."""
        return nbytes_of(*self.index_tensors(), self.val)

    def csr_order(self) -> torch.Tensor:
        """Hybrid position of each CSR entry ``(nnz,)`` int64 (inverse of ``csr_pos``; cached)."""
        inv = self._plans.get("csr_order")
        if inv is None:
            inv = torch.empty_like(self.csr_pos)
            inv[self.csr_pos] = torch.arange(self.nnz, device=self.device)
            self._plans["csr_order"] = inv
        return inv

    def _pattern(self) -> CSR:
        """The CSR pattern (no values) of the same matrix, cached."""
        pat = self._plans.get("csr")
        if pat is None:
            order = self.csr_order()
            row = torch.cat([self.head.row(), self.tail.row]).index_select(0, order)
            col = torch.cat([self.head.col, self.tail.col]).index_select(0, order)
            pat = self._plans["csr"] = CSR(ptr_from_sorted(row, self.shape[0]), col, None, self.shape, check=False)
            pat._row = row
        return pat

    def to_csr(self) -> CSR:
        """The same matrix in CSR (values reordered into CSR order; cached)."""
        csr = cached_for(self._csr, self.val)
        if csr is None:
            pat = self._pattern()
            csr = pat if self.val is None else pat.with_values(self.val.index_select(0, self.csr_order()))
            self._csr = cache_entry(self.val, csr)
        return csr

    def to_coo(self) -> COO:
        row = torch.cat([self.head.row(), self.tail.row])
        col = torch.cat([self.head.col, self.tail.col])
        return COO(row, col, self.val, self.shape, check=False)

    def _make_row_plan(self, transpose: bool):
        # NOTE: the CSR's plan walks the same entries; its perm points at CSR
        # positions, composed here with csr_order() to point at hybrid positions.
        ptr, idx, perm = self._pattern().row_plan(transpose)
        order = self.csr_order()
        return ptr, idx, order if perm is None else order.index_select(0, perm)

    def spmm_kernel(self, val, transpose):
        if transpose:
            return None
        return "spmm_hybrid", (self.head.rowptr, self.head.col, self.tail.row, self.tail.col, val)

    def sddmm_kernels(self, val):
        q1 = self.head.nnz
        v1, v2 = (None, None) if val is None else (val[:q1], val[q1:])
        return [("sddmm_rows", (self.head.rowptr, self.head.col, None, v1)), ("sddmm_coo", (self.tail.row, self.tail.col, v2))]

    def with_values(self, val) -> "Hybrid":
        """Same pattern (and plans) with other values in hybrid entry order."""
        q1 = self.head.nnz
        head = self.head.with_values(None if val is None else val[:q1])
        tail = self.tail.with_values(None if val is None else val[q1:])
        out = Hybrid(head, tail, self.t, self.csr_pos, val, self.shape, check=False)
        out._plans = self._plans  # pattern-only caches: csr_order, the CSR pattern, plans
        return out
