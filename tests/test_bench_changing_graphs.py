"""``corgnn bench changing-graphs``: the quick preset's grid at tiny sizes writes every
case for both variants (and the no-aggregation bound of the mini-batch cases), the two
variants compute the same outputs, and the output
check and failure handling work. No timing assertions."""

from __future__ import annotations

import math

import pytest
import torch

import corgnn.interop
from corgnn.bench import report
from corgnn.bench.experiments import changing_graphs as cg
from corgnn.bench.harness import Settings
from corgnn.bench.spec import CellSpec
from corgnn.cli import main

CASES = {"gcn-pool", "gin-pool", "sage-pool", "gcn-pool-eval", "gin-pool-eval", "sage-pool-eval", "gcn-sampled", "sage-sampled", "gcn-infer", "gcn-explain", "first-call"}


def test_quick_grid_at_tiny_size(tmp_path):
    out = tmp_path / "cg"
    args = ["bench", "changing-graphs", "--quick", "--sizes", "6", "--min-reps", "1", "--max-reps", "1", "--budget-s", "0"]
    assert main(args + ["--no-progress", "--threads", "1", "--out", str(out)]) == 0
    rows, meta = report.read_results(out)
    assert meta["preset"] == "quick" and meta["experiments"] == [cg.NAME]
    bad = [(r["model"], r["variant"], r["reason"]) for r in rows if r["status"] != "ok"]
    assert not bad
    steady = [r for r in rows if r["model"] != "first-call"]
    # every case of the quick grid (PubMed and the Arxiv stand-in sampled), both variants, one total row each
    got = {(r["model"], r["dataset"].split(" (")[0], r["variant"]) for r in steady}
    want = {(m, d, v) for m in cg.POOL_MODELS for d in ["molecules"] for v in cg.VARIANTS}  # (with the no-aggregation bound)
    want |= {(m, d, v) for m in cg.SAMPLED_MODELS for d in ["PubMed", "OGB-Arxiv"] for v in cg.PAIR}
    want |= {(m, "Cora", v) for m in cg.CORA_MODELS for v in cg.PAIR}
    assert got == want and len(steady) == len(want)
    assert {r["model"] for r in rows} == CASES
    for r in steady:
        assert r["phase"] == "total" and r["reps"] == cg.BATCHES_PER_ROUND["quick"] and r["median_ms"] > 0 and r["spread_ms"] >= 0
        assert r["n"] > 0 and r["q"] > 0 and r["peak_mem_bytes"] > 0 and r["setup_s"] >= 0
        assert r["batch"] == (0 if r["model"] in cg.CORA_MODELS else 6) and r["hidden"] == (6 if r["model"] in cg.CORA_MODELS else cg.HIDDEN)
        # the comparison is fair: same outputs on the same input and parameters (the bound is another model)
        if r["variant"] == cg.BOUND:
            assert r["model"] in cg.POOL_MODELS and math.isnan(r["max_rel_diff"])
        else:
            assert r["max_rel_diff"] < 1e-4 and (r["variant"] == "corgnn" or r["max_rel_diff"] == 0)
    assert {r["dataset"] for r in steady if r["model"] in cg.SAMPLED_MODELS} == {"PubMed (real graph, synthetic features)", "OGB-Arxiv (synthetic)"}
    first = [r for r in rows if r["model"] == "first-call"]
    assert sorted((r["variant"], r["phase"]) for r in first) == [("corgnn", "import"), ("corgnn", "total"), ("pyg", "import"), ("pyg", "total")]
    assert all(r["median_ms"] > 0 and r["batch"] == 6 for r in first)
    ratios = cg.speedups(rows)
    cases = {(m, d) for m, d, _ in want}
    assert len(ratios) == len(cases) + 1 and all(math.isfinite(v) and v > 0 for v in ratios.values())
    summary = (out / "summary.md").read_text()
    for label in ratios:
        assert label in summary
    bounds = [line for line in summary.splitlines() if line.startswith("| GIN+add-pool") or line.startswith("| GCN+mean-pool")]
    assert len(bounds) == 4 and all(line.split(" | ")[7] not in ("-", "nan") for line in bounds)  # the bound column is filled
    assert "Geometric mean speed-up" in summary and "First call of a fresh process" in summary
    assert (out / "changing_graphs_speedup.png").stat().st_size > 0


class _Args:
    seed, root, threads = 0, None, None


class _Run:
    """The few runner attributes ``workload`` uses."""

    def __init__(self):
        from corgnn.bench.spec import PRESETS

        self.args, self.preset, self.shared = _Args(), PRESETS["tiny"], {}

    def graph(self, name):
        from corgnn.datasets import synthetic

        key = ("data", name)
        if key not in self.shared:
            self.shared[key] = synthetic(name, 0, nodes=80, edges=320, features=8)
        return self.shared[key]


@pytest.mark.parametrize("model", ["gin-pool", "sage-sampled", "gcn-explain"])
def test_output_check_sees_a_different_model(monkeypatch, model):
    """The max_rel_diff check fails when corgnn's model computes something else."""
    real = corgnn.interop.optimize

    def perturbed(module, **kw):
        m = real(module, **kw)
        with torch.no_grad():
            next(p for p in m.parameters() if p.dim() == 2).mul_(1.5)
        return m

    c = CellSpec(model, "corgnn", 8, batch=3, dataset="Cora")
    settings = Settings(warmup=1, min_reps=1, max_reps=1, budget_s=0.0, memory=False)
    honest = cg.compare(cg.workload(c, _Run()), ["pyg", "corgnn"], settings, k=1)
    assert honest["corgnn"].max_rel_diff < 1e-4 and honest["pyg"].timing.reps == 1
    monkeypatch.setattr(corgnn.interop, "optimize", perturbed)
    res = cg.compare(cg.workload(c, _Run()), ["corgnn"], settings, k=1)
    assert res["corgnn"].max_rel_diff > 1e-3


def test_a_failing_case_is_a_missing_point(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no luck")

    monkeypatch.setattr(cg, "compare", boom)
    out = tmp_path / "cg"
    assert main(["bench", "changing-graphs", "--tiny", "--datasets", "Cora", "--no-progress", "--out", str(out)]) == 0
    rows, _ = report.read_results(out)
    assert rows and all(r["status"] == "missing" and "RuntimeError: no luck" in r["reason"] for r in rows)
    assert {r["model"] for r in rows} == set(cg.CORA_MODELS)


def test_eval_pool_cases_run_no_grad_forwards_in_eval_mode():
    w = cg.workload(CellSpec("gin-pool-eval", "pyg", 8, batch=3), _Run())
    m = w.build()
    assert w.prepare(m) is None and not m.training
    before = [p.detach().clone() for p in m.parameters()]
    w.step(m, None, w.inputs(1, 0)[0])
    assert all(p.grad is None for p in m.parameters()) and all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert cg.case_label({"model": "gin-pool-eval", "batch": 3, "dataset": "molecules"}) == "GIN+add-pool eval, 3 graphs"


def test_workload_inputs_are_new_graphs_each_round():
    w = cg.workload(CellSpec("gcn-pool", "pyg", 8, batch=3), _Run())
    a, b = w.inputs(2, 0), w.inputs(2, 1)
    assert len(a) == 2 and a[0][2].max() == 2  # 3 graphs per batch
    assert not torch.equal(a[0][0], a[1][0]) and not torch.equal(a[0][0], b[0][0])
    assert torch.equal(w.inputs(2, 0)[1][1], a[1][1])  # seeded
    with pytest.raises(ValueError, match="variants"):
        cg.compare(w, ["dgl"], Settings(), k=1)
    with pytest.raises(ValueError, match="variants"):  # the bound is a mini-batch case's only
        cg.compare(cg.workload(CellSpec("gcn-explain", "pyg", 8, dataset="Cora"), _Run()), [cg.BOUND], Settings(), k=1)
    with pytest.raises(ValueError, match="model"):
        cg.workload(CellSpec("mlp", "pyg", 8), _Run())


@pytest.mark.parametrize("model", ["gin-pool", "gcn-pool-eval"])
def test_no_aggregation_bound_is_the_model_without_message_passing(model):
    """The bound's model keeps the parameters and drops only the aggregation: on a
    graph without edges GIN's and GCN's aggregations are the identity (a GCN node
    without neighbours keeps its own features, normalised by 1), so both models agree
    there and differ once edges exist."""
    from corgnn.bench.workloads import without_aggregation

    w = cg.workload(CellSpec(model, "pyg", 8, batch=3), _Run())
    torch.manual_seed(0)
    m = w.build()
    bound = without_aggregation(m)
    assert all(p is not q and torch.equal(p, q) for p, q in zip(m.parameters(), bound.parameters()))
    x, ei, batch, _ = w.inputs(1, 0)[0]
    empty = ei[:, :0]
    with torch.no_grad():
        torch.testing.assert_close(bound(x, ei, batch), m(x, empty, batch))
        assert not torch.allclose(bound(x, ei, batch), m(x, ei, batch))
    with pytest.raises(TypeError, match="convs"):
        without_aggregation(torch.nn.Linear(2, 2))


def test_no_aggregation_bound_of_sage_aggregates_each_node_itself():
    """SAGE's bound runs ``lin_l(x) + lin_r(x)``: the model on a graph of self-loops
    only (the mean over a node's one in-edge is its own features), not on the batch's."""
    from corgnn.bench.workloads import without_aggregation

    w = cg.workload(CellSpec("sage-pool", "pyg", 8, batch=3), _Run())
    torch.manual_seed(0)
    m = w.build()
    bound = without_aggregation(m)
    x, ei, batch, _ = w.inputs(1, 0)[0]
    loops = torch.arange(x.size(0)).expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(bound(x, ei, batch), m(x, loops, batch))
        assert not torch.allclose(bound(x, ei, batch), m(x, ei, batch))
