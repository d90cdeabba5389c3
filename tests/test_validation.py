"""Issue 23 item 1: public sparse formats never let a kernel read out of bounds.

Every public constructor validates its indices (dtype, dimension, pointer shape and
monotonicity, ranges, device) and raises a ValueError / TypeError naming the
argument before any kernel runs; valid inputs keep working; ``check=False`` skips
the value checks (trusted internal callers).
"""

import pytest
import torch

from corgnn.sparse import COO, CSC, CSR, ELL, Hybrid, convert, sddmm, spmm

t = torch.tensor

BAD = {
    # name: (constructor, exception, words the message must contain)
    "csr pointer past nnz": (lambda: CSR(t([0, 1, 2, 3, 5000]), t([0, 1, 2]), None, (4, 5)), ValueError, "rowptr"),
    "csr pointer short of nnz": (lambda: CSR(t([0, 1, 1, 1, 1]), t([0, 1, 2]), None, (4, 5)), ValueError, "rowptr"),
    "csr pointer not from 0": (lambda: CSR(t([1, 1, 2, 2, 3]), t([0, 1, 2]), None, (4, 5)), ValueError, "rowptr"),
    "csr pointer decreasing": (lambda: CSR(t([0, 2, 1, 3, 3]), t([0, 1, 2]), None, (4, 5)), ValueError, "rowptr"),
    "csr pointer wrong length": (lambda: CSR(t([0, 1, 3]), t([0, 1, 2]), None, (4, 5)), ValueError, "rowptr"),
    "csr column out of range": (lambda: CSR(t([0, 1, 2, 2, 2]), t([0, 100000]), None, (4, 5)), ValueError, "col"),
    "csr column = m": (lambda: CSR(t([0, 1, 2, 2, 2]), t([0, 5]), None, (4, 5)), ValueError, "col"),
    "csr negative column": (lambda: CSR(t([0, 1, 2, 2, 2]), t([0, -1]), None, (4, 5)), ValueError, "col"),
    "csr float column": (lambda: CSR(t([0, 1, 2, 2, 2]), t([0.0, 1.0]), None, (4, 5)), TypeError, "col"),
    "csr float rowptr": (lambda: CSR(t([0.0, 1, 2, 2, 2]), t([0, 1]), None, (4, 5)), TypeError, "rowptr"),
    "csr 2-D column": (lambda: CSR(t([0, 1, 2, 2, 2]), t([[0, 1]]), None, (4, 5)), ValueError, "col"),
    "csr negative shape": (lambda: CSR(t([0]), t([], dtype=torch.long), None, (-1, 5)), ValueError, "shape"),
    "csr float shape": (lambda: CSR(t([0, 0]), t([], dtype=torch.long), None, (1.0, 5)), TypeError, "shape"),
    "csr shape not a pair": (lambda: CSR(t([0, 0]), t([], dtype=torch.long), None, (1,)), TypeError, "shape"),
    "coo row out of range": (lambda: COO(t([0, 4]), t([0, 1]), None, (4, 5)), ValueError, "row"),
    "coo negative row": (lambda: COO(t([-1, 0]), t([0, 1]), None, (4, 5)), ValueError, "row"),
    "coo col out of range": (lambda: COO(t([0, 1]), t([0, 9]), None, (4, 5)), ValueError, "col"),
    "coo float row": (lambda: COO(t([0.0, 1.0]), t([0, 1]), None, (4, 5)), TypeError, "row"),
    "coo length mismatch": (lambda: COO(t([0, 1]), t([0]), None, (4, 5)), ValueError, "row and col"),
    "coo sorted flag on unsorted rows": (lambda: COO(t([1, 0]), t([0, 1]), None, (4, 5), sorted=True), ValueError, "row"),
    "coo negative shape": (lambda: COO(t([0]), t([0]), None, (4, -5)), ValueError, "shape"),
    "csc rows out of range": (lambda: CSC(t([0, 1, 2, 2, 2, 2]), t([0, 7]), None, (4, 5)), ValueError, "row"),
    "csc negative row": (lambda: CSC(t([0, 1, 2, 2, 2, 2]), t([0, -3]), None, (4, 5)), ValueError, "row"),
    "csc colptr past nnz": (lambda: CSC(t([0, 1, 2, 2, 2, 9]), t([0, 1]), None, (4, 5)), ValueError, "colptr"),
    "csc colptr decreasing": (lambda: CSC(t([0, 2, 1, 2, 2, 2]), t([0, 1]), None, (4, 5)), ValueError, "colptr"),
    "csc perm out of range": (lambda: CSC(t([0, 1, 2, 2, 2, 2]), t([0, 1]), None, (4, 5), perm=t([0, 2])), ValueError, "perm"),
    "from_coo col out of range": (lambda: CSR.from_coo(t([0, 1]), t([0, 5]), None, (4, 5)), ValueError, "col"),
    "from_coo negative row": (lambda: CSR.from_coo(t([-1, 1]), t([0, 1]), None, (4, 5)), ValueError, "row"),
    "from_coo float indices": (lambda: CSR.from_coo(t([0.0, 1.0]), t([0, 1]), None, (4, 5)), TypeError, "row"),
    "ell col out of range": (lambda: ELL(t([[0, 7], [1, -1]], dtype=torch.int32), t([2, 1]), None, (2, 5)), ValueError, "col"),
    "ell negative col in a stored slot": (lambda: ELL(t([[0, -1], [1, -1]], dtype=torch.int32), t([2, 1]), None, (2, 5)), ValueError, "col"),
    "ell lengths past width": (lambda: ELL(t([[0, 1], [1, -1]], dtype=torch.int32), t([3, 1]), None, (2, 5)), ValueError, "lengths"),
    "ell padding not -1": (lambda: ELL(t([[0, 1], [1, 2]], dtype=torch.int32), t([2, 1]), None, (2, 5)), ValueError, "-1"),
    "ell int64 col": (lambda: ELL(t([[0, 1], [1, -1]]), t([2, 1]), None, (2, 5)), TypeError, "col"),
    "ell float lengths": (lambda: ELL(t([[0, 1], [1, -1]], dtype=torch.int32), t([2.0, 1.0]), None, (2, 5)), TypeError, "lengths"),
    "hybrid csr_pos out of range": (
        lambda: Hybrid(CSR(t([0, 1, 1]), t([0]), None, (2, 3)), COO(t([0]), t([2]), None, (2, 3), sorted=True), 1, t([0, 5]), None, (2, 3)),
        ValueError, "csr_pos"),
    "hybrid unsorted tail": (
        lambda: Hybrid(CSR(t([0, 1, 1]), t([0]), None, (2, 3)), COO(t([0]), t([2]), None, (2, 3)), 1, t([0, 1]), None, (2, 3)),
        ValueError, "tail"),
    "hybrid negative t": (
        lambda: Hybrid(CSR(t([0, 1, 1]), t([0]), None, (2, 3)), COO(t([0]), t([2]), None, (2, 3), sorted=True), -1, t([0, 1]), None, (2, 3)),
        ValueError, "t must"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_indices_raise_naming_the_argument(case):
    make, exc, words = BAD[case]
    with pytest.raises(exc, match=words.replace("(", r"\(")) as info:
        make()
    assert type(info.value) is exc


def test_out_of_bounds_pointer_never_reaches_the_kernel():
    # used to segfault (issue 23): the error is raised by the constructor
    with pytest.raises(ValueError, match="rowptr"):
        spmm(CSR(t([0, 1, 2, 3, 5000]), t([0, 1, 2]), None, (4, 5)), torch.randn(5, 3))


def _valid():
    row, col = t([0, 0, 1, 3, 3, 3]), t([4, 1, 0, 2, 3, 4])
    val = torch.arange(1.0, 7.0)
    return row, col, val


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell", "hybrid"])
def test_valid_inputs_still_work(fmt):
    row, col, val = _valid()
    A = convert(CSR.from_coo(row, col, val, (4, 5)), fmt)
    dense = torch.zeros(4, 5)
    dense[row, col] = val
    B = torch.randn(5, 3, dtype=torch.float32)
    torch.testing.assert_close(spmm(A, B), dense @ B)
    torch.testing.assert_close(spmm(A, torch.randn(4, 3), transpose=True).shape, torch.Size([5, 3]))
    assert sddmm(A, torch.randn(4, 2), torch.randn(2, 5)).shape == (6,)


def test_hand_built_formats_and_round_trips():
    row, col, val = _valid()
    ref = CSR.from_coo(row, col, val, (4, 5))
    A = CSR(ref.rowptr.clone(), ref.col.clone(), ref.val.clone(), (4, 5))
    torch.testing.assert_close(A.to_dense(), ref.to_dense())
    C = CSC(ref.to_csc().colptr, ref.to_csc().row, ref.to_csc().val, (4, 5), perm=ref.to_csc().perm)
    torch.testing.assert_close(C.to_dense(), ref.to_dense())
    E = convert(ref, "ell")
    E2 = ELL(E.col.clone(), E.lengths.clone(), E.val, (4, 5))
    torch.testing.assert_close(E2.to_dense(), ref.to_dense())
    H = convert(ref, "hybrid")
    H2 = Hybrid(H.head, H.tail, H.t, H.csr_pos, H.val, (4, 5))
    torch.testing.assert_close(H2.to_dense(), ref.to_dense())
    # empty matrices and shapes given as torch.Size / numpy-like ints
    Z = CSR(torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, torch.Size([0, 3]))
    assert Z.shape == (0, 3) and isinstance(Z.shape, tuple)
    assert COO(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, (0, 0)).nnz == 0


def test_check_false_skips_value_checks():
    # the escape hatch for arrays the library built: no O(nnz) pass, no error
    A = CSR(t([0, 1, 2, 2, 2]), t([0, 100000]), None, (4, 5), check=False)
    assert A.nnz == 2
    with pytest.raises(TypeError, match="col"):  # structural checks still run
        CSR(t([0, 1, 2, 2, 2]), t([0.0, 1.0]), None, (4, 5), check=False)


def test_values_named():
    with pytest.raises(ValueError, match="values"):
        CSR(t([0, 1, 2, 2, 2]), t([0, 1]), torch.ones(3), (4, 5))
    A = CSR(t([0, 1, 2, 2, 2]), t([0, 1]), None, (4, 5))
    with pytest.raises(ValueError, match="B must"):
        spmm(A, torch.randn(4, 3))
    with pytest.raises(ValueError, match="sddmm needs B"):
        sddmm(A, torch.randn(4, 2), torch.randn(3, 5))
