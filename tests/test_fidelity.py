"""Drop-in fidelity: what ``optimize()`` keeps (parameter objects and their state,
shared layers, lazy layers), cache keys, pickling, empty graphs, coalescing
patterns, progress output in logs, PyG's constructor signatures, half precision,
``torch.sparse`` features. Each test fails on the code before its fix (the
half-precision accuracy tests guard paths that already worked)."""

import contextlib
import copy
import inspect
import io
import os
import re
import warnings

import pytest
import torch
from torch_geometric.nn import GATConv as PygGATConv
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.nn import GAT, GCN, GATConv, GCNConv
from corgnn.sparse import COO, CSR, FORMAT_NAMES, edge_softmax, use_backend
from conftest import TRITON, make_graph

F64 = torch.float64
BACKENDS = ["numba", "torch"]


class TwoLayer(torch.nn.Module):
    """A PyG model: ``conv2(elu(conv1(x)))``."""

    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, ei):
        return self.conv2(torch.nn.functional.elu(self.conv1(x, ei)), ei)


def pyg_model(m=5, seed=0):
    torch.manual_seed(seed)
    return TwoLayer(PygGCNConv(m, 6), PygGATConv(6, 3, heads=2))


def outputs_and_grads(model, x, ei):
    model.zero_grad()
    out = model(x, ei)
    out.square().sum().backward()
    return [out.detach()] + [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def assert_same(got, want, tol=1e-10):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ------------------------------------------------------------- 3: parameter state
def test_optimize_keeps_parameter_objects_and_their_state():
    ei, n = make_graph()
    model = pyg_model().to(F64).eval()
    model.conv1.requires_grad_(False)  # frozen layer
    model.conv2.att_src.requires_grad_(False)  # one frozen tensor
    x = torch.randn(n, 5, dtype=F64)
    want = outputs_and_grads(model, x, ei)
    params = dict(model.named_parameters())
    frozen = {k for k, p in params.items() if not p.requires_grad}
    seen = []
    model.conv2.lin.weight.register_hook(lambda g: seen.append("param hook"))
    handle = model.conv1.register_forward_hook(lambda mod, args, out: seen.append("module hook"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before optimize: must still train it

    assert corgnn.optimize(model) is model
    assert isinstance(model.conv1, GCNConv) and isinstance(model.conv2, GATConv)
    new = dict(model.named_parameters())
    assert new.keys() == params.keys() and all(new[k] is params[k] for k in params)  # the very same objects
    assert {k for k, p in new.items() if not p.requires_grad} == frozen
    assert not model.training and not model.conv1.training and not model.conv2.training
    assert all(p.dtype == F64 for p in new.values())
    got = outputs_and_grads(model, x, ei)
    assert_same(got, want)
    assert seen == ["module hook", "param hook"]
    before = model.conv2.lin.weight.detach().clone()
    opt.step()
    assert not torch.equal(model.conv2.lin.weight, before)
    handle.remove()  # a handle taken on the PyG layer still removes its hook
    model(x, ei)
    assert seen.count("module hook") == 1

    odd = PygGCNConv(5, 6)  # hooks on PyG's message-passing steps: corgnn has no such steps
    odd.register_message_forward_hook(lambda mod, inputs, out: out)
    with pytest.warns(UserWarning, match="MessagePassing hooks"):
        assert corgnn.optimize(odd) is odd


# ------------------------------------------------------------- 4: shared layers
def test_optimize_keeps_shared_layers_shared():
    torch.manual_seed(0)
    shared = PygGCNConv(4, 4)
    inner = torch.nn.Module()
    inner.conv = shared

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = shared
            self.b = shared  # the same module under two names of one parent
            self.inner = inner  # ... and under another parent
            self.tied1, self.tied2 = PygGATConv(4, 4), PygGATConv(4, 4)
            self.tied2.lin.weight = self.tied1.lin.weight  # weight tying between layers

        def forward(self, x, ei):
            x = self.b(self.a(x, ei).relu(), ei).relu()
            return self.tied2(self.tied1(self.inner.conv(x, ei), ei), ei)

    ei, n = make_graph()
    net = Net().to(F64)
    x = torch.randn(n, 4, dtype=F64)
    want = outputs_and_grads(net, x, ei)
    corgnn.optimize(net)
    assert isinstance(net.a, GCNConv) and net.b is net.a and net.inner.conv is net.a
    assert isinstance(net.tied1, GATConv) and net.tied2.lin.weight is net.tied1.lin.weight
    assert_same(outputs_and_grads(net, x, ei), want)


# --------------------------------------------------------------- 6: cache keys
def test_graph_cache_sees_rebound_data():
    """``edge_index.data = other`` (same tensor object, version counter untouched)
    and ``x.data = other`` must not reuse the adjacency / sparse features built
    for the old contents."""
    ei, n = make_graph(seed=1)
    ei2, _ = make_graph(seed=2)
    torch.manual_seed(0)
    ref = PygGCNConv(6, 3).to(F64)
    ours = corgnn.optimize(copy.deepcopy(ref))
    x = (torch.rand(n, 6, dtype=F64) < 0.04).to(F64)  # sparse enough for the sparse-feature path
    x[0, 0] = 1.0
    ei_ours = ei.clone()
    torch.testing.assert_close(ours(x, ei_ours), ref(x, ei))
    ei_ours.data = ei2.clone()
    torch.testing.assert_close(ours(x, ei_ours), ref(x, ei2))
    x2 = (torch.rand(n, 6, dtype=F64) < 0.04).to(F64)
    x2[1, 1] = 1.0
    x.data = x2
    torch.testing.assert_close(ours(x, ei_ours), ref(x2, ei2))


# ------------------------------------------------------------------ 7: empty graphs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("concat", [True, False])
def test_gat_without_edges_matches_pyg(backend, n, add_self_loops, concat):
    empty = torch.empty(2, 0, dtype=torch.long)
    torch.manual_seed(0)
    ref = PygGATConv(3, 2, heads=2, concat=concat, add_self_loops=add_self_loops).to(F64)
    with torch.no_grad():
        ref.bias.normal_()
    x = torch.randn(n, 3, dtype=F64, requires_grad=True)
    want = outputs_and_grads(ref, x, empty) + [x.grad.clone()]
    x.grad = None
    with use_backend(backend):
        for fmt in FORMAT_NAMES:
            for cache in corgnn.cost.GAT_CACHE_SCHEMES:
                ours = GATConv(3, 2, heads=2, concat=concat, add_self_loops=add_self_loops, format=fmt, cache=cache).to(F64)
                ours.load_state_dict(ref.state_dict())
                got = outputs_and_grads(ours, x, empty) + [x.grad.clone()]
                x.grad = None
                assert_same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_edge_softmax_without_entries(backend, fmt):
    none = torch.empty(0, dtype=torch.long)
    with use_backend(backend):
        for n in (0, 1, 3):
            A = COO(none, none, None, (n, n)).to(fmt)
            for shape in ((0,), (0, 1), (0, 4)):
                s = torch.randn(shape, dtype=F64, requires_grad=True)
                y = edge_softmax(A, s)
                assert y.shape == shape
                (g,) = torch.autograd.grad(y.sum(), s)
                assert g.shape == shape


# -------------------------------------------------------------------- 8: lazy layers
def test_optimize_lazy_layers_before_and_after_first_forward():
    ei, n = make_graph()
    x = torch.randn(n, 5, dtype=F64)
    torch.manual_seed(0)
    ref = TwoLayer(PygGCNConv(-1, 6), PygGATConv(-1, 3, heads=2)).to(F64)
    model = copy.deepcopy(ref)
    torch.manual_seed(1)  # lazy weights are drawn at the first forward: the same draws for both
    want = ref(x, ei)

    # before the first forward: left as PyG, converted by that forward
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert corgnn.optimize(model) is model
    assert type(model.conv1) is PygGCNConv and type(model.conv2) is PygGATConv
    weight = model.conv1.lin.weight
    torch.manual_seed(1)
    torch.testing.assert_close(model(x, ei), want)  # PyG's first call materialises the weights
    assert isinstance(model.conv1, GCNConv) and isinstance(model.conv2, GATConv)
    assert model.conv1.in_channels == 5 and model.conv2.in_channels == 6
    assert model.conv1.lin.weight is weight and weight.shape == (6, 5)
    torch.testing.assert_close(model(x, ei), want)  # now corgnn's

    # after the first forward: converted with the materialised shapes, same parameters
    weight = ref.conv1.lin.weight
    corgnn.optimize(ref)
    assert isinstance(ref.conv1, GCNConv) and ref.conv1.lin.weight is weight and ref.conv1.in_channels == 5
    torch.testing.assert_close(ref(x, ei), want)

    # a bare lazy layer: nowhere to swap it in later, so kept with a warning
    bare = PygGCNConv(-1, 4)
    with pytest.warns(UserWarning, match="lazy"):
        assert corgnn.optimize(bare) is bare


# ------------------------------------------------------------ 9: save / deepcopy
def _roundtrip(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("make", [
    lambda: GCN(5, 8, 3),
    lambda: GAT(5, 4, 3, heads=2),
    lambda: GCNConv(5, 3),
    lambda: corgnn.optimize(pyg_model()),
    lambda: corgnn.optimize(TwoLayer(PygGCNConv(-1, 6), PygGATConv(-1, 3, heads=2))),  # conversion pending
], ids=["GCN", "GAT", "GCNConv", "optimized-pyg", "optimized-lazy-pyg"])
def test_save_load_and_deepcopy_at_any_time(make):
    ei, n = make_graph()
    x = (torch.rand(n, 5) < 0.04).float()  # sparse features: the feature cache is filled too
    torch.manual_seed(0)
    model = make().eval()
    copies = [_roundtrip(model), copy.deepcopy(model)]  # before any forward
    torch.manual_seed(1)  # (lazy weights are drawn at the first forward)
    want = model(x, ei)
    copies += [_roundtrip(model), copy.deepcopy(model)]  # after one (caches filled)
    for c in copies:
        torch.manual_seed(1)
        torch.testing.assert_close(c(x, ei), want)
        torch.testing.assert_close(c(x, ei), want)
        assert not any("torch_geometric" in type(m).__module__ for m in c.modules() if "Conv" in type(m).__name__)
    torch.testing.assert_close(model(x, ei), want)


# ----------------------------------------------------------- 10: coalesced patterns
def test_coalescing_a_pattern_sums_its_duplicates():
    row = torch.tensor([2, 0, 0, 1, 0, 2, 2])
    col = torch.tensor([1, 1, 1, 0, 1, 1, 3])
    dense = torch.zeros(3, 4)
    dense.index_put_((row, col), torch.ones(7), accumulate=True)
    A = COO(row, col, None, (3, 4))
    torch.testing.assert_close(A.to_dense(), dense)
    C = A.to_csr(coalesce=True)
    assert C.nnz == 4 and C.val is not None
    torch.testing.assert_close(C.to_dense(), dense)
    B = torch.randn(4, 2)
    torch.testing.assert_close(corgnn.sparse.spmm(C, B), dense @ B)
    unique = COO(torch.tensor([0, 1]), torch.tensor([1, 0]), None, (2, 2)).to_csr(coalesce=True)
    assert unique.val is None  # no duplicates: still a pattern
    torch.testing.assert_close(CSR.from_coo(row, col, None, (3, 4), coalesce=True).to_dense(), dense)


# ------------------------------------------------------------- 11: progress in logs
def test_train_progress_is_quiet_when_not_a_terminal():
    from corgnn.train import TrainConfig, train

    log = io.StringIO()  # not a tty, like a CI log
    with contextlib.redirect_stderr(log):  # the bar's default stream
        train(TrainConfig(epochs=40, progress=True))
    lines = [s for s in re.split(r"[\r\n]+", log.getvalue()) if s.strip()]
    assert 1 <= len(lines) <= 3, lines  # start, end (and at most one periodic line), not one per epoch
    assert "40/40" in lines[-1]


# ------------------------------------------------- 5: constructor signatures
def _signature_keys(cls):
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]


@pytest.mark.parametrize("ours,theirs", [(GCNConv, PygGCNConv), (GATConv, PygGATConv)], ids=["GCNConv", "GATConv"])
def test_constructor_signature_is_pygs(ours, theirs):
    """PyG's parameters in PyG's order, kinds and defaults; corgnn's own options
    keyword-only after them; ``**kwargs`` last, as PyG's."""
    want, got = _signature_keys(theirs), _signature_keys(ours)
    var_kw = inspect.Parameter.VAR_KEYWORD
    assert want[-1][1] is var_kw and got[-1][1] is var_kw
    shared = want[:-1]
    assert got[: len(shared)] == shared
    assert got[len(shared):-1] and all(kind is inspect.Parameter.KEYWORD_ONLY for _, kind, _ in got[len(shared):-1])


def _gcn_pair(*args, **kw):
    torch.manual_seed(0)
    ref = PygGCNConv(*args, **kw).to(F64)
    ours = GCNConv(*args, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("args,kw", [
    ((4, 3, True), {}),  # improved
    ((4, 3, False, False, None, False), {}),  # normalize=False: no self-loops unless asked
    ((4, 3, False, True, False), {}),  # cached, no self-loops
    ((4, 3, False, False, None, True, False), {}),  # bias=False is the 7th positional
    ((4, 3), dict(normalize=False)),
    ((4, 3), dict(add_self_loops=None, improved=True)),
    ((4, 3), dict(aggr="add", flow="source_to_target", node_dim=0, decomposed_layers=2)),
])
def test_gcn_positional_arguments_and_defaults_mean_pygs(args, kw):
    ei, n = make_graph()
    ref, ours = _gcn_pair(*args, **kw)
    for name in ("improved", "add_self_loops", "normalize"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert (ours.bias is None) == (ref.bias is None)
    x = torch.randn(n, 4, dtype=F64, requires_grad=True)
    ew = torch.rand(ei.size(1), dtype=F64)
    want = outputs_and_grads(ref, x, ei) + [x.grad.clone()]
    x.grad = None
    assert_same(outputs_and_grads(ours, x, ei) + [x.grad.clone()], want)
    if not ref.cached:  # (PyG's cached=True reuses its first graph, whatever the new weights)
        torch.testing.assert_close(ours(x, ei, ew), ref(x, ei, ew), rtol=1e-10, atol=1e-10)
    assert GCNConv(16, 8, True).improved is True
    assert GCNConv(16, 8, normalize=False).add_self_loops is False
    assert GCNConv(16, 8).add_self_loops is True


@pytest.mark.parametrize("args,kw", [
    ((4, 3, 2, False, 0.1, 0.0, False), {}),  # add_self_loops=False is the 7th positional
    ((4, 3, 2, True, 0.2, 0.0, True, None, "mean", False), {}),  # bias=False is the 10th
    ((4, 3), dict(heads=2, fill_value=0.5, residual=False, edge_dim=None, aggr="sum")),
])
def test_gat_positional_arguments_mean_pygs(args, kw):
    ei, n = make_graph()
    torch.manual_seed(0)
    ref = PygGATConv(*args, **kw).to(F64)
    ours = GATConv(*args, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())
    for name in ("heads", "concat", "negative_slope", "dropout", "add_self_loops"):
        assert getattr(ours, name) == getattr(ref, name), name
    x = torch.randn(n, 4, dtype=F64, requires_grad=True)
    want = outputs_and_grads(ref, x, ei) + [x.grad.clone()]
    x.grad = None
    assert_same(outputs_and_grads(ours, x, ei) + [x.grad.clone()], want)


@pytest.mark.parametrize("make,name", [
    (lambda: GATConv(4, 3, aggr="mean"), "aggr"),
    (lambda: GATConv(4, 3, flow="target_to_source"), "flow"),
    (lambda: GCNConv(4, 3, aggr="max"), "aggr"),
    (lambda: GCNConv(4, 3, flow="sideways"), "flow"),
], ids=["gat-aggr", "gat-flow", "gcn-aggr", "gcn-flow"])
def test_unsupported_pyg_options_raise_naming_them(make, name):
    with pytest.raises(ValueError, match=name) as err:  # (GCNConv honours flow="target_to_source")
        make()
    if "sideways" not in str(err.value):
        assert isinstance(err.value, NotImplementedError) and isinstance(err.value, corgnn.nn.UnsupportedOption)
    with pytest.raises(TypeError, match="no_such_option"):
        GCNConv(4, 3, no_such_option=1)
    with pytest.raises(TypeError, match="no_such_option"):
        GATConv(4, 3, no_such_option=1)
    with pytest.raises(TypeError, match="node_dim"):  # as PyG's GATConv, which fixes it
        GATConv(4, 3, node_dim=0)


# ---------------------------------------------------------- 13: half precision
HALF = [torch.bfloat16, torch.float16]


def _rel_errors(got, want):
    return [float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)) for a, b in zip(got, want)]


def _half_check(make_pyg, dtype, backend, m=5):
    """corgnn in ``dtype`` is at least as close to the float32 result (same rounded
    parameters and inputs) as PyG's layer run in ``dtype``, forward and backward."""
    ei, n = make_graph(n=60, q=400)
    torch.manual_seed(0)
    ref_half = make_pyg().to(dtype)
    with torch.no_grad():
        for p in ref_half.parameters():
            p.add_(0.1 * torch.randn_like(p))  # a non-zero bias
    ref32 = copy.deepcopy(ref_half).float()
    x = torch.randn(n, m).to(dtype).requires_grad_(True)

    def run(model, x):
        model.zero_grad()
        x = x.detach().clone().requires_grad_(True)
        out = model(x, ei)
        g = torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype)
        (out * g).sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in model.parameters()]

    want = run(ref32, x.float())
    pyg = run(ref_half, x)
    ours_model = corgnn.optimize(copy.deepcopy(ref_half))
    assert not any("torch_geometric" in type(mod).__module__ for mod in ours_model.modules() if "Conv" in type(mod).__name__)
    with use_backend(backend):
        got = run(ours_model, x)
    assert all(t.dtype == dtype for t in got)
    eps = torch.finfo(dtype).eps
    for e_ours, e_pyg in zip(_rel_errors(got, want), _rel_errors(pyg, want)):
        assert e_ours <= 2 * e_pyg + 4 * eps, (e_ours, e_pyg)
    torch.testing.assert_close(got[0].float(), want[0], rtol=8 * eps, atol=8 * eps * float(want[0].abs().max()))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", [pytest.param(None, id="auto"), "torch", TRITON])
@pytest.mark.parametrize("layer", ["gcn", "gat", "model"])
def test_half_precision_matches_float32_and_pyg(dtype, backend, layer):
    if layer == "model" and backend == "triton" and dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's CPU interpreter truncates float32 -> bfloat16 casts (GPUs round to nearest), "
                    "which biases the attention-vector gradients")
    make = {
        "gcn": lambda: PygGCNConv(5, 6),
        "gat": lambda: PygGATConv(5, 3, heads=2),
        "model": lambda: TwoLayer(PygGCNConv(5, 6), PygGATConv(6, 3, heads=2, concat=False)),
    }[layer]
    _half_check(make, dtype, backend)


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_dispatch_falls_back_from_numba(dtype):
    from corgnn.sparse.dispatch import Case, select

    for op in ("spmm_rows", "gat_attention", "gat_attention_backward"):
        assert select(Case(op, "cpu", dtype)).name == "torch"
    assert "float32" in corgnn.sparse.dispatch._registry()["numba"].supports(Case("spmm_rows", "cpu", dtype))
    ei, n = make_graph()
    x = torch.randn(n, 4).to(dtype)
    with use_backend("numba"), pytest.raises(ValueError, match="numba"):  # forced: never a silent fallback
        GCNConv(4, 3).to(dtype)(x, ei)
    # sparse features (derived from a mostly-zero x, or a torch.sparse x) in half too
    xs = (torch.rand(n, 4) < 0.03).to(dtype)
    layer = GCNConv(4, 3).to(dtype)
    with torch.no_grad():
        want = layer.float()(xs.float(), ei).to(dtype)
    layer.to(dtype)
    eps = torch.finfo(dtype).eps  # (the half adjacency values are rounded: an ulp or two)
    for inp in (xs, xs.to_sparse(), xs.to_sparse_csr()):
        torch.testing.assert_close(layer(inp, ei), want, rtol=4 * eps, atol=4 * eps * float(want.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("make", [lambda: GCNConv(4, 3), lambda: GATConv(4, 3, heads=2)], ids=["GCNConv", "GATConv"])
def test_unsupported_float_dtypes_raise_type_error_first(make, dtype):
    ei, n = make_graph()
    layer = make().to(dtype)
    name = str(dtype).replace("torch.", "")
    with pytest.raises(TypeError, match=f"x is {name}; supported dtypes are float32, float64, bfloat16, float16"):
        layer(torch.randn(n, 4).to(dtype), ei)
    xs = CSR.from_coo(torch.tensor([0, 3]), torch.tensor([1, 2]), torch.ones(2).to(dtype), (n, 4))
    with pytest.raises(TypeError, match=f"x is {name}"):
        layer(xs, ei)


# ---------------------------------------------------- 14: torch.sparse features
def _sparse_x(n, m, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, m, generator=g, dtype=dtype) * (torch.rand(n, m, generator=g) < 0.3)
    x[0] = 0.0  # an empty row
    return x


LAYOUTS = {
    "coo": lambda x: x.to_sparse(),
    "coo-uncoalesced": lambda x: torch.sparse_coo_tensor(
        torch.cat([x.to_sparse().indices()] * 2, 1), torch.cat([x.to_sparse().values() / 2] * 2), x.shape, check_invariants=True),
    "csr": lambda x: x.to_sparse_csr(),
    "csc": lambda x: x.to_sparse_csc(),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("make_pyg", [lambda: PygGCNConv(6, 4), lambda: PygGATConv(6, 3, heads=2)], ids=["GCNConv", "GATConv"])
def test_torch_sparse_features_match_pyg_dense(layout, make_pyg):
    ei, n = make_graph()
    torch.manual_seed(0)
    ref = make_pyg().to(F64)
    with torch.no_grad():
        ref.bias.normal_()
    ours = corgnn.optimize(copy.deepcopy(ref))
    x = _sparse_x(n, 6)
    xs = LAYOUTS[layout](x)
    want = outputs_and_grads(ref, x, ei)
    assert_same(outputs_and_grads(ours, xs, ei), want)
    if isinstance(ours, GCNConv):
        assert ours.last_plan.scheme.name == "transform-first+fused"  # the sparse-feature path
        forced = GCNConv(6, 4, scheme="propagate-first+split+cache").to(F64)  # cannot take sparse X: densified
        forced.load_state_dict(ref.state_dict())
        assert_same(outputs_and_grads(forced, xs, ei), want)
    # a sparse x that needs a gradient gets PyG's gradient (at its entries)
    xg = x.to_sparse().requires_grad_(True)
    xd = x.clone().requires_grad_(True)
    ref(xd, ei).square().sum().backward()
    ours(xg, ei).square().sum().backward()
    mask = x != 0
    torch.testing.assert_close(xg.grad.to_dense()[mask], xd.grad[mask], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("make", [lambda: GCN(6, 8, 3, dropout=0.5), lambda: GAT(6, 4, 3, heads=2, dropout=0.5)], ids=["GCN", "GAT"])
def test_models_take_torch_sparse_features(make):
    ei, n = make_graph()
    x = _sparse_x(n, 6)
    torch.manual_seed(0)
    model = make().to(F64).eval()
    want = model(x, ei)
    for layout in ("coo", "csr"):
        torch.testing.assert_close(model(LAYOUTS[layout](x), ei), want, rtol=1e-10, atol=1e-10)
    model.train()
    torch.manual_seed(1)
    out = model(x.to_sparse(), ei)
    out.sum().backward()
    assert out.shape == (n, 3) and torch.isfinite(out).all()


def test_bad_torch_sparse_features_raise():
    ei, n = make_graph()
    layer = GCNConv(6, 4).to(F64)
    x = _sparse_x(n, 6)
    with pytest.raises(ValueError, match="dense dim"):
        layer(x.to_sparse(1), ei)  # hybrid: rows sparse, values (6,) dense
    with pytest.raises(ValueError, match="sparse x must be"):
        layer(_sparse_x(n, 5).to_sparse(), ei)  # wrong width
    with pytest.raises(TypeError, match="float32"):
        layer(x.float().to_sparse(), ei)  # dtype mismatch with the parameters
    nan = x.clone()
    nan[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        layer(nan.to_sparse(), ei)
    from corgnn.interop import from_torch_sparse

    for make in LAYOUTS.values():
        A = from_torch_sparse(make(x))
        assert isinstance(A, CSR) and A.shape == x.shape
        torch.testing.assert_close(A.to_dense(), x)
    with pytest.raises(TypeError, match="torch.sparse"):
        from_torch_sparse(x)
