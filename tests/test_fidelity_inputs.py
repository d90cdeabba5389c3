"""Drop-in fidelity of the layers' inputs (issue "Drop-in fidelity", items 11-12):
a sparse adjacency in place of ``edge_index`` (``torch.sparse`` COO/CSR and
``torch_sparse.SparseTensor``, PyG's ``adj_t``), and GATConv's
``return_attention_weights``, bipartite inputs / ``in_channels``, ``edge_dim`` with
``edge_attr`` and ``residual``; each compared with PyG's own layer holding the
same parameters (float64: outputs and every gradient), directly and through
``corgnn.optimize``. Each test fails on the code before its fix."""

import importlib.util
import warnings

import pytest
import torch
from torch_geometric.nn import GATConv as PygGATConv
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.graph import Graph
from corgnn.nn import GATConv, GCNConv
from conftest import make_graph

F64 = torch.float64
HAS_TORCH_SPARSE = importlib.util.find_spec("torch_sparse") is not None
LAYOUTS = ["coo", "coo-uncoalesced", "csr"]


def adj_t(ei, n, layout, weight=None):
    """PyG's ``adj_t`` of ``edge_index``: row = target, column = source; a fresh
    tensor on every call (PyG marks a COO argument coalesced in place)."""
    w = torch.ones(ei.size(1), dtype=F64) if weight is None else weight.clone()
    a = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), w, (n, n))
    if layout == "coo-uncoalesced":
        return a
    a = a.coalesce()
    return a.to_sparse_csr() if layout == "csr" else a


def weights(ei, seed=3):
    return torch.rand(ei.size(1), dtype=F64, generator=torch.Generator().manual_seed(seed)) + 0.1


def flatten(out):
    """Every tensor in a (nested) layer output, sparse ones made dense."""
    if isinstance(out, torch.Tensor):
        return [out.to_dense() if out.layout != torch.strided else out]
    return [t for o in out for t in flatten(o)]


def run(layer, call, inputs=()):
    """Outputs of ``call(layer)`` and the gradients of every parameter and input
    after a loss on the output (and on the attention weights, when returned)."""
    layer.zero_grad()
    for t in inputs:
        t.grad = None
    out = call(layer)
    main = out[0] if isinstance(out, tuple) else out
    loss = (main * torch.linspace(-1, 1, main.numel(), dtype=main.dtype).view_as(main)).sum() + main.square().sum()
    if isinstance(out, tuple) and isinstance(out[1], tuple) and out[1][1].requires_grad:
        alpha = out[1][1]
        loss = loss + (alpha * torch.arange(alpha.numel(), dtype=alpha.dtype).view_as(alpha).sin()).sum()
    loss.backward()
    grads = [(name, p.grad) for name, p in layer.named_parameters()] + [(f"input{i}", t.grad) for i, t in enumerate(inputs)]
    return [t.detach() for t in flatten(out)], grads


def assert_same(ref, ours, call, inputs=(), tol=1e-10):
    want_out, want_grads = run(ref, call, inputs)
    got_out, got_grads = run(ours, call, inputs)
    assert len(got_out) == len(want_out)
    for a, b in zip(got_out, want_out):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert [n for n, _ in got_grads] == [n for n, _ in want_grads]
    for (name, a), (_, b) in zip(got_grads, want_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=name)


def gcn_pair(m, k, **kw):
    torch.manual_seed(0)
    ref = PygGCNConv(m, k, **kw).to(F64)
    with torch.no_grad():
        ref.bias.normal_()
    ours = GCNConv(m, k, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def gat_pair(*args, **kw):
    torch.manual_seed(0)
    ref = PygGATConv(*args, **kw).to(F64)
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 1:
                p.normal_()  # a non-zero bias
    ours = GATConv(*args, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())  # the same keys, bipartite / edge_dim / residual included
    return ref, ours


def graph_with_loops():
    """make_graph plus extra self-loops on nodes 7 and 9 (and a duplicated loop)."""
    ei, n = make_graph()
    return torch.cat([ei, torch.tensor([[7, 9, 9], [7, 9, 9]])], dim=1), n


# ============================================ 11: sparse adjacency as edge_index
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kw", [{}, dict(improved=True), dict(normalize=False)], ids=["default", "improved", "no-normalize"])
def test_gcn_torch_sparse_adjacency_matches_pyg(layout, kw):
    """PyG's ``gcn_norm`` on a ``torch.sparse`` adj_t adds a full identity (an
    existing self-loop's weight grows by the fill value, unlike ``edge_index``'s
    ``add_remaining_self_loops``), degrees by target row; the values are the weights."""
    ei, n = graph_with_loops()
    w = weights(ei)
    ref, ours = gcn_pair(5, 3, **kw)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, adj_t(ei, n, layout, w)), [x])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gcn_sparse_adjacency_differs_from_edge_index_where_pyg_does(layout):
    """The self-loop rule follows the input form: with weighted self-loops present,
    the sparse adjacency and the ``edge_index`` give different outputs, in corgnn
    as in PyG."""
    ei, n = graph_with_loops()
    w = weights(ei)
    ref, ours = gcn_pair(5, 3)
    x = torch.randn(n, 5, dtype=F64)
    sparse, dense = ours(x, adj_t(ei, n, layout, w)), ours(x, ei, w)
    assert (sparse - dense).abs().max() > 1e-3
    torch.testing.assert_close(dense, ref(x, ei, w), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("heads,concat", [(1, True), (3, False)])
def test_gat_torch_sparse_adjacency_matches_pyg(layout, add_self_loops, heads, concat):
    """GAT on a sparse adj_t: PyG replaces the loops and coalesces the pattern
    (duplicate entries become one edge); without self-loops it uses the entries as
    stored (PyG needs a coalesced COO there)."""
    if layout == "coo-uncoalesced" and not add_self_loops:
        pytest.skip("PyG's GATConv fails on an uncoalesced COO without self-loops")
    ei, n = graph_with_loops()
    ref, ours = gat_pair(5, 4, heads=heads, concat=concat, add_self_loops=add_self_loops)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, adj_t(ei, n, layout, weights(ei))), [x])
    assert_same(ref, ours, lambda m: m(x, adj_t(ei, n, layout), return_attention_weights=True), [x])


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_gat_sparse_adjacency_attention_weights_are_pygs_sparse_matrix(layout):
    ei, n = graph_with_loops()
    ref, ours = gat_pair(5, 4, heads=2)
    x = torch.randn(n, 5, dtype=F64)
    with torch.no_grad():
        out, (adj, alpha) = ours(x, adj_t(ei, n, layout), return_attention_weights=True)
        want_out, (want_adj, want_alpha) = ref(x, adj_t(ei, n, layout), return_attention_weights=True)
    assert adj.layout == want_adj.layout and adj.shape == want_adj.shape == (n, n, 2)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(adj.to_dense(), want_adj.to_dense(), rtol=1e-10, atol=1e-10)
    if layout == "csr":
        assert torch.equal(adj.crow_indices(), want_adj.crow_indices()) and torch.equal(adj.col_indices(), want_adj.col_indices())
    else:
        assert torch.equal(adj.indices(), want_adj.indices())


def test_sparse_adjacency_graph_is_cached_and_rebuilt_after_in_place_edit():
    ei, n = graph_with_loops()
    ref, ours = gcn_pair(5, 3)
    x = torch.randn(n, 5, dtype=F64)
    a = adj_t(ei, n, "coo", weights(ei))
    first = ours(x, a)
    graph = ours._graphs._graph
    ours(x, a)
    assert ours._graphs._graph is graph  # built once per adjacency
    a._values().mul_(3.0)  # in place: a new graph
    got = ours(x, a)
    assert ours._graphs._graph is not graph
    torch.testing.assert_close(got, ref(x, a), rtol=1e-10, atol=1e-10)
    assert (got - first).abs().max() > 1e-6


def test_sparse_adjacency_errors_name_the_problem():
    ei, n = make_graph()
    x = torch.randn(n, 5, dtype=F64)
    gcn, gat = GCNConv(5, 3).double(), GATConv(5, 3).double()
    a = adj_t(ei, n, "coo")
    # the old message was "edge_index must have an integer dtype"
    with pytest.raises(ValueError, match="edge_weight must be None with a sparse adjacency"):
        gcn(x, a, torch.ones(ei.size(1), dtype=F64))
    with pytest.raises(ValueError, match="layout"):
        gcn(x, a.to_sparse_csc())
    with pytest.raises(ValueError, match="rows but the sparse adjacency"):
        gat(x[:-1], a)
    with pytest.raises(ValueError, match="square"):
        gcn(x, torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1, dtype=F64), (n, n + 1)))
    with pytest.raises(TypeError, match="sparse"):
        Graph(a)
    assert Graph.from_sparse(a).num_nodes == n
    # torch checks a sparse tensor's invariants only when asked: a malformed one is named here
    ones = torch.ones(2, dtype=F64)
    for crow, col, match in (
        ([0, 2, 1], [0, 1], "crow_indices must be non-decreasing"),
        ([1, 1, 2], [0, 1], "crow_indices must start at 0"),
        ([0, 1, 2], [0, n + 5], r"col_indices must lie in \[0, "),
    ):
        bad = torch.sparse_csr_tensor(torch.tensor(crow + [2] * (n - 2)), torch.tensor(col), ones, (n, n))
        with pytest.raises(ValueError, match=match):
            gcn(x, bad)
    with pytest.raises(ValueError, match=f"node id {n + 5} but num_nodes={n}"):
        gcn(x, torch.sparse_coo_tensor(torch.tensor([[0, n + 5], [1, 2]]), ones, (n, n)))


def test_optimized_pyg_model_takes_sparse_adjacency():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = PygGCNConv(5, 6), PygGATConv(6, 3, heads=2)

        def forward(self, x, adj):
            return self.conv2(torch.nn.functional.elu(self.conv1(x, adj)), adj)

    ei, n = graph_with_loops()
    torch.manual_seed(0)
    ref = Net().to(F64)
    torch.manual_seed(0)
    ours = corgnn.optimize(Net().to(F64))
    assert isinstance(ours.conv1, GCNConv) and isinstance(ours.conv2, GATConv)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    for layout in LAYOUTS:
        assert_same(ref, ours, lambda m: m(x, adj_t(ei, n, layout, weights(ei))), [x])


@pytest.mark.skipif(not HAS_TORCH_SPARSE, reason="torch_sparse is not installed: SparseTensor inputs cannot be built")
def test_torch_sparse_sparsetensor_adjacency_matches_pyg():  # pragma: no cover - needs torch_sparse
    from torch_sparse import SparseTensor

    ei, n = graph_with_loops()
    w = weights(ei)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)

    def st(weighted=True):
        return SparseTensor(row=ei[1], col=ei[0], value=w.clone() if weighted else None, sparse_sizes=(n, n))

    ref, ours = gcn_pair(5, 3)
    assert_same(ref, ours, lambda m: m(x, st()), [x])
    assert_same(ref, ours, lambda m: m(x, st(False)), [x])
    ref, ours = gat_pair(5, 4, heads=2)
    assert_same(ref, ours, lambda m: m(x, st(False)), [x])
    with torch.no_grad():
        out, adj = ours(x, st(False), return_attention_weights=True)
        want_out, want_adj = ref(x, st(False), return_attention_weights=True)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(adj.to_dense(), want_adj.to_dense())


# ========================================= 12: GATConv return_attention_weights
@pytest.mark.parametrize("heads,concat,add_self_loops", [(1, True, True), (3, True, True), (3, False, True), (2, True, False)])
def test_gat_return_attention_weights_matches_pyg(heads, concat, add_self_loops):
    """``(out, (edge_index, alpha))``: the edges after PyG's self-loop handling in its
    order (duplicates kept, loops last), alpha ``(q', heads)`` aligned with them and
    differentiable (a loss on alpha gives PyG's gradients)."""
    ei, n = graph_with_loops()
    ref, ours = gat_pair(5, 4, heads=heads, concat=concat, add_self_loops=add_self_loops)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei, return_attention_weights=True), [x])
    out, (edge_index, alpha) = ours(x, ei, return_attention_weights=True)
    _, (want_ei, _) = ref(x, ei, return_attention_weights=True)
    assert torch.equal(edge_index, want_ei) and alpha.shape == (want_ei.size(1), heads)
    with torch.no_grad():  # the fused kernels' alpha
        got = ours(x, ei, return_attention_weights=True)
        want = ref(x, ei, return_attention_weights=True)
    assert ours.last_cache is not None
    for a, b in zip(flatten(got), flatten(want)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gat_return_attention_weights_false_returns_the_tensor():
    ei, n = make_graph()
    ref, ours = gat_pair(5, 4, heads=2)
    x = torch.randn(n, 5, dtype=F64)
    for flag in (False, None):  # PyG returns the weights for a true value only
        got, want = ours(x, ei, return_attention_weights=flag), ref(x, ei, return_attention_weights=flag)
        assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_gat_attention_weights_with_dropout_in_training():
    ei, n = make_graph()
    _, ours = gat_pair(5, 4, heads=2, dropout=0.5)
    ours.train()
    x = torch.randn(n, 5, dtype=F64)
    out, (edge_index, alpha) = ours(x, ei, return_attention_weights=True)
    dropped = (alpha == 0).float().mean()
    assert 0.3 < dropped < 0.7 and alpha.shape == (edge_index.size(1), 2)
    assert bool((alpha <= 2.0 + 1e-12).all())  # kept coefficients scaled by 1 / (1 - p)


# ====================================================== 12: bipartite GATConv
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("heads,concat", [(2, True), (2, False)])
def test_gat_bipartite_in_channels_matches_pyg(add_self_loops, heads, concat):
    """``in_channels=(m_src, m_dst)``: lin_src/lin_dst (state_dict keys as PyG's),
    ``(x_src, x_dst)`` inputs with different node counts; self-loops for the nodes
    both sides have."""
    ei, n = graph_with_loops()
    n_dst = 25
    ei = ei[:, ei[1] < n_dst]
    ref, ours = gat_pair((5, 3), 4, heads=heads, concat=concat, add_self_loops=add_self_loops)
    assert set(ours.state_dict()) == set(ref.state_dict()) >= {"lin_src.weight", "lin_dst.weight"}
    x_src = torch.randn(n, 5, dtype=F64, requires_grad=True)
    x_dst = torch.randn(n_dst, 3, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m((x_src, x_dst), ei), [x_src, x_dst])
    assert_same(ref, ours, lambda m: m((x_src, x_dst), ei, return_attention_weights=True), [x_src, x_dst])


def test_gat_bipartite_variants_match_pyg():
    ei, n = graph_with_loops()
    n_dst = 25
    bei = ei[:, ei[1] < n_dst]
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    x_dst = torch.randn(n_dst, 5, dtype=F64, requires_grad=True)
    ref, ours = gat_pair(5, 4, heads=2)  # shared lin, pair input
    assert_same(ref, ours, lambda m: m((x, x_dst), bei), [x, x_dst])
    assert_same(ref, ours, lambda m: m((x, x_dst), bei, size=(n, n_dst)), [x, x_dst])
    assert_same(ref, ours, lambda m: m((x, None), ei, size=(n, n)), [x])  # no target features
    ref, ours = gat_pair((5, 5), 4, heads=2)  # separate transforms, one feature matrix
    assert_same(ref, ours, lambda m: m(x, ei, return_attention_weights=True), [x])
    assert_same(ref, ours, lambda m: m(x, adj_t(ei, n, "csr")), [x])
    with pytest.raises(ValueError, match="target id"):
        ours((x, x_dst), ei)


# ============================================================ 12: edge_dim
@pytest.mark.parametrize("fill_value", ["mean", 0.5, "add", "max", "tensor"])
def test_gat_edge_features_match_pyg(fill_value):
    """``edge_dim`` with ``edge_attr``: ``<lin_edge(e), att_edge>`` in each logit;
    self-loops get PyG's ``fill_value`` features; gradients reach edge_attr too."""
    if fill_value == "tensor":
        fill_value = torch.tensor([0.1, -0.2, 0.3], dtype=F64)
    ei, n = graph_with_loops()
    ref, ours = gat_pair(5, 4, heads=2, edge_dim=3, fill_value=fill_value)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    ea = torch.randn(ei.size(1), 3, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei, edge_attr=ea), [x, ea])
    assert_same(ref, ours, lambda m: m(x, ei, ea, return_attention_weights=True), [x, ea])
    assert_same(ref, ours, lambda m: m(x, ei), [x])  # edge_dim without edge_attr: no edge term


def test_gat_edge_features_variants_match_pyg():
    ei, n = graph_with_loops()
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    ea1 = torch.randn(ei.size(1), dtype=F64, requires_grad=True)
    ref, ours = gat_pair(5, 4, heads=3, concat=False, edge_dim=1)  # 1-D edge_attr
    assert_same(ref, ours, lambda m: m(x, ei, edge_attr=ea1), [x, ea1])
    ref, ours = gat_pair(5, 4, heads=2, edge_dim=1, add_self_loops=False)
    assert_same(ref, ours, lambda m: m(x, ei, edge_attr=ea1), [x, ea1])
    n_dst = 25
    bei = ei[:, ei[1] < n_dst]
    ea = torch.randn(bei.size(1), 2, dtype=F64, requires_grad=True)
    x_dst = torch.randn(n_dst, 3, dtype=F64, requires_grad=True)
    ref, ours = gat_pair((5, 3), 4, heads=2, edge_dim=2)
    assert_same(ref, ours, lambda m: m((x, x_dst), bei, ea), [x, x_dst, ea])
    with pytest.raises(ValueError, match="edge_attr"):
        ours((x, x_dst), bei, ea[:-1])


# ============================================================ 12: residual
@pytest.mark.parametrize("concat", [True, False])
def test_gat_residual_matches_pyg(concat):
    ei, n = graph_with_loops()
    ref, ours = gat_pair(5, 4, heads=2, concat=concat, residual=True)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei), [x])
    assert_same(ref, ours, lambda m: m(x, ei, return_attention_weights=True), [x])
    # constant mostly-zero features run as a sparse matrix (res through an SpMM)
    xs = torch.where(torch.rand(n, 5) < 0.02, torch.randn(n, 5), torch.zeros(n, 5)).to(F64)
    assert_same(ref, ours, lambda m: m(xs, ei))
    ref, ours = gat_pair((5, 3), 4, heads=2, residual=True, edge_dim=2)
    n_dst = 25
    bei = ei[:, ei[1] < n_dst]
    x_dst = torch.randn(n_dst, 3, dtype=F64, requires_grad=True)
    ea = torch.randn(bei.size(1), 2, dtype=F64)
    assert_same(ref, ours, lambda m: m((x, x_dst), bei, ea), [x, x_dst])


# =============================================== 12: optimize() converts them
@pytest.mark.parametrize("kw", [
    dict(in_channels=5, edge_dim=3),
    dict(in_channels=5, residual=True),
    dict(in_channels=(5, 5)),
    dict(in_channels=(5, 5), edge_dim=3, residual=True, fill_value=0.5, concat=False),
], ids=["edge_dim", "residual", "bipartite", "all"])
def test_optimize_converts_gat_options(kw):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = PygGATConv(out_channels=4, heads=2, **kw)

        def forward(self, x, ei, ea):
            out, (edge_index, alpha) = self.conv(x, ei, edge_attr=ea, return_attention_weights=True)
            return out, (edge_index, alpha)

    ei, n = graph_with_loops()
    torch.manual_seed(0)
    ref = Net().to(F64)
    torch.manual_seed(0)
    net = Net().to(F64)
    params = {name: p for name, p in net.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left unchanged" warning
        corgnn.optimize(net)
    assert isinstance(net.conv, GATConv)
    assert all(p is params[name] for name, p in net.named_parameters()) and len(params) == len(list(net.parameters()))
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    ea = torch.randn(ei.size(1), 3, dtype=F64, requires_grad=True)
    assert_same(ref, net, lambda m: m(x, ei, ea), [x, ea])


def test_optimize_still_declines_what_gatconv_lacks():
    layer = PygGATConv(5, 4, edge_dim=2)
    layer.lin_edge.bias = torch.nn.Parameter(torch.zeros(4))  # a bias corgnn's GATConv has no place for
    with pytest.warns(UserWarning, match="lin_edge.bias"):
        assert corgnn.optimize(layer) is layer
