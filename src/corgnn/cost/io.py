"""I/O model of SpMM and SDDMM per sparse format (paper appendix "Common Sparse
Operators", Tables 6-7), and the format choice built on it.

Units: FLOPs, bytes, FLOP/byte. Every stored value and every index is 4 bytes (the
paper's accounting; corgnn itself stores int64 indices except ELL's int32 column
matrix). The sparse matrix ``A`` is ``(n, n)`` with ``q = nnz`` stored entries and
the longest row ``p = max_degree``; dense operands have ``n`` rows and ``f`` columns.

SpMM ``C = A B`` (Table 6). FLOPs = ``2 q f`` (one multiply-add per entry and
column; ELL counts only its non-padding slots, as the paper does). Bytes:

=======  ====================================================================
CSR      ``4 (q + (n+1) + q + n f + 2 n f)``: values, row pointers, columns,
         ``B`` read once, ``C`` read *and* written (Listing 1 accumulates into
         ``C``: ``C[i, k] += ...``)
CSC      the same with column pointers (``m + 1 = n + 1``)
COO      ``4 (3 q + 3 n f)``: values, rows, columns
ELL      ``4 (2 n p + 3 n f)``: the padded ``Col`` and ``V`` matrices, ``n x p``
hybrid   ``4 (2 q_1 + (n+1) + 3 q_2 + 3 n f)``: CSR part ``q_1`` entries, COO part
         ``q_2 = coo_nnz``
=======  ====================================================================

These reproduce every Table 6 entry to the printed three decimals, Cora (n=2708,
q=10556, p=168) / OGB-Arxiv (n=169343, q=1166243, p=436) at f=64: CSR and CSC
0.621 / 1.066, COO 0.612 / 1.036, ELL 0.236 / 0.207 (``tests/test_cost_io.py``).
Counting ``C`` once (``2 n f`` for ``B`` and ``C``) would give 0.912 / 1.544 for
CSR instead; only the read-modify-write count matches the table.

SDDMM ``D = A ⊙ (B C)`` (Table 7), ``B (n, f)``, ``C (f, n)``. The printed CSR and
COO entries are reproduced exactly (0.567 / 0.620 and 0.562 / 0.613) by this
accounting, found by solving for the terms against both datasets, and adopted here:
FLOPs = ``3 q f`` (per entry and column a multiply, an add and the scaling by
``a_ij``; the minimal count is ``2 q f + q``, which would lower every intensity
by a factor ``(2f+1)/3f`` = 0.67 at f=64); bytes:

=======  ====================================================================
CSR      ``4 (q + q + (n+1) + 2 q + n f + q f)``: values, columns, row
         pointers, ``D`` read and written, ``B`` rows once (row-wise walk),
         ``C`` columns gathered once per entry
CSC      the same with column pointers (column-wise walk: ``C`` once, ``B``
         gathered)
COO      ``4 (3 q + 2 q + n f + q f)``
ELL      ``4 (2 n p + 2 n p + n f + q f)``: ``Col`` and ``V``, and ``D`` stored
         padded ``(n, p)``, read and written; ``C`` gathered for stored entries only
hybrid   CSR part ``4 q_1 + (n+1)``, COO part ``5 q_2``, plus ``n f + q f``
=======  ====================================================================

Differences from Table 7, left as they are:

* CSC gives 0.567 / 0.620 (= CSR; for a square matrix the column walk moves the
  same bytes as the row walk, and the paper says so for SpMM). The table prints
  0.613 for CSC on Arxiv, which is its COO value; its Cora CSC value equals CSR.
* ELL gives 0.190 / 0.147, the table 0.308 / 0.325. No combination of the terms
  above (and ``n p f``) reproduces both printed values, and they rise from Cora to
  Arxiv although Arxiv pads more (``n p / q`` = 43 vs 63), contrary to the paper's
  own explanation ("even lower operational intensity due to irregular row sizes").
  Ours falls with the padding, as that explanation says.

The model is the paper's and ignores caches: SpMM's gathered ``B`` rows are
counted once (perfect reuse) while SDDMM's gathered ``C`` columns are counted per
entry. ``corgnn bench spmm`` reports achieved bandwidth under this model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sparse.registry import FORMAT_NAMES

__all__ = [
    "IO_FORMATS",
    "IOCost",
    "io_model",
    "operational_intensity",
    "MatrixStats",
    "FormatChoice",
    "choose_format",
    "ELL_MAX_PADDING",
]

IO_FORMATS: tuple[str, ...] = FORMAT_NAMES
"""The modelled formats: every format of :data:`corgnn.sparse.FORMATS` (each has its
sparse-array terms in :data:`SPARSE_ARRAYS`)."""
_OPS = ("spmm", "sddmm")
_WORD = 4  # bytes per value and per index (paper)


@dataclass(frozen=True)
class IOCost:
    """FLOPs and bytes moved by one operator call, and their ratio (FLOP/byte).

    ``terms``: ``(name, bytes)`` of each array the bytes are made of.
    """

    op: str
    format: str
    flops: int
    bytes: int
    terms: tuple[tuple[str, int], ...]

    @property
    def intensity(self) -> float:
        """Operational intensity, FLOP per byte (0 when nothing moves)."""
        return self.flops / self.bytes if self.bytes else 0.0


def _check(op, format, n, nnz, f, max_degree, coo_nnz):
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    if format not in IO_FORMATS:
        raise ValueError(f"format must be one of {IO_FORMATS}, got {format!r}")
    for name, v in (("n", n), ("nnz", nnz), ("f", f)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if format == "ell":
        if max_degree is None:
            raise ValueError("format='ell' needs max_degree (the ELL width p = the longest row)")
        if max_degree < 0 or max_degree * n < nnz:
            raise ValueError(f"max_degree={max_degree} cannot hold nnz={nnz} entries in n={n} rows")
    if format == "hybrid":
        if coo_nnz is None:
            raise ValueError("format='hybrid' needs coo_nnz (entries in the COO part)")
        if not 0 <= coo_nnz <= nnz:
            raise ValueError(f"coo_nnz must be in [0, nnz={nnz}], got {coo_nnz}")


def _compressed(ptr: str, idx: str):
    return lambda n, q, p, q2: [("values", q), (ptr, n + 1), (idx, q)]


SPARSE_ARRAYS = {
    "csr": _compressed("row pointers", "columns"),
    "csc": _compressed("column pointers", "rows"),
    "coo": lambda n, q, p, q2: [("values", q), ("rows", q), ("columns", q)],
    "ell": lambda n, q, p, q2: [("V (n x p)", n * p), ("Col (n x p)", n * p)],
    "hybrid": lambda n, q, p, q2: [
        ("CSR values", q - q2), ("row pointers", n + 1), ("CSR columns", q - q2), ("COO values, rows, columns", 3 * q2),
    ],
}
"""Format name -> ``(n, nnz, max_degree, coo_nnz) -> [(array, words)]``: the sparse
arrays one call reads (module docstring). A new format adds its entry here."""

if set(SPARSE_ARRAYS) != set(IO_FORMATS):  # pragma: no cover - a format without an I/O model
    raise ImportError(f"cost.io models {sorted(SPARSE_ARRAYS)} but corgnn.sparse has {sorted(IO_FORMATS)}")


def io_model(op: str, format: str, n: int, nnz: int, f: int, max_degree: int | None = None, *, coo_nnz: int | None = None) -> IOCost:
    """FLOPs and bytes of ``op`` ("spmm" | "sddmm") on an ``(n, n)`` matrix in ``format``.

    Args:
        op: ``"spmm"`` (``C = A B``, Table 6) or ``"sddmm"`` (``D = A ⊙ (B C)``, Table 7).
        format: ``"csr" | "csc" | "coo" | "ell" | "hybrid"``.
        n: rows (= columns) of ``A``, rows of the dense operands.
        nnz: stored entries ``q``.
        f: columns of the dense operands.
        max_degree: longest row ``p`` (needed for ``"ell"``).
        coo_nnz: entries in the hybrid format's COO part (needed for ``"hybrid"``).

    Returns:
        :class:`IOCost` (see the module docstring for every formula).

    Raises:
        ValueError: unknown op or format; negative sizes; missing ``max_degree``
            for ELL or ``coo_nnz`` for hybrid, or values that cannot hold ``nnz``.
    """
    _check(op, format, n, nnz, f, max_degree, coo_nnz)
    q, W = nnz, _WORD
    sparse = SPARSE_ARRAYS[format](n, q, max_degree, coo_nnz)
    if op == "spmm":
        flops = 2 * q * f
        dense = [("B", n * f), ("C read+written", 2 * n * f)]
    else:
        flops = 3 * q * f
        d = n * max_degree if format == "ell" else q
        dense = [("D read+written", 2 * d), ("B rows", n * f), ("C gathered per entry", q * f)]
    terms = tuple((name, W * words) for name, words in sparse + dense)
    return IOCost(op, format, flops, sum(b for _, b in terms), terms)


def operational_intensity(op: str, format: str, n: int, nnz: int, f: int, max_degree: int | None = None, *, coo_nnz: int | None = None) -> float:
    """FLOP per byte of ``op`` in ``format`` (paper Tables 6-7); see :func:`io_model`.

    Example:
        >>> round(operational_intensity("spmm", "csr", 2708, 10556, 64), 3)   # Cora
        0.621
    """
    return io_model(op, format, n, nnz, f, max_degree, coo_nnz=coo_nnz).intensity


# ------------------------------------------------------------------ format choice
ELL_MAX_PADDING = 1.5
"""ELL is considered only when ``n * p / nnz`` (stored slots per entry) is at most this."""


@dataclass(frozen=True)
class MatrixStats:
    """The shape facts the I/O model needs: ``n`` rows, ``nnz`` entries, the longest
    row ``max_degree``, and the hybrid split (``hybrid_t``, ``hybrid_coo_nnz``;
    ``None`` when unknown, which leaves the hybrid format unmodelled)."""

    n: int
    nnz: int
    max_degree: int
    hybrid_t: int | None = None
    hybrid_coo_nnz: int | None = None

    @property
    def padding_ratio(self) -> float:
        """ELL slots per stored entry, ``n * max_degree / nnz`` (1.0 = no padding)."""
        return self.n * self.max_degree / max(self.nnz, 1)

    @classmethod
    def of(cls, A) -> "MatrixStats":
        """Stats of a corgnn sparse matrix (read once: ``A``'s CSR row lengths).

        Raises:
            TypeError: ``A`` is not a corgnn sparse format.
        """
        from ..sparse.ell import hybrid_threshold
        from ..sparse.formats import SparseFormat

        if not isinstance(A, SparseFormat):
            raise TypeError(f"A must be a corgnn sparse format or MatrixStats, got {type(A).__name__}")
        deg = A.to_csr().degrees()
        t = hybrid_threshold(deg)
        tail = int((deg - t).clamp_min(0).sum()) if deg.numel() else 0
        return cls(A.shape[0], A.nnz, int(deg.max()) if deg.numel() else 0, t, tail)

    def io(self, op: str, format: str, f: int) -> IOCost:
        """:func:`io_model` of this matrix."""
        return io_model(op, format, self.n, self.nnz, f, self.max_degree, coo_nnz=self.hybrid_coo_nnz)


@dataclass(frozen=True)
class FormatChoice:
    """The chosen format, every candidate's modelled cost, and the reason."""

    format: str
    costs: dict
    reason: str
    stats: MatrixStats


def choose_format(A, f: int = 64, *, op: str = "spmm") -> FormatChoice:
    """The sparse format ``format="auto"`` resolves to for ``A`` and ``f`` columns.

    Rule, from the I/O model and the kernels' measured behaviour (``corgnn bench
    spmm`` and the NOTEs in :mod:`corgnn.sparse.ops`): among the candidates, the
    one with the fewest modelled bytes for ``op`` (the highest operational
    intensity); ties go to CSR. The candidates are CSR, and ELL when its padding
    ratio ``n p / nnz`` is at most :data:`ELL_MAX_PADDING`.

    * ELL: in the model it beats CSR only when ``2 n p < 2 q + n + 1``, i.e. with
      next to no padding (no row pointers to read); its kernel was measured
      slightly faster than the row walk on a padding-free graph (134 vs 145 ms
      median) and slower from padding ~5 on. The padding bound also keeps ``n p`` storage (and the per-call padding of
      attention values) off graphs with hubs, which pad 30-60x.
    * COO: the model favours it when ``q < n`` (a row index per entry is then
      cheaper than a pointer per row), but its SpMM runs the CSR kernel over a row
      pointer built from its sorted rows (faster than an entry-split kernel), so it
      moves CSR's bytes plus its row array: never chosen.
    * CSC moves CSR's bytes for a square matrix, but its forward SpMM walks through
      a permutation; hybrid always moves more bytes than CSR (its COO part stores a
      row index per entry) and runs two passes: neither is chosen.

    Args:
        A: a corgnn sparse matrix (any format) or its :class:`MatrixStats`.
        f: columns of the dense operand (for a GCN layer, the narrower of in/out).
        op: ``"spmm"`` or ``"sddmm"``.

    Returns:
        :class:`FormatChoice`.

    Raises:
        ValueError: unknown ``op``; ``f`` negative. TypeError: ``A`` of another type.
    """
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise ValueError(f"f must be a non-negative int, got {f!r}")
    stats = A if isinstance(A, MatrixStats) else MatrixStats.of(A)
    costs = {fmt: stats.io(op, fmt, f) for fmt in IO_FORMATS if fmt != "hybrid" or stats.hybrid_coo_nnz is not None}
    candidates = ["csr"] + (["ell"] if stats.padding_ratio <= ELL_MAX_PADDING else [])
    best = min(candidates, key=lambda fmt: (costs[fmt].bytes, fmt != "csr"))
    why = f"fewest modelled bytes for {op} at f={f} ({costs[best].bytes / 1e6:.3g} MB, {costs[best].intensity:.3f} FLOP/B)"
    if "ell" not in candidates:
        why += f"; ELL excluded: padding ratio {stats.padding_ratio:.1f} > {ELL_MAX_PADDING}"
    return FormatChoice(best, costs, why, stats)
