"""Cross-call cache of A'X for constant input features (issue 12, lever 1):
GCNConv(cache_propagation=True), the reuse scheme of the plan, its invalidation."""

import copy
import pickle

import pytest
import torch
from torch_geometric.nn import GCNConv as PygGCNConv

from corgnn.cli import main
from corgnn.cost.gcn import REUSE_SCHEME, parse_scheme, plan_gcn
from corgnn.functional.gcn import gcn_conv
from corgnn.graph import Graph
from corgnn.nn import GCN, GCNConv
from conftest import make_graph

REUSE = REUSE_SCHEME.name


def pair(m, k, dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    ref = PygGCNConv(m, k).to(dtype)
    with torch.no_grad():
        ref.bias.normal_()
    kw.setdefault("cache_propagation", True)  # the mechanism; the "auto" memory rule: test_auto_keeps_only_without_extra_memory
    ours = GCNConv(m, k, **kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def step(layer, x, ei, ew, g):
    """One forward + backward; returns (out, [x.grad?, dweight, dbias])."""
    layer.zero_grad()
    x.grad = None
    out = layer(x, ei, ew)
    out.backward(g)
    grads = [x.grad.clone()] if x.requires_grad else []
    return out.detach(), grads + [layer.lin.weight.grad.clone(), layer.bias.grad.clone()]


def assert_same(ours, ref, x, ei, ew=None, k=4):
    g = torch.randn(x.size(0), k, dtype=x.dtype)
    o2, g2 = step(ours, x, ei, ew, g)
    o1, g1 = step(ref, x, ei, ew, g)
    torch.testing.assert_close(o2, o1, rtol=1e-11, atol=1e-11)
    assert len(g1) == len(g2)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def scheme(layer) -> str:
    return layer.last_plan.scheme.name


@pytest.mark.parametrize("m,k", [(6, 4), (3, 8)])
def test_second_call_reuses_and_matches_pyg(m, k):
    ei, n = make_graph()
    ref, ours = pair(m, k)
    x = torch.randn(n, m, dtype=torch.float64)
    used = []
    for _ in range(3):  # epoch 1 remembers x, epoch 2 computes A'X, epoch 3 reads it
        assert_same(ours, ref, x, ei, k=k)
        used.append(scheme(ours))
        with torch.no_grad():  # an optimiser step: new weights, same constant x
            ours.lin.weight.add_(0.1)
            ref.lin.weight.add_(0.1)
    assert used[0] != REUSE and used[1:] == [REUSE, REUSE]
    assert ours.propagation_cache_nbytes() == n * m * 8


def test_reuse_in_inference_and_weighted_graph():
    ei, n = make_graph()
    ew = torch.rand(ei.size(1), dtype=torch.float64)
    ref, ours = pair(5, 3)
    x = torch.randn(n, 5, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(2):
            out = ours(x, ei, ew)
    assert scheme(ours) == REUSE
    torch.testing.assert_close(out, ref(x, ei, ew), rtol=1e-12, atol=1e-12)


def test_gradcheck_reuse_scheme_float64():
    ei, n = make_graph()
    A = Graph(ei, num_nodes=n).gcn_adjacency(dtype=torch.float64)
    from corgnn.sparse import spmm

    ax = spmm(A, torch.randn(n, 4, dtype=torch.float64))
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, b: gcn_conv(ax, w, b, A, REUSE_SCHEME), (w, b))
    assert torch.autograd.gradgradcheck(lambda w, b: gcn_conv(ax, w, b, A, REUSE_SCHEME), (w, b))


def test_reuse_scheme_refuses_gradients_to_x():
    ei, n = make_graph()
    A = Graph(ei, num_nodes=n).gcn_adjacency(dtype=torch.float64)
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="constant features"):
        gcn_conv(x, torch.randn(3, 4, dtype=torch.float64), None, A, REUSE_SCHEME)


def warm(layer, x, ei, ew=None):
    for _ in range(2):
        layer(x, ei, ew).sum().backward()
    assert scheme(layer) == REUSE


def _in_place(x, ei, ew):
    x.mul_(2.0)
    return x, ei, ew


INVALIDATORS = {
    "in-place edit of x": _in_place,
    "new x, equal values": lambda x, ei, ew: (x.clone(), ei, ew),
    "new graph": lambda x, ei, ew: (x, ei[:, : ei.size(1) // 2].clone(), None),
    "in-place edit of edge_weight": lambda x, ei, ew: (x, ei, ew.mul_(3.0)),  # a new Graph, a new A'
}


@pytest.mark.parametrize("change", sorted(INVALIDATORS))
def test_invalidation(change):
    ei, n = make_graph()
    ref, ours = pair(6, 4)
    x = torch.randn(n, 6, dtype=torch.float64)
    ew = torch.rand(ei.size(1), dtype=torch.float64)
    warm(ours, x, ei, ew)
    x2, ei2, ew2 = INVALIDATORS[change](x, ei, ew)
    assert_same(ours, ref, x2, ei2, ew2)  # a stale A'X would give the old output
    assert scheme(ours) != REUSE
    assert_same(ours, ref, x2, ei2, ew2)  # the new key is kept from its second call
    assert scheme(ours) == REUSE


def test_dtype_change_invalidates():
    ei, n = make_graph()
    ref, ours = pair(6, 4)
    x = torch.randn(n, 6, dtype=torch.float64)
    warm(ours, x, ei)
    ours.float()
    ref.float()
    out = ours(x.float(), ei)
    assert out.dtype == torch.float32 and scheme(ours) != REUSE
    torch.testing.assert_close(out, ref(x.float(), ei), rtol=1e-5, atol=1e-5)


def test_x_requiring_grad_never_reuses():
    ei, n = make_graph()
    ref, ours = pair(6, 4)
    x = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        assert_same(ours, ref, x, ei)  # x.grad compared too
        assert scheme(ours) != REUSE
    assert ours.propagation_cache_nbytes() == 0


def test_edge_weight_requiring_grad_never_reuses():
    ei, n = make_graph()
    ref, ours = pair(6, 4)
    x = torch.randn(n, 6, dtype=torch.float64)
    ew = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    for _ in range(3):
        out = ours(x, ei, ew)
        assert scheme(ours) != REUSE
    (gw,) = torch.autograd.grad(out.sum(), ew)
    (gw_ref,) = torch.autograd.grad(ref(x, ei, ew).sum(), ew)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-11, atol=1e-11)


def test_switched_off_and_forced_scheme():
    ei, n = make_graph()
    x = torch.randn(n, 6, dtype=torch.float64)
    off = GCNConv(6, 4, cache_propagation=False).double()
    forced = GCNConv(6, 4, scheme="propagate-first+split+cache").double()
    for _ in range(3):
        off(x, ei).sum().backward()
        forced(x, ei).sum().backward()
    assert scheme(off) != REUSE and off.propagation_cache_nbytes() == 0
    assert scheme(forced) == "propagate-first+split+cache"
    on = GCNConv(6, 4).double()
    warm(on, x, ei)
    on.cache_propagation = False  # frees the kept A'X at the next call
    on(x, ei)
    assert scheme(on) != REUSE and on.propagation_cache_nbytes() == 0


def test_input_dropout_never_caches():
    ei, n = make_graph()
    x = torch.randn(n, 6, dtype=torch.float64)
    model = GCN(6, 5, 3, dropout=0.5).double()
    for _ in range(3):
        model(x, ei).sum().backward()
    assert model.schemes()[0] != REUSE and model.conv1.propagation_cache_nbytes() == 0
    model.eval()  # no dropout in eval: the constant x is reused from its second call
    model.conv1.cache_propagation = True  # (inference keeps n k transients: "auto" would not keep n m)
    with torch.no_grad():
        for _ in range(2):
            model(x, ei)
    assert model.schemes()[0] == REUSE


def test_model_without_input_dropout_matches_uncached():
    ei, n = make_graph()
    x = torch.randn(n, 6, dtype=torch.float64)
    torch.manual_seed(1)
    a = GCN(6, 5, 3).double()
    b = copy.deepcopy(a)
    b.conv1.cache_propagation = b.conv2.cache_propagation = False
    for _ in range(3):
        for mdl in (a, b):
            mdl.zero_grad()
            mdl(x, ei).square().sum().backward()
    assert a.schemes()[0] == REUSE and b.schemes()[0] != REUSE
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-11, atol=1e-11)


def test_copies_start_empty():
    ei, n = make_graph()
    layer = GCNConv(6, 4).double()
    x = torch.randn(n, 6, dtype=torch.float64)
    warm(layer, x, ei)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert twin.propagation_cache_nbytes() == 0
        twin(x, ei)
        assert scheme(twin) != REUSE


def test_plan_reuse_candidate():
    n, q = 169343, 1335586
    dense = plan_gcn(n, q, 128, 256, False, reuse=True)
    assert dense.scheme == REUSE_SCHEME and "kept across calls" in dense.reason
    cost = next(c for c in dense.costs if c.scheme.reuse)
    assert cost.spmm_columns == () and cost.kept == n * 128
    assert plan_gcn(n, q, 128, 256, False).scheme != REUSE_SCHEME  # not a candidate without reuse
    assert not any(c.scheme.reuse for c in plan_gcn(n, q, 128, 256, True, reuse=True).costs)  # X needs a gradient
    assert plan_gcn(n, q, 128, 256, False, reuse=True, scheme="transform-first+fused").scheme.name == "transform-first+fused"
    # Cora's bag-of-words (49216 non-zeros): transform-first over the sparse X beats a dense A'X
    cora = plan_gcn(2708, 13264, 1433, 16, False, reuse=True, x_nnz=49216)
    assert cora.scheme.name == "transform-first+fused"
    assert plan_gcn(2708, 13264, 1433, 16, False, reuse=True, reuse_extra_memory=True).scheme == REUSE_SCHEME  # the same X dense
    with pytest.raises(ValueError, match="unknown GCN scheme"):
        parse_scheme(REUSE)  # not forcible: it needs A'X kept by the layer


def test_explain_shows_reuse(capsys):
    assert main(["explain", "--n", "1000", "--q", "10000", "--m", "64", "--k", "32", "--constant-input"]) == 0
    assert f"choice: {REUSE}" in capsys.readouterr().out
    assert main(["explain", "--n", "1000", "--q", "10000", "--m", "64", "--k", "32"]) == 0
    assert REUSE not in capsys.readouterr().out


def test_auto_keeps_only_without_extra_memory():
    """Default ``cache_propagation="auto"``: A'X is kept only where its n m values do
    not exceed the transients of the step it replaces (no higher peak memory)."""
    n, q = 169343, 1335586  # OGB-Arxiv, m = 128
    small = plan_gcn(n, q, 128, 16, False, reuse=True)  # transform-first: 2 n k = 32 n < 128 n
    assert small.scheme != REUSE_SCHEME and all(c.kept == 0 for c in small.costs)
    assert plan_gcn(n, q, 128, 16, False, reuse=True, reuse_extra_memory=True).scheme == REUSE_SCHEME
    assert plan_gcn(n, q, 128, 256, False, reuse=True).scheme == REUSE_SCHEME  # replaces the A'X held anyway
    ei, nodes = make_graph(n=3000, q=12000)  # large enough that transform-first wins (k = 2 < m/2)
    x = torch.randn(nodes, 64)
    auto, always = GCNConv(64, 2), GCNConv(64, 2, cache_propagation=True)
    for _ in range(3):
        auto(x, ei).sum().backward()
        always(x, ei).sum().backward()
    assert auto.last_plan.scheme != REUSE_SCHEME and auto.propagation_cache_nbytes() == 0
    assert always.last_plan.scheme == REUSE_SCHEME and always.propagation_cache_nbytes() == nodes * 64 * 4
    with pytest.raises(ValueError, match="cache_propagation"):
        GCNConv(8, 2, cache_propagation="yes")
