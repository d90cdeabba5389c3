"""GATv2: layer vs PyG's GATv2Conv (outputs and every gradient), every caching scheme and
backend, the explicit backward (gradcheck), attention dropout, bipartite inputs,
optimize() conversion, pickling, the caching plan, errors."""

import inspect
import io
import pickle
import warnings

import pytest
import torch
from torch_geometric.nn import GATv2Conv as PygGATv2Conv
from torch_geometric.utils import softmax as pyg_softmax

import corgnn
from corgnn.cost import GATV2_CACHE_SCHEMES, gatv2_bytes_saved, plan_gatv2
from corgnn.functional.gatv2 import gatv2_conv
from corgnn.graph import Graph
from corgnn.nn import GATv2, GATv2Conv, UnsupportedOption
from corgnn.sparse import use_backend
from corgnn.sparse.attention import DropoutSpec, dropout_keep_mask
from conftest import FAST_GRADCHECK, FORCED_TRITON_INTERPRETER, KERNEL_BACKENDS, eight_head_tier, make_graph

SCHEMES = list(GATV2_CACHE_SCHEMES)
F64 = torch.float64
OPTIONS = [
    dict(heads=3),
    dict(heads=3, concat=False),
    dict(heads=8),  # (the kernels' eight-head paths: numba_kernels.HEADS8)
    dict(heads=8, concat=False),
    dict(heads=2, share_weights=True),
    dict(heads=2, bias=False),
    dict(heads=2, residual=True, concat=False),
    dict(heads=2, add_self_loops=False, negative_slope=0.1),
]


def pair(m, k, seed=0, **kw):
    """PyG's layer and ours with the same parameters (random biases, so they count)."""
    torch.manual_seed(seed)
    ref = PygGATv2Conv(m, k, **kw).to(F64)
    with torch.no_grad():
        for p in (ref.bias, ref.lin_l.bias, ref.lin_r.bias):
            if p is not None:
                p.normal_()
    ours = GATv2Conv(m, k, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())  # same keys: lin_l.*, lin_r.*, att, bias, res.weight
    return ref, ours


def run(layer, x, ei, g):
    """``[out, dL/dx, dL/dparam...]`` for ``L = <out, g>`` (parameters in registration order)."""
    xs = [t.detach().clone().requires_grad_(True) for t in (x if isinstance(x, tuple) else (x,))]
    layer.zero_grad()
    out = layer(tuple(xs) if isinstance(x, tuple) else xs[0], ei)
    out.backward(g)
    return [out.detach()] + [t.grad for t in xs] + [p.grad.clone() for p in layer.parameters()]


def assert_all_close(got, want, tol=1e-10):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_constructor_signature_is_pygs():
    """PyG 2.8's parameters in PyG's order, kinds and defaults; corgnn's own options
    keyword-only after them; ``**kwargs`` last, as PyG's."""
    keys = lambda cls: [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]  # noqa: E731
    want, got = keys(PygGATv2Conv), keys(GATv2Conv)
    assert want[-1][1] is inspect.Parameter.VAR_KEYWORD and got[-1][1] is inspect.Parameter.VAR_KEYWORD
    assert got[: len(want) - 1] == want[:-1]
    extra = got[len(want) - 1:-1]
    assert [name for name, _, _ in extra] == ["cache", "format", "memory_budget"]
    assert all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in extra)


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_matches_pyg_float64(cache, kw, monkeypatch):
    eight_head_tier(monkeypatch, kw["heads"])
    ei, n = make_graph()  # duplicates, self-loops, isolated nodes, directed
    ref, ours = pair(6, 4, **kw)
    ours.cache = cache
    x = torch.randn(n, 6, dtype=F64)
    width = 4 * kw["heads"] if kw.get("concat", True) else 4
    g = torch.randn(n, width, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))
    assert ours.last_cache == cache


@pytest.mark.parametrize("fmt", ["coo", "csc", "ell"])
def test_formats_agree(fmt):
    ei, n = make_graph(seed=1)
    ref, ours = pair(5, 3, heads=2)
    ours.format = fmt
    x, g = torch.randn(n, 5, dtype=F64), torch.randn(n, 6, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))


@pytest.mark.parametrize("add_self_loops", [True, False])
def test_zero_edges(add_self_loops):
    n = 7
    ref, ours = pair(4, 3, heads=2, add_self_loops=add_self_loops)
    empty = torch.empty(2, 0, dtype=torch.long)
    x, g = torch.randn(n, 4, dtype=F64), torch.randn(n, 6, dtype=F64)
    got = run(ours, x, empty, g)
    assert_all_close(got, run(ref, x, empty, g))
    if not add_self_loops:  # no edges at all: bias only, no gradient to x
        torch.testing.assert_close(got[0], ours.bias.detach().expand(n, -1))
        assert float(got[1].abs().sum()) == 0.0


@pytest.mark.parametrize("share_weights", [False, True])
@pytest.mark.parametrize("cache", SCHEMES)
def test_bipartite_matches_pyg(share_weights, cache):
    g_ = torch.Generator().manual_seed(3)
    n_src, n_dst = 9, 6
    ei = torch.stack([torch.randint(0, n_src, (30,), generator=g_), torch.randint(0, n_dst, (30,), generator=g_)])
    ei = torch.cat([ei, torch.tensor([[2, 2], [2, 2]])], 1)  # a duplicated self-loop
    in_channels = (5, 5) if share_weights else (5, 4)
    ref, ours = pair(in_channels, 3, heads=2, share_weights=share_weights, residual=True)
    ours.cache = cache
    x = (torch.randn(n_src, in_channels[0], dtype=F64), torch.randn(n_dst, in_channels[1], dtype=F64))
    g = torch.randn(n_dst, 6, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))
    assert ours.last_cache == cache


def test_bipartite_in_channels_with_one_input():
    ei, n = make_graph(seed=7)
    ref, ours = pair((5, 5), 3, heads=2)
    x, g = torch.randn(n, 5, dtype=F64), torch.randn(n, 6, dtype=F64)
    assert_all_close(run(ours, x, ei, g), run(ref, x, ei, g))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_torch_sparse_adjacency_matches_pyg(layout):
    ei, n = make_graph(seed=8)
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(ei.size(1), dtype=F64), (n, n)).coalesce()
    if layout == "csr":
        adj = adj.to_sparse_csr()
    ref, ours = pair(4, 3, heads=2)
    x, g = torch.randn(n, 4, dtype=F64), torch.randn(n, 6, dtype=F64)
    assert_all_close(run(ours, x, adj, g), run(ref, x, adj, g))


def test_return_attention_weights():
    ei, n = make_graph(seed=9)
    ref, ours = pair(4, 3, heads=2)
    x = torch.randn(n, 4, dtype=F64)
    with torch.no_grad():  # the fused forward's alpha
        out_r, (ei_r, a_r) = ref(x, ei, return_attention_weights=True)
        out_o, (ei_o, a_o) = ours(x, ei, return_attention_weights=True)
    assert torch.equal(ei_r, ei_o)
    assert_all_close([out_o, a_o], [out_r, a_r])
    assert ours.last_cache == "none"
    # with autograd: differentiable alpha, as PyG's
    outs = []
    for layer in (ref, ours):
        layer.zero_grad()
        out, (_, a) = layer(x, ei, return_attention_weights=True)
        (out.square().sum() + a.square().sum()).backward()
        outs.append([out.detach(), a.detach()] + [p.grad.clone() for p in layer.parameters()])
    assert_all_close(outs[1], outs[0])
    assert ours.last_cache is None


# ------------------------------------------------------------------ explicit backward
def tiny_adjacency():
    ei = torch.tensor([[0, 1, 2, 3, 3, 4, 1, 1], [1, 2, 0, 0, 0, 2, 1, 4]])
    return Graph(ei, num_nodes=6).gat_adjacency()  # node 5 isolated, duplicate 3->0, a self-loop


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck(cache, p):
    A = tiny_adjacency()
    torch.manual_seed(0)
    H, K, m = 2, 2, 3
    x, wl, bl, wr, br = (torch.randn(s, dtype=F64, requires_grad=True) for s in [(6, m), (H * K, m), (H * K,), (H * K, m), (H * K,)])
    att = torch.randn(1, H, K, dtype=F64, requires_grad=True)
    drop = DropoutSpec(p, seed=7)  # fixed seed: the same mask on every call
    b = torch.randn(H * K, dtype=F64, requires_grad=True)
    f = lambda *t: gatv2_conv(t[0], None, *t[1:5], t[5], t[6], A, H, dropout=drop, training=True, cache=cache)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, wl, bl, wr, br, att, b), fast_mode=FAST_GRADCHECK)
    b = torch.randn(K, dtype=F64, requires_grad=True)  # shared weights, heads averaged
    f = lambda *t: gatv2_conv(t[0], None, t[1], t[2], None, None, t[3], t[4], A, H, concat=False, dropout=drop, training=True, cache=cache)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, wl, bl, att, b), fast_mode=FAST_GRADCHECK)


def reference_gatv2(x, wl, bl, wr, br, att, b, A, heads, slope, keep):
    """Pure-torch autograd GATv2 on ``A``'s entry order with a given dropout scale ``keep (q, h)``."""
    coo = A.to_coo()
    dst, src = coo.row, coo.col
    n = x.size(0)
    XL, XR = (x @ wl.t() + bl).view(n, heads, -1), (x @ wr.t() + br).view(n, heads, -1)
    s = (torch.nn.functional.leaky_relu(XL[src] + XR[dst], slope) * att).sum(-1)
    alpha = pyg_softmax(s, dst, num_nodes=n) * keep
    out = torch.zeros_like(XL).index_add(0, dst, XL[src] * alpha.unsqueeze(-1))
    return out.reshape(n, -1) + b


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("H", [3, 8])
def test_backends_and_dropout_match_reference(backend, H, monkeypatch):
    """Every backend and scheme, with attention dropout: the same mask as the GAT
    kernels (:func:`dropout_keep_mask`), outputs and every gradient (8 heads: the
    kernels' eight-head paths, ``numba_kernels.HEADS8``)."""
    eight_head_tier(monkeypatch, H)
    ei, n = make_graph(seed=3)
    A = Graph(ei, num_nodes=n).gat_adjacency()
    K, m, p = 4, 5, 0.5
    drop = DropoutSpec(p, seed=123)
    keep = dropout_keep_mask(A.nnz, H, drop.p, drop.seed).to(F64) / (1 - p)
    assert 0.4 < float((keep > 0).double().mean()) < 0.6
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=F64) for s in [(n, m), (H * K, m), (H * K,), (H * K, m), (H * K,), (1, H, K), (H * K,)]]
    g = torch.randn(n, H * K, dtype=F64)

    def grads(fn):
        t = [v.clone().requires_grad_() for v in inputs]
        out = fn(*t)
        out.backward(g)
        return [out.detach()] + [v.grad for v in t]

    want = grads(lambda *t: reference_gatv2(*t, A, H, 0.2, keep))
    with use_backend(backend):
        for cache in SCHEMES:
            got = grads(lambda x, *w: gatv2_conv(x, None, *w, A, H, dropout=drop, training=True, cache=cache))
            assert_all_close(got, want)
        with torch.no_grad():  # the no-autograd forward and its attention weights
            out, alpha = gatv2_conv(*inputs[:1], None, *inputs[1:], A, H, return_attention_weights=True)
        no_drop = reference_gatv2(*inputs, A, H, 0.2, torch.ones_like(keep))
        torch.testing.assert_close(out, no_drop)
        rows = torch.zeros(n, H, dtype=F64).index_add_(0, A.to_coo().row, alpha)
        torch.testing.assert_close(rows, torch.ones(n, H, dtype=F64))  # softmax rows (every node has its loop)


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("spread", [1.0, 60.0])
@pytest.mark.parametrize("heads", [4, 8])
def test_float32_matches_float64(cache, spread, heads, monkeypatch):
    """The float32 kernels (the forward's exps a vectorized polynomial; with 8 heads its
    eight-head path) against the float64 ones (``math.exp``), every caching scheme;
    ``spread`` 60 makes scores wide enough that some attention weights underflow to 0
    in float32."""
    eight_head_tier(monkeypatch, heads)
    ei, n = make_graph(seed=10)
    ref, ours = pair(6, 8, heads=heads)
    ours.cache = cache
    x, g = spread * torch.randn(n, 6, dtype=F64), torch.randn(n, 8 * heads, dtype=F64)
    want = run(ours, x, ei, g)
    ours32 = GATv2Conv(6, 8, heads=heads)
    ours32.load_state_dict(ours.state_dict())
    ours32.cache = cache
    got = run(ours32, x.float(), ei, g.float())
    for a, b in zip([t.double() for t in got], want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * max(1.0, float(b.abs().max())))
    if spread > 1:
        _, (_, alpha) = ours.eval()(x, ei, return_attention_weights=True)
        assert float(alpha.min()) < 1e-30  # (float64) some weights are below float32's range


def test_dropout_modes():
    ei, n = make_graph(seed=4)
    ref, layer = pair(4, 3, heads=4, dropout=0.6)
    x = torch.randn(n, 4, dtype=F64)
    layer.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, ei), ref(x, ei))  # eval: no attention dropout
    layer.train()
    torch.manual_seed(1)
    b = layer(x, ei)
    torch.manual_seed(1)
    torch.testing.assert_close(layer(x, ei), b)  # seed drawn from torch's generator
    assert not torch.allclose(layer(x, ei), b)  # a fresh mask per call
    if FORCED_TRITON_INTERPRETER:  # (300 interpreted calls: minutes; the mask itself is checked per backend above)
        return
    # train-mode statistics: the dropped output is unbiased (mean over masks ~ eval output)
    layer.eval()
    with torch.no_grad():
        want = layer(x, ei)
        layer.train()
        mean = sum(layer(x, ei) for _ in range(300)) / 300
    assert float((mean - want).abs().mean()) < 0.1 * float(want.abs().mean())


# ----------------------------------------------------------------------- model / interop
def test_optimize_swap_keeps_parameters_and_outputs():
    ei, n = make_graph(seed=5)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = PygGATv2Conv(5, 4, heads=3)
            self.conv2 = PygGATv2Conv(12, 2, heads=2, concat=False, negative_slope=0.3, share_weights=True)

        def forward(self, x, ei):
            return self.conv2(torch.nn.functional.elu(self.conv1(x, ei)), ei)

    torch.manual_seed(0)
    net = Net().to(F64)
    x = torch.randn(n, 5, dtype=F64)
    want = net(x, ei)
    keys = set(net.state_dict())
    params = {id(p) for p in net.parameters()}
    corgnn.optimize(net)
    assert isinstance(net.conv1, GATv2Conv) and isinstance(net.conv2, GATv2Conv)
    assert net.conv2.lin_r is net.conv2.lin_l
    assert set(net.state_dict()) == keys and {id(p) for p in net.parameters()} == params
    torch.testing.assert_close(net(x, ei), want, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for layer in (PygGATv2Conv(5, 4, residual=True), PygGATv2Conv((5, 3), 4), PygGATv2Conv(5, 4, bias=False)):
            assert isinstance(corgnn.optimize(layer), GATv2Conv)
        declined = PygGATv2Conv(5, 4, edge_dim=2)
        assert corgnn.optimize(declined) is declined
    assert len(w) == 1 and "edge_dim" in str(w[0].message)


def test_pickle_and_save_after_forward():
    ei, n = make_graph()
    layer = GATv2Conv(4, 3, heads=2)
    x = torch.randn(n, 4)
    layer(x, ei).sum().backward()
    copy_ = pickle.loads(pickle.dumps(layer))
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (copy_, loaded):
        torch.testing.assert_close(other(x, ei), layer(x, ei))


@pytest.mark.parametrize("residual", [False, True])
def test_gatv2_sparse_features_match_dense(cora, residual):
    """Bag-of-words features (constant, ~1 % non-zero) run SpMMs instead of the
    transforms' GEMMs: the same outputs and parameter gradients as the dense path."""
    x = (cora.x[:400] / cora.x[:400].sum(1, keepdim=True).clamp_min(1)).to(F64)
    keep = (cora.edge_index < 400).all(0)
    ei = cora.edge_index[:, keep]
    torch.manual_seed(0)
    layer = GATv2Conv(x.size(1), 4, heads=2, residual=residual).to(F64)
    assert layer.sparse_features(x) is not None
    out = layer(x, ei)  # (x needs no grad: the sparse path)
    out.sum().backward()
    sparse = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    dense_out = layer(x.clone().requires_grad_(), ei)  # needs dL/dx: the dense path
    dense_out.sum().backward()
    torch.testing.assert_close(dense_out, out)
    assert_all_close([p.grad for p in layer.parameters()], sparse)
    torch.manual_seed(0)
    model = GATv2(x.size(1), 4, 7, heads=2).to(F64)
    model(x, ei).square().sum().backward()
    assert model.schemes() == ["edge_weights", "edge_weights"]
    torch.manual_seed(0)
    budget = GATv2(x.size(1), 4, 7, heads=2, memory_budget=0).to(F64)
    budget(x, ei).square().sum().backward()  # (recomputes XL, XR: the stacked SpMM again)
    assert budget.schemes() == ["none", "none"]
    assert_all_close([p.grad for p in budget.parameters()], [p.grad for p in model.parameters()])


def test_train_cli_gatv2_smoke(cora):
    from corgnn.train import TrainConfig, train

    res = train(TrainConfig(model="gatv2", epochs=2, progress=False))
    assert res.schemes == ["edge_weights", "edge_weights"] and 0.0 <= res.test_acc <= 1.0


# ---------------------------------------------------------------------------- errors
def test_bad_input_errors():
    ei, n = make_graph()
    layer = GATv2Conv(4, 3, heads=2)
    x = torch.randn(n, 4)
    with pytest.raises(TypeError, match="edge_index"):
        layer(x, ei.float())
    with pytest.raises(ValueError, match="node id"):
        layer(x[:10], ei)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        layer(bad, ei)
    with pytest.raises(ValueError, match="in_channels"):
        layer(torch.randn(n, 5), ei)
    with pytest.raises(TypeError, match="float64"):
        layer(x.double(), ei)
    with pytest.raises(ValueError, match="edge_attr"):
        layer(x, ei, edge_attr=torch.randn(ei.size(1), 2))
    with pytest.raises(ValueError, match="x_dst"):
        GATv2Conv((4, 4), 3)((x, None), ei)
    with pytest.raises(UnsupportedOption, match="edge_dim"):
        GATv2Conv(4, 3, edge_dim=2)
    for kw in (dict(cache="node_attention"), dict(dropout=1.0), dict(heads=0), dict(format="dense")):
        with pytest.raises(ValueError):
            GATv2Conv(4, 3, **kw)


# ---------------------------------------------------------------------------- cost model
def test_bytes_saved_and_plan():
    n, q, h, k, m = 2708, 13264, 8, 8, 1433
    got = [gatv2_bytes_saved(s, n, q, h, k, m) for s in SCHEMES]
    assert got == [4 * n * h, 8 * n * h * k + 4 * n * h, 8 * n * h * k + 4 * q * h]
    assert gatv2_bytes_saved("features", n, q, h, k, m, shared=True) == 4 * n * h * k + 4 * n * h
    plan = plan_gatv2(n, q, h, k, m)
    assert plan.scheme == "edge_weights" and "GATv2 layer" in plan.table() and "features" in plan.table()
    assert [c.time_s for c in plan.costs] == sorted((c.time_s for c in plan.costs), reverse=True)
    assert plan_gatv2(n, q, h, k, m, memory_budget=got[1]).scheme == "features"
    assert plan_gatv2(n, q, h, k, m, memory_budget=got[0]).scheme == "none"
    assert plan_gatv2(n, q, h, k, m, cache="xl_xr").scheme == "features"
    assert plan_gatv2(n, q, h, k, m, training=False).scheme == "none"
    with pytest.raises(ValueError, match="scheme"):
        gatv2_bytes_saved("node_attention", n, q, h, k, m)


@pytest.mark.parametrize("share_weights", [False, True])
@pytest.mark.parametrize("cache", SCHEMES)
def test_saved_tensors_follow_the_plan(cache, share_weights):
    """What the Function keeps for backward (autograd's saved-tensor hooks) is the
    input plus exactly the scheme's values and the 8-byte dropout seed; parameters aside."""
    ei, n = make_graph(seed=6)
    _, layer = pair(5, 3, heads=2, dropout=0.5, share_weights=share_weights)
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
    want = gatv2_bytes_saved(cache, n, q, 2, 3, 5, value_bytes=8, include_input=True, shared=share_weights)
    assert sum(saved) == want + 8  # + the attention-dropout seed (one int64), not a mask


@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("stack", [True, "by 4-row chunks", False])
def test_stacked_projections_equal_separate_gemms_and_autograd(biases, stack, monkeypatch):
    from corgnn.functional import projection
    from corgnn.functional.projection import stacked_projection_grads, stacked_projections

    monkeypatch.setattr(projection, "STACK_GRADS_MIN_BYTES", 0 if stack else 1 << 40)  # (x is tiny: one product per block unless forced)
    if stack == "by 4-row chunks":  # (dP made 4 rows at a time: 11 rows are 3 chunks, the last short)
        monkeypatch.setattr(projection, "CHUNK_BYTES", 4 * 18 * 8)
    monkeypatch.setattr(projection, "STACK_MIN_FEATURES", 0 if stack else 1 << 30)  # (the forward likewise)

    g = torch.Generator().manual_seed(3)
    x = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    ws = tuple(torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    bs = tuple(torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)) if biases else (None,) * 3
    outs = stacked_projections(x, ws, bs, heads=2)
    for out, w, b in zip(outs, ws, bs):
        ref = x @ w.t() + (0 if b is None else b)
        assert out.shape == (11, 2, 3) and torch.allclose(out.flatten(1), ref)
    dPs = [torch.randn(11, 6, dtype=torch.float64, generator=g) for _ in range(3)]
    blocks = list(dPs)
    dws, dbs, dx = stacked_projection_grads(blocks, x.detach(), tuple(w.detach() for w in ws), True, True, biases)
    assert blocks == []  # (emptied once stacked, or block by block: a caller's only references are freed there)
    auto = torch.autograd.grad([o.flatten(1) for o in outs], (*ws, x) + (bs if biases else ()), dPs)
    for got, want in zip((*dws, dx) + (tuple(dbs) if biases else ()), auto):
        assert torch.allclose(got, want)
    assert dbs is None or len(dbs) == 3
    assert stacked_projection_grads(list(dPs), x.detach(), ws, False, False, False) == (None, None, None)


def test_attention_ops_check_shapes():
    """The raw GATv2 ops raise before any kernel runs when ``XL``, ``XR``, ``att`` or
    ``G`` do not fit the pattern or one another."""
    from corgnn.sparse.attention import gatv2_attention_backward, gatv2_attention_forward

    ei, n = make_graph(seed=4)
    A = Graph(ei, num_nodes=n).gat_adjacency(add_self_loops=True)
    XL = XR = torch.randn(n, 2, 4)
    att = torch.randn(1, 2, 4)
    _, _, lse = gatv2_attention_forward(A, XL, XR, att, 0.2)
    bad = {"XR": (XL, torch.randn(n - 1, 2, 4), att), "XL": (torch.randn(n, 2, 3), XR, att), "att": (XL, XR, torch.randn(2, 3))}
    for what, (xl, xr, a) in bad.items():
        with pytest.raises(ValueError, match=what):
            gatv2_attention_forward(A, xl, xr, a, 0.2)
        with pytest.raises(ValueError, match=what):
            gatv2_attention_backward(A, XR, xl, xr, a, 0.2, lse=lse)
    with pytest.raises(ValueError, match="G must have shape"):
        gatv2_attention_backward(A, torch.randn(n, 2, 5), XL, XR, att, 0.2, lse=lse)
