"""GCN gradients beyond the first-order ones of x and the parameters, against PyG's
GCNConv with identical parameters: learnable edge weights (``edge_weight.grad``
through the normalisation, in every scheme and sparse format) and second
derivatives (gradient penalties with ``create_graph=True``, gradgradcheck)."""

import pytest
import torch
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.cost import GCN_SCHEMES
from corgnn.functional import gcn_conv
from corgnn.functional.gcn import gcn_values
from corgnn.nn import GCNConv
from corgnn.sparse import FORMAT_NAMES
from conftest import FAST_GRADCHECK, make_graph

SCHEMES = ["auto"] + [s.name for s in GCN_SCHEMES]
# (PyG forbids self-loops without normalisation; corgnn would add them by default)
OPTIONS = [dict(), dict(improved=True), dict(add_self_loops=False), dict(normalize=False, add_self_loops=False)]
F64 = torch.float64


def pair(m, k, seed=0, dtype=F64, **kw):
    """PyG's layer and ours with the same parameters (a non-zero bias)."""
    torch.manual_seed(seed)
    ref = PygGCNConv(m, k, **{o: v for o, v in kw.items() if o not in ("scheme", "format")}).to(dtype)
    with torch.no_grad():
        ref.bias.normal_()
    ours = GCNConv(m, k, **kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def leaf(t, grad=True):
    return t.detach().clone().requires_grad_(grad)


def assert_grads_match(got, want, tol):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, f"gradient {i} missing"
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda s: f"gradient {i}: {s}")


# ----------------------------------------------------------- learnable edge weights


def edge_weight_grads(layer, x, ei, ew, g):
    """``(out, [ew.grad, x.grad?, weight.grad, bias.grad])`` of ``<layer(x, ei, ew), g>``."""
    x, ew = leaf(x, x.requires_grad), leaf(ew)
    layer.zero_grad()
    out = layer(x, ei, ew)
    out.backward(g)
    return out.detach(), [ew.grad] + ([x.grad] if x.requires_grad else []) + [layer.lin.weight.grad, layer.bias.grad]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_edge_weight_grad_matches_pyg_every_scheme_and_format(scheme, fmt):
    ei, n = make_graph()
    ew = torch.rand(ei.size(1), dtype=F64) + 0.1
    x = torch.randn(n, 6, dtype=F64, requires_grad=True)
    g = torch.randn(n, 3, dtype=F64)
    ref, ours = pair(6, 3, scheme=scheme, format=fmt)
    o1, g1 = edge_weight_grads(ref, x, ei, ew, g)
    o2, g2 = edge_weight_grads(ours, x, ei, ew, g)
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    assert_grads_match(g2, g1, 1e-11)


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(o) or "default")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("input_grad", [True, False])
def test_edge_weight_grad_matches_pyg_options(scheme, opts, input_grad):
    """improved (self-loop fill 2), no self-loops, no normalisation; x with or without grad."""
    ei, n = make_graph(seed=2)
    ew = torch.rand(ei.size(1), dtype=F64) + 0.1
    x = torch.randn(n, 5, dtype=F64, requires_grad=input_grad)
    g = torch.randn(n, 4, dtype=F64)
    ref, ours = pair(5, 4, scheme=scheme, **opts)
    o1, g1 = edge_weight_grads(ref, x, ei, ew, g)
    o2, g2 = edge_weight_grads(ours, x, ei, ew, g)
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    assert_grads_match(g2, g1, 1e-11)


def test_edge_weight_grad_sparse_features_and_model():
    """Constant sparse input features (the SpMM-over-X path) and the 2-layer GCN with
    a Graph carrying the learnable weights, as an explainer's edge mask would."""
    ei, n = make_graph(seed=4)
    x = torch.zeros(n, 30, dtype=F64)
    x[torch.arange(n), torch.randint(0, 30, (n,))] = torch.rand(n, dtype=F64)
    mask = torch.randn(ei.size(1), dtype=F64, requires_grad=True)
    ref, ours = pair(30, 4)
    g = torch.randn(n, 4, dtype=F64)
    grads = []
    for layer in (ref, ours):
        mask.grad = None
        layer(x, ei, mask.sigmoid()).backward(g)
        grads.append(mask.grad)
    assert ours._features.newest is not None  # the sparse-feature path ran
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-11, atol=1e-11)

    model = corgnn.nn.GCN(30, 8, 4).double()
    ew = torch.rand(ei.size(1), dtype=F64, requires_grad=True)
    model(x, corgnn.Graph(ei, ew, n)).square().sum().backward()
    ref1, ref2 = PygGCNConv(30, 8).double(), PygGCNConv(8, 4).double()
    ref1.load_state_dict(model.conv1.state_dict())
    ref2.load_state_dict(model.conv2.state_dict())
    ew2 = leaf(ew)
    ref2(torch.relu(ref1(x, ei, ew2)), ei, ew2).square().sum().backward()
    torch.testing.assert_close(ew.grad, ew2.grad, rtol=1e-11, atol=1e-11)


def test_learnable_edge_weight_training_matches_pyg():
    """An ``nn.Parameter`` edge weight trained with SGD (in-place updates: the layer's
    Graph cache must rebuild A' each step), two backward passes per step."""
    ei, n = make_graph(seed=3)
    x = torch.randn(n, 5, dtype=F64)
    ew0 = torch.rand(ei.size(1), dtype=F64) + 0.5
    params = []
    for layer in pair(5, 3, scheme="propagate-first+split+cache"):
        ew = torch.nn.Parameter(ew0.clone())
        opt = torch.optim.SGD([ew, *layer.parameters()], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            for _ in range(2):  # gradient accumulation: the same weights, two graphs
                layer(x, ei, ew).square().mean().backward()
            opt.step()
        params.append([ew.detach(), layer.lin.weight.detach(), layer.bias.detach()])
    for a, b in zip(params[1], params[0]):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_edge_weight_grad_on_cora_float32(cora):
    ref, ours = pair(cora.x.size(1), 16, dtype=torch.float32)
    ew = torch.rand(cora.edge_index.size(1)) + 0.5
    g = torch.randn(cora.num_nodes, 16)
    o1, g1 = edge_weight_grads(ref, cora.x, cora.edge_index, ew, g)
    o2, g2 = edge_weight_grads(ours, cora.x, cora.edge_index, ew, g)
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-5)
    assert_grads_match(g2, g1, 1e-4)


def test_constant_edge_weight_takes_the_cached_path(monkeypatch):
    """Without a gradient on edge_weight (or under no_grad) nothing extra runs."""
    import corgnn.nn.gcn as gcn_mod

    monkeypatch.setattr(gcn_mod, "gcn_values", lambda *a, **k: pytest.fail("differentiable values built"))
    ei, n = make_graph()
    layer = GCNConv(4, 3)
    x = torch.randn(n, 4, requires_grad=True)
    layer(x, ei, torch.rand(ei.size(1))).sum().backward()
    with torch.no_grad():
        layer(x, ei, torch.rand(ei.size(1), requires_grad=True))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gcn_values_match_the_adjacency(fmt):
    ei, n = make_graph()
    ew = torch.rand(ei.size(1), dtype=F64)
    for opts in OPTIONS:
        A = corgnn.Graph(ei, ew, n).gcn_adjacency(dtype=F64, format=fmt, **opts)
        # (the same matrix: duplicate edges are separate entries of A, whose weights
        # gcn_values may sum into one of them)
        torch.testing.assert_close(A.with_values(gcn_values(A, ei, ew, **opts)).to_dense(), A.to_dense(), rtol=1e-14, atol=1e-14)


def without_repeated_loops(ei):
    """``ei`` with each self-loop once. NOTE: of a repeated self-loop PyG's
    ``add_remaining_self_loops`` keeps one copy's weight but its backward sends the
    gradient to every copy (an ``index_put``); corgnn reproduces that (see the tests
    above), finite differences do not."""
    loop = ei[0] == ei[1]
    return torch.cat([ei[:, ~loop], ei[:, loop].unique(dim=1)], dim=1)


@pytest.mark.parametrize("scheme", [s.name for s in GCN_SCHEMES])
def test_edge_weight_gradcheck_and_gradgradcheck(scheme):
    """Through the whole layer: normalisation (degrees incl. self-loops), SpMMs, backward."""
    ei, n = make_graph(n=9, q=16, seed=5)
    ei = without_repeated_loops(ei)
    layer = GCNConv(3, 2, scheme=scheme).double()
    x = torch.randn(n, 3, dtype=F64, requires_grad=True)
    ew = (torch.rand(ei.size(1), dtype=F64) + 0.5).requires_grad_()
    f = lambda x, ew: layer(x, ei, ew * 1)  # noqa: E731  (a fresh tensor per call: no stale Graph cache)
    assert torch.autograd.gradcheck(f, (x, ew), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(f, (x, ew), fast_mode=FAST_GRADCHECK)


# ------------------------------------------------------------- second derivatives


def functional_case(scheme, fmt):
    ei, n = make_graph(n=10, q=20, seed=1)
    A = corgnn.Graph(ei, num_nodes=n).gcn_adjacency(dtype=F64, format=fmt)
    torch.manual_seed(0)
    x, w, b = (torch.randn(*shape, dtype=F64, requires_grad=True) for shape in ((n, 3), (2, 3), (2,)))
    return A, corgnn.cost.parse_scheme(scheme), x, w, b


@pytest.mark.parametrize("fmt", ["csr", "csc", "hybrid"])
@pytest.mark.parametrize("scheme", [s.name for s in GCN_SCHEMES])
def test_gradgradcheck_functional(scheme, fmt):
    """GCNFunction's backward is differentiable w.r.t. x, weight, bias and G (constant A')."""
    A, s, x, w, b = functional_case(scheme, fmt)
    assert torch.autograd.gradgradcheck(lambda x, w, b: gcn_conv(x, w, b, A, s), (x, w, b), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(lambda w, b: gcn_conv(x.detach(), w, b, A, s), (w, b), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(lambda x: gcn_conv(x, w.detach(), b.detach(), A, s), (x,), fast_mode=FAST_GRADCHECK)


@pytest.mark.parametrize("fmt", ["csr", "csc", "hybrid"])
@pytest.mark.parametrize("scheme", [s.name for s in GCN_SCHEMES])
def test_gradcheck_and_gradgradcheck_functional_values(scheme, fmt):
    """... and w.r.t. the values of A' when they are an input."""
    A, s, x, w, b = functional_case(scheme, fmt)
    val = leaf(A.val)
    f = lambda x, w, b, val: gcn_conv(x, w, b, A, s, None, val)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b, val), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(f, (x, w, b, val), fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(lambda val: gcn_conv(x.detach(), w.detach(), None, A, s, None, val), (val,), fast_mode=FAST_GRADCHECK)


def penalty_grads(l1, l2, x, ei, ew, wrt):
    """Gradient-penalty loss ``out.sum() + |d(out^2).sum()/d wrt|^2`` of a 2-layer net,
    then its gradients w.r.t. every parameter, x and (when given) edge_weight."""
    x = leaf(x)
    ew = None if ew is None else leaf(ew)
    for layer in (l1, l2):
        layer.zero_grad()
    out = l2(torch.tanh(l1(x, ei, ew)), ei, ew)
    target = {"x": x, "weight1": l1.lin.weight, "weight2": l2.lin.weight, "edge_weight": ew}[wrt]
    (gp,) = torch.autograd.grad(out.square().sum(), target, create_graph=True)
    (out.sum() + gp.square().sum()).backward()
    grads = [p.grad for layer in (l1, l2) for p in (layer.lin.weight, layer.bias)] + [x.grad]
    return grads + ([] if ew is None else [ew.grad])


@pytest.mark.parametrize("wrt", ["x", "weight1", "weight2", "edge_weight"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradient_penalty_matches_pyg(scheme, wrt):
    ei, n = make_graph(seed=6)
    ew = torch.rand(ei.size(1), dtype=F64) + 0.1 if wrt == "edge_weight" else None
    x = torch.randn(n, 6, dtype=F64)
    r1, o1 = pair(6, 8, seed=0, scheme=scheme)
    r2, o2 = pair(8, 12, seed=1, scheme=scheme)  # k > m: auto caches A'X with an input gradient
    want = penalty_grads(r1, r2, x, ei, ew, wrt)
    got = penalty_grads(o1, o2, x, ei, ew, wrt)
    assert_grads_match(got, want, 1e-10)
    if scheme == "auto":
        assert o2.last_plan.scheme.cache


def test_gradient_penalty_simple_example_every_scheme():
    """The issue's example: loss = out.sum() + |dL/dx|^2 on one layer."""
    ei, n = make_graph()
    x0 = torch.randn(n, 6, dtype=F64)
    for scheme in SCHEMES:
        ref, ours = pair(6, 3, scheme=scheme)
        res = []
        for layer in (ref, ours):
            x = leaf(x0)
            out = layer(x, ei)
            (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            (out.sum() + gx.pow(2).sum()).backward()
            res.append([x.grad, layer.lin.weight.grad, layer.bias.grad])
        assert_grads_match(res[1], res[0], 1e-11)
