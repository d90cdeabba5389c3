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

from dataclasses import KW_ONLY, InitVar, dataclass, field

import torch

from .._validate import (
    can_read, check_index, check_ptr, check_range, check_shape, check_sorted, index_stats, min_max, ptr_terms, validate_compressed, validate_coo,
)

__all__ = ["SparseFormat", "COO", "CSR", "CSC", "nbytes_of", "ptr_from_sorted", "check_values", "check_shape", "check_index", "index_stats", "VALIDATION_DOC"]

VALIDATION_DOC = """Validation: every public constructor checks, once and in O(nnz) vectorised
torch ops (one host sync), that indices are integer tensors of the documented dtype
and dimension on one device, that compressed pointers start at 0, never decrease
and end at the number of entries, and that every index lies inside ``shape``;
violations raise ``TypeError`` / ``ValueError`` naming the argument, so no kernel
ever reads out of bounds. ``check=False`` (keyword-only) skips the value checks for
arrays the library built itself; while ``torch.compile`` traces (fake tensors) only
the structural checks run."""


def nbytes_of(*tensors) -> int:
    """Bytes held by ``tensors`` (``None`` entries count 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _build_supported(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether the O(q) Numba builds (:mod:`corgnn.sparse.build`) run here now."""
    from .build import supported

    return supported(device, dtype)


def ptr_from_sorted(index: torch.Tensor, size: int) -> torch.Tensor:
    """Compressed pointer (size+1,) int64 from a sorted index vector."""
    counts = torch.bincount(index, minlength=size) if index.numel() else torch.zeros(size, dtype=torch.long, device=index.device)
    ptr = torch.zeros(size + 1, dtype=torch.long, device=index.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return ptr


_ptr_from_sorted = ptr_from_sorted  # NOTE: old name, still imported by nn/gcn.py and graph.py (the lead's files)


def check_values(val, nnz: int, what: str) -> None:
    """``val`` is ``None`` or a floating ``(nnz,)`` / ``(nnz, h)`` tensor.

    Raises:
        TypeError: not a floating tensor.
        ValueError: another shape.
    """
    if val is None:
        return
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        raise TypeError(f"{what}: values must be a floating tensor, got {getattr(val, 'dtype', type(val))}")
    if val.dim() not in (1, 2) or val.size(0) != nnz:
        raise ValueError(f"{what}: values must have shape ({nnz},) or ({nnz}, heads), got {tuple(val.shape)}")


def cache_entry(val: torch.Tensor | None, item) -> tuple:
    """``item`` (a conversion holding a copy of the values ``val``) kept with what it
    was made from: the tensor and its in-place version (:func:`cached_for`)."""
    return (val, values_version(val), item)


def cached_for(entry: tuple | None, val: torch.Tensor | None):
    """The item of :func:`cache_entry` ``entry`` when it was made from ``val`` as it is
    now (the same tensor, not written in place since), else None: a matrix's values
    written in place (``A.val.mul_(2)`` under ``no_grad``) are never read stale from a
    conversion's copy of them."""
    if entry is None or entry[0] is not val or entry[1] != values_version(val):
        return None
    return entry[2]


def values_version(val: torch.Tensor | None) -> int | None:
    """``val``'s in-place version counter (None: no values, or an inference tensor,
    which has none and cannot be written). Any tensor: a torch.sparse adjacency's too."""
    return None if val is None or val.is_inference() else val._version


class SparseFormat:
    """Common interface of every sparse format.

    Attributes:
        shape: ``(n, m)`` rows x columns.
        val: ``(nnz,)`` or ``(nnz, h)`` floating values in this format's entry
            order, or ``None`` for an all-ones pattern.
    """

    __doc__ += "\n" + VALIDATION_DOC

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

    @property
    def plans(self) -> dict:
        """This matrix's store of what is derived from its pattern: its row plans
        (:meth:`row_plan`) and the launchers :func:`corgnn.sparse.spmm` binds to them.
        Shared with :meth:`with_values` copies (one pattern), so an entry derived from
        values also records which values it used."""
        return self._plans

    def set_row_plan(self, transpose: bool, ptr: torch.Tensor, idx: torch.Tensor, perm: torch.Tensor | None = None, *, check: bool = True) -> None:
        """Install a precomputed compressed-row walk of ``op(A)`` (what
        :meth:`row_plan` would build): ``ptr (rows(op(A))+1,)``, ``idx`` and ``perm``
        ``(q,)`` int64 on this format's device (``perm=None``: the walk follows the
        format's own entry order). Per-entry arrays may run past ``ptr[-1]``
        (padding that is never read). Plans hold the pattern only, so copies made by
        ``with_values`` share them.

        ``check`` (default True) reads the arrays once: ``ptr`` starts at 0, never
        decreases and ends at ``nnz``; the walked ``idx`` lie in ``[0, columns of
        op(A))`` and ``perm`` in ``[0, nnz)``, so no kernel reads outside its operands.
        ``check=False`` is for arrays the library built itself (as the formats'
        constructors take it), whose shapes are still checked.

        Raises:
            TypeError / ValueError: an array of another dtype, dimension or length;
                with ``check``, a pointer or index out of its range.
        """
        what = f"{type(self).__name__}.set_row_plan"
        rows, cols = (self.shape[1], self.shape[0]) if transpose else self.shape
        check_index(ptr, "ptr", what)
        check_index(idx, "idx", what, device=ptr.device)
        if not torch.compiler.is_compiling() and ptr.numel() != rows + 1:
            raise ValueError(f"{what}: ptr must have shape ({rows + 1},) for op(A) with {rows} rows, got {tuple(ptr.shape)}")
        if perm is not None:
            check_index(perm, "perm", what, device=ptr.device)
            if perm.shape != idx.shape:
                raise ValueError(f"{what}: perm must have idx's shape {tuple(idx.shape)}, got {tuple(perm.shape)}")
        if check and can_read(ptr, idx):
            q = self.nnz
            if idx.numel() < q:
                raise ValueError(f"{what}: idx must hold at least nnz = {q} entries, got {idx.numel()}")
            walked = [idx[:q]] + ([] if perm is None else [perm[:q]])
            s = index_stats(*ptr_terms(ptr), *(m for t in walked for m in min_max(t)))
            check_ptr(s[:3], "ptr", what, q, "the matrix's entries")
            check_range(s[3:5], "idx", what, cols)
            if perm is not None:
                check_range(s[5:7], "perm", what, q)
        self._plans[bool(transpose)] = (ptr, idx, perm)

    def spmm_kernel(self, val: torch.Tensor | None, transpose: bool):
        """This format's own kernel for ``op(A) @ B`` with entry values ``val``:
        ``(name, args)`` of the :mod:`corgnn.sparse.library` op to call as
        ``op(*args, B)``, or ``None`` to walk :meth:`row_plan` (the default, and every
        format's choice for ``A^T B``). A new format with its own kernels overrides
        this (and :meth:`sddmm_kernels`) in its own file."""
        return None

    def sddmm_kernels(self, val: torch.Tensor | None):
        """This format's own SDDMM kernels: a list of ``(name, args)`` of
        :mod:`corgnn.sparse.library` ops, each called as ``op(*args, B, Ct)``, whose
        outputs concatenated are the per-entry results in this format's order; or
        ``None`` to walk the row plans (the default)."""
        return None

    def _make_row_plan(self, transpose: bool):
        coo = self.to_coo()
        row, col = (coo.col, coo.row) if transpose else (coo.row, coo.col)
        n, m = (self.shape[1], self.shape[0]) if transpose else self.shape
        perm = torch.argsort(row * max(m, 1) + col, stable=True)
        return ptr_from_sorted(row[perm], n), col[perm].contiguous(), perm

    def nbytes(self) -> int:
        """Bytes held by index and value arrays (lazy caches excluded)."""
        return nbytes_of(*self.index_tensors(), self.val)

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
    _: KW_ONLY
    check: InitVar[bool] = True
    _csr: tuple | None = field(default=None, init=False)  # (cache_entry of the CSR)
    _plans: dict = field(default_factory=dict, init=False)

    name = "coo"

    def __post_init__(self, check: bool):
        self.shape = validate_coo(self.row, self.col, self.shape, "COO", check=check, sorted_rows=bool(self.sorted))
        check_values(self.val, self.row.numel(), "COO")

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

    def spmm_kernel(self, val, transpose):
        """``spmm_coo`` (a scatter over the entries in their order, no row plan) for
        ``A^T B`` and for the ``A B`` of an unsorted COO on CPU, with single-head values; a
        row-sorted COO's ``A B`` walks its rows. Transposing a COO swaps its index
        arrays, so an ``edge_index`` read as a COO serves a forward and its backward
        with no build at all (:meth:`corgnn.Graph.aggr_adjacency`'s edge lists).
        Always the same kernel for the same product, so repeated products give the
        same sums bit for bit (a row plan built later, e.g. by an
        :func:`~corgnn.sparse.edge_softmax`, changes nothing here).

        NOTE (measured 2026-11-29, 2-core VM): scattering 4k entries (a batch of 32
        small graphs) at 64 columns took 18 us over two threads against 34 us for
        the row walk, and 68k entries (512 graphs) ~280 against 204 us plus the
        row plan's sort (~0.5 ms) the walk needs first."""
        if (self.sorted and not transpose) or (val is not None and val.dim() != 1) or self.row.device.type != "cpu":
            return None  # (on a GPU the row walks of cuSPARSE / Triton, as before)
        if transpose:
            return "spmm_coo", (self.col, self.row, val, self.shape[1])
        return "spmm_coo", (self.row, self.col, val, self.shape[0])

    def sddmm_kernels(self, val):
        # NOTE: COO SDDMM runs per entry: as fast as the row walk and needs no sorted order.
        return [("sddmm_coo", (self.row, self.col, val))]

    def _make_row_plan(self, transpose: bool):
        if self.sorted and not transpose:
            return ptr_from_sorted(self.row, self.shape[0]), self.col, None
        return super()._make_row_plan(transpose)

    def to_csr(self, coalesce: bool = False) -> "CSR":
        """The same matrix in CSR (cached); ``coalesce=True`` sums duplicate entries
        (see :meth:`CSR.from_coo`) and returns a new, uncached CSR."""
        csr = None if coalesce else cached_for(self._csr, self.val)
        if csr is None:
            csr = CSR.from_coo(self.row, self.col, self.val, self.shape, coalesce=coalesce, check=False)
            if coalesce:
                return csr
            self._csr = cache_entry(self.val, csr)
        return csr

    def t(self) -> "COO":
        return COO(self.col, self.row, self.val, (self.shape[1], self.shape[0]), check=False)

    def with_values(self, val) -> "COO":
        return COO(self.row, self.col, val, self.shape, self.sorted, check=False)


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
    _: KW_ONLY
    check: InitVar[bool] = True
    _row: torch.Tensor | None = field(default=None, init=False)
    _csc: tuple | None = field(default=None, init=False)  # (cache_entry of the CSC)
    _plans: dict = field(default_factory=dict, init=False)
    _rows: "tuple[torch.Tensor, CSR] | None" = field(default=None, init=False)  # nonempty_rows() of these values

    name = "csr"

    def __post_init__(self, check: bool):
        self.shape = validate_compressed(self.rowptr, self.col, self.shape, "CSR", "rowptr", "col", check=check)
        check_values(self.val, self.col.numel(), "CSR")

    @staticmethod
    def from_coo(row, col, val, shape, coalesce: bool = False, *, check: bool = True) -> "CSR":
        """Build from unsorted COO arrays (stable row-major sort).

        ``coalesce=True`` sums duplicate entries (GCN); otherwise duplicates are
        kept as separate entries (GAT treats each as its own edge, like PyG). A
        pattern (``val=None``, entries worth 1) with duplicates coalesces into
        values equal to each entry's multiplicity (default float dtype), so the
        matrix is unchanged; without duplicates it stays a pattern.

        Raises:
            TypeError / ValueError: ``row``, ``col``, ``val`` or ``shape`` invalid
                (see :class:`SparseFormat`), unless ``check=False``.
        """
        n, m = validate_coo(row, col, shape, "CSR.from_coo", check=check)
        check_values(val, row.numel(), "CSR.from_coo")
        if row.numel() and row.device.type == "cpu" and (val is None or val.dim() == 1) and _build_supported(row.device, None if val is None else val.dtype):
            # NOTE: counting sorts (sparse/build.py), O(q): the same entries, order and sums
            from .build import coo_to_csr

            counts = coalesce and val is None  # (a coalesced pattern holds multiplicities)
            v = torch.ones(row.numel(), dtype=torch.get_default_dtype()) if counts else val
            ptr, c, v, entry = coo_to_csr(row.long(), col.long(), v, n, coalesce=coalesce, check=False)
            if counts and c.numel() == row.numel():
                v = None  # no duplicates: still a pattern
            elif val is not None and val.requires_grad and torch.is_grad_enabled():
                v = val.new_zeros(c.numel()).index_add(0, entry, val)  # (the same sums, differentiable w.r.t. val)
            return CSR(ptr, c, v, (n, m), check=False)
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
        csr = CSR(ptr_from_sorted(row, n), col.contiguous(), None if val is None else val.contiguous(), (n, m), check=False)
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

    def head(self, rows: int) -> "CSR":
        """The first ``rows`` rows, ``A[:rows]`` ``(rows, m)``: views of this matrix's
        arrays, no copy (one read of ``rowptr[rows]``).

        Raises:
            ValueError: ``rows`` outside ``[0, n]``.
        """
        if not 0 <= rows <= self.shape[0]:
            raise ValueError(f"CSR.head: rows must be in [0, {self.shape[0]}], got {rows}")
        end = int(self.rowptr[rows])
        val = None if self.val is None else self.val[:end]
        return CSR(self.rowptr[: rows + 1], self.col[:end], val, (rows, self.shape[1]), check=False)

    def nonempty_rows(self) -> tuple[torch.Tensor, "CSR"]:
        """``(rows, A_r)``: the rows that hold at least one entry, ``(r,)`` int64
        ascending, and this matrix restricted to them, ``A_r = A[rows]`` ``(r, m)``.

        ``A_r`` shares ``col`` and ``val`` (the same entries in the same order, so
        per-entry values in ``A``'s order, e.g. a layer's differentiable edge
        values, are ``A_r``'s too) and, when ``A`` has its ``A^T`` walk, the same
        walk with the rows renumbered (no second counting sort). ``A X`` is zero in
        every other row, so a product that only needs ``A X``'s rows runs on ``r``
        rows: a neighbour-sampled subgraph's last hop (most of its nodes) has no
        incoming edges. The pattern is built once per matrix (cached with the
        plans), ``A_r`` once per matrix object (a dictionary read after that).
        """
        if self._rows is not None:
            return self._rows
        pattern = self._plans.get("rows")
        if pattern is None:
            rows = (self.rowptr[1:] != self.rowptr[:-1]).nonzero().squeeze(1)
            pattern = CSR(torch.cat([self.rowptr[rows], self.rowptr[-1:]]), self.col, None, (rows.numel(), self.shape[1]), check=False)
            walk = self._plans.get(True)
            if walk is not None:  # (A^T's rows are A's columns: the same walk, A's row ids renumbered 0..r-1)
                renumber = torch.empty(self.shape[0], dtype=torch.long, device=self.device)
                renumber[rows] = torch.arange(rows.numel(), device=self.device)
                pattern.set_row_plan(True, walk[0], renumber[walk[1]], walk[2], check=False)
            pattern = self._plans["rows"] = (rows, pattern)
        self._rows = (pattern[0], pattern[1].with_values(self.val))
        return self._rows

    def to_coo(self) -> COO:
        return COO(self.row(), self.col, self.val, self.shape, sorted=True, check=False)

    def _make_row_plan(self, transpose: bool):
        """The walk of ``A`` (this CSR's arrays) or of ``A^T``: the CSC dual's arrays
        (the CSR arrays of ``A^T``) with ``perm`` back to this CSR's entry order,
        without the CSC's values (:meth:`to_csc` adds them): a backward walks ``A^T``
        with ``A``'s values (or per-call ones) through ``perm``."""
        if not transpose:
            return self.rowptr, self.col, None
        n, m = self.shape
        if _build_supported(self.device, None):  # one counting sort on the column, O(nnz)
            from .build import csr_to_csc

            return csr_to_csc(self.rowptr, self.col, m, check=False)
        key = self.col * max(n, 1) + self.row()
        perm = torch.argsort(key, stable=True)
        return ptr_from_sorted(self.col[perm], m), self.row()[perm], perm

    def to_csr(self) -> "CSR":
        return self

    @classmethod
    def from_format(cls, A):
        return A.to_csr()

    def to_csc(self) -> "CSC":
        """The same matrix in CSC, with ``perm`` back to this CSR's entry order (cached)."""
        csc = cached_for(self._csc, self.val)
        if csc is None:
            plan = self._plans.get(True)  # (the arrays of A^T's walk, when built: shared)
            if plan is None or plan[1].numel() != self.nnz:  # (none yet, or an installed padded plan)
                plan = self._make_row_plan(True)
            colptr, row, perm = plan
            val = self.val.index_select(0, perm) if self.val is not None else None
            csc = CSC(colptr, row, val, self.shape, perm=perm, check=False)
            self._csc = cache_entry(self.val, csc)
        return csc

    def t(self) -> "CSC":
        """``A^T`` as CSC sharing these arrays (no copy)."""
        return CSC(self.rowptr, self.col, self.val, (self.shape[1], self.shape[0]), check=False)

    def with_values(self, val) -> "CSR":
        """Same pattern (and caches) with other values in CSR entry order."""
        out = CSR(self.rowptr, self.col, val, self.shape, check=False)
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
    _: KW_ONLY
    check: InitVar[bool] = True
    _col: torch.Tensor | None = field(default=None, init=False)
    _dual: "CSC | None" = field(default=None, init=False)
    _plans: dict = field(default_factory=dict, init=False)

    name = "csc"

    def __post_init__(self, check: bool):
        shape = check_shape(self.shape, "CSC")
        validate_compressed(self.colptr, self.row, (shape[1], shape[0]), "CSC", "colptr", "row", check=check)
        self.shape = shape
        check_values(self.val, self.row.numel(), "CSC")
        if self.perm is not None:
            check_index(self.perm, "perm", "CSC", device=self.row.device)
            if self.perm.numel() != self.row.numel():
                raise ValueError(f"CSC: perm must have shape ({self.row.numel()},), got {tuple(self.perm.shape)}")
            if check and can_read(self.perm):
                check_range(index_stats(*min_max(self.perm)), "perm", "CSC", self.row.numel())

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
        return COO(self.row, self.col(), self.val, self.shape, check=False)

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
        return CSR(self.colptr, self.row, self.val, (self.shape[1], self.shape[0]), check=False)

    def with_values(self, val) -> "CSC":
        return CSC(self.colptr, self.row, val, self.shape, perm=self.perm, check=False)
