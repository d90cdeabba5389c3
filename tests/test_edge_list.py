"""A new graph's matrix rented, not bought: the unsorted-COO SpMM (``spmm_coo``), a
graph's edge list (:meth:`corgnn.Graph.aggr_adjacency` with ``columns``), the
rent-or-buy plan (:mod:`corgnn.cost.setup`) and GIN on it, against PyG."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINConv as PygGINConv
from torch_geometric.nn import global_add_pool

import corgnn
import corgnn.cost.setup as setup
from corgnn.graph import Graph, shared_graph
from corgnn.sparse import COO, CSR, edge_softmax, spmm
from corgnn.sparse import library as L
from corgnn.sparse.backends import numba_cpu
from corgnn.sparse.dispatch import use_backend

F64 = torch.float64


def unsorted_coo(seed=0, n=30, m=20, q=120, dtype=F64, values=True):
    g = torch.Generator().manual_seed(seed)
    row, col = torch.randint(0, n, (q,), generator=g), torch.randint(0, m, (q,), generator=g)
    val = torch.randn(q, generator=g, dtype=dtype) if values else None
    return COO(row, col, val, (n, m))


def dense(A):
    return A.to_dense() if A.val is not None else A.with_values(torch.ones(A.nnz, dtype=F64)).to_dense()


# ------------------------------------------------------------------ the kernel op


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("values", [True, False])
def test_spmm_coo_op_equals_dense_in_any_entry_order(backend, values):
    A = unsorted_coo(values=values)
    B = torch.randn(20, 5, dtype=F64)
    with use_backend(backend):
        out = L.spmm_coo(A.row, A.col, A.val, 30, B)
        outT = L.spmm_coo(A.col, A.row, A.val, 20, torch.randn(30, 5, dtype=F64).copy_(B.new_ones(30, 5)))
        out3 = L.spmm_coo(A.row, A.col, A.val, 30, B.view(20, 1, 5).expand(20, 2, 5).contiguous())
    torch.testing.assert_close(out, dense(A) @ B)
    torch.testing.assert_close(outT, dense(A).t() @ torch.ones(30, 5, dtype=F64))
    torch.testing.assert_close(out3, (dense(A) @ B).unsqueeze(1).expand(30, 2, 5))


@pytest.mark.parametrize("task_work", [1, 7, 1 << 30])
def test_spmm_coo_split_over_threads_equals_one_thread(task_work, monkeypatch):
    """Output rows split over tasks (each task adds its own rows' entries): the same
    sums as one thread, whatever the split (rows empty, a row in every task)."""
    monkeypatch.setattr(numba_cpu, "SCATTER_PARALLEL_WORK", task_work)
    monkeypatch.setenv("CORGNN_TIER_UP_S", "0")
    for dt in (torch.float32, F64):
        A = unsorted_coo(seed=3, n=40, m=40, q=300, dtype=dt)
        B = torch.randn(40, 9, dtype=dt)
        with use_backend("numba"):
            out = L.spmm_coo(A.row, A.col, A.val, 40, B)
        torch.testing.assert_close(out, (A.to_dense().double() @ B.double()).to(dt), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- COO products


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_unsorted_coo_products_scatter_without_a_row_plan_and_gradcheck(backend):
    A = unsorted_coo()
    B = torch.randn(20, 4, dtype=F64, requires_grad=True)
    val = A.val.clone().requires_grad_()
    with use_backend(backend):
        fresh = unsorted_coo()
        gB, gval = torch.autograd.grad(spmm(fresh, B, values=val).sum(), [B, val])
        assert False not in fresh.plans and True not in fresh.plans  # no row plan: the entries were scattered
        torch.testing.assert_close(gB, dense(A).t() @ torch.ones(30, 4, dtype=F64))
        assert torch.autograd.gradcheck(lambda b, v: spmm(A, b, values=v), (B, val))
        assert torch.autograd.gradcheck(lambda b: spmm(A, b, transpose=True), (torch.randn(30, 4, dtype=F64, requires_grad=True),))


def test_repeated_coo_products_give_the_same_sums_bit_for_bit():
    """The same kernel for the same product every time (no switch to a row plan after
    some uses, none when a row plan exists for another op): a backward run twice, as
    gradcheck's reentrancy check runs it, gives equal gradients."""
    A = unsorted_coo(seed=1, dtype=torch.float32)
    B = torch.randn(20, 16)
    first = [spmm(A, B), spmm(A, torch.ones(30, 16), transpose=True)]
    for _ in range(20):
        assert torch.equal(spmm(A, B), first[0]) and torch.equal(spmm(A, torch.ones(30, 16), transpose=True), first[1])
    edge_softmax(A, torch.randn(A.nnz, 1))  # (walks A's rows: a row plan now exists)
    assert False in A.plans
    assert torch.equal(spmm(A, B), first[0])


# --------------------------------------------------------------- graph edge lists


def _graph(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, 40), generator=g)
    ei = torch.cat([ei, torch.tensor([[3, 3, 5], [3, 7, 7]])], 1)  # a self-loop and a duplicate edge
    return ei, n


@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("c", [None, 0.0, 1.0, 0.5])
def test_edge_list_is_the_built_matrix(aggr, weighted, c):
    ei, n = _graph()
    w = torch.rand(ei.size(1), dtype=F64) if weighted else None
    opts = dict(dtype=F64, weighted=weighted, diagonal=c is not None, diagonal_value=c or 0.0)
    rented = Graph(ei, w, n).aggr_adjacency(aggr, columns=8, **opts)
    built = Graph(ei, w, n).aggr_adjacency(aggr, **opts)
    assert isinstance(rented, COO) and not rented.sorted and rented.nnz == ei.size(1) + (n if c is not None else 0)
    torch.testing.assert_close(dense(rented), built.to_dense())


def test_edge_list_diagonal_mask_marks_the_appended_entries_not_self_loop_edges():
    ei, n = _graph()
    g = Graph(ei, None, n)
    A = g.aggr_adjacency("sum", dtype=F64, diagonal=True, columns=8)
    mask = g.diagonal_mask("sum", dtype=F64, weighted=False, matrix=A)
    assert torch.equal(mask, torch.cat([torch.zeros(ei.size(1), dtype=F64), torch.ones(n, dtype=F64)]))
    csr = Graph(ei, None, n).aggr_adjacency("sum", dtype=F64, diagonal=True)  # (the CSR's mask: one diagonal entry per node)
    assert int(Graph(ei, None, n).diagonal_mask("sum", dtype=F64, weighted=False).sum()) == n == csr.shape[0]


def test_rent_or_buy_switches_to_the_built_matrix_once_the_rent_reaches_the_price(monkeypatch):
    ei, n = _graph()
    g = Graph(ei, None, n)
    price = setup.build_s(g.num_edges)
    # (every product pays 0.4 of the price in rent: the third use builds; a pure
    # function of the call's arguments, so patched before the graph's first call)
    monkeypatch.setattr(corgnn.graph, "scatter_rent_s", lambda nnz, columns, threads, products=1: 0.4 * price)
    A0 = g.aggr_adjacency("sum", dtype=F64, columns=8)
    assert isinstance(A0, COO) and g.last_setup == (False, 0.4 * price, price)
    kinds = [type(g.aggr_adjacency("sum", dtype=F64, columns=8)).__name__ for _ in range(4)]
    assert kinds == ["COO", "CSR", "CSR", "CSR"]
    assert g.last_setup.build and g.last_setup.rent_s >= price
    assert g.aggr_adjacency("sum", dtype=F64, columns=8) is g.aggr_adjacency("sum", dtype=F64)


def test_an_edge_list_without_rent_is_handed_out_again_and_a_build_ends_it():
    # no rent (small graph): the same edge list for every call with those arguments,
    # from the graph's memo; a build for other arguments (no columns) leaves the
    # memo's matrix a correct one, and a built matrix is handed out again too
    ei, n = _graph()
    g = Graph(ei, None, n)
    A = g.aggr_adjacency("sum", dtype=F64, columns=8)
    assert isinstance(A, COO) and g.aggr_adjacency("sum", dtype=F64, columns=8) is A
    assert g.aggr_adjacency("sum", dtype=F64, columns=16) is A  # (another width: the same edge list)
    with torch.no_grad():
        assert g.aggr_adjacency("sum", dtype=F64, columns=8) is A
    C = g.aggr_adjacency("sum", dtype=F64)
    assert isinstance(C, CSR) and g.aggr_adjacency("sum", dtype=F64) is C
    x = torch.randn(n, 8, dtype=F64)
    torch.testing.assert_close(spmm(A, x), spmm(C, x))


def test_the_handed_out_edge_list_serves_every_width_without_rent_and_no_wider():
    """The memo keeps an edge list for every product as narrow as the widest free one
    (``setup.free_columns``: a first layer's 16 columns and the next layer's 64 share
    it), and a wider product goes through the rent again (it counts rent)."""
    threads = torch.get_num_threads()
    q = next(q for q in range(1000, 10**6, 1000) if 8 <= setup.free_columns(q, threads) < 200)
    free = setup.free_columns(q, threads)
    assert setup.scatter_rent_s(q, free, threads) == 0 < setup.scatter_rent_s(q, free + 1, threads)
    assert setup.free_columns(q, threads) <= setup.free_columns(q // 2, threads)  # (fewer entries: wider)
    assert setup.free_columns(0, threads) == float("inf")
    ei = torch.randint(0, q // 4, (2, q), generator=torch.Generator().manual_seed(1))
    g = Graph(ei, None, q // 4)
    A = g.aggr_adjacency("sum", dtype=F64, columns=1)
    assert isinstance(A, COO) and g.last_setup.rent_s == 0
    g.last_setup = None
    assert g.aggr_adjacency("sum", dtype=F64, columns=free) is A and g.last_setup is None  # (from the memo)
    assert g.aggr_adjacency("sum", dtype=F64, columns=free + 1) is A and g.last_setup.rent_s > 0  # (rent counted)


def test_no_edge_list_without_columns_or_for_another_format():
    ei, n = _graph()
    assert type(Graph(ei, None, n).aggr_adjacency("sum", dtype=F64)).__name__ == "CSR"
    assert type(Graph(ei, None, n).aggr_adjacency("sum", dtype=F64, format="coo", columns=8)).__name__ == "COO"
    assert Graph(ei, None, n).aggr_adjacency("sum", dtype=F64, format="coo", columns=8).sorted  # (the CSR's COO)


def test_rent_rules():
    # small graphs: the scatter is the faster, no rent (never built); larger: rent grows
    # with the product count and the width
    assert setup.scatter_rent_s(4000, 64, 2, 2) == 0.0
    assert setup.scatter_rent_s(300_000, 64, 2, 2) == 2 * setup.scatter_rent_s(300_000, 64, 2, 1) > 0
    assert setup.scatter_rent_s(300_000, 16, 2) < setup.scatter_rent_s(300_000, 64, 2)
    assert setup.build_s(10_000) < setup.build_s(20_000)
    assert "edge list" in setup.BuildPlan(False, 0.0, 1e-4).line() and "build" in setup.BuildPlan(True, 2e-4, 1e-4).line()
    with pytest.raises(ValueError, match="must be >= 0"):
        setup.scatter_rent_s(-1, 4, 1)
    with pytest.raises(ValueError, match="threads >= 1"):
        setup.scatter_rent_s(10, 4, 0)


# -------------------------------------------------------------------- GIN on it


def _molecules(count, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(3, 9, (), generator=g))
        ei = torch.randint(0, n, (2, 2 * n), generator=g)  # (self-loops and duplicates possible)
        out.append(Data(x=torch.randn(n, 5, generator=g, dtype=F64), edge_index=ei))
    return out


class _Pool(torch.nn.Module):
    def __init__(self, train_eps, eps):
        super().__init__()
        mlp = lambda i: torch.nn.Sequential(torch.nn.Linear(i, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))  # noqa: E731
        self.convs = torch.nn.ModuleList([PygGINConv(mlp(5), eps=eps, train_eps=train_eps), PygGINConv(torch.nn.Linear(6, 6), eps=eps, train_eps=train_eps)])

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return global_add_pool(x, batch)


@pytest.mark.parametrize("train_eps,eps", [(False, 0.0), (False, 0.3), (True, 0.0), (True, -0.4)])
def test_gin_on_new_mini_batches_matches_pyg_outputs_and_every_gradient(train_eps, eps):
    corgnn.clear_caches()  # (a long stream of new graphs from other tests would skip the content lookup below)
    torch.manual_seed(0)
    ref = _Pool(train_eps, eps).double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    for step in range(3):
        b = Batch.from_data_list(_molecules(6, seed=step))
        x1, x2 = b.x.clone().requires_grad_(), b.x.clone().requires_grad_()
        out_ref, out = ref(x1, b.edge_index, b.batch), ours(x2, b.edge_index.clone(), b.batch)
        torch.testing.assert_close(out, out_ref)
        g = torch.randn_like(out)
        grads_ref = torch.autograd.grad(out_ref, [x1, *ref.parameters()], g)
        grads = torch.autograd.grad(out, [x2, *ours.parameters()], g)
        for a, r in zip(grads, grads_ref):
            torch.testing.assert_close(a, r)
        with torch.no_grad():
            torch.testing.assert_close(ours(b.x, b.edge_index.clone(), b.batch), ref(b.x, b.edge_index, b.batch))
    graph = shared_graph(b.edge_index, None, b.num_nodes)  # (found by content: the graph the calls above used)
    assert any(k[0] == "edges" for k in graph._cache) and not any(k[0] == "aggr" for k in graph._cache)  # edge list, no CSR


def test_gin_gradcheck_on_the_edge_list_with_a_trainable_eps():
    ei, n = _graph(seed=2)
    layer = corgnn.nn.GINConv(torch.nn.Linear(4, 3), eps=0.2, train_eps=True).double()
    x = torch.randn(n, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, e: layer(x, Graph(ei, None, n)) * (1 + 0 * e), (x, layer.eps))
    ran = Graph(ei, None, n)
    layer(x, ran)
    assert ("edges",) in {k[:1] for k in ran._cache} and not any(k[0] == "aggr" for k in ran._cache)  # no CSR built
