"""SAGEConv, GraphConv, GINConv, SGConv and APPNP against PyG's layers (outputs and
every gradient, float64), gradcheck, Cora, plans, caches, bad input, optimize()."""

import copy
import warnings

import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric.nn.models import GIN, MLP, GraphSAGE

import corgnn.nn as cnn
from corgnn import Graph
from corgnn.cost.propagate import plan_propagation
from corgnn.interop import optimize
from corgnn.nn import UnsupportedOption
from conftest import FAST_GRADCHECK, leaves_graph, make_graph

D = torch.float64


def pair(pyg_cls, ours_cls, *args, seed=0, **kw):
    """The PyG layer and corgnn's, built from the same seed (same initial values)."""
    torch.manual_seed(seed)
    ref = pyg_cls(*args, **kw).to(D)
    torch.manual_seed(seed)
    ours = ours_cls(*args, **kw).to(D)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in ours.named_parameters()]
    for a, b in zip(ref.parameters(), ours.parameters()):
        assert torch.equal(a, b)
    return ref, ours


def check_same(ref, ours, x, ei, *extra, calls=1, **kw):
    """Outputs and gradients (x, extra tensors needing one, every parameter) equal."""
    for _ in range(calls):
        o1, o2 = ref(x, ei, *extra, **kw), ours(x, ei, *extra, **kw)
        torch.testing.assert_close(o2, o1, rtol=1e-10, atol=1e-10)
        g = torch.randn_like(o1)
        ins = [t for t in (x, *extra) if isinstance(t, torch.Tensor) and t.requires_grad]
        g1 = torch.autograd.grad(o1, ins + list(ref.parameters()), g, allow_unused=True)
        g2 = torch.autograd.grad(o2, ins + list(ours.parameters()), g, allow_unused=True)
        assert len(g1) == len(g2) > 0
        for a, b in zip(g2, g1):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("aggr", ["mean", "sum"])
@pytest.mark.parametrize("opts", [{}, {"normalize": True}, {"root_weight": False}, {"project": True}, {"bias": False}])
@pytest.mark.parametrize("scheme", ["auto", "transform-first+fused", "propagate-first+split+cache"])
def test_sage_matches_pyg(aggr, opts, scheme):
    ei, n = make_graph()
    ref, ours = pair(pyg.SAGEConv, cnn.SAGEConv, 6, 4, aggr=aggr, **opts)
    ours.scheme = scheme
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=True), ei)
    if scheme != "auto":
        assert ours.last_plan.scheme.name == scheme


@pytest.mark.parametrize("aggr", ["add", "mean"])
@pytest.mark.parametrize("scheme", ["auto", "transform-first+split", "propagate-first+fused", "propagate-first+split+cache"])
@pytest.mark.parametrize("x_grad", [True, False])
def test_graphconv_matches_pyg_with_edge_weight_grad(aggr, scheme, x_grad):
    ei, n = make_graph()
    ref, ours = pair(pyg.GraphConv, cnn.GraphConv, 5, 7, aggr=aggr)
    ours.scheme = scheme
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True)
    check_same(ref, ours, torch.randn(n, 5, dtype=D, requires_grad=x_grad), ei, ew)


def _mlp(kind):
    if kind == "sequential":
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    if kind == "mlp":
        return MLP([6, 5, 3])
    if kind == "linear":
        return torch.nn.Linear(6, 3)
    return torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(6, 3))  # no leading Linear


@pytest.mark.parametrize("kind", ["sequential", "mlp", "linear", "no-linear"])
@pytest.mark.parametrize("train_eps", [False, True])
@pytest.mark.parametrize("scheme", ["auto", "transform-first+split", "propagate-first+split+cache"])
def test_gin_matches_pyg(kind, train_eps, scheme):
    ei, n = make_graph()
    torch.manual_seed(0)
    ref = pyg.GINConv(_mlp(kind), eps=0.25, train_eps=train_eps).to(D)  # (both reset nn on construction)
    torch.manual_seed(0)
    ours = cnn.GINConv(_mlp(kind), eps=0.25, train_eps=train_eps, scheme=scheme).to(D)
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=True), ei, calls=2)
    assert (ours.last_plan is None) == (kind == "no-linear")
    assert not any(isinstance(m, torch.nn.Identity) for m in ours.nn.modules())  # the Linear is back after the call


@pytest.mark.parametrize("hooked", ["none", "sequential", "global"])
def test_gin_runs_the_rest_of_nn_with_its_hooks(hooked):
    """The modules after nn's first Linear run as nn's forward runs them: directly for
    a hook-free Sequential, through nn's call (its hooks, torch's global hooks) else;
    outputs and gradients as PyG's either way."""
    ei, n = make_graph()
    torch.manual_seed(0)
    ref = pyg.GINConv(_mlp("sequential"), eps=0.25).to(D)
    torch.manual_seed(0)
    ours = cnn.GINConv(_mlp("sequential"), eps=0.25).to(D)
    seen = []
    handles = []
    for layer in (ref, ours):
        if hooked == "sequential":
            handles.append(layer.nn.register_forward_hook(lambda m, i, o: seen.append(o.shape)))
    if hooked == "global":
        handles.append(torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: seen.append(type(m).__name__)))
    try:
        check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=True), ei)
    finally:
        for h in handles:
            h.remove()
    if hooked == "sequential":
        assert seen == [(n, 3), (n, 3)]  # (PyG's nn, then ours)
    elif hooked == "global":
        assert seen.count("Sequential") == 2 and seen.count("ReLU") == 2


def test_gin_with_a_parametrized_first_linear_matches_pyg():
    """The layers read their Linears' weights from the parameter dict (no
    ``Module.__getattr__`` per read); a ``torch.nn.utils.parametrize`` weight (here
    weight norm) is a property there, read as such, with its gradients."""
    from torch.nn.utils.parametrizations import weight_norm

    ei, n = make_graph()
    torch.manual_seed(0)
    ref = pyg.GINConv(torch.nn.Sequential(weight_norm(torch.nn.Linear(6, 5)), torch.nn.ReLU(), torch.nn.Linear(5, 3))).to(D)
    ours = cnn.GINConv(copy.deepcopy(ref.nn)).to(D)
    ours.nn.load_state_dict(ref.nn.state_dict())
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=True), ei)
    assert "weight" not in ours.nn[0]._parameters  # (the property path was taken)


@pytest.mark.parametrize("K", [0, 2])
@pytest.mark.parametrize("scheme", ["auto", "transform-first", "propagate-first"])
@pytest.mark.parametrize("x_grad,weights", [(True, False), (False, False), (False, True)])
def test_sgconv_matches_pyg(K, scheme, x_grad, weights):
    ei, n = make_graph()
    ref, ours = pair(pyg.SGConv, cnn.SGConv, 6, 3, K=K)
    ours.scheme = scheme
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True) if weights else None
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=x_grad), ei, ew, calls=2)  # 2nd call: kept S^K X
    if scheme != "auto":
        assert ours.last_plan.order == scheme


def test_sgconv_cached_true_keeps_first_result_as_pyg():
    ei, n = make_graph()
    ref, ours = pair(pyg.SGConv, cnn.SGConv, 6, 3, K=2, cached=True)
    for _ in range(2):  # the second x is ignored by both (PyG's transductive cache)
        check_same(ref, ours, torch.randn(n, 6, dtype=D), ei)
    assert ours.last_plan.cached


@pytest.mark.parametrize("K", [1, 4])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("x_grad,weights", [(True, False), (True, True), (False, True)])
def test_appnp_matches_pyg(K, normalize, x_grad, weights):
    ei, n = make_graph()
    ref, ours = pyg.APPNP(K, 0.2, normalize=normalize), cnn.APPNP(K, 0.2, normalize=normalize)
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True) if weights else None
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=x_grad), ei, ew)


def test_kept_propagation_follows_the_input():
    """The cross-call cache of a constant input is used, and dropped when x changes in place."""
    ei, n = make_graph()
    x = torch.randn(n, 6, dtype=D)
    appnp, ref = cnn.APPNP(3, 0.1), pyg.APPNP(3, 0.1)
    sgc_ref, sgc = pair(pyg.SGConv, cnn.SGConv, 6, 3, K=2)
    for _ in range(2):
        torch.testing.assert_close(appnp(x, ei), ref(x, ei))
        torch.testing.assert_close(sgc(x, ei), sgc_ref(x, ei))
        assert appnp.last_plan.cached and sgc.last_plan.name == "propagate-first+cache"
        x.mul_(2.0)  # in place: a new version, the kept result must not be reused


SCHEMES = ["transform-first+fused", "transform-first+split", "propagate-first+fused", "propagate-first+split", "propagate-first+split+cache"]


@pytest.mark.parametrize("scheme", ["auto"] + SCHEMES)
@pytest.mark.parametrize("opts", [{"aggr": "mean"}, {"aggr": "sum", "bias": False}, {"aggr": "mean", "root_weight": False}, {"aggr": "mean", "project": True}])
@pytest.mark.parametrize("x_grad", [True, False])
def test_sage_on_the_rows_with_entries_matches_pyg(scheme, opts, x_grad):
    """Most nodes without incoming edges: the aggregated term runs on the rows with
    entries (``target_rows``), outputs and every gradient as PyG's."""
    ei, n = leaves_graph()
    ref, ours = pair(pyg.SAGEConv, cnn.SAGEConv, 6, 4, **opts)
    ours.scheme = scheme
    check_same(ref, ours, torch.randn(n, 6, dtype=D, requires_grad=x_grad), ei, calls=2)
    assert ours.last_plan.rows == 8 and ours.target_rows(ours.adjacency(Graph(ei, None, n), D))[0].tolist() == list(range(8))


@pytest.mark.parametrize("scheme", ["auto"] + SCHEMES)
@pytest.mark.parametrize("aggr", ["add", "mean"])
def test_graphconv_on_the_rows_with_entries_matches_pyg_with_edge_weight_grad(scheme, aggr):
    ei, n = leaves_graph()
    ref, ours = pair(pyg.GraphConv, cnn.GraphConv, 5, 7, aggr=aggr)
    ours.scheme = scheme
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True)
    check_same(ref, ours, torch.randn(n, 5, dtype=D, requires_grad=True), ei, ew)
    assert ours.last_plan.rows == 8


@pytest.mark.parametrize("cls", ["SAGEConv", "GraphConv"])
def test_rows_with_entries_with_sparse_features_match_pyg(cls):
    """Bag-of-words features (used as a CSR: SpMM transforms) on a graph with few
    targets: the root term over the sparse features takes the aggregated rows in place."""
    ei, n = leaves_graph(n=400, targets=60, q=600)
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(n, 300, generator=g) < 0.01).to(D) * torch.rand(n, 300, generator=g, dtype=D)
    ref, ours = pair(getattr(pyg, cls), getattr(cnn, cls), 300, 16)
    check_same(ref, ours, x, ei, calls=2)
    assert ours.last_plan.rows == 60 and ours.last_plan.x_nnz == int((x != 0).sum())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rows_with_entries_gradcheck(scheme):
    ei, n = leaves_graph(n=12, targets=3, q=10)
    x = torch.randn(n, 3, dtype=D, requires_grad=True)
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True)
    for layer, extra in ((cnn.SAGEConv(3, 2, scheme=scheme).to(D), ()), (cnn.GraphConv(3, 2, aggr="mean", scheme=scheme).to(D), (ew,))):
        params = list(layer.parameters())

        def f(x, *ts, layer=layer, k=len(extra)):
            return layer(x, ei, *ts[:k])

        assert torch.autograd.gradcheck(f, (x, *extra, *params), fast_mode=FAST_GRADCHECK), type(layer).__name__
        assert layer.last_plan.rows == 4  # (targets 0-2 and the extra edges into 2 and 3)


def test_rows_with_entries_only_below_the_fraction():
    """A graph where most nodes have incoming edges runs on every row (no scatter)."""
    ei, n = make_graph()
    layer = cnn.SAGEConv(4, 2)
    layer(torch.randn(n, 4), ei)
    assert layer.last_plan.rows is None
    ei, n = leaves_graph(n=10, targets=6)  # 6 of 10 rows > TARGET_ROWS_MAX_FRACTION
    layer(torch.randn(n, 4), ei)
    assert layer.last_plan.rows is None
    layer(torch.randn(n, 4), ei[:, :0])  # no edges: nothing to aggregate, the bias alone
    assert layer.last_plan.rows is None


def test_gradcheck_float64():
    ei, n = make_graph(n=8, q=16)
    # NOTE: no self-loops: PyG's add_remaining_self_loops keeps one of two duplicate
    # loops' weights (a scatter overwrite), whose edge-weight gradient gradcheck rejects,
    # for PyG's own SGConv/APPNP too (corgnn matches PyG there: test_sgconv_matches_pyg)
    ei = ei[:, ei[0] != ei[1]]
    x = torch.randn(n, 3, dtype=D, requires_grad=True)
    ew = torch.rand(ei.size(1), dtype=D, requires_grad=True)
    layers = [
        (cnn.SAGEConv(3, 2, project=True).to(D), ()), (cnn.SAGEConv(3, 2, aggr="sum", normalize=True).to(D), ()),
        (cnn.GraphConv(3, 2, aggr="mean").to(D), (ew,)), (cnn.SGConv(3, 2, K=2, scheme="transform-first").to(D), (ew,)),
        (cnn.APPNP(2, 0.3), (ew,)), (cnn.GINConv(MLP([3, 4, 2]), train_eps=True).to(D), ()),
    ]
    for layer, extra in layers:
        params = [p for p in layer.parameters()]

        def f(x, *ts, layer=layer, k=len(extra)):
            return layer(x, ei, *ts[:k])

        assert torch.autograd.gradcheck(f, (x, *extra, *params)), type(layer).__name__


@pytest.mark.parametrize("name", ["sage", "graphconv", "gin", "sgc", "appnp"])
def test_cora_float32_matches_pyg(cora, name):
    x, ei, m = cora.x, cora.edge_index, cora.x.size(1)
    torch.manual_seed(0)
    ref = {
        "sage": lambda: pyg.SAGEConv(m, 16), "graphconv": lambda: pyg.GraphConv(m, 16),
        "gin": lambda: pyg.GINConv(MLP([m, 16, 16])), "sgc": lambda: pyg.SGConv(m, 7, K=2), "appnp": lambda: pyg.APPNP(10, 0.1),
    }[name]()
    ours = optimize(copy.deepcopy(ref))
    assert type(ours).__module__.startswith("corgnn")
    xin = (x[:, :64] if name == "appnp" else x).clone().requires_grad_(name == "appnp")  # (APPNP: 64 columns, K=10)
    for _ in range(2):
        o1, o2 = ref(xin, ei), ours(xin, ei)
        torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-5)
        if name != "appnp":
            g1 = torch.autograd.grad(o1.square().sum(), list(ref.parameters()))
            g2 = torch.autograd.grad(o2.square().sum(), list(ours.parameters()))
            scale = max(float(b.abs().max()) for b in g1)  # float32 sums in another order (GIN: an exact 0 is ~1e-3)
            for a, b in zip(g2, g1):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6 * scale)


@pytest.mark.parametrize("model", ["sage", "gin"])
def test_pyg_models_train_identically_after_optimize(model):
    ei, n = make_graph(n=60, q=240)
    torch.manual_seed(0)
    x, y = torch.randn(n, 8, dtype=D), torch.randint(0, 3, (n,))
    ref = (GraphSAGE if model == "sage" else GIN)(8, 16, 2, 3).to(D)
    ours = optimize(copy.deepcopy(ref))
    assert sum(type(m).__module__.startswith("corgnn") for m in ours.modules()) == 2
    for net in (ref, ours):
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x, ei), y).backward()
            opt.step()
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_optimize_keeps_parameters_and_warns_on_unsupported():
    gin = pyg.GINConv(torch.nn.Sequential(torch.nn.Linear(3, 3)), train_eps=True)
    sage = pyg.SAGEConv(3, 2)
    model = torch.nn.ModuleList([gin, sage, pyg.SAGEConv(3, 2, aggr="max"), pyg.GraphConv((3, 4), 2)])
    eps, w = gin.eps, sage.lin_l.weight
    with pytest.warns(UserWarning) as rec:
        optimize(model)
    msgs = " ".join(str(r.message) for r in rec)
    assert "aggr='max'" in msgs and "bipartite" in msgs
    assert isinstance(model[0], cnn.GINConv) and model[0].eps is eps and model[0].nn is gin.nn
    assert isinstance(model[1], cnn.SAGEConv) and model[1].lin_l.weight is w
    assert type(model[2]) is pyg.SAGEConv and type(model[3]) is pyg.GraphConv


def test_plans_follow_the_sizes():
    # SGC, x needs a gradient: transform-first when k << m, propagate-first when k >> m
    assert plan_propagation(1000, 10000, 512, 8, 2, True).order == "transform-first"
    assert plan_propagation(1000, 10000, 8, 512, 2, True).order == "propagate-first"
    # constant input: propagate-first keeps S^K X, no SpMM left, whatever the widths
    p = plan_propagation(1000, 10000, 512, 8, 2, False, constant_input=True)
    assert p.cached and p.name == "propagate-first+cache"
    assert "propagate-first" in p.table() and "choice:" in p.table()
    assert plan_propagation(10, 20, 4, None, 3, True, layer="APPNP").costs[0].spmm_columns == (4,) * 6
    with pytest.raises(ValueError, match="scheme"):
        plan_propagation(10, 20, 4, None, 3, True, scheme="transform-first")


def test_bad_input_raises_before_work():
    ei, n = make_graph()
    with pytest.raises(UnsupportedOption, match="aggr"):
        cnn.SAGEConv(4, 2, aggr="max")
    with pytest.raises(UnsupportedOption, match="bipartite"):
        cnn.GraphConv((4, 5), 2)
    with pytest.raises(ValueError, match="K"):
        cnn.SGConv(4, 2, K=-1)
    with pytest.raises(ValueError, match="scheme"):
        cnn.SGConv(4, 2, scheme="cached")
    with pytest.raises(ValueError, match="alpha"):
        cnn.APPNP(2, 1.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        cnn.GINConv(torch.nn.Linear(4, 2), bogus=1)
    for layer in (cnn.SAGEConv(4, 2), cnn.GraphConv(4, 2), cnn.SGConv(4, 2), cnn.APPNP(2, 0.1), cnn.GINConv(torch.nn.Linear(4, 2))):
        if not isinstance(layer, cnn.APPNP):  # (APPNP takes any width)
            with pytest.raises(ValueError, match="columns"):
                layer(torch.randn(n, 3), ei)
        with pytest.raises(ValueError, match="rows"):
            layer(torch.randn(n - 1, 4), Graph(ei, num_nodes=n))
        with pytest.raises(ValueError, match="edge_index"):
            layer(torch.randn(n, 4), torch.tensor([[0, n + 5], [1, 2]]))
        bad = torch.randn(n, 4)
        bad[0, 0] = float("nan")
        with pytest.raises(ValueError, match="x"):
            layer(bad, ei)
        with pytest.raises(TypeError, match="x"):
            layer(torch.randint(0, 2, (n, 4)), ei)


def test_bench_layers_variants_compute_the_same_model():
    """``corgnn bench layers``: the corgnn variant is PyG's model after optimize (same output)."""
    from corgnn.bench.baselines import LAYER_MODELS, GraphData, build
    from corgnn.datasets import synthetic

    g = GraphData.from_pyg(synthetic("Cora", seed=1, nodes=60, edges=240, features=8))
    for model in LAYER_MODELS:
        torch.manual_seed(0)
        ref, inputs = build("pyg-coo", model, g, 8)
        torch.manual_seed(0)
        ours, _ = build("corgnn", model, g, 8)
        assert any(type(m).__module__.startswith("corgnn") for m in ours.modules()), model
        torch.testing.assert_close(ours(*inputs), ref(*inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.large_graph
def test_cli_train_sgc_and_explain_model(tmp_path, capsys):
    import json

    from corgnn.cli import main

    out = tmp_path / "s.json"
    assert main(["train", "--model", "sgc", "--no-progress", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "sgc" and res["schemes"] == ["propagate-first+cache"]
    assert 0.78 <= res["test_acc"] <= 0.83, res  # SGC paper, Cora: 81.0
    assert main(["explain", "--dataset", "Cora", "--model", "sage"]) == 0
    text = capsys.readouterr().out
    assert text.count("choice:") == 2 and "SAGEConv" in text


def test_any_parameter_requires_grad_matches_the_parameters_walk():
    """The plans' training flag reads the parameter dicts directly; it answers as
    ``any(p.requires_grad for p in module.parameters())`` for nested, frozen, shared
    and None-valued parameters and modules."""
    from corgnn.nn.base import any_parameter_requires_grad

    inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2, bias=False))
    outer = torch.nn.ModuleDict({"a": inner, "b": torch.nn.Linear(2, 2), "shared": inner})
    outer.register_parameter("none", None)
    outer.register_module("empty", None)
    cases = []
    for frozen in ([], ["b"], ["b", "a.0"], ["b", "a.0", "a.2"]):
        for p in outer.parameters():
            p.requires_grad_(True)
        for name in frozen:
            for p in outer.get_submodule(name).parameters():
                p.requires_grad_(False)
        cases.append(any_parameter_requires_grad(outer))
        assert cases[-1] == any(p.requires_grad for p in outer.parameters())
    assert cases == [True, True, True, False]
