"""Drop-in fidelity: what ``optimize()`` keeps (parameter objects and their state,
shared layers, lazy layers), cache keys, pickling, empty graphs, coalescing
patterns, progress output in logs. Each test fails on the code before its fix."""

import contextlib
import copy
import io
import re
import warnings

import pytest
import torch
from torch_geometric.nn import GATConv as PygGATConv
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.nn import GAT, GCN, GATConv, GCNConv
from corgnn.sparse import COO, CSR, FORMAT_NAMES, edge_softmax, use_backend
from conftest import make_graph

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
