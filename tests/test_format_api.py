"""Issue 22 item 3: formats own their kernels and plans.

The public ops ask the format for its kernels (``spmm_kernel`` / ``sddmm_kernels``)
instead of branching on its class, so a new format touches its own file (and the
registry) only; precomputed row plans go in through ``set_row_plan``.
"""

import ast
import inspect

import pytest
import torch

import corgnn.sparse.ops as ops
from corgnn.sparse import CSR, FORMAT_NAMES, FORMATS, sddmm, spmm


def _small():
    row, col = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([1, 3, 0, 2, 3])
    val = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    return CSR.from_coo(row, col, val, (3, 4))


class Traced(CSR):
    """A CSR subclass (not registered: no ``name`` of its own) that records what the
    ops ask it and answers with kernels of its choosing."""

    calls: list

    def spmm_kernel(self, val, transpose):
        Traced.calls.append(("spmm", transpose))
        return None if transpose else ("spmm_rows", (self.rowptr, self.col, None, val))

    def sddmm_kernels(self, val):
        Traced.calls.append(("sddmm",))
        q = 2  # split in two parts, concatenated by the op in entry order
        v1, v2 = (None, None) if val is None else (val[:q], val[q:])
        row = self.row()
        return [("sddmm_coo", (row[:q], self.col[:q], v1)), ("sddmm_coo", (row[q:], self.col[q:], v2))]


def test_ops_ask_the_format_for_its_kernels():
    A = _small()
    T = Traced(A.rowptr, A.col, A.val, A.shape)
    Traced.calls = []
    B, G = torch.randn(4, 3), torch.randn(3, 3)
    torch.testing.assert_close(spmm(T, B), A.to_dense() @ B)
    torch.testing.assert_close(spmm(T, G, transpose=True), A.to_dense().t() @ G)
    X, Y = torch.randn(3, 2), torch.randn(2, 4)
    torch.testing.assert_close(sddmm(T, X, Y), sddmm(A, X, Y))
    assert Traced.calls == [("spmm", False), ("spmm", True), ("sddmm",)]
    assert "traced" not in FORMATS  # subclasses without a name of their own are not formats


def test_ops_do_not_branch_on_format_classes():
    src = inspect.getsource(ops)
    names = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
    classes = {cls.__name__ for cls in FORMATS.values()}
    assert not (names & classes), f"ops.py names format classes {sorted(names & classes)}"


def test_set_row_plan_installs_the_walk():
    A = _small()
    ptr, idx, perm = A.row_plan(True)
    B = CSR(A.rowptr, A.col, A.val, A.shape)
    B.set_row_plan(True, ptr, idx, perm)
    assert B.row_plan(True)[0] is ptr and B.row_plan(True)[2] is perm
    G = torch.randn(3, 2)
    torch.testing.assert_close(spmm(B, G, transpose=True), A.to_dense().t() @ G)
    # plans belong to the pattern: a copy with other values shares them
    assert B.with_values(torch.ones(5)).row_plan(True)[1] is idx


def test_nonempty_rows_restricts_the_matrix_to_its_rows_with_entries():
    """``A[rows]`` sharing ``col``/``val`` (so per-entry values carry over), its ``A^T``
    walk renumbered from ``A``'s when ``A`` has one (else built), cached per pattern."""
    row = torch.tensor([1, 1, 4, 6, 6, 6])
    col = torch.tensor([0, 3, 3, 1, 1, 5])
    val = torch.arange(1.0, 7.0)
    for with_walk in (False, True):
        A = CSR.from_coo(row, col, val, (8, 6))
        if with_walk:
            A.row_plan(True)
        rows, R = A.nonempty_rows()
        assert rows.tolist() == [1, 4, 6] and R.shape == (3, 6)
        assert R.col is A.col and R.val is A.val
        torch.testing.assert_close(R.to_dense(), A.to_dense()[rows])
        ptr, idx, perm = R.row_plan(True)
        assert (perm is A.row_plan(True)[2]) == with_walk
        G = torch.randn(3, 2)
        torch.testing.assert_close(spmm(R, G, transpose=True), A.to_dense()[rows].t() @ G)
        w = torch.randn(6)
        torch.testing.assert_close(spmm(R, torch.eye(6), values=w), A.with_values(w).to_dense()[rows])
        again, R2 = A.with_values(w).nonempty_rows()
        assert again is rows and R2.rowptr is R.rowptr and R2.val is w  # (the pattern is cached: a copy's values, no rebuild)
    empty = CSR.from_coo(row[:0], col[:0], val[:0], (3, 2))
    rows, R = empty.nonempty_rows()
    assert rows.numel() == 0 and R.shape == (0, 2) and R.rowptr.tolist() == [0]


@pytest.mark.parametrize("bad, exc, word", [
    (lambda A, p: A.set_row_plan(False, p[0][:-1], p[1]), ValueError, "ptr"),
    (lambda A, p: A.set_row_plan(False, p[0].float(), p[1]), TypeError, "ptr"),
    (lambda A, p: A.set_row_plan(False, p[0], p[1], torch.zeros(2, dtype=torch.long)), ValueError, "perm"),
    # (the arrays' values: a kernel would read outside its operands)
    (lambda A, p: A.set_row_plan(False, p[0], torch.full_like(p[1], 10**9)), ValueError, r"idx must lie in \[0, 4\)"),
    (lambda A, p: A.set_row_plan(False, p[0], -p[1] - 1), ValueError, r"idx must lie in \[0, 4\)"),
    (lambda A, p: A.set_row_plan(True, *A.row_plan(True)[:2], torch.full_like(p[1], 5)), ValueError, r"perm must lie in \[0, 5\)"),
    (lambda A, p: A.set_row_plan(False, p[0].flip(0), p[1]), ValueError, "ptr must start at 0"),
    (lambda A, p: A.set_row_plan(False, p[0] * 2, p[1].repeat(2)), ValueError, "ptr must end at nnz = len"),
    (lambda A, p: A.set_row_plan(False, p[0].clone().index_fill_(0, torch.tensor([1]), 4), p[1]), ValueError, "non-decreasing"),
    (lambda A, p: A.set_row_plan(False, p[0], p[1][:2]), ValueError, "at least nnz = 5"),
])
def test_set_row_plan_checks_shapes_and_ranges(bad, exc, word):
    """Bad arrays raise before they are installed (``check=True``, the default), so the
    matrix keeps its own plan and its products stay right; no kernel reads outside."""
    A = _small()
    expected = A.to_dense()
    with pytest.raises(exc, match=word):
        bad(A, A.row_plan(False))
    B = torch.randn(A.shape[1], 2)
    torch.testing.assert_close(spmm(A, B), expected @ B)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_format_answers_the_kernel_questions(fmt):
    A = _small().to(fmt)
    own = A.spmm_kernel(A.val, False)
    assert own is None or (isinstance(own, tuple) and isinstance(own[0], str))
    own_t = A.spmm_kernel(A.val, True)
    # (A^T B walks the row plan, except a COO's: its transpose is its index arrays swapped, scattered)
    assert own_t is None if fmt != "coo" else own_t[0] == "spmm_coo" and own_t[1][0] is A.col and own_t[1][1] is A.row
    parts = A.sddmm_kernels(A.val)
    assert parts is None or all(isinstance(name, str) for name, _ in parts)


def test_one_list_of_formats():
    # issue 22 item 3: the cost model and the benchmarks read the registry's list
    from corgnn.bench.experiments import formats as experiment
    from corgnn.bench import spmm as bench
    from corgnn.cost.io import IO_FORMATS, SPARSE_ARRAYS

    assert IO_FORMATS == bench.FORMATS == experiment.FORMATS == FORMAT_NAMES == tuple(FORMATS)
    assert set(SPARSE_ARRAYS) == set(FORMAT_NAMES)
