"""GAT: layer vs PyG's GATConv, every caching scheme, explicit backward, dropout, errors."""

import warnings

import pytest
import torch
from torch_geometric.nn import GATConv as PygGATConv
from torch_geometric.utils import softmax as pyg_softmax

import corgnn
from corgnn.cost import GAT_CACHE_SCHEMES, bytes_saved, plan_gat
from corgnn.functional.gat import gat_conv
from corgnn.graph import Graph
from corgnn.nn import GAT, GATConv
from corgnn.sparse import use_backend
from corgnn.sparse.attention import DropoutSpec, dropout_keep_mask
from conftest import FAST_GRADCHECK, KERNEL_BACKENDS, eight_head_tier, make_graph

SCHEMES = list(GAT_CACHE_SCHEMES)
F64 = torch.float64


def pair(m, k, heads, concat, seed=0, **kw):
    torch.manual_seed(seed)
    ref = PygGATConv(m, k, heads=heads, concat=concat, **kw).to(F64)
    with torch.no_grad():
        ref.bias.normal_()
    ours = GATConv(m, k, heads=heads, concat=concat, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())  # same keys: lin.weight, att_src, att_dst, bias
    return ref, ours


def run(layer, x, ei, g):
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(x, ei)
    out.backward(g)
    return [out.detach(), x.grad] + [p.grad.clone() for p in (layer.lin.weight, layer.att_src, layer.att_dst, layer.bias)]


def assert_all_close(got, want, tol=1e-10):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False), (8, True), (8, False)])  # (8: numba_kernels.HEADS8)
def test_matches_pyg_float64(cache, heads, concat, monkeypatch):
    eight_head_tier(monkeypatch, heads)
    ei, n = make_graph()  # duplicates, self-loops, isolated nodes, directed
    ref, ours = pair(6, 4, heads, concat)
    ours.cache = cache
    x = torch.randn(n, 6, dtype=F64)
    g = torch.randn(n, heads * 4 if concat else 4, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))
    assert ours.last_cache == cache


@pytest.mark.parametrize("fmt", ["coo", "csc", "ell", "hybrid"])
def test_formats_agree(fmt):
    ei, n = make_graph(seed=1)
    ref, ours = pair(5, 3, 2, True, negative_slope=0.1)
    ours.format = fmt
    x = torch.randn(n, 5, dtype=F64)
    g = torch.randn(n, 6, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))


def test_without_self_loops_and_empty_graph():
    ei, n = make_graph(seed=2)
    ref, ours = pair(4, 3, 2, True, add_self_loops=False)
    x = torch.randn(n, 4, dtype=F64)
    g = torch.randn(n, 6, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))
    empty = torch.empty(2, 0, dtype=torch.long)
    out = run(ours, x, empty, g)
    torch.testing.assert_close(out[0], ours.bias.detach().expand(n, -1))  # no edges: bias only
    assert float(out[1].abs().sum()) == 0.0


# ------------------------------------------------------------------ explicit backward
def tiny_adjacency(fmt="csr"):
    ei = torch.tensor([[0, 1, 2, 3, 3, 4, 1, 1], [1, 2, 0, 0, 0, 2, 1, 4]])
    return Graph(ei, num_nodes=6).gat_adjacency(format=fmt)  # node 5 isolated, duplicate 3->0


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck(cache, p):
    A = tiny_adjacency()
    torch.manual_seed(0)
    shapes = [(6, 3), (4, 3), (1, 2, 2), (1, 2, 2)]
    params = [torch.randn(s, dtype=F64, requires_grad=True) for s in shapes]
    for concat, bias_shape in [(True, (4,)), (False, (2,))]:
        b = torch.randn(bias_shape, dtype=F64, requires_grad=True)
        drop = DropoutSpec(p, seed=7)  # fixed seed: the same mask on every call
        f = lambda *t: gat_conv(*t, A, 2, concat=concat, dropout=drop, training=True, cache=cache)  # noqa: E731
        assert torch.autograd.gradcheck(f, (*params, b), fast_mode=FAST_GRADCHECK)


def reference_gat(x, W, a_src, a_dst, b, A, heads, concat, slope, keep):
    """Pure-torch autograd GAT on ``A``'s entry order with a given dropout ``keep`` scale (q, h)."""
    coo = A.to_coo()
    dst, src = coo.row, coo.col
    n = x.size(0)
    M = (x @ W.t()).view(n, heads, -1)
    s, d = (M * a_src).sum(-1), (M * a_dst).sum(-1)
    alpha = pyg_softmax(torch.nn.functional.leaky_relu(s[src] + d[dst], slope), dst, num_nodes=n) * keep
    out = torch.zeros_like(M).index_add(0, dst, M[src] * alpha.unsqueeze(-1))
    return (out.reshape(n, -1) if concat else out.mean(1)) + b


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_attention_dropout_matches_reference(backend):
    ei, n = make_graph(seed=3)
    A = Graph(ei, num_nodes=n).gat_adjacency()
    H, K, m, p = 3, 4, 5, 0.5
    drop = DropoutSpec(p, seed=123)
    keep = dropout_keep_mask(A.nnz, H, drop.p, drop.seed).to(F64) / (1 - p)
    assert 0.4 < float((keep > 0).double().mean()) < 0.6
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=F64) for s in [(n, m), (H * K, m), (1, H, K), (1, H, K), (H * K,)]]
    g = torch.randn(n, H * K, dtype=F64)

    def grads(fn):
        t = [v.clone().requires_grad_() for v in inputs]
        out = fn(*t)
        out.backward(g)
        return [out.detach()] + [v.grad for v in t]

    want = grads(lambda *t: reference_gat(*t, A, H, True, 0.2, keep))
    with use_backend(backend):
        for cache in SCHEMES:
            assert_all_close(grads(lambda *t: gat_conv(*t, A, H, dropout=drop, training=True, cache=cache)), want)


def test_dropout_modes():
    ei, n = make_graph(seed=4)
    _, layer = pair(4, 3, 4, True, dropout=0.6)
    x = torch.randn(n, 4, dtype=F64)
    layer.eval()
    with torch.no_grad():
        a = layer(x, ei)
    layer.dropout = 0.0
    with torch.no_grad():
        torch.testing.assert_close(layer(x, ei), a)  # eval: no attention dropout
    layer.dropout = 0.6
    layer.train()
    torch.manual_seed(1)
    b = layer(x, ei)
    torch.manual_seed(1)
    torch.testing.assert_close(layer(x, ei), b)  # seed drawn from torch's generator
    assert not torch.allclose(layer(x, ei), b)  # a fresh mask per call
    m1 = dropout_keep_mask(1000, 8, 0.3, DropoutSpec(0.3, 1).seed)
    m2 = dropout_keep_mask(1000, 8, 0.3, DropoutSpec(0.3, 2).seed)
    assert abs(float(m1.double().mean()) - 0.7) < 0.02 and not torch.equal(m1, m2)


# ----------------------------------------------------------------------- model / interop
def test_gat_model_schemes_and_sparse_features(cora):
    x = cora.x[:300] / cora.x[:300].sum(1, keepdim=True).clamp_min(1)
    keep = (cora.edge_index < 300).all(0)
    ei = cora.edge_index[:, keep]
    torch.manual_seed(0)
    model = GAT(x.size(1), 4, 7, heads=2).to(F64)
    x = x.to(F64)
    assert model.conv1.sparse_features(x) is not None  # bag-of-words: the sparse path
    out = model(x, ei)
    out.square().sum().backward()
    sparse_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out2 = model(x.clone().requires_grad_(), ei)  # needs dL/dx: the dense path
    out2.square().sum().backward()
    torch.testing.assert_close(out2, out)
    assert_all_close([p.grad for p in model.parameters()], sparse_grads)
    assert model.schemes() == ["edge_weights", "edge_weights"]
    budget = GAT(x.size(1), 4, 7, heads=2, memory_budget=0).to(F64)
    budget(x, ei)
    assert budget.schemes() == ["none", "none"]


def test_state_dict_and_optimize_swap():
    ei, n = make_graph(seed=5)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = PygGATConv(5, 4, heads=3)
            self.conv2 = PygGATConv(12, 2, heads=2, concat=False, negative_slope=0.3)

        def forward(self, x, ei):
            return self.conv2(torch.nn.functional.elu(self.conv1(x, ei)), ei)

    torch.manual_seed(0)
    net = Net().to(F64)
    x = torch.randn(n, 5, dtype=F64)
    want = net(x, ei)
    keys = set(net.state_dict())
    corgnn.optimize(net)
    assert isinstance(net.conv1, GATConv) and isinstance(net.conv2, GATConv)
    assert set(net.state_dict()) == keys
    torch.testing.assert_close(net(x, ei), want, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for layer in (PygGATConv(5, 4, edge_dim=2), PygGATConv(5, 4, residual=True), PygGATConv((5, 3), 4)):
            assert isinstance(corgnn.optimize(layer), GATConv)  # converted (tests/test_fidelity_inputs.py)
        declined = PygGATConv(5, 4, flow="target_to_source")
        assert corgnn.optimize(declined) is declined
    assert len(w) == 1 and "unsupported" in str(w[0].message)


# ---------------------------------------------------------------------------- errors
def test_bad_input_errors():
    ei, n = make_graph()
    layer = GATConv(4, 3, heads=2)
    x = torch.randn(n, 4)
    with pytest.raises(TypeError, match="edge_index"):
        layer(x, ei.float())
    with pytest.raises(ValueError, match="node id"):
        layer(x[:10], ei)
    with pytest.raises(ValueError, match="rows"):
        layer(x, Graph(ei, num_nodes=n + 1))
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        layer(bad, ei)
    with pytest.raises(ValueError, match="in_channels"):
        layer(torch.randn(n, 5), ei)
    with pytest.raises(TypeError, match="float64"):
        layer(x.double(), ei)
    # without edge_dim PyG ignores edge_attr; with it, a wrong shape is named
    torch.testing.assert_close(layer(x, ei, edge_attr=torch.randn(ei.size(1), 2)), layer(x, ei))
    with pytest.raises(ValueError, match="edge_attr"):
        GATConv(4, 3, edge_dim=3)(x, ei, edge_attr=torch.randn(ei.size(1), 2))
    for kw in (dict(cache="everything"), dict(dropout=1.0), dict(heads=0), dict(format="dense")):
        with pytest.raises(ValueError):
            GATConv(4, 3, **kw)
    with pytest.raises(ValueError, match="pair"):
        GATConv((4, 5, 6), 3)


# ---------------------------------------------------------------------------- cost model
def test_bytes_saved_follow_table4():
    n, q, h, k, m = 2708, 13264, 8, 8, 1433
    got = [bytes_saved(s, n, q, h, k, m) for s in SCHEMES]
    assert got == [0, 4 * n * h * k, 4 * n * h * (k + 2), 4 * n * h * k + 5 * q * h]  # Table 4
    assert got == sorted(got) and len(set(got)) == 4
    assert bytes_saved("features", n, q, h, k, m, include_input=True) == got[1] + 4 * n * m
    plan = plan_gat(n, q, h, k, m)
    assert plan.scheme == "edge_weights" and "edge_weights" in plan.table()
    assert [c.time_s for c in plan.costs] == sorted((c.time_s for c in plan.costs), reverse=True)
    assert plan_gat(n, q, h, k, m, memory_budget=got[2]).scheme == "node_attention"
    assert plan_gat(n, q, h, k, m, cache="features").forced
    with pytest.raises(ValueError, match="scheme"):
        bytes_saved("all", n, q, h, k, m)


@pytest.mark.parametrize("cache", SCHEMES)
def test_saved_tensors_are_table4(cache):
    """What the Function really keeps for backward (autograd's saved-tensor hooks) is
    the input plus exactly the scheme's Table 4 values and the 8-byte dropout seed;
    parameters aside."""
    ei, n = make_graph(seed=6)
    _, layer = pair(5, 3, 2, True, dropout=0.5)
    layer.cache = cache
    params = {id(p) for p in layer.parameters()}
    saved = []

    def pack(t):
        if id(t) not in params:
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(torch.randn(n, 5, dtype=F64), ei).sum().backward()
    q = Graph(ei, num_nodes=n).gat_adjacency().nnz
    want = bytes_saved(cache, n, q, 2, 3, 5, value_bytes=8, include_input=True)
    assert sum(saved) == want + 8  # + the attention-dropout seed (one int64), not a mask


def test_train_cli_gat_smoke(cora):
    from corgnn.train import TrainConfig, train

    res = train(TrainConfig(model="gat", epochs=2, progress=False))
    assert res.schemes == ["edge_weights", "edge_weights"] and 0.0 <= res.test_acc <= 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    ei, n = make_graph()
    ref, ours = pair(6, 4, 3, True)
    x = torch.randn(n, 6, dtype=F64)
    g = torch.randn(n, 12, dtype=F64)
    want = run(ours, x, ei, g)
    ours = ours.cuda()
    got = run(ours, x.cuda(), ei.cuda(), g.cuda())
    assert_all_close([t.cpu() for t in got], want)


def test_raw_attention_ops_check_shapes():
    """The raw GAT ops (``corgnn.sparse.attention``) raise, naming the argument, before
    any kernel runs when an operand does not fit the pattern or the others: a kernel
    would read it at the sizes the others imply."""
    from corgnn.sparse.attention import attention_backward, attention_forward, head_weighted_sums, node_scores

    ei, n = make_graph(seed=4)
    A = Graph(ei, num_nodes=n).gat_adjacency(add_self_loops=True)
    M = torch.randn(n, 2, 4)
    a_s, a_d = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    s, d = node_scores(M, a_s, a_d)
    out, alpha, leaky = attention_forward(A, s, d, M, 0.2, want_leaky=True)
    G = torch.randn_like(out)
    dM, ds, dd = attention_backward(A, G, M, a_s, a_d, 0.2, alpha=alpha, leaky=leaky)  # (fits: runs)
    assert dM.shape == M.shape and ds.shape == dd.shape == (n, 2)
    short, wide = torch.randn(n - 1, 2), torch.randn(n, 3)
    for what, call in {
        "M must": lambda: node_scores(torch.randn(n, 8), a_s, a_d),
        "att_dst": lambda: node_scores(M, a_s, torch.randn(2, 3)),
        "M must have shape": lambda: attention_forward(A, s, d, torch.randn(n - 1, 2, 4), 0.2),
        "s must": lambda: attention_forward(A, short, d, M, 0.2),
        "d must": lambda: attention_forward(A, s, wide, M, 0.2),
        "G must": lambda: attention_backward(A, torch.randn(n, 2, 5), M, a_s, a_d, 0.2, alpha=alpha, leaky=leaky),
        "att_dst must": lambda: attention_backward(A, G, M, a_s, torch.randn(3), 0.2, alpha=alpha, leaky=leaky),
        "att_src must": lambda: attention_backward(A, G, M, torch.randn(3), a_d, 0.2, alpha=alpha, leaky=leaky),
        "alpha must": lambda: attention_backward(A, G, M, a_s, a_d, 0.2, alpha=alpha[1:], leaky=leaky),
        "d must ": lambda: attention_backward(A, G, M, a_s, a_d, 0.2, s=s, d=short),
        "w2 must": lambda: head_weighted_sums(ds, dd[:, :1], M),
    }.items():
        with pytest.raises(ValueError, match=what.strip()):
            call()
