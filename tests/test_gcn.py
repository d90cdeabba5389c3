import warnings

import pytest
import torch
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.cost import GCN_SCHEMES
from corgnn.nn import GCN, GCNConv
from conftest import FAST_GRADCHECK, make_graph

SCHEMES = ["auto"] + [s.name for s in GCN_SCHEMES]


def pair(m, k, dtype, seed=0, **kw):
    torch.manual_seed(seed)
    ref = PygGCNConv(m, k, **kw).to(dtype)
    with torch.no_grad():
        ref.bias.normal_()
    ours = GCNConv(m, k, **kw).to(dtype)
    ours.load_state_dict(ref.state_dict())  # same keys: lin.weight, bias
    return ref, ours


def run(layer, x, ei, ew, g):
    x = x.detach().clone().requires_grad_(x.requires_grad)
    out = layer(x, ei, ew)
    out.backward(g)
    grads = [x.grad] if x.requires_grad else []
    return out.detach(), grads + [layer.lin.weight.grad, layer.bias.grad]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m,k", [(6, 3), (3, 8)])
@pytest.mark.parametrize("input_grad", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_pyg_float64(scheme, m, k, input_grad, weighted):
    ei, n = make_graph()
    ew = torch.rand(ei.size(1), dtype=torch.float64) if weighted else None
    ref, ours = pair(m, k, torch.float64)
    ours.scheme = scheme
    x = torch.randn(n, m, dtype=torch.float64, requires_grad=input_grad)
    g = torch.randn(n, k, dtype=torch.float64)
    o1, g1 = run(ref, x, ei, ew, g)
    o2, g2 = run(ours, x, ei, ew, g)
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    assert len(g1) == len(g2) == (3 if input_grad else 2)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
    if scheme != "auto":
        assert ours.last_plan.scheme.name == scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_pyg_on_cora_float32(cora, scheme):
    ref, ours = pair(cora.x.size(1), 16, torch.float32)
    ours.scheme = scheme
    x = cora.x.clone().requires_grad_(True)
    g = torch.randn(cora.num_nodes, 16)
    o1, g1 = run(ref, x, cora.edge_index, None, g)
    o2, g2 = run(ours, x, cora.edge_index, None, g)
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-5)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scheme", [s.name for s in GCN_SCHEMES])
def test_gradcheck(scheme):
    ei, n = make_graph(n=12, q=30, seed=1)
    layer = GCNConv(4, 3, scheme=scheme).double()
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    g = corgnn.Graph(ei, num_nodes=n)
    assert torch.autograd.gradcheck(lambda x, w, b: corgnn.functional.gcn_conv(x, w, b, g.gcn_adjacency(dtype=torch.float64), layer.last_plan.scheme if layer.last_plan else corgnn.cost.parse_scheme(scheme)), (x, layer.lin.weight, layer.bias), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradcheck(lambda x: layer(x, g), (x,), fast_mode=FAST_GRADCHECK)


def test_all_schemes_agree():
    ei, n = make_graph(seed=3)
    x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
    outs = []
    for s in SCHEMES:
        torch.manual_seed(0)
        layer = GCNConv(5, 7, scheme=s).double()
        out = layer(x, ei)
        gx, gw = torch.autograd.grad(out.square().sum(), (x, layer.lin.weight))
        outs.append((out.detach(), gx, gw))
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_auto_plan_follows_table_2():
    ei, n = make_graph()
    x = torch.randn(n, 32)
    narrow, wide = GCNConv(32, 4), GCNConv(32, 256)
    narrow(x, ei).sum().backward()
    wide(x, ei).sum().backward()
    assert narrow.last_plan.scheme.forward == "transform-first"
    assert wide.last_plan.scheme.cache  # k >= m/2 without input gradient: propagate-first + cache
    assert not narrow.last_plan.input_grad


def test_cache_saves_ax_instead_of_x():
    """The cached scheme keeps A'X (n, m) in place of X: same bytes, one SpMM fewer."""
    ei, n = make_graph()
    x = torch.randn(n, 8)
    saved = {}
    for s in ("propagate-first+split", "propagate-first+split+cache"):
        layer = GCNConv(8, 16, scheme=s)
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = layer(x, ei)
        saved[s] = sum(sizes) - layer.lin.weight.numel() * sizes.count(layer.lin.weight.numel())
        out.sum().backward()
    assert saved["propagate-first+split"] == saved["propagate-first+split+cache"] == n * 8


def test_adjacency_not_rebuilt(monkeypatch):
    ei, n = make_graph()
    layer = GCNConv(4, 2)
    x = torch.randn(n, 4)
    layer(x, ei)
    calls = []
    import corgnn.graph as graph_mod

    monkeypatch.setattr(graph_mod.Graph, "__init__", lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(AssertionError("rebuilt")))
    layer(x, ei)
    layer(x, ei)
    assert calls == []


def test_edge_index_modified_in_place_rebuilds():
    ei, n = make_graph()
    layer = GCNConv(4, 2).double()
    x = torch.randn(n, 4, dtype=torch.float64)
    a = layer(x, ei)
    ei[0, :10] = ei[1, :10]
    b = layer(x, ei)
    ref = PygGCNConv(4, 2).double()
    ref.load_state_dict(layer.state_dict())
    torch.testing.assert_close(b, ref(x, ei))
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(
    "make_x, ei, ew, exc, match",
    [
        (lambda n: torch.randn(n - 5, 4), None, None, ValueError, "num_nodes=35"),
        (lambda n: torch.randn(n + 1, 4), "graph", None, ValueError, "x has 41 rows but the Graph has 40"),
        (lambda n: torch.randn(n, 5), None, None, ValueError, "in_channels=4"),
        (lambda n: torch.randint(0, 3, (n, 4)), None, None, TypeError, "floating"),
        (lambda n: torch.full((n, 4), float("nan")), None, None, ValueError, "x contains"),
        (lambda n: torch.randn(n, 4), "float", None, TypeError, "integer dtype"),
        (lambda n: torch.randn(n, 4), "oob", None, ValueError, "node id"),
        (lambda n: torch.randn(n, 4), "neg", None, ValueError, "negative"),
        (lambda n: torch.randn(n, 4), None, "short", ValueError, "edge_weight must have shape"),
        (lambda n: torch.randn(n, 4), None, "inf", ValueError, "edge_weight contains"),
    ],
)
def test_bad_input(make_x, ei, ew, exc, match):
    e, n = make_graph()
    if ei == "float":
        e = e.float()
    elif ei == "oob":
        e = e.clone()
        e[1, 0] = n + 5
    elif ei == "graph":
        e = corgnn.Graph(e, num_nodes=n)
    elif ei == "neg":
        e = e.clone()
        e[0, 0] = -1
    w = None
    if ew == "short":
        w = torch.ones(e.size(1) - 1)
    elif ew == "inf":
        w = torch.ones(e.size(1))
        w[3] = float("inf")
    with pytest.raises(exc, match=match):
        GCNConv(4, 2)(make_x(n), e, w)


def test_unknown_scheme_rejected():
    with pytest.raises(ValueError, match="unknown GCN scheme"):
        GCNConv(4, 2, scheme="fastest")


def test_gcn_model_and_optimize_roundtrip(cora):
    class PygGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([PygGCNConv(cora.x.size(1), 16), PygGCNConv(16, 7)])

        def forward(self, x, ei):
            return self.convs[1](torch.relu(self.convs[0](x, ei)), ei)

    torch.manual_seed(0)
    model = PygGCN()
    ref = model(cora.x, cora.edge_index)
    opt = corgnn.optimize(model)
    assert opt is model and all(isinstance(c, GCNConv) for c in model.convs)
    torch.testing.assert_close(model(cora.x, cora.edge_index), ref, rtol=1e-4, atol=1e-5)


def test_optimize_bare_layer_and_unsupported():
    ref = PygGCNConv(4, 3)
    new = corgnn.optimize(ref)
    assert isinstance(new, GCNConv)
    torch.testing.assert_close(new.lin.weight, ref.lin.weight)
    odd = PygGCNConv(4, 3, aggr="max")
    with pytest.warns(UserWarning, match="unchanged"):
        same = corgnn.optimize(odd)
    assert same is odd
    with pytest.raises(TypeError):
        corgnn.optimize("not a module")


@pytest.mark.parametrize("kw", [dict(improved=True), dict(add_self_loops=False), dict(normalize=False), dict(bias=False)])
def test_optimize_keeps_pyg_options(kw):
    ei, n = make_graph()
    torch.manual_seed(0)
    ref = PygGCNConv(4, 3, **kw).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = corgnn.optimize(PygGCNConv(4, 3, **kw).double())
    new.load_state_dict(ref.state_dict())
    x = torch.randn(n, 4, dtype=torch.float64)
    torch.testing.assert_close(new(x, ei), ref(x, ei), rtol=1e-12, atol=1e-12)


def test_gcn_model_shares_one_graph(cora):
    model = GCN(cora.x.size(1), 16, 7, dropout=0.5)
    model.train()
    out = model(cora.x, cora.edge_index)
    assert out.shape == (cora.num_nodes, 7)
    assert model.conv1._graphs._graph is None  # the model converted edge_index once
    assert model.schemes()[0].startswith("transform-first")
    with pytest.raises(ValueError, match="dropout"):
        GCN(4, 4, 2, dropout=1.5)


def test_sparse_features_match_pyg(cora):
    """Cora's bag-of-words (1.3 % non-zeros, no grad) runs as a sparse matrix."""
    ref, ours = pair(cora.x.size(1), 16, torch.float32)
    g = torch.randn(cora.num_nodes, 16)
    o1, g1 = run(ref, cora.x, cora.edge_index, None, g)
    o2, g2 = run(ours, cora.x, cora.edge_index, None, g)
    assert ours._features.newest is not None and ours.last_plan.x_nnz == int((cora.x != 0).sum())
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-5)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_sparse_feature_cutoff_depends_on_the_layer_width():
    """~8 %-dense constant features (PubMed's TF-IDF is ~10 %) run sparse in a 64-wide
    layer, where the SpMMs win, and dense in a 512-wide one, where they do not
    (``corgnn.nn.base.sparse_feature_density``); a GCN model decides by its first layer."""
    from corgnn.nn.base import SPARSE_FEATURE_DENSITY, SPARSE_FEATURE_DENSITY_WIDE, WIDE_LAYER, sparse_feature_density

    assert sparse_feature_density(WIDE_LAYER) == SPARSE_FEATURE_DENSITY > 0.08 > SPARSE_FEATURE_DENSITY_WIDE == sparse_feature_density(WIDE_LAYER + 1)
    ei, n = make_graph()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 200, generator=g) * (torch.rand(n, 200, generator=g) < 0.08)
    for width, sparse in ((64, True), (512, False)):
        ref, ours = pair(200, width, torch.float32)
        torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-4, atol=1e-5)
        assert (ours._features.newest is not None) is sparse, width
        model = GCN(200, width, 3)
        model(x, ei)
        assert (model.conv1._features.newest is not None) is sparse, width


@pytest.mark.parametrize("scheme", SCHEMES)
def test_sparse_features_every_scheme_float64(scheme):
    ei, n = make_graph()
    x = torch.zeros(n, 30, dtype=torch.float64)
    x[torch.arange(n), torch.randint(0, 30, (n,))] = torch.rand(n, dtype=torch.float64)  # 1 nnz per row
    ref, ours = pair(30, 4, torch.float64)
    ours.scheme = scheme
    g = torch.randn(n, 4, dtype=torch.float64)
    o1, g1 = run(ref, x, ei, None, g)
    o2, g2 = run(ours, x, ei, None, g)
    assert ours._features.newest is not None
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_sparse_x_argument_and_errors():
    from corgnn.nn.gcn import dense_to_csr

    ei, n = make_graph()
    x = torch.zeros(n, 6, dtype=torch.float64)
    x[::3, 2] = 1.5
    ref, ours = pair(6, 3, torch.float64)
    torch.testing.assert_close(ours(dense_to_csr(x), ei), ref(x, ei), rtol=1e-12, atol=1e-12)
    assert ours.last_plan.scheme.name == "transform-first+fused"
    with pytest.raises(ValueError, match="sparse x must be"):
        ours(dense_to_csr(x[:, :5]), ei)
    bad = dense_to_csr(x)
    bad.val[0] = float("nan")
    with pytest.raises(ValueError, match="x contains"):
        ours(bad, ei)


def test_gcn_model_sparse_dropout_matches_dense_dropout_statistics(cora):
    model = GCN(cora.x.size(1), 16, 7, dropout=0.5).train()
    torch.manual_seed(0)
    out = model(cora.x, cora.edge_index)
    assert model.conv1._features.newest is not None  # sparse input path taken
    out.sum().backward()
    assert model.conv1.lin.weight.grad is not None and torch.isfinite(model.conv1.lin.weight.grad).all()
    model.eval()
    with torch.no_grad():
        a, b = model(cora.x, cora.edge_index), model(cora.x, cora.edge_index)
    torch.testing.assert_close(a, b)  # no dropout in eval
