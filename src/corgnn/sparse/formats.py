"""Sparse matrix formats: COO, CSR, CSC (and ELL / hybrid CSR+COO in :mod:`.ell`).

Paper appendix "Sparse Formats". Every format holds torch tensors (any device),
int64 indices, and optional values; ``val=None`` means a pattern whose entries are
all 1 (GAT supplies per-edge, per-head values at call time instead).

Entry order
    Each format has its own entry order: COO and CSR are row-major (sorted by row,
    then column, stably, duplicates kept unless ``coalesce=True``), CSC is
    column-major. Per-edge values passed to :func:`corgnn.sparse.spmm` or
    returned by :func:`corgnn.sparse.sddmm` are aligned with *the format's own*
    entry order. A CSC built from a CSR keeps ``perm``: ``perm[j]`` is the CSR
    position of CSC entry ``j``, so CSR-ordered values can be read through it
    without copying (DESIGN: "the csr->csc permutation").

Transposes are free: the CSR arrays of ``A`` are the CSC arrays of ``A^T`` and vice
versa (:meth:`CSR.t`, :meth:`CSC.t`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SparseFormat", "COO", "CSR", "CSC", "ptr_from_sorted"]


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def ptr_from_sorted(index: torch.Tensor, size: int) -> torch.Tensor:
    """Compressed pointer (size+1,) int64 from a sorted index vector."""
    counts = torch.bincount(index, minlength=size) if index.numel() else torch.zeros(size, dtype=torch.long, device=index.device)
    ptr = torch.zeros(size + 1, dtype=torch.long, device=index.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return ptr


def _check_values(val, nnz: int, what: str) -> None:
    if val is None:
        return
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        raise TypeError(f"{what}: values must be a floating tensor, got {getattr(val, 'dtype', type(val))}")
    if val.dim() not in (1, 2) or val.size(0) != nnz:
        raise ValueError(f"{what}: values must have shape ({nnz},) or ({nnz}, heads), got {tuple(val.shape)}")


class SparseFormat:
    """Common interface of every sparse format.

    Attributes:
        shape: ``(n, m)`` rows x columns.
        val: ``(nnz,)`` or ``(nnz, h)`` floating values in this format's entry
            order, or ``None`` for an all-ones pattern.
    """

    name: str = "?"
    shape: tuple[int, int]
    val: torch.Tensor | None

    registry: dict[str, type] = {}
    """Every format class by :attr:`name`, filled as each class is defined (the
    public view is :data:`corgnn.sparse.FORMATS`)."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name", "?") != "?":
            SparseFormat.registry[cls.name] = cls

    @classmethod
    def from_format(cls, A: "SparseFormat") -> "SparseFormat":
        """``A`` converted to this format (``A`` itself if it already is one)."""
        raise NotImplementedError  # pragma: no cover - overridden

    @property
    def nnz(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return self.index_tensors()[0].device

    def index_tensors(self) -> tuple[torch.Tensor, ...]:  # pragma: no cover - overridden
        raise NotImplementedError

    def row_plan(self, transpose: bool = False):
        """Compressed-row walk of ``op(A)`` (``A`` or ``A^T``), cached.

        Returns ``(ptr, idx, perm)``: ``ptr (rows(op(A))+1,)``, ``idx (nnz,)`` column
        of each walked entry, ``perm (nnz,)`` position of that entry in this
        format's own value order, or ``None`` when the walk follows it already.
        The CPU kernels and the CUDA fallback run on this plan.
        """
        key = bool(transpose)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_row_plan(key)
        return plan

    def _make_row_plan(self, transpose: bool):
        coo = self.to_coo()
        row, col = (coo.col, coo.row) if transpose else (coo.row, coo.col)
        n, m = (self.shape[1], self.shape[0]) if transpose else self.shape
        perm = torch.argsort(row * max(m, 1) + col, stable=True)
        return ptr_from_sorted(row[perm], n), col[perm].contiguous(), perm

    def nbytes(self) -> int:
        """Bytes held by index and value arrays (lazy caches excluded)."""
        return _nbytes(*self.index_tensors(), self.val)

    def to_coo(self) -> "COO":
        raise NotImplementedError

    def to_csr(self) -> "CSR":
        return self.to_coo().to_csr()

    def to_csc(self) -> "CSC":
        return self.to_csr().to_csc()

    def to(self, name: str) -> "SparseFormat":
        """Convert to the format called ``name`` (a key of :attr:`registry`).

        Raises:
            ValueError: unknown format name.
        """
        cls = SparseFormat.registry.get(name)
        if cls is None:
            raise ValueError(f"format must be one of {tuple(SparseFormat.registry)}, got {name!r}")
        return self if isinstance(self, cls) else cls.from_format(self)

    def to_dense(self) -> torch.Tensor:
        """Dense ``(n, m)`` matrix (duplicates summed); for tests and small graphs."""
        coo = self.to_coo()
        val = coo.val if coo.val is not None else torch.ones(coo.nnz, device=coo.device)
        if val.dim() != 1:
            raise ValueError("to_dense() needs single-head values (nnz,)")
        out = torch.zeros(self.shape, dtype=val.dtype, device=val.device)
        out.index_put_((coo.row, coo.col), val, accumulate=True)
        return out

    def __repr__(self) -> str:
        v = "pattern" if self.val is None else f"val={tuple(self.val.shape)} {self.val.dtype}"
        return f"{type(self).__name__}(shape={self.shape}, nnz={self.nnz}, {v}, device={self.device})"


@dataclass(eq=False, repr=False)
class COO(SparseFormat):
    """Coordinate format: ``row (nnz,)``, ``col (nnz,)`` int64, ``val``."""

    row: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor | None
    shape: tuple[int, int]
    sorted: bool = False  # row-major sorted (as built by CSR.to_coo)
    _csr: "CSR | None" = field(default=None, init=False)
    _plans: dict = field(default_factory=dict, init=False)

    name = "coo"

    def __post_init__(self):
        if self.row.shape != self.col.shape or self.row.dim() != 1:
            raise ValueError(f"COO: row and col must be 1-D of equal length, got {tuple(self.row.shape)} and {tuple(self.col.shape)}")
        _check_values(self.val, self.row.numel(), "COO")

    @property
    def nnz(self) -> int:
        return self.row.numel()

    def index_tensors(self):
        return (self.row, self.col)

    def to_coo(self) -> "COO":
        return self

    @classmethod
    def from_format(cls, A):
        return A.to_coo()

    def _make_row_plan(self, transpose: bool):
        if self.sorted and not transpose:
            return ptr_from_sorted(self.row, self.shape[0]), self.col, None
        return super()._make_row_plan(transpose)

    def to_csr(self, coalesce: bool = False) -> "CSR":
        """The same matrix in CSR (cached); ``coalesce=True`` sums duplicate entries
        (see :meth:`CSR.from_coo`) and returns a new, uncached CSR."""
        if self._csr is None or coalesce:
            csr = CSR.from_coo(self.row, self.col, self.val, self.shape, coalesce=coalesce)
            if coalesce:
                return csr
            self._csr = csr
        return self._csr

    def t(self) -> "COO":
        return COO(self.col, self.row, self.val, (self.shape[1], self.shape[0]))

    def with_values(self, val) -> "COO":
        return COO(self.row, self.col, val, self.shape, self.sorted)


@dataclass(eq=False, repr=False)
class CSR(SparseFormat):
    """Compressed sparse row: ``rowptr (n+1,)``, ``col (nnz,)`` int64, ``val``.

    Lazy caches: the row index of every entry (:meth:`row`) and the CSC dual with
    its permutation (:meth:`to_csc`), each built once on first use.
    """

    rowptr: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor | None
    shape: tuple[int, int]
    _row: torch.Tensor | None = field(default=None, init=False)
    _csc: "CSC | None" = field(default=None, init=False)
    _plans: dict = field(default_factory=dict, init=False)

    name = "csr"

    def __post_init__(self):
        if self.rowptr.dim() != 1 or self.rowptr.numel() != self.shape[0] + 1:
            raise ValueError(f"CSR: rowptr must have shape ({self.shape[0] + 1},), got {tuple(self.rowptr.shape)}")
        _check_values(self.val, self.col.numel(), "CSR")

    @staticmethod
    def from_coo(row, col, val, shape, coalesce: bool = False) -> "CSR":
        """Build from unsorted COO arrays (stable row-major sort).

        ``coalesce=True`` sums duplicate entries (GCN); otherwise duplicates are
        kept as separate entries (GAT treats each as its own edge, like PyG). A
        pattern (``val=None``, entries worth 1) with duplicates coalesces into
        values equal to each entry's multiplicity (default float dtype), so the
        matrix is unchanged; without duplicates it stays a pattern.
        """
        n, m = shape
        if row.numel() and row.device.type == "cpu" and (val is None or val.dtype in (torch.float32, torch.float64)):
            # NOTE: counting sorts (sparse/build.py), O(q): the same entries, order and sums
            from .build import coo_to_csr

            counts = coalesce and val is None  # (a coalesced pattern holds multiplicities)
            v = torch.ones(row.numel(), dtype=torch.get_default_dtype()) if counts else val
            ptr, c, v, _ = coo_to_csr(row.long(), col.long(), v, n, coalesce=coalesce)
            if counts and c.numel() == row.numel():
                v = None  # no duplicates: still a pattern
            return CSR(ptr, c, v, (n, m))
        if row.numel():
            key = row * max(m, 1) + col
            if coalesce:
                key, inv = torch.unique(key, sorted=True, return_inverse=True)
                if val is None and key.numel() < row.numel():
                    val = torch.ones(row.numel(), device=row.device)  # summed below: multiplicities
                if val is not None:
                    v = torch.zeros((key.numel(),) + tuple(val.shape[1:]), dtype=val.dtype, device=val.device)
                    v.index_add_(0, inv, val)
                    val = v
                row, col = key // max(m, 1), key % max(m, 1)
            else:
                perm = torch.argsort(key, stable=True)
                row, col = row[perm], col[perm]
                val = val[perm] if val is not None else None
        csr = CSR(ptr_from_sorted(row, n), col.contiguous(), None if val is None else val.contiguous(), (n, m))
        csr._row = row.contiguous()
        return csr

    @property
    def nnz(self) -> int:
        return self.col.numel()

    def index_tensors(self):
        return (self.rowptr, self.col)

    def row(self) -> torch.Tensor:
        """Row index of every entry ``(nnz,)`` int64 (cached)."""
        if self._row is None:
            counts = self.rowptr[1:] - self.rowptr[:-1]
            self._row = torch.repeat_interleave(torch.arange(self.shape[0], device=self.device), counts)
        return self._row

    def degrees(self) -> torch.Tensor:
        """Entries per row ``(n,)`` int64."""
        return self.rowptr[1:] - self.rowptr[:-1]

    def to_coo(self) -> COO:
        return COO(self.row(), self.col, self.val, self.shape, sorted=True)

    def _make_row_plan(self, transpose: bool):
        if not transpose:
            return self.rowptr, self.col, None
        csc = self.to_csc()  # CSC arrays of A are the CSR arrays of A^T
        return csc.colptr, csc.row, csc.perm

    def to_csr(self) -> "CSR":
        return self

    @classmethod
    def from_format(cls, A):
        return A.to_csr()

    def to_csc(self) -> "CSC":
        """The same matrix in CSC, with ``perm`` back to this CSR's entry order (cached)."""
        if self._csc is None:
            n, m = self.shape
            if self.device.type == "cpu":  # one counting sort on the column, O(nnz)
                from .build import csr_to_csc

                colptr, row, perm = csr_to_csc(self.rowptr, self.col, m)
            else:
                key = self.col * max(n, 1) + self.row()
                perm = torch.argsort(key, stable=True)
                row = self.row()[perm]
                colptr = ptr_from_sorted(self.col[perm], m)
            val = self.val[perm] if self.val is not None else None
            self._csc = CSC(colptr, row, val, self.shape, perm=perm)
        return self._csc

    def t(self) -> "CSC":
        """``A^T`` as CSC sharing these arrays (no copy)."""
        return CSC(self.rowptr, self.col, self.val, (self.shape[1], self.shape[0]))

    def with_values(self, val) -> "CSR":
        """Same pattern (and caches) with other values in CSR entry order."""
        out = CSR(self.rowptr, self.col, val, self.shape)
        out._row = self._row
        out._plans = self._plans  # plans depend on the pattern only
        return out



@dataclass(eq=False, repr=False)
class CSC(SparseFormat):
    """Compressed sparse column: ``colptr (m+1,)``, ``row (nnz,)`` int64, ``val``.

    ``perm`` (optional, ``(nnz,)`` int64): CSR entry position of each CSC entry,
    set when the CSC was derived from a CSR.
    """

    colptr: torch.Tensor
    row: torch.Tensor
    val: torch.Tensor | None
    shape: tuple[int, int]
    perm: torch.Tensor | None = None
    _col: torch.Tensor | None = field(default=None, init=False)
    _dual: "CSC | None" = field(default=None, init=False)
    _plans: dict = field(default_factory=dict, init=False)

    name = "csc"

    def __post_init__(self):
        if self.colptr.dim() != 1 or self.colptr.numel() != self.shape[1] + 1:
            raise ValueError(f"CSC: colptr must have shape ({self.shape[1] + 1},), got {tuple(self.colptr.shape)}")
        _check_values(self.val, self.row.numel(), "CSC")

    @property
    def nnz(self) -> int:
        return self.row.numel()

    def index_tensors(self):
        return (self.colptr, self.row)

    def col(self) -> torch.Tensor:
        """Column index of every entry ``(nnz,)`` int64 (cached)."""
        if self._col is None:
            counts = self.colptr[1:] - self.colptr[:-1]
            self._col = torch.repeat_interleave(torch.arange(self.shape[1], device=self.device), counts)
        return self._col

    def to_coo(self) -> COO:
        return COO(self.row, self.col(), self.val, self.shape)

    def _make_row_plan(self, transpose: bool):
        if transpose:
            return self.colptr, self.row, None
        if self._dual is None:
            # CSR arrays of A = CSC arrays of A^T, whose perm points into our CSC order
            self._dual = self.t().to_csc()
        return self._dual.colptr, self._dual.row, self._dual.perm

    def to_csr(self) -> CSR:
        return self.t().to_csc().t()

    def to_csc(self) -> "CSC":
        return self

    @classmethod
    def from_format(cls, A):
        return A.to_csc()

    def t(self) -> CSR:
        """``A^T`` as CSR sharing these arrays (no copy)."""
        return CSR(self.colptr, self.row, self.val, (self.shape[1], self.shape[0]))

    def with_values(self, val) -> "CSC":
        return CSC(self.colptr, self.row, val, self.shape, perm=self.perm)
