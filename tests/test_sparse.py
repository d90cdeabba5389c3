"""Sparse formats and their SpMM / SDDMM: every format against dense references and
torch.sparse, float32 and float64, transposed and semi-batched, awkward shapes, the
torch fallback (the CUDA code path) forced on CPU, and argument errors."""

from __future__ import annotations

import pytest
import torch

from corgnn.graph import Graph
from corgnn.sparse import COO, CSR, ELL, Hybrid, convert, edge_softmax, sddmm, spmm
from corgnn.sparse import ops, use_backend
from corgnn.sparse.backends import numba_kernels as cpu
from corgnn.sparse.ell import hybrid_threshold
from conftest import KERNEL_BACKENDS

FORMATS = ["csr", "csc", "coo", "coo-unsorted", "ell", "hybrid", "hybrid-t1"]
CASES = ["odd", "empty-rows", "nnz1", "nnz0", "hub", "duplicates"]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def make_coo(case: str, dtype=torch.float64, seed: int = 0):
    """(row, col, val, shape) of a test matrix; duplicates are summed by the reference."""
    g = torch.Generator().manual_seed(seed)
    if case == "odd":  # non-square, odd sizes
        n, m, q = 11, 7, 30
        row, col = torch.randint(0, n, (q,), generator=g), torch.randint(0, m, (q,), generator=g)
    elif case == "empty-rows":  # first, middle and last rows empty
        n, m = 9, 9
        row = torch.tensor([1, 1, 2, 3, 3, 3, 5, 6, 7, 7])
        col = torch.tensor([0, 8, 2, 1, 4, 7, 5, 0, 3, 8])
    elif case == "nnz1":
        n, m = 5, 6
        row, col = torch.tensor([3]), torch.tensor([2])
    elif case == "nnz0":
        n, m = 4, 3
        row = col = torch.zeros(0, dtype=torch.long)
    elif case == "hub":  # one row spanning many COO chunks, for the carry path
        n, m = 40, 60
        hub = torch.arange(60)
        rest = torch.randint(0, n, (50,), generator=g)
        row = torch.cat([torch.full((60,), 17), rest])
        col = torch.cat([hub, torch.randint(0, m, (50,), generator=g)])
    elif case == "duplicates":
        n, m = 6, 6
        row = torch.tensor([0, 0, 0, 2, 2, 5, 5, 5])
        col = torch.tensor([1, 1, 3, 2, 2, 0, 0, 0])
    else:  # pragma: no cover
        raise ValueError(case)
    val = torch.randn(row.numel(), generator=g, dtype=torch.float64).to(dtype)
    return row.long(), col.long(), val, (n, m)


def build(fmt: str, row, col, val, shape):
    """The matrix in format ``fmt`` (duplicates kept as separate entries)."""
    if fmt == "coo-unsorted":
        perm = torch.randperm(row.numel(), generator=torch.Generator().manual_seed(1))
        return COO(row[perm], col[perm], None if val is None else val[perm], shape)
    csr = CSR.from_coo(row, col, val, shape)
    if fmt == "hybrid-t1":
        return Hybrid.from_csr(csr, t=1)
    return convert(csr, fmt)


def dense(A, val=None) -> torch.Tensor:
    """Dense (n, m) or (h, n, m) of ``A`` with values ``val`` (A's entry order) or A.val."""
    coo = A.to_coo()
    v = A.val if val is None else val
    dtype = v.dtype if v is not None else torch.float64
    if v is None:
        v = torch.ones(coo.nnz, dtype=dtype)
    if v.dim() == 1:
        out = torch.zeros(A.shape, dtype=dtype)
        out.index_put_((coo.row, coo.col), v, accumulate=True)
        return out
    out = torch.zeros((v.size(1),) + tuple(A.shape), dtype=dtype)
    for h in range(v.size(1)):
        out[h].index_put_((coo.row, coo.col), v[:, h], accumulate=True)
    return out


@pytest.fixture(params=KERNEL_BACKENDS)
def backend(request):
    """Run each test on the Numba kernels, the torch reference backend and the Triton
    kernels (in Triton's interpreter on CPU)."""
    with use_backend(request.param):
        yield request.param


# ------------------------------------------------------------------------- SpMM
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("transpose", [False, True])
def test_spmm_matches_dense(backend, fmt, case, dtype, transpose):
    row, col, val, shape = make_coo(case, dtype)
    A = build(fmt, row, col, val, shape)
    D = dense(A)
    n_in = shape[0] if transpose else shape[1]
    B = torch.randn(5, n_in, dtype=dtype).t()  # non-contiguous operand
    out = spmm(A, B, transpose=transpose)
    ref = (D.t() if transpose else D) @ B
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["odd", "hub", "empty-rows"])
@pytest.mark.parametrize("transpose", [False, True])
def test_spmm_pattern_and_value_override(backend, fmt, case, transpose):
    row, col, _, shape = make_coo(case)
    A = build(fmt, row, col, None, shape)  # pattern only
    n_in = shape[0] if transpose else shape[1]
    B = torch.randn(n_in, 4, dtype=torch.float64)
    D = dense(A)
    torch.testing.assert_close(spmm(A, B, transpose=transpose), (D.t() if transpose else D) @ B)
    vals = torch.randn(A.nnz, 2, dtype=torch.float64)[:, 1]  # non-contiguous values
    Dv = dense(A, vals)
    torch.testing.assert_close(spmm(A, B, values=vals, transpose=transpose), (Dv.t() if transpose else Dv) @ B)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["odd", "hub", "nnz0"])
@pytest.mark.parametrize("dtype,pattern", [(torch.float32, False), (torch.float64, True)])
@pytest.mark.parametrize("transpose", [False, True])
def test_spmm_semi_batched(backend, fmt, case, dtype, transpose, pattern):
    row, col, _, shape = make_coo(case, dtype)
    A = build(fmt, row, col, None, shape)
    h, f = 3, 5
    n_in = shape[0] if transpose else shape[1]
    B = torch.randn(n_in, f, h, dtype=dtype).transpose(1, 2)  # (n_in, h, f), non-contiguous
    vals = None if pattern else torch.randn(A.nnz, h, dtype=dtype)
    Dh = dense(A, vals if vals is not None else torch.ones(A.nnz, h, dtype=dtype))  # (h, n, m)
    if transpose:
        Dh = Dh.transpose(1, 2)
    ref = torch.einsum("hnm,mhf->nhf", Dh, B)
    out = spmm(A, B, values=vals, transpose=transpose)
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("fmt", FORMATS)
def test_spmm_matches_torch_sparse(fmt):
    row, col, val, shape = make_coo("odd", torch.float32, seed=3)
    A = build(fmt, row, col, val, shape)
    T = torch.sparse_coo_tensor(torch.stack([row, col]), val, shape).coalesce()
    B = torch.randn(shape[1], 33)
    torch.testing.assert_close(spmm(A, B), torch.sparse.mm(T, B), rtol=1e-4, atol=1e-5)
    Bt = torch.randn(shape[0], 17)
    torch.testing.assert_close(spmm(A, Bt, transpose=True), torch.sparse.mm(T.t(), Bt), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------ SDDMM
def sddmm_ref(A, B, C, val=None):
    """Per-entry reference in A's own entry order: val_e * <B[r_e], C[:, c_e]>."""
    coo = A.to_coo()
    v = A.val if val is None else val
    if B.dim() == 2:
        dots = (B[coo.row] * C.t()[coo.col]).sum(-1)
    else:
        dots = (B[coo.row] * C[coo.col]).sum(-1)
    return dots if v is None else dots * v


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,pattern", [(torch.float32, False), (torch.float64, False), (torch.float64, True)])
def test_sddmm_matches_reference(backend, fmt, case, dtype, pattern):
    row, col, val, (n, m) = make_coo(case, dtype)
    A = build(fmt, row, col, None if pattern else val, (n, m))
    B = torch.randn(n, 6, dtype=dtype)
    M = torch.randn(m, 6, dtype=dtype)
    out = sddmm(A, B, M.t())  # C = M^T: a non-contiguous (f, m) view
    assert out.shape == (A.nnz,) and out.dtype == dtype
    torch.testing.assert_close(out, sddmm_ref(A, B, M.t()), **TOL[dtype])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["odd", "hub", "duplicates"])
@pytest.mark.parametrize("dtype,pattern", [(torch.float32, False), (torch.float64, True)])
def test_sddmm_semi_batched(backend, fmt, case, dtype, pattern):
    row, col, _, (n, m) = make_coo(case, dtype)
    A = build(fmt, row, col, None, (n, m))
    h, f = 2, 5
    B = torch.randn(n, h, f, dtype=dtype)
    C = torch.randn(m, f, h, dtype=dtype).transpose(1, 2)  # (m, h, f), non-contiguous
    vals = None if pattern else torch.randn(A.nnz, h, dtype=dtype)
    out = sddmm(A, B, C, values=vals)
    assert out.shape == (A.nnz, h)
    torch.testing.assert_close(out, sddmm_ref(A, B, C, vals), **TOL[dtype])


def test_sddmm_matches_torch_sampled_addmm():
    row, col, val, shape = make_coo("odd", torch.float32, seed=5)
    csr = CSR.from_coo(row, col, val, shape)
    T = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.val, shape)
    B, C = torch.randn(shape[0], 9), torch.randn(9, shape[1])
    ref = torch.sparse.sampled_addmm(T, B, C, beta=0.0).values() * csr.val  # CSR order
    for fmt in ("csr", "coo", "ell"):  # row-major entry order = CSR order
        torch.testing.assert_close(sddmm(convert(csr, fmt), B, C), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_edge_softmax_every_format(backend, fmt):
    row, col, _, shape = make_coo("hub")
    A = build(fmt, row, col, None, shape)
    scores = torch.randn(A.nnz, 2, dtype=torch.float64)
    out = edge_softmax(A, scores)
    r = A.to_coo().row  # A's own entry order
    ex = (scores - scores.max()).exp()
    den = torch.zeros(shape[0], 2, dtype=torch.float64).index_add_(0, r, ex)
    torch.testing.assert_close(out, ex / den[r])


# ---------------------------------------------------------------- raw kernels
@pytest.mark.parametrize("nchunks", [1, 3, 16, 1000])
@pytest.mark.parametrize("accumulate", [False, True])
def test_coo_kernel_chunking_and_accumulate(nchunks, accumulate):
    """Every chunk count (a row split over many chunks, more chunks than entries)
    gives the same sums; accumulate adds to the output and leaves empty rows alone."""
    row, col, val, (n, m) = make_coo("hub", torch.float64)
    csr = CSR.from_coo(row, col, val, (n, m))
    coo = csr.to_coo()
    B = torch.randn(m, 4, dtype=torch.float64)
    out = torch.full((n, 4), 2.0, dtype=torch.float64)
    cpu.spmm_coo(coo.row.numpy(), coo.col.numpy(), coo.val.numpy(), B.numpy(), out.numpy(), nchunks, accumulate)
    ref = dense(csr) @ B + (2.0 if accumulate else 0.0)
    torch.testing.assert_close(out, ref)
    out3 = torch.full((n, 1, 4), 2.0, dtype=torch.float64)
    cpu.spmm_coo_heads(coo.row.numpy(), coo.col.numpy(), coo.val.numpy()[:, None].copy(), B.numpy()[:, None, :].copy(), out3.numpy(), nchunks, accumulate)
    torch.testing.assert_close(out3[:, 0], ref)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ell_kernel_and_row_plan_agree(monkeypatch, case, dtype):
    """ELL runs its own kernels up to a padding ratio and the row plan above it:
    both paths, forced, on every case (single-head and semi-batched, with and
    without values)."""
    row, col, val, (n, m) = make_coo(case, dtype)
    E = build("ell", row, col, val, (n, m))
    B, B3 = torch.randn(m, 5, dtype=dtype), torch.randn(m, 2, 5, dtype=dtype)
    R, M3 = torch.randn(n, 5, dtype=dtype), torch.randn(m, 2, 5, dtype=dtype)
    R3, v3 = torch.randn(n, 2, 5, dtype=dtype), torch.randn(E.nnz, 2, dtype=dtype)
    results = []
    for limit in (float("inf"), 0.0):
        monkeypatch.setattr(ELL, "kernel_max_padding", limit)
        results.append([spmm(E, B), spmm(E.with_values(None), B), spmm(E, B3, values=v3), sddmm(E, R, B.t()), sddmm(E, R3, M3, values=v3)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TOL[dtype])
    torch.testing.assert_close(results[0][0], dense(E) @ B, **TOL[dtype])


# ------------------------------------------------------------------ the formats
def test_ell_layout_padding_and_roundtrip():
    row, col, val, shape = make_coo("empty-rows")
    csr = CSR.from_coo(row, col, val, shape)
    E = convert(csr, "ell")
    assert isinstance(E, ELL) and E.col.dtype == torch.int32
    assert E.width == int(csr.degrees().max()) == 3
    assert torch.equal(E.lengths, csr.degrees())
    slot = torch.arange(E.width).expand(shape[0], -1)
    pad = slot >= E.lengths.unsqueeze(1)
    assert bool((E.col[pad] == -1).all()) and bool((E.col[~pad] >= 0).all())
    V = E.values_padded()
    assert V is E.values_padded()  # cached
    assert bool((V[pad] == 0).all())
    assert torch.equal(V[~pad], csr.val)  # row-major slots = CSR entry order
    assert E.val is csr.val  # shared, no copy
    back = E.to_csr()
    assert torch.equal(back.rowptr, csr.rowptr) and torch.equal(back.col, csr.col)
    assert torch.equal(E.to_dense(), csr.to_dense())
    assert E.padding_ratio() == pytest.approx(shape[0] * 3 / csr.nnz)
    assert E.nbytes() == E.col.numel() * 4 + E.lengths.numel() * 8 + E.col.numel() * 8  # Col, lengths, V (float64)
    E2 = E.with_values(-csr.val)
    torch.testing.assert_close(E2.values_padded()[~pad], -csr.val)
    assert E2.row_plan(True) is E.row_plan(True)  # plans shared by pattern


def test_hybrid_split_rule_and_roundtrip():
    row, col, val, shape = make_coo("hub")
    csr = CSR.from_coo(row, col, val, shape)
    H = convert(csr, "hybrid")
    deg = csr.degrees()
    assert H.t == hybrid_threshold(deg)
    sorted_deg = deg.sort().values
    assert H.t == max(1, int(sorted_deg[-(-9 * deg.numel() // 10) - 1]))  # nearest-rank 90th percentile
    assert int(H.head.degrees().max()) <= H.t
    assert H.tail.nnz == int((deg - H.t).clamp_min(0).sum())
    assert bool((H.tail.row[1:] >= H.tail.row[:-1]).all())  # row-sorted COO part
    assert torch.equal(torch.sort(H.csr_pos).values, torch.arange(csr.nnz))
    torch.testing.assert_close(H.val, csr.val[H.csr_pos])
    back = H.to_csr()
    assert torch.equal(back.rowptr, csr.rowptr) and torch.equal(back.col, csr.col)
    torch.testing.assert_close(back.val, csr.val)
    assert torch.equal(H.to_dense(), csr.to_dense())
    assert H.nbytes() == sum(t.numel() * t.element_size() for t in (H.head.rowptr, H.head.col, H.tail.row, H.tail.col, H.val))
    assert hybrid_threshold(torch.zeros(0, dtype=torch.long)) == 0
    assert hybrid_threshold(torch.tensor([0, 0, 5])) == 5
    with pytest.raises(ValueError, match="percentile"):
        hybrid_threshold(deg, 120.0)
    with pytest.raises(ValueError, match="t must be"):
        Hybrid.from_csr(csr, t=-1)


@pytest.mark.parametrize("fmt", ["coo", "csc", "ell", "hybrid"])
def test_graph_builds_each_format_once(fmt):
    ei = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 3, 0]])
    g = Graph(ei, num_nodes=5)
    A = g.gcn_adjacency(format=fmt)
    assert A is g.gcn_adjacency(format=fmt)
    assert A.name == fmt
    torch.testing.assert_close(A.to_dense(), g.gcn_adjacency().to_dense())
    P = g.gat_adjacency(format=fmt)
    assert P.val is None and P is g.gat_adjacency(format=fmt)


def test_ell_validation():
    with pytest.raises(ValueError, match="col must have shape"):
        ELL(torch.zeros(3, 2, dtype=torch.int32), torch.zeros(4, dtype=torch.long), None, (4, 4))
    with pytest.raises(ValueError, match="lengths must have shape"):
        ELL(torch.zeros(4, 2, dtype=torch.int32), torch.zeros(3, dtype=torch.long), None, (4, 4))
    with pytest.raises(ValueError, match="values must have shape"):
        ELL(torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.long), torch.ones(3), (2, 2))
    with pytest.raises(ValueError, match="format must be one of"):
        CSR.from_coo(torch.tensor([0]), torch.tensor([0]), None, (1, 1)).to("csr2")


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("fmt", ["csr", "ell", "hybrid", "coo"])
def test_argument_errors(fmt):
    row, col, val, shape = make_coo("odd", torch.float32)
    A = build(fmt, row, col, val, shape)
    with pytest.raises(TypeError, match="A must be"):
        spmm(torch.eye(3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="B must have shape"):
        spmm(A, torch.ones(shape[0] + 1, 2))
    with pytest.raises(TypeError, match="B must be a floating"):
        spmm(A, torch.ones(shape[1], 2, dtype=torch.long))
    with pytest.raises(TypeError, match="values dtype"):
        spmm(A, torch.ones(shape[1], 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="values must have shape"):
        spmm(A, torch.ones(shape[1], 2), values=torch.ones(A.nnz + 1))
    with pytest.raises(ValueError, match="sddmm needs"):
        sddmm(A, torch.ones(shape[0], 3), torch.ones(4, shape[1]))
    with pytest.raises(TypeError, match="values dtype"):
        sddmm(A, torch.ones(shape[0], 3, dtype=torch.float64), torch.ones(3, shape[1], dtype=torch.float64))


def test_transposed_spmm_reads_cached_walk_values_and_follows_in_place_changes():
    """A^T B of a CSR walks its CSC arrays with the values kept in walk order
    (ops._walk_values): results equal the dense reference, the kept copy is reused,
    and an in-place change of A.val is picked up (version counter)."""
    from corgnn.sparse.ops import _WALK_VALUES

    row, col, val, shape = make_coo("odd")
    A = CSR.from_coo(row, col, val, shape)
    B = torch.randn(shape[0], 5, dtype=torch.float64)
    torch.testing.assert_close(spmm(A, B, transpose=True), dense(A).t() @ B)
    kept = _WALK_VALUES[A.val]
    assert len(kept) == 1 and torch.equal(next(iter(kept.values()))[2], A.val[A.row_plan(True)[2]])
    first = next(iter(kept.values()))[2]
    spmm(A, B, transpose=True)
    assert next(iter(_WALK_VALUES[A.val].values()))[2] is first  # reused, not rebuilt
    A.val.mul_(-2.0)
    torch.testing.assert_close(spmm(A, B, transpose=True), dense(A).t() @ B)
    # values passed explicitly are read through perm, never kept
    other = torch.randn(A.nnz, dtype=torch.float64)
    torch.testing.assert_close(spmm(A, B, transpose=True, values=other), dense(A, other).t() @ B)
    assert other not in _WALK_VALUES


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_follows_values_written_in_place(fmt, backend):
    """Values written in place (``A.val.mul_`` under ``no_grad``) reach every product
    (SpMM both ways, SDDMM) and every conversion, whatever each cached before (ELL's
    padded values, COO's and hybrid's CSR, CSR's CSC: copies of the values, kept with
    the version they were made from)."""
    A = build(fmt, *make_coo("odd"))
    n, m = A.shape
    g = torch.Generator().manual_seed(4)
    B, G, C = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((m, 3), (n, 3), (3, m)))

    def results():
        with use_backend(backend):
            out = dict(spmm=spmm(A, B), spmm_t=spmm(A, G, transpose=True), sddmm=sddmm(A, G, C), dense=A.to_dense())
        for name in ("csr", "csc", "coo"):
            out[name] = A.to(name).to_dense()
        if isinstance(A, ELL):
            out["padded"] = A.values_padded()
        return out

    before = results()
    torch.testing.assert_close(before["spmm"], dense(A) @ B)
    with torch.no_grad():
        A.val.mul_(-2.0)
    after = results()
    for name, value in before.items():
        torch.testing.assert_close(after[name], -2.0 * value, msg=lambda msg: f"{name}: {msg}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_public_ops_on_a_matrix_made_under_inference_mode(fmt):
    """A matrix built inside ``torch.inference_mode`` (inference tensors have no version
    counter, which the kept walk values and bound kernels are keyed on) runs every op
    there, both directions, twice (the second from what the first kept)."""
    with torch.inference_mode():
        A = build(fmt, *make_coo("odd"))
        n, m = A.shape
        B, G = torch.randn(m, 3, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)
        D = dense(A)
        for _ in range(2):
            torch.testing.assert_close(spmm(A, B), D @ B)
            torch.testing.assert_close(spmm(A, G, transpose=True), D.t() @ G)
            torch.testing.assert_close(sddmm(A, G, B.t()), (G @ B.t())[A.to_coo().row, A.to_coo().col] * A.to_coo().val)


def test_numba_row_plan_arrays_follow_an_in_place_edit_of_the_pattern():
    """The numba backend keeps a pattern's kernel arrays on its row pointer (one
    attribute read per call); an in-place edit of the pattern's arrays (a new version)
    or another ``idx`` with the same pointer must not reuse them."""
    rowptr = torch.tensor([0, 2, 3, 5])
    col = torch.tensor([0, 2, 1, 0, 2])
    B = torch.randn(3, 4, dtype=torch.float64)
    A = CSR(rowptr, col, None, (3, 3))
    with use_backend("numba"):
        first = spmm(A, B)
        torch.testing.assert_close(first, A.to_dense().double() @ B)
        rowptr[1:] = torch.tensor([1, 3, 5])  # (in place: rows of 1, 2 and 2 entries)
        A2 = CSR(rowptr, col, None, (3, 3))
        torch.testing.assert_close(spmm(A2, B), A2.to_dense().double() @ B)
        col2 = torch.tensor([2, 2, 1, 1, 0])  # (same pointer, other columns)
        A3 = CSR(rowptr, col2, None, (3, 3))
        torch.testing.assert_close(spmm(A3, B), A3.to_dense().double() @ B)
