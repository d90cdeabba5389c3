"""Graphs that change every call: the shared graph store, the O(q) builds, mini-batches
of small graphs, learnable edge weights, PyG's Explainer, inference_mode, clear_caches."""

from __future__ import annotations

import copy
import gc
import pickle

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv as PygGCNConv
from torch_geometric.nn import GINConv as PygGINConv
from torch_geometric.nn import SAGEConv as PygSAGEConv
from torch_geometric.nn import global_add_pool, global_mean_pool
from torch_geometric.nn.conv.gcn_conv import gcn_norm

import corgnn
from corgnn.graph import GRAPHS, Graph, GraphCache, aggr_edge_weights, shared_graph
from corgnn.nn import GCNConv, GINConv
from corgnn.nn.base import UnsupportedOption
from corgnn.sparse import build
from corgnn.sparse.formats import CSR

from conftest import leaves_graph, make_graph

F64 = torch.float64


def random_edges(seed: int, n_max: int = 50, q_max: int = 200):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, n_max, (), generator=g))
    q = int(torch.randint(0, q_max, (), generator=g))
    return torch.randint(0, n, (2, q), generator=g), n, g


# ----------------------------------------------------------------------- builds


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loops,normalize", [(True, True), (True, False), (False, True), (False, False)])
def test_adjacency_build_equals_gcn_norm_and_a_coalescing_sort(seed, improved, weighted, loops, normalize):
    """The one-pass build is PyG's gcn_norm (+ remaining self-loops, duplicates summed)."""
    ei, n, g = random_edges(seed)
    ei = torch.cat([ei, torch.tensor([[0, 0], [0, 0]])], 1)  # a duplicated self-loop
    ew = torch.rand(ei.size(1), generator=g, dtype=F64) if weighted else None
    if normalize:
        ref_ei, ref_w = gcn_norm(ei, ew, n, improved, loops, "source_to_target", F64)
    else:
        from torch_geometric.utils import add_remaining_self_loops

        ref_ei, ref_w = (add_remaining_self_loops(ei, ew, 2.0 if improved else 1.0, n) if loops else (ei, ew))
        ref_w = torch.ones(ref_ei.size(1), dtype=F64) if ref_w is None else ref_w
    ref = CSR.from_coo(ref_ei[1], ref_ei[0], ref_w, (n, n), coalesce=True)
    ptr, col, val, entry = build.adjacency_csr(
        ei, ew, n, dtype=F64, loops=build.LOOPS_REMAINING if loops else build.LOOPS_KEEP, fill=2.0 if improved else 1.0,
        norm=build.NORM_SYMMETRIC if normalize else build.NORM_NONE,
    )
    assert torch.equal(ptr, ref.rowptr) and torch.equal(col, ref.col)
    torch.testing.assert_close(val, ref.val, rtol=1e-12, atol=1e-12)
    # every edge's entry is its (target, source); dropped self-loops are -1
    q = ei.size(1)
    kept = ei[0] != ei[1] if loops else torch.ones(q, dtype=torch.bool)
    assert torch.equal(col[entry[:q][kept]], ei[0][kept])
    assert torch.equal(torch.searchsorted(ptr, entry[:q][kept], right=True) - 1, ei[1][kept])
    assert (entry[:q][~kept] == -1).all()
    if loops:  # node v's loop entry is at (v, v)
        assert torch.equal(col[entry[q:]], torch.arange(n))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_aggregation_build_equals_the_reference(seed, aggr, diagonal, weighted):
    ei, n, g = random_edges(seed)
    ew = torch.rand(ei.size(1), generator=g, dtype=F64) if weighted else None
    w = aggr_edge_weights(ei, ew, n, aggr, F64)
    ref_ei = ei
    if diagonal:
        loops = torch.arange(n)
        ref_ei, w = torch.cat([ei, torch.stack([loops, loops])], 1), torch.cat([w, w.new_zeros(n)])
    ref = CSR.from_coo(ref_ei[1], ref_ei[0], w, (n, n), coalesce=True)
    ptr, col, val, _ = build.adjacency_csr(
        ei, ew, n, dtype=F64, loops=build.LOOPS_DIAGONAL if diagonal else build.LOOPS_KEEP, fill=0.0,
        norm=build.NORM_MEAN if aggr == "mean" else build.NORM_NONE,
    )
    assert torch.equal(ptr, ref.rowptr) and torch.equal(col, ref.col)
    torch.testing.assert_close(val, ref.val, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "loops,norm",
    [(build.LOOPS_REMAINING, build.NORM_SYMMETRIC), (build.LOOPS_REMAINING, build.NORM_NONE), (build.LOOPS_KEEP, build.NORM_SYMMETRIC),
     (build.LOOPS_KEEP, build.NORM_MEAN), (build.LOOPS_DIAGONAL, build.NORM_NONE), (build.LOOPS_DIAGONAL, build.NORM_MEAN),
     (build.LOOPS_REPLACE, build.NORM_NONE)],
)
def test_unsorted_build_is_the_sorted_one_in_edge_order_with_its_transpose(seed, weighted, loops, norm):
    """``sort=False, coalesce=False`` (what Graph builds on CPU): the entries of the
    sorted, uncoalesced build, each row in edge order (appended loops last), every
    edge's entry at its (target, source); ``transposed=True`` adds the CSC dual of
    exactly that matrix (``csr_to_csc``'s arrays), and changes nothing else."""
    ei, n, g = random_edges(seed, q_max=300)  # (duplicates and self-loops likely)
    ei = torch.cat([ei, torch.tensor([[0, 0], [0, 0]])], 1)  # a duplicated self-loop
    ew = torch.rand(ei.size(1), generator=g, dtype=F64) if weighted else None
    kw = dict(dtype=F64, loops=loops, fill=2.0, norm=norm)
    ref_ptr, ref_col, ref_val, _ = build.adjacency_csr(ei, ew, n, coalesce=False, **kw)
    out = build.adjacency_csr(ei, ew, n, coalesce=False, sort=False, transposed=True, **kw)
    assert len(out) == 7
    ptr, col, val, entry, colptr, trow, tperm = out
    assert torch.equal(ptr, ref_ptr)
    for name, a in zip(("ptr", "col", "val", "entry"), build.adjacency_csr(ei, ew, n, coalesce=False, sort=False, **kw)):
        assert torch.equal(a, out[("ptr", "col", "val", "entry").index(name)]), name
    row = torch.repeat_interleave(torch.arange(n), ptr.diff())
    order = torch.argsort(row * n + col, stable=True)  # sorting each row by column, stably, gives the sorted build
    assert torch.equal(col[order], ref_col)
    torch.testing.assert_close(val[order], ref_val, rtol=1e-12, atol=1e-12)
    q = ei.size(1)
    kept = entry[:q] >= 0
    if loops in (build.LOOPS_REMAINING, build.LOOPS_REPLACE):
        assert torch.equal(kept, ei[0] != ei[1])
    else:
        assert kept.all()
    at = entry[:q][kept]
    assert torch.equal(col[at], ei[0][kept]) and torch.equal(row[at], ei[1][kept])
    # edge order within each row: a later edge of the same target sits further right
    tgt = ei[1][kept]
    later = torch.argsort(tgt, stable=True)
    assert (at[later].diff()[tgt[later].diff() == 0] > 0).all()
    if loops != build.LOOPS_KEEP:  # one appended loop per node, last in its row
        assert torch.equal(entry[q:], ptr[1:] - 1) and torch.equal(col[entry[q:]], torch.arange(n))
    for a, b in zip((colptr, trow, tperm), build.csr_to_csc(ptr, col, n)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("matrix", ["gcn", "sum", "mean", "gin", "gat"])
def test_graph_takes_the_transposed_walk_from_the_build_only_with_autograd_on(matrix):
    """With autograd on, a Graph's CPU matrix comes with its ``A^T`` walk installed by
    the build (the same arrays a later ``row_plan(True)`` would build); under
    ``no_grad`` none is built until a product needs it. Same products either way."""
    ei, n, g = random_edges(3, q_max=300)

    def build_matrix(graph):
        if matrix == "gcn":
            return graph.gcn_adjacency(dtype=F64)
        if matrix == "gat":
            return graph.gat_adjacency()
        if matrix == "gin":
            return graph.aggr_adjacency("sum", dtype=F64, diagonal=True, diagonal_value=1.5)
        return graph.aggr_adjacency(matrix, dtype=F64)

    A = build_matrix(Graph(ei, None, n))
    assert True in A._plans
    with torch.no_grad():
        B = build_matrix(Graph(ei, None, n))
    assert True not in B._plans
    for a, b in zip(A.row_plan(True), B.row_plan(True)):
        assert torch.equal(a, b)
    x = torch.randn(n, 4, dtype=F64, generator=g)
    if A.val is not None:
        torch.testing.assert_close(corgnn.sparse.spmm(A, x, transpose=True), A.to_dense().t() @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("coalesce", [False, True])
def test_coo_to_csr_and_csc_by_counting_sort_equal_sorting(seed, coalesce):
    ei, n, g = random_edges(seed, q_max=400)  # (duplicates likely)
    m = n + 3
    row, col = ei[1], ei[0]
    val = torch.rand(row.numel(), generator=g, dtype=F64)
    key = row * m + col
    if coalesce:
        ukey, inv = torch.unique(key, return_inverse=True)
        ref_val = torch.zeros(ukey.numel(), dtype=F64).index_add_(0, inv, val)
        ref_row, ref_col = ukey // m, ukey % m
    else:
        perm = torch.argsort(key, stable=True)
        ref_row, ref_col, ref_val = row[perm], col[perm], val[perm]
    ptr, c, v, entry = build.coo_to_csr(row, col, val, n, coalesce=coalesce)
    assert torch.equal(ptr, torch.searchsorted(ref_row, torch.arange(n + 1)))
    assert torch.equal(c, ref_col)
    torch.testing.assert_close(v, ref_val, rtol=1e-12, atol=1e-12)
    assert torch.equal(c[entry], col)  # every input entry lands on its column
    # CSC dual: column-major with rows ascending, perm back to CSR order
    A = CSR(ptr, c, v, (n, m))
    colptr, r, perm = build.csr_to_csc(ptr, c, m)
    order = torch.argsort(c * max(n, 1) + A.row(), stable=True)
    assert torch.equal(perm, order) and torch.equal(r, A.row()[order])
    assert torch.equal(colptr, torch.searchsorted(c[order], torch.arange(m + 1)))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("weighted", [False, True])
def test_mean_weights_in_one_pass_equal_the_torch_formula_bit_for_bit(seed, dtype, weighted):
    """``build.mean_weights`` (the mean aggregation's per-edge weights of a mini-batch's
    edge list, one Numba pass) is :func:`aggr_edge_weights`' ``"mean"``, bit for bit:
    weights over the target's edge count (duplicates counted), nodes without edges,
    no edges at all; a Graph's SAGE edge list holds those weights."""
    g = torch.Generator().manual_seed(seed)
    n, q = 60, 400
    ei = torch.randint(0, n - 5, (2, q), generator=g)  # (the last 5 nodes: no edges)
    ei = torch.cat([ei, ei[:, :30]], 1)  # duplicates
    ew = torch.rand(ei.size(1), generator=g, dtype=F64) if weighted else None
    ref = aggr_edge_weights(ei, ew, n, "mean", dtype)
    out = build.mean_weights(ei[1], ew, n, dtype=dtype)
    assert out.dtype == dtype and torch.equal(out, ref)
    assert build.mean_weights(torch.zeros(0, dtype=torch.long), None, n, dtype=dtype).shape == (0,)
    graph = Graph(ei, ew, n)
    A = graph.aggr_adjacency("mean", dtype=dtype, weighted=weighted, columns=8)
    assert type(A).__name__ == "COO" and torch.equal(A.val, ref)


def test_mean_weights_count_in_degrees_past_float32s_integers():
    """A target with more than 2**24 edges: its count is exact (a float32 counter
    stops at 2**24), so the weight is torch's ``1 / float32(count)``."""
    q = 2**24 + 2
    target = torch.zeros(q, dtype=torch.long)
    out = build.mean_weights(target, None, 1, dtype=torch.float32)
    assert out[0].item() == (torch.ones(1) / torch.tensor([float(q)])).item() != 2.0**-24


def test_feature_transform_adds_in_one_product_on_every_path():
    """``feature_transform(x, W, xs, add=Y)`` is ``Y + X W^T`` on the dense GEMM (one
    ``addmm``), the large-product :class:`RowsLinear` and the sparse-feature SpMM paths,
    with the gradients of ``x``, ``W`` and ``Y``."""
    from corgnn.functional.gcn import ROWS_MIN_MACS, feature_transform
    from corgnn.nn.base import dense_to_csr

    g = torch.Generator().manual_seed(3)
    for n in (40, ROWS_MIN_MACS // (16 * 16) + 1):
        x = torch.rand(n, 16, generator=g, dtype=F64).requires_grad_()
        W = torch.rand(16, 16, generator=g, dtype=F64).requires_grad_()
        Y = torch.rand(n, 16, generator=g, dtype=F64).requires_grad_()
        out = feature_transform(x, W, None, add=Y)
        ref = Y + x @ W.t()
        assert torch.allclose(out, ref)
        G = torch.rand(n, 16, generator=g, dtype=F64)
        got = torch.autograd.grad(out, (x, W, Y), G)
        want = torch.autograd.grad(ref, (x, W, Y), G)
        assert all(torch.allclose(a, b) for a, b in zip(got, want))
    xd = (torch.rand(30, 16, generator=g, dtype=F64) > 0.8).to(F64)
    xs = dense_to_csr(xd)
    Y = torch.rand(30, 16, generator=g, dtype=F64)
    assert torch.allclose(feature_transform(None, W.detach(), xs, add=Y), Y + xd @ W.detach().t())


@pytest.mark.parametrize("length", [33, 64, 300, 1025])
def test_long_rows_are_sorted_stably(length):
    """Rows longer than 32 entries take the merge sort (shorter ones insertion sort):
    columns ascending, equal columns in input order (their values show it)."""
    g = torch.Generator().manual_seed(length)
    row = torch.cat([torch.zeros(length, dtype=torch.long), torch.ones(5, dtype=torch.long)])
    col = torch.randint(0, 40, (length + 5,), generator=g)  # many duplicates
    val = torch.arange(length + 5, dtype=F64)
    ptr, c, v, entry = build.coo_to_csr(row, col, val, 2, coalesce=False)
    perm = torch.argsort(row * 40 + col, stable=True)
    assert torch.equal(c, col[perm]) and torch.equal(v, val[perm]) and torch.equal(c[entry], col)


def test_a_build_too_large_to_allocate_raises_memory_error():
    """The build kernels allocate through Numba's runtime (``numba_kernels.empty_array``):
    an allocation that fails raises MemoryError, as ``np.empty`` would, not a crash."""
    ei = torch.randint(0, 50, (2, 200))
    with pytest.raises(MemoryError):  # (check=False: the checks refuse node counts past 2**31 - 2 first)
        build.adjacency_csr(ei, None, 2**42, dtype=torch.float32, loops=build.LOOPS_DIAGONAL, fill=1.0, check=False)
    ptr, col, _, _ = build.adjacency_csr(ei, None, 50, dtype=torch.float32, loops=build.LOOPS_DIAGONAL, fill=1.0)
    with pytest.raises(MemoryError):
        build.csr_to_csc(ptr, col, 2**42)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: build.coo_to_csr(torch.tensor([0, 10**6]), torch.tensor([0, 1]), torch.ones(2), 2, coalesce=False), ValueError, r"row must lie in \[0, 2\), found 1000000"),
    (lambda: build.coo_to_csr(torch.tensor([0, -5]), torch.tensor([0, 1]), None, 2, coalesce=True), ValueError, "row must lie in .* found -5"),
    (lambda: build.coo_to_csr(torch.tensor([0, 1]), torch.tensor([0, -1]), None, 2, coalesce=True), ValueError, "col must be non-negative"),
    (lambda: build.coo_to_csr(torch.tensor([0, 1]), torch.tensor([0]), None, 2, coalesce=True), ValueError, "one value per entry"),
    (lambda: build.coo_to_csr(torch.tensor([0.0]), torch.tensor([0]), None, 2, coalesce=True), TypeError, "row must be a 1-D integer"),
    (lambda: build.csr_to_csc(torch.tensor([0, 1, 2]), torch.tensor([0, 10**6]), 2), ValueError, r"col must lie in \[0, 2\)"),
    (lambda: build.csr_to_csc(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), 2), ValueError, "rowptr must be non-decreasing"),
    (lambda: build.adjacency_csr(torch.tensor([[0, 10**6], [0, 1]]), None, 2, dtype=torch.float32, loops=build.LOOPS_KEEP), ValueError, "node id 1000000"),
    (lambda: build.adjacency_csr(torch.tensor([[0, -3], [0, 1]]), None, 2, dtype=torch.float32, loops=build.LOOPS_KEEP, sort=False, coalesce=False, transposed=True), ValueError, "negative node id"),
    (lambda: build.adjacency_csr(torch.tensor([[0, 1], [0, 1]]), torch.ones(3), 2, dtype=torch.float32, loops=build.LOOPS_KEEP), ValueError, "edge_weight must have shape"),
    (lambda: build.adjacency_csr(torch.tensor([[0, 1], [0, 1]]), None, 2, dtype=torch.float16, loops=build.LOOPS_KEEP), TypeError, "dtype must be torch.float32"),
    (lambda: build.adjacency_csr(torch.tensor([[0, 1], [0, 1]]), None, 2, dtype=torch.float32, loops=7), ValueError, "loops must be one of"),
    (lambda: build.mean_weights(torch.tensor([0, 10**6]), None, 2, dtype=torch.float32), ValueError, r"target must lie in \[0, 2\), found 1000000"),
    (lambda: build.mean_weights(torch.tensor([0, -4]), None, 2, dtype=torch.float32), ValueError, r"target must lie in .* found -4"),
    (lambda: build.mean_weights(torch.tensor([[0, 1]]), None, 2, dtype=torch.float32), TypeError, "target must be a 1-D integer"),
    (lambda: build.mean_weights(torch.tensor([0.0, 1.0]), None, 2, dtype=torch.float32), TypeError, "target must be a 1-D integer"),
    (lambda: build.mean_weights(torch.tensor([0, 1]), torch.ones(3), 2, dtype=torch.float32), ValueError, "edge_weight must have shape"),
    (lambda: build.mean_weights(torch.tensor([0, 1]), None, -1, dtype=torch.float32), ValueError, "num_nodes must be a non-negative int"),
    (lambda: build.mean_weights(torch.tensor([0, 1]), None, 2, dtype=torch.float16), TypeError, "dtype must be torch.float32"),
])
def test_the_build_functions_check_their_arguments(call, exc, match):
    """The public builders of :mod:`corgnn.sparse.build` refuse ids outside their range
    (their kernels index arrays by them: a bad id crashed the process) and malformed
    arguments, naming the argument, before any kernel runs."""
    with pytest.raises(exc, match=match):
        call()


def test_kernel_allocation_is_np_empty_in_shape_dtype_and_errors():
    """``empty_array`` (every kernel's scratch and output allocation): C-ordered arrays
    of the given shape (an int or a tuple) and the dtype of an array or a NumPy type;
    a negative dimension raises ValueError as ``np.empty`` does (no wrapped-around
    allocation of a negative size)."""
    from numba import njit

    from corgnn.sparse.backends.numba_kernels import empty_array

    @njit(cache=False)
    def make(n, m):
        a = empty_array((n, m, 2), np.float32)
        b = empty_array(n, a)
        c = empty_array(m, np.int64)
        a[:] = 1
        b[:] = 2
        c[:] = 3
        return a, b, c

    a, b, c = make(3, 4)
    assert a.shape == (3, 4, 2) and a.dtype == np.float32 and a.flags.c_contiguous and a.sum() == 24
    assert b.shape == (3,) and b.dtype == np.float32 and b.sum() == 6
    assert c.shape == (4,) and c.dtype == np.int64 and c.sum() == 12
    for n, m in ((-1, 4), (3, -2)):
        with pytest.raises(ValueError, match="negative dimensions"):
            make(n, m)


@pytest.mark.parametrize("seed", range(4))
def test_row_split_is_the_searchsorted_of_equal_work(seed):
    """``split_rows`` (the kernels' parallel task bounds): bound ``t`` is the first row
    whose ``entries + rows`` before it reach ``t / tasks`` of the total, as NumPy's
    ``searchsorted`` gives it, on graphs with empty rows, one long row and one row."""
    from corgnn.sparse.backends.numba_kernels import split_rows

    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 64, 257):
        for deg in (rng.integers(0, 12, n), rng.integers(0, 12, n) * (rng.random(n) < 0.3), np.eye(1, n, n // 2, dtype=np.int64)[0] * 500):
            ptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
            work = ptr + np.arange(n + 1)
            for tasks in {1, 2, 3, 8, n}:
                if tasks > n:
                    continue
                want = np.searchsorted(work, np.arange(tasks + 1) * (work[-1] / tasks), side="left")
                want[0], want[-1] = 0, n
                got = split_rows(ptr, tasks)
                assert got.dtype == np.int64 and np.array_equal(got, want), (ptr, tasks, got, want)


# ------------------------------------------------------------- the shared store


def test_every_layer_shares_one_graph_per_edge_index():
    corgnn.clear_caches()  # (with it the count of content misses: see the next tests)
    ei, n = make_graph()
    a, b = GraphCache(), GraphCache()
    g = a(ei, None, n)
    assert b(ei, None, n) is g  # another layer (or model): the same Graph
    assert b(ei.clone(), None, n) is g  # a new tensor of the same contents: found by them (CONTENT_GRAPHS)
    other = ei.clone()
    other[0, 0] = (other[0, 0] + 1) % n
    assert b(other, None, n) is not g  # other contents: a new Graph
    ew = torch.rand(ei.size(1))
    gw = a(ei, ew, n)
    assert gw is not g and gw.unweighted() is g  # weights share the unweighted patterns
    ei[0, 0] = (ei[0, 0] + 1) % n  # an in-place edit: a new key, and new contents
    g2 = a(ei, None, n)
    assert g2 is not g and torch.equal(g2.edge_index, ei)


def test_a_graph_found_by_contents_is_built_on_its_own_copy():
    """A new ``edge_index`` tensor equal to one seen before gets that one's Graph, with
    its matrices (no build), in any layer; the Graph holds a private copy, so writes
    to the first tensor, even through ``.data``, change neither it nor the lookup;
    other node counts and graphs over :data:`CONTENT_MAX_EDGES` edges are their own."""
    from corgnn.graph import CONTENT_GRAPHS, CONTENT_MAX_EDGES

    corgnn.clear_caches()
    ei, n = make_graph(seed=11)
    g = shared_graph(ei, None, n)
    A = g.gcn_adjacency()
    want = A.to_dense().clone()
    ei.data[0, :] = 0  # (unseen by version counters: the copy is untouched)
    fresh = make_graph(seed=11)[0]
    g2 = shared_graph(fresh, None, n)
    assert g2 is g and g2.gcn_adjacency() is A and torch.equal(A.to_dense(), want)
    assert not torch.equal(g.edge_index, ei) and torch.equal(g.edge_index, fresh)
    assert shared_graph(fresh.clone(), None, n + 1) is not g  # (another node count)
    x = torch.randn(n, 3, dtype=torch.float64)
    conv = GCNConv(3, 2).double()
    torch.testing.assert_close(conv(x, fresh.clone()), conv(x, make_graph(seed=11)[0]))
    big = torch.randint(0, 50, (2, CONTENT_MAX_EDGES + 1))
    before = len(CONTENT_GRAPHS)
    assert shared_graph(big, None, 50) is not shared_graph(big.clone(), None, 50) and len(CONTENT_GRAPHS) == before


def test_the_store_drops_a_graph_with_its_edge_index():
    GRAPHS.clear()
    ei, n = make_graph(seed=3)
    shared_graph(ei, None, n)
    assert len(GRAPHS) == 1
    del ei
    gc.collect()
    assert len(GRAPHS) == 0  # keyed weakly: the Graph does not keep edge_index alive


def test_the_latest_entry_of_the_store_is_checked_like_the_others():
    """The store answers its latest hit first (every layer asks for the same batch's
    graph in turn) under the same key rules: an in-place edit, another node count, a
    freed tensor and clear() all miss it, as they miss the store."""
    from corgnn._cache import SharedCache

    cache = SharedCache(capacity=4)
    a, b = torch.arange(6), torch.arange(6)
    cache.put((a,), "a", (1,))
    cache.put((b,), "b", (1,))
    assert cache.get((a,), (1,)) == "a" and cache.get((a,), (1,)) == "a"  # (the latest: a)
    assert cache.get((a,), (2,)) is None and cache.get((b,), (1,)) == "b"
    b.add_(1)  # (in place: a new version)
    assert cache.get((b,), (1,)) is None and cache.get((b,), (1,)) is None
    assert cache.get((a,), (1,)) == "a"
    del a
    gc.collect()
    assert len(cache) == 0 and cache._last is None  # (freed: the latest entry too)
    c = torch.arange(3)
    cache.put((c,), "c")
    cache.clear()
    assert cache.get((c,)) is None


def test_the_content_store_stops_looking_up_a_stream_that_never_repeats():
    """After ``capacity`` misses in a row only every ``recheck``-th key is looked up
    (the skipped ones counted as misses); a hit, and clear(), start over."""
    from corgnn._cache import ContentCache

    with pytest.raises(ValueError, match="recheck"):
        ContentCache(capacity=3, recheck=0)
    cache = ContentCache(capacity=3, recheck=4)
    keys = [torch.arange(i + 1) for i in range(20)]
    looked = []
    for i, key in enumerate(keys):
        if cache.probes():
            looked.append(i)
            assert cache.get((key,)) is None
            cache.put((key.clone(),), i)
    assert looked == [0, 1, 2, 4, 8, 12, 16]
    assert cache.get((keys[16].clone(),)) == 16  # (the probe's entry)
    assert [cache.probes() for _ in range(3)] == [True] * 3  # (the hit reset the count)
    for key in keys[:3]:
        cache.get((key,))
    assert not cache.probes()
    cache.clear()
    assert cache.probes() and len(cache) == 0
    assert pickle.loads(pickle.dumps(cache)).recheck == 4


def test_graphs_that_come_back_are_found_by_contents_between_new_ones():
    """PyG's mutag_gin.py pattern: each epoch new shuffled training batches (never
    seen again) and evaluation batches collated into new tensors of the same
    contents; the evaluation batches keep their Graphs while a long stream of new
    graphs builds each on the caller's tensor with no copy kept."""
    from corgnn.graph import CONTENT_GRAPHS

    corgnn.clear_caches()
    evaluation = [small_graph_batch(3, seed=100 + i).edge_index for i in range(3)]
    kept = [shared_graph(ei.clone(), None, None) for ei in evaluation]
    for epoch in range(6):
        for i in range(2):
            shared_graph(small_graph_batch(3, seed=10 * epoch + i).edge_index.clone(), None, None)
        assert all(shared_graph(ei.clone(), None, None) is g for ei, g in zip(evaluation, kept))
    corgnn.clear_caches()
    stream = [small_graph_batch(3, seed=1000 + i).edge_index for i in range(3 * CONTENT_GRAPHS.capacity)]
    copied = [shared_graph(ei, None, None).edge_index.data_ptr() != ei.data_ptr() for ei in stream]
    assert all(copied[: CONTENT_GRAPHS.capacity]) and not all(copied[CONTENT_GRAPHS.capacity:])
    assert sum(copied[CONTENT_GRAPHS.capacity:]) == len(range(CONTENT_GRAPHS.capacity, len(stream), CONTENT_GRAPHS.recheck))


def test_the_content_store_compares_shapes_before_contents():
    from corgnn._cache import ContentCache

    cache = ContentCache(capacity=3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    cache.put((ei.clone(), None), "g", (3,))
    assert cache.get((ei.clone(), None), (3,)) == "g"
    assert cache.get((ei.clone(), None), (4,)) is None  # (another node count)
    assert cache.get((ei[:, :2].clone(), None), (3,)) is None  # (another shape)
    assert cache.get((ei.clone().int(), None), (3,)) is None  # (another dtype)
    assert cache.get((ei.clone(), torch.ones(3)), (3,)) is None  # (weights vs none)
    other = ei.clone()
    other[0, 0] = 2
    assert cache.get((other, None), (3,)) is None  # (same shape, other contents)


def test_plans_come_from_the_memo_only_for_the_same_machine_and_candidates():
    from corgnn.cost.gcn import GCN_SCHEMES, MachineModel, plan_gcn

    p = plan_gcn(1000, 5000, 64, 64, True, approximate=True)
    assert plan_gcn(1000, 5000, 64, 64, True, approximate=True) is p
    slow_spmm = MachineModel(bandwidth=1e6)  # (another machine: planned for it)
    assert plan_gcn(1000, 5000, 64, 64, True, approximate=True, machine=slow_spmm) == plan_gcn(1000, 5000, 64, 64, True, approximate=True, machine=MachineModel(bandwidth=1e6))
    only = tuple(s for s in GCN_SCHEMES if s.forward == "transform-first")
    assert plan_gcn(1000, 5000, 64, 64, True, approximate=True, candidates=only).scheme in only
    assert plan_gcn(1000, 5000, 64, 64, True, approximate=True, candidates=list(only)).scheme in only  # (a list: no memo)


def test_an_activation_of_the_wrong_shape_or_dtype_is_refused_naming_x():
    ei, n = make_graph()
    conv = GINConv(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4)))
    x = torch.randn(n, 4, requires_grad=True)
    assert conv(x * 1.0, ei).shape == (n, 4)  # (an activation: one condition, then the layer)
    with pytest.raises(ValueError, match="x has 5 columns"):
        conv(torch.randn(n, 5, requires_grad=True) * 1.0, ei)
    with pytest.raises(ValueError, match="num_nodes"):  # (fewer rows than edge_index's nodes)
        conv(torch.randn(int(ei.max()), 4, requires_grad=True) * 1.0, ei)
    with pytest.raises(TypeError, match="float64"):
        conv(torch.randn(n, 4, dtype=torch.float64, requires_grad=True) * 1.0, ei)
    with pytest.raises(ValueError, match="2-D"):
        conv(torch.randn(n, 4, 1, requires_grad=True) * 1.0, ei)


def test_the_store_is_bounded():
    GRAPHS.clear()
    tensors = [make_graph(seed=s)[0] for s in range(GRAPHS.capacity + 5)]
    for t in tensors:
        shared_graph(t, None, 40)
    assert len(GRAPHS) == GRAPHS.capacity


def test_a_graph_refuses_an_edge_index_edited_in_place_after_construction():
    ei, n = make_graph()
    g = Graph(ei, num_nodes=n)
    ei[0, 0] = -2
    with pytest.raises(ValueError, match="edge_index was modified in place"):
        g.gcn_adjacency()
    ei2, n = make_graph()
    g2 = Graph(ei2, num_nodes=n)
    A = g2.gcn_adjacency()
    ei2[0, 0] = 1000  # already built: the Graph keeps answering for the graph it validated
    assert g2.gcn_adjacency() is A


# ------------------------------------------------------ mini-batches vs PyG


def small_graph_batch(num_graphs: int, seed: int, m: int = 8) -> Batch:
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(3, 12, (), generator=g))
        ei = torch.randint(0, n, (2, 2 * n), generator=g)
        graphs.append(Data(x=torch.randn(n, m, generator=g, dtype=F64), edge_index=torch.cat([ei, ei.flip(0)], 1)))
    return Batch.from_data_list(graphs)


class GCNPool(torch.nn.Module):
    def __init__(self, m=8, h=6):
        super().__init__()
        self.convs = torch.nn.ModuleList([PygGCNConv(m, h), PygGCNConv(h, h), PygGCNConv(h, h)])
        self.lin = torch.nn.Linear(h, 2)

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.lin(global_mean_pool(x, batch))


class GINPool(torch.nn.Module):
    def __init__(self, m=8, h=6):
        super().__init__()
        mlp = lambda i: torch.nn.Sequential(torch.nn.Linear(i, h), torch.nn.ReLU(), torch.nn.Linear(h, h))  # noqa: E731
        self.convs = torch.nn.ModuleList([PygGINConv(mlp(m), train_eps=True), PygGINConv(mlp(h))])
        self.lin = torch.nn.Linear(h, 2)

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.lin(global_add_pool(x, batch))


@pytest.mark.parametrize("model_cls", [GCNPool, GINPool])
def test_minibatches_of_small_graphs_match_pyg_every_batch(model_cls):
    torch.manual_seed(0)
    ref = model_cls().double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    assert not any(isinstance(m, (PygGCNConv, PygGINConv)) for m in ours.modules())
    for step in range(3):  # a new graph (a new edge_index tensor) every call
        assert_same_step(ref, ours, small_graph_batch(5, seed=step))


def assert_same_step(ref, ours, b: Batch) -> None:
    """``ours`` gives ``ref``'s outputs and gradients (input and every parameter) on
    one training step of batch ``b``."""
    outs = []
    for model in (ref, ours):
        model.zero_grad()
        x = b.x.clone().requires_grad_()
        out = model(x, b.edge_index, b.batch)
        out.square().sum().backward()
        outs.append((out, x.grad, [p.grad for p in model.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    torch.testing.assert_close(outs[1][1], outs[0][1])
    for g1, g0 in zip(outs[1][2], outs[0][2]):
        torch.testing.assert_close(g1, g0)


@pytest.mark.parametrize("model_cls", [GCNPool, GINPool])
@pytest.mark.parametrize("width", [6, 600])
@pytest.mark.parametrize("built", [False, True])
def test_the_cached_scheme_runs_composed_unless_a_large_backward_could_skip_rows(model_cls, width, built, monkeypatch):
    """A tie (m = k) goes to propagate-first+split+cache, which the layer runs as
    spmm + torch's own linear (GCNFunction never runs), except in a call that records
    a backward on a built CSR for a product of at least ROWS_MIN_MACS (GCNFunction's
    backward may skip the output gradient's all-zero rows there): then GCNFunction.
    ``built``: a rent that buys the CSR at the first product; else GIN's products run
    on the batch's edge list (GCN's matrix is always built). Evaluation (no grad)
    composes at every size. Outputs and every gradient (GIN's trained eps included)
    equal PyG's either way."""
    from corgnn.functional import gcn as functional_gcn

    corgnn.clear_caches()  # (the same batch's graph from another case would come back by its contents)
    if built:
        monkeypatch.setattr(corgnn.graph, "scatter_rent_s", lambda nnz, columns, threads, products=1: 1e9)
    torch.manual_seed(0)
    ref = model_cls(m=width, h=width).double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    calls = []
    real = functional_gcn.GCNFunction.apply
    monkeypatch.setattr(functional_gcn.GCNFunction, "apply", lambda *a: calls.append(a[4]) or real(*a))
    b = small_graph_batch(5, seed=3, m=width)
    assert_same_step(ref, ours, b)
    schemes = [conv.last_plan.scheme for conv in ours.convs]
    if width == 600 and (built or model_cls is GCNPool):
        assert b.num_nodes * width * width >= functional_gcn.ROWS_MIN_MACS
        assert len(calls) == len(schemes) and calls == schemes
    else:
        assert schemes == [functional_gcn.COMPOSED_SCHEME] * len(schemes) and calls == []
    calls.clear()
    with torch.no_grad():
        out, expected = ours(b.x, b.edge_index, b.batch), ref(b.x, b.edge_index, b.batch)
    assert calls == [] and [conv.last_plan.scheme for conv in ours.convs] == [functional_gcn.COMPOSED_SCHEME] * len(schemes)
    torch.testing.assert_close(out, expected)


class AggregatePool(torch.nn.Module):
    """Two SAGE / GraphConv layers (PyG's) and mean pooling, as a graph classifier."""

    def __init__(self, kind: str, m=8, h=8):
        super().__init__()
        import torch_geometric.nn as pyg

        make = {"sage-mean": pyg.SAGEConv, "sage-sum": lambda i, o: pyg.SAGEConv(i, o, aggr="sum"), "graphconv": pyg.GraphConv}[kind]
        self.convs = torch.nn.ModuleList([make(m, h), make(h, h)])
        self.lin = torch.nn.Linear(h, 2)

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.lin(global_mean_pool(x, batch))


@pytest.mark.parametrize("kind", ["sage-mean", "sage-sum", "graphconv"])
def test_sage_and_graphconv_scatter_a_batch_edge_list_composed_and_build_a_sampled_csr(kind, monkeypatch):
    """On a mini-batch of small graphs (most nodes targets) SAGE and GraphConv multiply
    by the batch's edge list (the graph's rent-or-buy state is recorded, no CSR built)
    and run the aggregated term as spmm + torch's own linear (GCNFunction never runs),
    training and evaluation; on a sampled layout (edges into the first 8 of 40 nodes)
    the CSR is built and the term runs on its rows with entries. Outputs and every
    gradient equal PyG's."""
    from corgnn.functional import gcn as functional_gcn

    corgnn.clear_caches()
    torch.manual_seed(0)
    ref = AggregatePool(kind).double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    calls = []
    real = functional_gcn.GCNFunction.apply
    monkeypatch.setattr(functional_gcn.GCNFunction, "apply", lambda *a: calls.append(a[4]) or real(*a))
    b = small_graph_batch(6, seed=4)
    graph = shared_graph(b.edge_index, None, b.num_nodes)
    assert graph.target_bound() > 0.5 * b.num_nodes
    assert_same_step(ref, ours, b)
    with torch.no_grad():
        torch.testing.assert_close(ours(b.x, b.edge_index, b.batch), ref(b.x, b.edge_index, b.batch))
    assert calls == [] and graph.last_setup is not None and not graph.last_setup.build
    assert all(conv.last_plan.scheme == functional_gcn.COMPOSED_SCHEME and conv.last_plan.rows is None for conv in ours.convs)
    ei, n = leaves_graph()
    assert shared_graph(ei, None, n).target_bound() == 8
    x = torch.randn(n, 8, dtype=F64, requires_grad=True)
    outs = [conv(x, ei) for conv in (ref.convs[0], ours.convs[0])]
    torch.testing.assert_close(outs[1], outs[0])
    assert len(calls) == 1 and ours.convs[0].last_plan.rows == int(torch.unique(ei[1]).numel())
    grads = [torch.autograd.grad(out.square().sum(), x)[0] for out in outs]
    torch.testing.assert_close(grads[1], grads[0])


def test_target_bound_is_one_past_the_largest_target():
    assert corgnn.Graph(torch.tensor([[0, 3, 1], [2, 0, 5]]), num_nodes=9).target_bound() == 6
    assert corgnn.Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4).target_bound() == 0


def test_targets_beyond_reads_the_last_edge_before_reducing():
    b = small_graph_batch(6, seed=4)
    g = Graph(b.edge_index, num_nodes=b.num_nodes)
    assert g.targets_beyond(0.5 * b.num_nodes) and "target-bound" not in g._cache  # (a batch's last edge: in its last graph)
    ei, n = leaves_graph()  # (targets first, as NeighborLoader: its last edge ends in node 3)
    g = Graph(ei, num_nodes=n)
    assert not g.targets_beyond(0.5 * n) and g._cache["target-bound"] == 8
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(2, 30, (1,), generator=gen))
        g = Graph(torch.randint(0, n, (2, int(torch.randint(1, 40, (1,), generator=gen))), generator=gen), num_nodes=n)
        bound = Graph(g.edge_index.clone(), num_nodes=n).target_bound()
        for limit in (0, bound - 1, bound - 0.5, bound, bound + 0.5, n):
            assert g.targets_beyond(limit) == (bound > limit), (g.edge_index, limit)
    assert not Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4).targets_beyond(0)


# --------------------------------------------------- explain masks, edge weights


def test_pyg_explainer_on_an_optimized_gcn_gives_pyg_masks():
    from torch_geometric.explain import Explainer, GNNExplainer

    ei, n = make_graph(n=30, q=90)
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(1))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = PygGCNConv(6, 8), PygGCNConv(8, 3)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index).log_softmax(-1)

    torch.manual_seed(0)
    ref = Net().eval()
    ours = corgnn.optimize(copy.deepcopy(ref)).eval()
    masks = []
    for model in (ref, ours):
        torch.manual_seed(5)
        explainer = Explainer(
            model, algorithm=GNNExplainer(epochs=20), explanation_type="model", node_mask_type="attributes",
            edge_mask_type="object", model_config=dict(mode="multiclass_classification", task_level="node", return_type="log_probs"),
        )
        masks.append(explainer(x, ei, index=3))
    assert (masks[0].edge_mask > 0).sum() > 0
    torch.testing.assert_close(masks[1].edge_mask, masks[0].edge_mask, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(masks[1].node_mask, masks[0].node_mask, rtol=1e-4, atol=1e-5)
    assert all(m._explain is not True for m in ours.modules() if isinstance(m, GCNConv))  # cleared afterwards


def test_a_layer_that_cannot_apply_explain_masks_refuses_them():
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    from corgnn.nn import GATConv

    ei, n = make_graph()
    layer = GATConv(4, 3)
    with pytest.raises(UnsupportedOption, match="explain edge masks"):
        set_masks(layer, torch.nn.Parameter(torch.randn(ei.size(1))), ei)
    clear_masks(layer)
    assert layer.explain is not True
    layer(torch.randn(n, 4), ei)


def _pyg_layers():
    import torch_geometric.nn as pyg

    return {
        "gcn": lambda: PygGCNConv(4, 3),
        "gcn-improved-noloops": lambda: PygGCNConv(4, 3, improved=True, add_self_loops=False),
        "sage-mean": lambda: pyg.SAGEConv(4, 3),
        "sage-sum": lambda: pyg.SAGEConv(4, 3, aggr="sum"),
        "graphconv": lambda: pyg.GraphConv(4, 3),
        "gin": lambda: PygGINConv(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), train_eps=True),
        "sgc": lambda: pyg.SGConv(4, 3, K=2),
        "appnp": lambda: pyg.APPNP(K=2, alpha=0.2),
    }


@pytest.mark.parametrize("kind", list(_pyg_layers()))
@pytest.mark.parametrize("few_targets", [False, True])
def test_explain_mask_equals_pyg_message_masking(kind, few_targets):
    """set_masks on a converted layer: the output and the mask's gradient are PyG's
    (also where few nodes have incoming edges: SAGE and GraphConv then aggregate on
    those rows only, with the masks in the same entry order)."""
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    ei, n = leaves_graph() if few_targets else make_graph()
    torch.manual_seed(0)
    ref = _pyg_layers()[kind]().double()
    ours = corgnn.optimize(torch.nn.ModuleList([copy.deepcopy(ref)]))[0]
    assert type(ours).__module__.startswith("corgnn.")
    x = torch.randn(n, 4, dtype=F64)
    got = []
    for layer in (ref, ours):
        mask = torch.nn.Parameter(torch.linspace(-2, 2, ei.size(1), dtype=F64))
        set_masks(layer, mask, ei, apply_sigmoid=True)
        out = layer(x, ei)
        out.square().sum().backward()
        got.append((out, mask.grad))
        clear_masks(layer)
    torch.testing.assert_close(got[1][0], got[0][0])
    torch.testing.assert_close(got[1][1], got[0][1])
    assert got[0][1].abs().sum() > 0
    torch.testing.assert_close(ours(x, ei), ref(x, ei))  # (cleared: no mask any more)


def test_changing_learnable_edge_weights_reuse_one_pattern():
    ei, n = make_graph()
    layer = GCNConv(4, 3).double()
    x = torch.randn(n, 4, dtype=F64)
    mats = set()
    for step in range(3):
        w = torch.rand(ei.size(1), dtype=F64, requires_grad=True)
        layer(x, ei, w.sigmoid()).sum().backward()
        mats.add(id(layer.adjacency(shared_graph(ei, None, n), F64)))
        assert w.grad is not None and w.grad.abs().sum() > 0
    assert len(mats) == 1


# --------------------------------------------------- inference_mode, clear_caches


def _pyg_and_optimized(make):
    """``(PyG's module from make(), its optimize()d copy, edge_index, n, x (n, 8))``, seeded."""
    torch.manual_seed(0)
    ref = make()
    ei, n = make_graph()
    return ref, corgnn.optimize(copy.deepcopy(ref)), ei, n, torch.randn(n, 8)


@pytest.mark.parametrize("make", [
    lambda: torch.nn.ModuleList([PygGCNConv(8, 4)]),
    lambda: torch.nn.ModuleList([PygGINConv(torch.nn.Linear(8, 4))]),
])
def test_inference_mode_then_training_on_the_same_tensors(make):
    """Lightning validates under inference_mode and then trains on the same graph."""
    ref, ours, ei, n, x = _pyg_and_optimized(make)
    with torch.inference_mode():
        xi, ei_i = torch.randn(n, 8), ei.clone()  # inference tensors
        torch.testing.assert_close(ours[0](xi, ei_i), ref[0](xi, ei_i))
        torch.testing.assert_close(ours[0](x, ei), ref[0](x, ei))
    out = ours[0](x, ei)
    out.sum().backward()
    torch.testing.assert_close(out, ref[0](x, ei))


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("make", [
    lambda: PygGCNConv(8, 4),
    lambda: PygGINConv(torch.nn.Linear(8, 4)),
    lambda: PygSAGEConv(8, 4),
])
def test_a_sparse_adjacency_made_under_inference_mode(make, layout):
    """A ``torch.sparse`` ``adj_t`` made inside ``torch.inference_mode`` (an inference
    tensor: no version counter) is a graph like any: the same outputs as PyG's, twice
    (the second call from the cached graph)."""
    ref, ours, ei, n, x = _pyg_and_optimized(make)
    with torch.inference_mode():
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), (n, n)).coalesce()
        adj = adj.to_sparse_csr() if layout == "csr" else adj
        expected = ref(x, adj)
        for _ in range(2):
            torch.testing.assert_close(ours(x, adj), expected)


def test_clear_caches_drops_the_store_and_the_layers_caches():
    ei, n = make_graph()
    layer = GCNConv(4, 3)
    x = torch.randn(n, 4)
    layer(x, ei)
    assert len(GRAPHS) > 0 and layer._features.newest is not None or layer._features._slots
    ei.data[0, 0] = 7  # bypasses the version counter: not seen by the keys
    corgnn.clear_caches(layer)
    from corgnn.graph import CONTENT_GRAPHS

    assert len(GRAPHS) == 0 and len(CONTENT_GRAPHS) == 0 and not layer._features._slots
    fresh = GCNConv(4, 3)
    fresh.load_state_dict(layer.state_dict())
    corgnn.clear_caches()
    torch.testing.assert_close(layer(x, ei), fresh(x, ei.clone()))
    with pytest.raises(TypeError, match="model"):
        corgnn.clear_caches("model")


def test_gin_pickles_after_a_forward():
    ei, n = make_graph()
    layer = GINConv(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    layer(torch.randn(n, 4), ei)
    copy_ = pickle.loads(pickle.dumps(layer))
    x = torch.randn(n, 4)
    torch.testing.assert_close(copy_(x, ei), layer(x, ei))


# ------------------------------------------------- weighted torch.sparse adj_t


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("make", [
    lambda: __import__("torch_geometric.nn", fromlist=["SAGEConv"]).SAGEConv(4, 3),
    lambda: __import__("torch_geometric.nn", fromlist=["SAGEConv"]).SAGEConv(4, 3, aggr="sum"),
    lambda: PygGINConv(torch.nn.Linear(4, 3)),
], ids=["sage-mean", "sage-sum", "gin"])
def test_aggregation_layers_weigh_a_torch_sparse_adjacency_as_pyg(layout, make):
    """PyG's SAGEConv/GINConv multiply messages by a torch.sparse adj_t's stored values."""
    ei, n = make_graph()
    g = torch.Generator().manual_seed(2)
    w = torch.rand(ei.size(1), generator=g, dtype=F64) + 0.5
    adj = torch.sparse_coo_tensor(ei.flip(0), w, (n, n)).coalesce()
    adj = adj.to_sparse_csr() if layout == "csr" else adj
    torch.manual_seed(0)
    ref = make().double()
    ours = corgnn.optimize(torch.nn.ModuleList([copy.deepcopy(ref)]))[0]
    x = torch.randn(n, 4, dtype=F64, generator=g)
    unweighted = ref(x, torch.sparse_coo_tensor(ei.flip(0), torch.ones_like(w), (n, n)).coalesce())
    want = ref(x, adj)
    assert not torch.allclose(want, unweighted)  # (the values matter)
    torch.testing.assert_close(ours(x, adj), want)


def test_optimize_leaves_an_appnp_with_dropout_one_to_pyg():
    from torch_geometric.nn import APPNP as PygAPPNP

    model = torch.nn.ModuleList([PygAPPNP(K=2, alpha=0.1, dropout=1.0)])
    with pytest.warns(UserWarning, match="dropout=1.0"):
        out = corgnn.optimize(model)
    assert isinstance(out[0], PygAPPNP)


# ------------------------------------------------------- per-call overheads


def test_approximate_plans_cost_rounded_sizes_and_keep_the_calls_own():
    from corgnn.cost.gcn import PLAN_SIGNIFICANT_BITS, plan_gcn, rounded_size

    assert rounded_size(None) is None and rounded_size(63) == 63 and rounded_size(64) == 64
    assert rounded_size(801) == 800 and rounded_size(4003) == 3968
    for v in (65, 801, 4003, 123_457, 2**40 + 12345):
        r = rounded_size(v)
        assert r <= v and (v - r) / v < 2.0 ** (1 - PLAN_SIGNIFICANT_BITS) and r.bit_length() == v.bit_length()
        assert bin(r).rstrip("0").count("1") <= PLAN_SIGNIFICANT_BITS
    for n, q, m, k, ig in ((801, 4003, 64, 64, True), (2708, 13264, 1433, 16, False), (50_001, 800_123, 128, 512, True)):
        exact = plan_gcn(n, q, m, k, ig)
        approx = plan_gcn(n, q, m, k, ig, approximate=True)
        at = plan_gcn(rounded_size(n), rounded_size(q), m, k, ig)
        assert (approx.n, approx.q, approx.costed_at) == (n, q, (rounded_size(n), rounded_size(q), None))
        assert approx.scheme == at.scheme and approx.costs == at.costs
        assert approx.scheme.forward == exact.scheme.forward  # (rounding by < 1.6 % moves no Table-2 boundary here)
        assert "sizes rounded" in approx.table() and "sizes rounded" not in exact.table()
    small = plan_gcn(40, 60, 8, 4, True, approximate=True)
    assert small.costed_at is None and small == plan_gcn(40, 60, 8, 4, True)


def test_gin_with_a_frozen_eps_sees_eps_and_nn_edits():
    torch.manual_seed(0)
    ei = torch.randint(0, 30, (2, 90))
    x = torch.randn(30, 6, dtype=F64)
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5)).double()
    ref = PygGINConv(copy.deepcopy(mlp), eps=0.25)
    ours = corgnn.optimize(copy.deepcopy(ref))
    assert torch.allclose(ours(x, ei), ref(x, ei), atol=1e-12)
    for layer in (ref, ours):
        layer.eps.fill_(-0.5)  # an in-place edit of the frozen eps: the kept values must follow
    assert torch.allclose(ours(x, ei), ref(x, ei), atol=1e-12)
    lin = torch.nn.Linear(6, 8).double()
    for layer in (ref, ours):
        layer.nn[0] = copy.deepcopy(lin)  # a replaced first Linear: the memoised slot must follow
    assert torch.allclose(ours(x, ei), ref(x, ei), atol=1e-12)
    with torch.no_grad():
        assert torch.allclose(ours(x, ei), ref(x, ei), atol=1e-12)


@pytest.mark.parametrize("eps", [0.0, 0.25, -1.0])
def test_gin_layers_with_one_frozen_eps_share_one_matrix_a_plus_c_i(eps):
    ei = torch.tensor([[0, 1, 1, 2, 3, 3], [1, 0, 2, 2, 1, 1]])  # a self-loop (2, 2), a duplicate (3 -> 1), node 4 isolated
    g = Graph(ei, num_nodes=5)
    c = 1.0 + eps
    A = g.aggr_adjacency("sum", dtype=F64, diagonal=True, diagonal_value=c)
    dense = torch.zeros(5, 5, dtype=F64).index_put_((ei[1], ei[0]), torch.ones(6, dtype=F64), accumulate=True) + c * torch.eye(5, dtype=F64)
    assert torch.equal(A.to_dense(), dense)
    assert g.aggr_adjacency("sum", dtype=F64, diagonal=True, diagonal_value=c) is A  # cached per value
    torch.manual_seed(0)
    mk = lambda: PygGINConv(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3)).double(), eps=eps)
    refs = [mk(), mk()]
    ours = [corgnn.optimize(copy.deepcopy(r)) for r in refs]
    x = torch.randn(5, 4, dtype=F64)
    for r, o in zip(refs, ours):
        assert torch.allclose(o(x, g), r(x, ei), atol=1e-12)
    mats = {id(ours[0].adjacency(g, F64, c)), id(ours[1].adjacency(g, F64, c))}
    assert len(mats) == 1  # two layers, one matrix


def test_non_finite_features_are_refused_from_the_caller_not_from_activations():
    layer = GCNConv(4, 3)
    ei = torch.randint(0, 10, (2, 30))
    bad = torch.randn(10, 4)
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains 1 NaN"):
        layer(bad, ei)
    with pytest.raises(ValueError, match="x contains 1 NaN"):
        layer(bad.requires_grad_(), ei)  # (a leaf that needs a gradient is still the caller's data)
    act = bad * torch.ones(1, requires_grad=True)  # an activation: the model's own arithmetic, as in PyG
    assert torch.isnan(layer(act, ei)).any()


class _NanInside(torch.nn.Module):
    """Two GCNConv layers with a NaN made between them (the model's own arithmetic)."""

    def __init__(self):
        from torch_geometric.nn import GCNConv as PygGCNConv

        super().__init__()
        self.conv1, self.conv2 = PygGCNConv(4, 8), PygGCNConv(8, 3)
        self.poison = False

    def forward(self, x, edge_index):
        h = self.conv1(x, edge_index).relu()
        if self.poison:
            h = h.clone()
            h[0, 0] = float("nan")
        return self.conv2(h, edge_index)


@pytest.mark.parametrize("pass_as", ["args", "data"])
def test_an_optimized_model_scans_its_callers_tensors_not_its_activations_under_no_grad(pass_as):
    """Inside an optimize()d model's forward only the tensors its caller passed are
    scanned for NaN/Inf (as a tensor with a grad_fn never was): under no_grad an
    activation with a NaN runs through as in PyG, a NaN in the caller's x (also in a
    PyG Data object) is refused naming x; the scope is left also after an exception."""
    from torch_geometric.data import Data

    import corgnn._validate as V

    torch.manual_seed(0)
    ref = _NanInside()
    model = corgnn.optimize(copy.deepcopy(ref) if pass_as == "args" else _DataModel(copy.deepcopy(ref))).train(False)
    ei = torch.randint(0, 10, (2, 30))
    x = torch.randn(10, 4)
    inner = model if pass_as == "args" else model.inner

    def call(x):
        return model(x, ei) if pass_as == "args" else model(Data(x=x, edge_index=ei))

    inner.poison = ref.poison = True
    with torch.no_grad():
        out, want = call(x), ref(x, ei)
    assert torch.isnan(out).any() and torch.equal(torch.isnan(out), torch.isnan(want))  # (PyG's NaNs, no error)
    bad = x.clone()
    bad[3, 2] = float("nan")
    inner.poison = False
    with torch.no_grad(), pytest.raises(ValueError, match="x contains 1 NaN"):
        call(bad)
    assert V._SCOPE.inputs == []  # (left on the exception)
    with torch.no_grad(), pytest.raises(ValueError, match="x contains 80 NaN"):
        inner.conv2(torch.full((10, 8), float("nan")), ei)  # a layer called alone: its caller's data


class _DataModel(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, data):
        return self.inner(data.x, data.edge_index)


def test_a_stream_of_activations_in_an_optimized_model_skips_the_per_tensor_bookkeeping(monkeypatch):
    """Under no_grad, once a layer's input stream is known too dense, an activation of
    the running optimize()d model gets no fingerprint, slot search or insertion (only
    the recount every DENSE_RECOUNT-th tensor does), while the caller's x still does;
    outputs stay PyG's."""
    import corgnn.nn.base as base

    torch.manual_seed(0)
    ref = _NanInside().eval()
    model = corgnn.optimize(copy.deepcopy(ref)).eval()
    ei = torch.randint(0, 10, (2, 30))
    R = base.DENSE_RECOUNT
    with torch.no_grad():
        for _ in range(3 * R):
            model(torch.randn(10, 4), ei)
        counted = []
        real = base.tensor_state
        monkeypatch.setattr(base, "tensor_state", lambda t: counted.append(t.size(1)) or real(t))
        for _ in range(R):
            x = torch.randn(10, 4)
            torch.testing.assert_close(model(x, ei), ref(x, ei))
    assert counted.count(4) == R  # the caller's x: every call
    assert counted.count(8) == 1  # conv2's activations: the recount only


def test_the_model_scope_hooks_survive_copies_and_are_installed_once():
    import pickle

    import corgnn._validate as V

    model = corgnn.optimize(_NanInside())
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
    corgnn.optimize(model)
    assert len(model._forward_pre_hooks) == 1  # (a second optimize adds none)
    ei = torch.randint(0, 10, (2, 30))
    x = torch.randn(10, 4)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert len(twin._forward_pre_hooks) == 1
        with torch.no_grad():
            torch.testing.assert_close(twin(x, ei), model(x, ei))
    assert V._input_ids((x, [ei, None], {"w": x}, 3), {"k": None}) == frozenset({id(x), id(ei)})
    assert V._input_ids((object(),), {}) is None  # (unknown contents: every tensor counts as the caller's)
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    corgnn.optimize(plain)
    assert not plain._forward_pre_hooks  # (no layer replaced: the model is left alone)


def test_a_dense_sample_rules_out_the_sparse_feature_count_only_for_dense_features():
    from corgnn.nn.base import SPARSE_FEATURE_DENSITY, dense_sample_rules_out

    g = torch.Generator().manual_seed(0)
    for n, m in ((1000, 16), (2708, 1433), (5000, 64)):
        limit = int(SPARSE_FEATURE_DENSITY * n * m)
        half = torch.randn(n, m, generator=g).relu()  # an activation: about half non-zero
        assert dense_sample_rules_out(half, limit)
        for density in (0.01, 0.03, SPARSE_FEATURE_DENSITY):
            sparse = torch.randn(n, m, generator=g) * (torch.rand(n, m, generator=g) < density)
            assert not dense_sample_rules_out(sparse, limit)
        clustered = torch.zeros(n, m)
        clustered[: n // 50] = 1.0  # 2 % non-zero, all in the first rows: the sample must not rule it out
        assert not dense_sample_rules_out(clustered, limit)
    assert not dense_sample_rules_out(torch.ones(100, 8), 0)  # (small x: always counted in full)


def test_a_stream_of_dense_new_features_is_recounted_only_every_few_tensors(monkeypatch):
    """Features that arrive as a new tensor every call and keep being too dense (no-grad
    activations) are counted only every DENSE_RECOUNT-th tensor; a sparse tensor in
    the stream is converted from the next recount on, and every one after it."""
    import corgnn.nn.base as base

    counted = []
    real = base.dense_sample_rules_out
    monkeypatch.setattr(base, "dense_sample_rules_out", lambda x, limit: counted.append(1) or real(x, limit))
    g = torch.Generator().manual_seed(0)
    cache, R = base.FeatureCache(), base.DENSE_RECOUNT
    n, m = 1000, 64
    dense = [torch.randn(n, m, generator=g).relu() for _ in range(4 * R)]
    for x in dense:
        assert cache(x, n, m, width=64, training=False) is None
    S = base.DENSE_STREAK
    # the first (no stream yet), S in a row, then a recount every R-th tensor of the stream
    assert len(counted) == 1 + sum(1 for run in range(len(dense) - 1) if run < S or run % R == 0)
    sparse = [torch.randn(n, m, generator=g) * (torch.rand(n, m, generator=g) < 0.01) for _ in range(2 * R)]
    got = [cache(x, n, m, width=64, training=False) for x in sparse]
    first = next(i for i, csr in enumerate(got) if csr is not None)
    assert first < R  # converted from the next recount on ...
    assert all(csr is not None for csr in got[first:])  # ... and every one after it
    torch.testing.assert_close(got[-1].to_dense(), sparse[-1])


def test_a_stream_of_new_features_not_worth_converting_is_recounted_only_every_few_tensors(monkeypatch):
    """New tensors under the density limit whose one-use conversion plan says "dense"
    (a sampled subgraph's rows of ~10 %-dense features, under the 12 % limit) are not
    counted in full on every call either: as a too-dense stream, after DENSE_STREAK in a
    row, every DENSE_RECOUNT-th."""
    import corgnn.nn.base as base

    counted = []
    real = base.row_pointer
    monkeypatch.setattr(base, "row_pointer", lambda x: counted.append(1) or real(x))
    g = torch.Generator().manual_seed(0)
    cache, R, S = base.FeatureCache(), base.DENSE_RECOUNT, base.DENSE_STREAK
    n, m, width = 2000, 500, 64
    assert base.sparse_feature_density(width) >= 0.1
    length = S + 2 * R + 1
    stream = (torch.rand(n, m, generator=g) * (torch.rand(n, m, generator=g) < 0.1) for _ in range(length))
    cache(next(stream), n, m, width=width, training=True)  # (no stream yet: converted as reused features)
    for x in stream:
        assert cache(x, n, m, width=width, training=True) is None
    assert cache.last_conversion is not None and not cache.last_conversion.convert  # the plan's "dense", not the limit
    assert len(counted) == 1 + sum(1 for run in range(length - 1) if run < S or run % R == 0)


def test_inference_on_activations_gives_pyg_outputs_with_and_without_sparse_inputs():
    torch.manual_seed(0)
    ei = torch.randint(0, 400, (2, 1600))
    mk = lambda i: PygGINConv(torch.nn.Sequential(torch.nn.Linear(i, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16)))  # noqa: E731
    ref = torch.nn.ModuleList([mk(32), mk(16)])
    ours = corgnn.optimize(copy.deepcopy(ref))
    sparse_x = torch.randn(400, 32) * (torch.rand(400, 32) < 0.02)
    for x in (torch.randn(400, 32), sparse_x):
        with torch.no_grad():
            h, r = x, x
            for a, b in zip(ours, ref):
                h, r = a(h, ei).relu(), b(r, ei).relu()
        assert torch.allclose(h, r, atol=1e-5)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat", "sgc", "appnp"])
def test_a_write_that_bypasses_the_version_counter_gives_one_answer_whole_then_clear_caches_the_new(kind):
    """Issue 23 item 3: mostly-zero x (the sparse-feature path), a write through
    ``x.data``: never a mix of the old and the new features."""
    from torch_geometric.nn import APPNP, GATConv, SAGEConv, SGConv

    torch.manual_seed(0)
    n = 200
    ei = torch.randint(0, n, (2, 800))
    x = torch.randn(n, 50) * (torch.rand(n, 50) < 0.02)
    make = {"sage": lambda: SAGEConv(50, 8), "gcn": lambda: PygGCNConv(50, 8), "gat": lambda: GATConv(50, 8, heads=2),
            "sgc": lambda: SGConv(50, 8), "appnp": lambda: APPNP(10, 0.1)}[kind]
    ref = make()
    ours = corgnn.optimize(copy.deepcopy(ref))
    for grad in (True, False):
        xx = x.clone()
        with torch.set_grad_enabled(grad):
            old = ref(xx, ei)
            ours(xx, ei), ours(xx, ei)
            xx.data[3, 1] = 5.0
            xx.data[int(ei[0, 0]), 2] = 3.0
            new = ref(xx, ei)
            got = ours(xx, ei)
            assert torch.allclose(got, old, atol=1e-5) or torch.allclose(got, new, atol=1e-5)  # one answer, whole
            corgnn.clear_caches(ours)
            torch.testing.assert_close(ours(xx, ei), new, atol=1e-5, rtol=1e-5)
