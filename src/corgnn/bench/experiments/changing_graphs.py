"""``changing-graphs``: PyG models whose graph changes on every call, as PyG's own
model against the same model after ``corgnn.optimize(copy.deepcopy(model))``
(issue 21: the workloads where a per-graph cache never pays off).

Cases (``model`` column; the models are in :mod:`corgnn.bench.workloads`):

=================  ==============================================================
``gcn-pool``       3 x GCNConv + global_mean_pool, mini-batches of ``batch`` small
                   random graphs (15-35 nodes, ``Batch.from_data_list``), training
                   steps (forward, cross entropy, backward, Adam)
``gin-pool``       5 x GINConv (2-layer MLP) + global_add_pool, the same batches
``sage-pool``      3 x SAGEConv (mean) + global_mean_pool, the same batches
``*-pool-eval``    the same three models in eval mode, ``torch.no_grad()`` forwards on
                   the same kind of batches (a test loader's loop)
``gcn-sampled``    2-layer GCN on neighbour-sampled subgraphs (``batch`` seed nodes,
                   fanouts :data:`FANOUTS`, :func:`corgnn.sampling.sample_neighbors`
                   in NeighborLoader's layout) of PubMed's real graph and the
                   OGB-Arxiv-shaped stand-in; loss on the seeds; training steps
``sage-sampled``   2-layer GraphSAGE (mean) on the same batches
``gcn-infer``      2-layer GCN on Cora, eval mode, ``torch.no_grad()``, a new
                   ``edge_index.clone()`` tensor every call
``gcn-explain``    GNNExplainer-style loop: frozen 2-layer GCN on Cora, a learnable
                   edge mask (``sigmoid`` of a Parameter) passed as ``edge_weight``,
                   forward + backward to the mask, Adam on the mask
``first-call``     a fresh interpreter (subprocess): imports (phase ``import``),
                   then build + optimize + one forward/backward (phase ``total``) of
                   the ``gcn-pool`` model on one batch, in ms
=================  ==============================================================

Every step of the mini-batch and sampled cases sees a graph neither variant has
seen: each timed round draws new random graphs / new seed nodes (untimed, as a
DataLoader's workers would) and each variant gets its own tensor copies (the
inference case: the same features, a new ``edge_index`` tensor per call; the
explanation loop: the same tensors, new edge weights every step). The two
variants are timed in interleaved rounds (one round = :data:`BATCHES_PER_ROUND`
steps of one variant, then of the other, the order alternating), each step timed
alone; rows hold the median ms per step, the IQR (``spread_ms``), peak memory of
one step (:func:`~corgnn.bench.harness.track_peak`), the first step's extra time
(``setup_s``) and ``max_rel_diff``, the largest difference of the two variants'
outputs on the same input with the same parameters (relative to PyG's largest
output), checked before any training. Columns: ``hidden`` is the hidden width,
``batch`` the graphs or seed nodes per step, ``n``/``q`` the mean nodes/edges per
call. Sizes of the grid (``--sizes``) are batch sizes, except for Cora (hidden
widths).
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import report
from ..harness import Timing, gc_paused, geomean, track_peak
from ..spec import CellSpec, ExperimentSpec
from ..workloads import MOLECULE_FEATURES, NodeGCN, NodeSAGE, PoolGCN, PoolGIN, PoolSAGE, first_call_script, random_molecules, without_aggregation
from .common import missing_md

__all__ = ["SPEC", "NAME", "VARIANTS", "PAIR", "BOUND", "FANOUTS", "HIDDEN", "workload", "compare", "Workload", "measure"]

NAME = "changing-graphs"
BOUND = "no-aggregation"
VARIANTS = ("pyg", "corgnn", BOUND)
"""``pyg``: the PyG model as written; ``corgnn``: ``corgnn.optimize`` of a deep copy;
``no-aggregation`` (mini-batch cases only): the PyG model without message passing
(:func:`~corgnn.bench.workloads.without_aggregation`), whose time bounds what any
aggregation kernel can save: ``PyG / no-aggregation`` is the speed-up corgnn would
reach if its message passing, graph build included, cost nothing."""
MOLECULES = "molecules"
HIDDEN = 64
"""Hidden width of the mini-batch and sampled cases."""
FANOUTS = (10, 10)
"""Neighbours sampled per node at hop 1 and 2."""
BATCHES_PER_ROUND = {"full": 8, "quick": 4, "tiny": 2}
FIRST_CALL_REPS = {"full": 3, "quick": 1, "tiny": 1}
FIRST_CALL_GRAPHS = 128
_CHECK_ROUND = 1 << 20  # round ids of the check and warm-up inputs (timed rounds count from 0)
PAIR = VARIANTS[:2]
"""The variants of every case (the bound is measured for the mini-batch cases only)."""
POOL_MODELS = ("gcn-pool", "gin-pool", "sage-pool", "gcn-pool-eval", "gin-pool-eval", "sage-pool-eval")
SAMPLED_MODELS = ("gcn-sampled", "sage-sampled")
CORA_MODELS = ("gcn-infer", "gcn-explain")


def cells(dataset: str, sizes):
    if dataset == MOLECULES:
        for b in sizes:
            for model in POOL_MODELS:
                for v in VARIANTS:
                    yield CellSpec(model, v, HIDDEN, batch=b)
        b = FIRST_CALL_GRAPHS if FIRST_CALL_GRAPHS in sizes else min(sizes)
        for v in PAIR:
            yield CellSpec("first-call", v, HIDDEN, batch=b)
    elif dataset == "Cora":
        for h in sizes:
            for model in CORA_MODELS:
                for v in PAIR:
                    yield CellSpec(model, v, h)
    else:
        for b in sizes:
            for model in SAMPLED_MODELS:
                for v in PAIR:
                    yield CellSpec(model, v, HIDDEN, batch=b)


# ------------------------------------------------------------------- workloads


class Workload:
    """One case: a PyG model, fresh inputs per step, and what a step does.

    Subclasses set ``label`` (the ``dataset`` column), ``synthetic``, ``m`` (input
    features) and ``out`` (output width), and implement :meth:`build`,
    :meth:`inputs`, :meth:`step` and :meth:`output`; :meth:`prepare` makes a
    variant's optimiser state, :meth:`own` a variant's copy of an input.
    """

    label: str
    synthetic: bool
    m: int
    out: int

    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    def inputs(self, k: int, round_: int) -> list[tuple]:
        """``k`` per-step inputs of round ``round_`` (an int >= 0; new graphs for each
        round id)."""
        raise NotImplementedError

    def prepare(self, model: torch.nn.Module):
        return torch.optim.Adam(model.parameters(), lr=0.01)

    def step(self, model, state, inp) -> None:
        raise NotImplementedError

    def output(self, model, state, inp) -> torch.Tensor:
        raise NotImplementedError

    def own(self, inp) -> tuple:
        """A variant's own copy of step input ``inp`` (default: every tensor cloned,
        as a DataLoader collates new tensors for every batch)."""
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inp)

    @staticmethod
    def size(inp) -> tuple[int, int]:
        """(nodes, edges) of one call's graph."""
        return int(inp[0].size(0)), int(inp[1].size(1))


class PoolBatches(Workload):
    """``gcn-pool`` / ``gin-pool`` / ``sage-pool`` (``*-eval``: no-grad forwards in eval mode):
    mini-batches of ``graphs`` random small graphs."""

    def __init__(self, model: str, graphs: int, hidden: int, seed: int, tiny: bool):
        self.model, self.graphs, self.hidden, self.seed = model, graphs, hidden, seed
        self.label = f"{MOLECULES} (synthetic, tiny)" if tiny else f"{MOLECULES} (synthetic, 15-35 nodes)"
        self.synthetic, self.m, self.out = True, MOLECULE_FEATURES, 2

    def build(self):
        return {"gcn": PoolGCN, "gin": PoolGIN, "sage": PoolSAGE}[self.model.split("-")[0]](self.m, self.hidden, self.out)

    @property
    def evaluating(self) -> bool:
        """``*-pool-eval``: eval mode, ``torch.no_grad()`` forwards (a test loader's loop)."""
        return self.model.endswith("-eval")

    def prepare(self, model):
        if self.evaluating:
            model.eval()
            return None
        return super().prepare(model)

    def inputs(self, k, round_):
        from torch_geometric.data import Batch

        graphs = random_molecules(k * self.graphs, seed=self.seed * 1_000_003 + round_)
        batches = [Batch.from_data_list(graphs[i * self.graphs : (i + 1) * self.graphs]) for i in range(k)]
        return [(b.x, b.edge_index, b.batch, b.y) for b in batches]

    def step(self, model, opt, inp):
        x, ei, batch, y = inp
        if self.evaluating:
            with torch.no_grad():
                model(x, ei, batch)
            return
        opt.zero_grad()
        F.cross_entropy(model(x, ei, batch), y).backward()
        opt.step()

    def output(self, model, opt, inp):
        return model(*inp[:3])


class SampledBatches(Workload):
    """``gcn-sampled`` / ``sage-sampled``: NeighborLoader-style batches of ``seeds``
    seed nodes of ``data`` (all nodes are candidate seeds, drawn without repeats)."""

    def __init__(self, model: str, data, sampler, seeds: int, hidden: int, seed: int):
        self.model, self.data, self.sampler, self.seeds, self.hidden, self.seed = model, data, sampler, min(seeds, data.num_nodes), hidden, seed
        self.label, self.synthetic = data.name, bool(getattr(data, "synthetic", False))
        self.m, self.out = data.num_features, int(data.y.max()) + 1

    def build(self):
        return (NodeGCN if self.model == "gcn-sampled" else NodeSAGE)(self.m, self.hidden, self.out)

    def inputs(self, k, round_):
        import numpy as np

        rng = np.random.default_rng([self.seed, round_])
        out = []
        for _ in range(k):
            seeds = torch.from_numpy(rng.choice(self.data.num_nodes, self.seeds, replace=False))
            b = self.sampler.sample(seeds, FANOUTS, rng)
            out.append((b.x, b.edge_index, b.y, b.batch_size))
        return out

    def step(self, model, opt, inp):
        x, ei, y, bs = inp
        opt.zero_grad()
        F.cross_entropy(model(x, ei)[:bs], y[:bs]).backward()
        opt.step()

    def output(self, model, opt, inp):
        return model(inp[0], inp[1])


class FreshInference(Workload):
    """``gcn-infer``: eval-mode, no-grad forward with a new ``edge_index`` tensor per call."""

    def __init__(self, data, hidden: int):
        self.data, self.hidden = data, hidden
        self.label, self.synthetic = data.name, bool(getattr(data, "synthetic", False))
        self.m, self.out = data.num_features, int(data.y.max()) + 1

    def build(self):
        return NodeGCN(self.m, self.hidden, self.out)

    def inputs(self, k, round_):
        return [(self.data.x, self.data.edge_index.clone()) for _ in range(k)]

    def own(self, inp):
        return inp[0], inp[1].clone()  # the same features, a new edge_index tensor

    def prepare(self, model):
        model.eval()
        return None

    def step(self, model, state, inp):
        with torch.no_grad():
            model(*inp)

    def output(self, model, state, inp):
        return model(*inp)


class ExplainLoop(Workload):
    """``gcn-explain``: a frozen GCN, a learnable edge mask as ``edge_weight`` (the
    same ``edge_index`` tensor every call; the weights change every step)."""

    def __init__(self, data, hidden: int, seed: int):
        self.data, self.hidden, self.seed = data, hidden, seed
        self.label, self.synthetic = data.name, bool(getattr(data, "synthetic", False))
        self.m, self.out = data.num_features, int(data.y.max()) + 1

    def build(self):
        return NodeGCN(self.m, self.hidden, self.out)

    def inputs(self, k, round_):
        return [(self.data.x, self.data.edge_index)] * k

    def own(self, inp):
        return inp

    def prepare(self, model):
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        gen = torch.Generator().manual_seed(self.seed)
        mask = torch.nn.Parameter(0.1 * torch.randn(self.data.edge_index.size(1), generator=gen))
        with torch.no_grad():
            target = model(self.data.x, self.data.edge_index).argmax(-1)
        return mask, torch.optim.Adam([mask], lr=0.01), target

    def step(self, model, state, inp):
        mask, opt, target = state
        opt.zero_grad()
        w = mask.sigmoid()
        (F.cross_entropy(model(*inp, w), target) + 0.005 * w.mean()).backward()
        opt.step()

    def output(self, model, state, inp):
        return model(*inp, state[0].sigmoid())


def workload(c: CellSpec, runner) -> Workload:
    """The :class:`Workload` of cell ``c`` (its ``model``, ``dataset``, ``batch`` and
    ``hidden``) for this run.

    Raises:
        ValueError: an unknown ``model``.
    """
    if c.model not in POOL_MODELS + SAMPLED_MODELS + CORA_MODELS:
        raise ValueError(f"unknown changing-graphs model {c.model!r}; one of {POOL_MODELS + SAMPLED_MODELS + CORA_MODELS}")
    seed, tiny = runner.args.seed, runner.preset.name == "tiny"
    if c.model in POOL_MODELS:
        return PoolBatches(c.model, c.batch, c.hidden, seed, tiny)
    data = runner.graph(c.dataset)
    if c.model in SAMPLED_MODELS:
        key = ("sampler", c.dataset)
        if key not in runner.shared:
            from ...sampling import NeighborSampler

            runner.shared[key] = NeighborSampler(data)
        return SampledBatches(c.model, data, runner.shared[key], c.batch, c.hidden, seed)
    if c.model == "gcn-infer":
        return FreshInference(data, c.hidden)
    return ExplainLoop(data, c.hidden, seed)


@dataclass
class Result:
    """What :func:`compare` measured for one variant."""

    timing: Timing
    max_rel_diff: float
    nodes: float
    edges: float


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(w: Workload, variants, settings, k: int, seed: int = 0, device=torch.device("cpu")) -> dict[str, Result]:
    """Time ``variants`` of workload ``w`` in interleaved rounds of ``k`` steps each.

    The PyG model is built from ``seed``; ``corgnn`` is
    ``corgnn.optimize(copy.deepcopy(model))``, so both start from the same
    parameters. Before any step, both run :meth:`Workload.output` on one input and
    ``max_rel_diff`` records ``max |corgnn - pyg| / max |pyg|`` (0 for ``pyg``).
    Then ``settings.warmup`` untimed steps each (the first one's time gives
    ``setup_s``), one step under :func:`~corgnn.bench.harness.track_peak` each (if
    ``settings.memory``), and rounds of ``k`` fresh inputs per variant until both
    have ``settings.min_reps`` rounds and ``settings.budget_s`` seconds, at most
    ``settings.max_reps`` rounds.

    Returns:
        ``{variant: Result}``; ``Result.timing.total`` holds one sample (ms) per
        timed step.

    Raises:
        ValueError: a variant not in :data:`VARIANTS`.
    """
    from ...interop import optimize

    allowed = VARIANTS if isinstance(w, PoolBatches) else PAIR
    bad = [v for v in variants if v not in allowed]
    if bad:
        raise ValueError(f"changing-graphs variants of this case are {allowed}, got {bad}")

    def to(inp):
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inp)

    torch.manual_seed(seed)
    base = w.build().to(device)
    models = {"pyg": base, "corgnn": optimize(copy.deepcopy(base))}
    if BOUND in variants:
        models[BOUND] = without_aggregation(base)
    states = {v: w.prepare(m) for v, m in models.items()}
    check = to(w.inputs(1, _CHECK_ROUND)[0])
    with torch.no_grad():
        outs = {v: w.output(models[v], states[v], w.own(check)) for v in PAIR}
    scale = outs["pyg"].abs().max().clamp_min(1e-12)
    diff = {v: float((outs[v] - outs["pyg"]).abs().max() / scale) for v in PAIR}
    diff[BOUND] = math.nan  # (another model: nothing to compare)
    res = {v: Result(Timing(), diff[v], 0.0, 0.0) for v in variants}
    warm = [to(i) for i in w.inputs(settings.warmup + int(settings.memory), _CHECK_ROUND + 1)]
    for v in variants:
        for inp in warm[: settings.warmup]:
            inp = w.own(inp)
            _sync(device)
            t0 = time.perf_counter()
            w.step(models[v], states[v], inp)
            _sync(device)
            res[v].timing.warmup_ms.append((time.perf_counter() - t0) * 1e3)
        if settings.memory:
            inp = w.own(warm[-1])
            with track_peak(device) as peak:
                w.step(models[v], states[v], inp)
            res[v].timing.peak_mem_bytes = peak.bytes
    spent = dict.fromkeys(variants, 0.0)
    sizes = []
    rounds = 0
    while rounds < settings.max_reps and (rounds < settings.min_reps or min(spent.values()) < settings.budget_s):
        inputs = [to(i) for i in w.inputs(k, rounds)]
        sizes += [w.size(i) for i in inputs]
        for v in variants if rounds % 2 == 0 else variants[::-1]:
            mine = [w.own(i) for i in inputs]
            with gc_paused():
                for inp in mine:
                    _sync(device)
                    t0 = time.perf_counter()
                    w.step(models[v], states[v], inp)
                    _sync(device)
                    ms = (time.perf_counter() - t0) * 1e3
                    res[v].timing.total.append(ms)
                    spent[v] += ms / 1e3
            del mine
        rounds += 1
    if not sizes:
        sizes = [w.size(check)]
    for r in res.values():
        r.nodes = statistics.fmean(s[0] for s in sizes)
        r.edges = statistics.fmean(s[1] for s in sizes)
    return res


def _first_call(cells: list[CellSpec], runner) -> None:
    """Fresh interpreters, the variants alternating, :data:`FIRST_CALL_REPS` each."""
    threads = getattr(runner.args, "threads", None)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])  # the folder holding the corgnn package
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if threads:
        env["NUMBA_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    samples = defaultdict(list)
    last = {}
    variants = [c.variant for c in cells]
    for r in range(FIRST_CALL_REPS[runner.preset.name]):
        for v in variants if r % 2 == 0 else variants[::-1]:
            argv = first_call_script(v, cells[0].batch, cells[0].hidden, runner.args.seed, threads)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"first-call subprocess ({v}) failed: {done.stderr.strip()[-300:]}")
            last[v] = json.loads(done.stdout.strip().splitlines()[-1])
            if last[v]["corgnn_loaded"] != (v == "corgnn"):
                raise RuntimeError(f"first-call subprocess ({v}) {'loaded' if v == 'pyg' else 'did not load'} corgnn")
            samples[v, "total"].append(last[v]["first_ms"])
            samples[v, "import"].append(last[v]["import_ms"])
    label = f"{MOLECULES} (synthetic, tiny)" if runner.preset.name == "tiny" else f"{MOLECULES} (synthetic, 15-35 nodes)"
    for c in cells:
        for phase in ("total", "import"):
            t = Timing(total=samples[c.variant, phase])
            runner.record(c, phase, dataset=label, synthetic=True, n=last[c.variant]["nodes"], q=last[c.variant]["edges"], m=MOLECULE_FEATURES, out=2, median_ms=t.median("total"), spread_ms=t.spread("total"), reps=t.reps, status="ok")


def measure(cells: list[CellSpec], runner) -> None:
    """The ``measure`` hook of :data:`SPEC`: one case's variants (see the module
    docstring), rows recorded with ``runner.record``."""
    if cells[0].model == "first-call":
        return _first_call(cells, runner)
    w = workload(cells[0], runner)
    res = compare(w, [c.variant for c in cells], runner.settings, BATCHES_PER_ROUND[runner.preset.name], runner.args.seed, runner.device)
    for c in cells:
        r = res[c.variant]
        t = r.timing
        setup = max(0.0, (t.warmup_ms[0] - t.median("total")) / 1e3) if t.warmup_ms and t.total else math.nan
        runner.record(
            c, "total", dataset=w.label, synthetic=w.synthetic, n=round(r.nodes), q=round(r.edges), m=w.m, out=w.out,
            median_ms=t.median("total"), spread_ms=t.spread("total"), reps=t.reps, peak_mem_bytes=t.peak_mem_bytes, setup_s=setup,
            status="ok", max_rel_diff=r.max_rel_diff,
        )


# --------------------------------------------------------------- summary + plot


def case_label(r: dict) -> str:
    """Short name of a row's case, e.g. ``"GIN, 128 graphs"``."""
    ds = r["dataset"].split(" (")[0]
    return {
        "gcn-pool": f"GCN+mean-pool, {r['batch']} graphs",
        "gin-pool": f"GIN+add-pool, {r['batch']} graphs",
        "gcn-pool-eval": f"GCN+mean-pool eval, {r['batch']} graphs",
        "gin-pool-eval": f"GIN+add-pool eval, {r['batch']} graphs",
        "sage-pool": f"SAGE+mean-pool, {r['batch']} graphs",
        "sage-pool-eval": f"SAGE+mean-pool eval, {r['batch']} graphs",
        "gcn-sampled": f"GCN, {ds} sampled, {r['batch']} seeds",
        "sage-sampled": f"SAGE, {ds} sampled, {r['batch']} seeds",
        "gcn-infer": f"GCN inference, {ds}, fresh edge_index",
        "gcn-explain": f"explain loop, {ds}, edge mask",
        "first-call": f"first call, fresh process ({r['batch']} graphs)",
    }.get(r["model"], f"{r['model']}, {ds}")


def _pairs(rows, phase: str = "total") -> dict:
    """``{(model, dataset, batch, hidden): {variant: row}}`` of the ok rows."""
    out = defaultdict(dict)
    for r in report.ok_rows(rows, NAME, phase):
        out[(r["model"], r["dataset"], r["batch"], r["hidden"])][r["variant"]] = r
    return out


def speedups(rows) -> dict:
    """``{case label: pyg ms / corgnn ms}`` of every case with both variants measured
    (first call included), in measuring order."""
    return {case_label(v["pyg"]): v["pyg"]["median_ms"] / v["corgnn"]["median_ms"] for v in _pairs(rows).values() if "pyg" in v and "corgnn" in v}


def _ms(r) -> str:
    return "-" if r is None else f"{report.fmt(r['median_ms'])} ({report.fmt(r['spread_ms'], 2)})"


def _mib(r) -> str:
    return "-" if r is None or r.get("peak_mem_bytes") in (None, "") else report.fmt(r["peak_mem_bytes"] / 2**20)


def summary(rows) -> str:
    pairs = _pairs(rows)
    steady = {k: v for k, v in pairs.items() if k[0] != "first-call"}
    parts = []
    if steady:
        body = []
        for (model, ds, b, h), v in steady.items():
            any_row = next(iter(v.values()))
            p, c, f = v.get("pyg"), v.get("corgnn"), v.get(BOUND)
            ratio = p["median_ms"] / c["median_ms"] if p and c else math.nan
            bound = report.fmt(p["median_ms"] / f["median_ms"], 2) if p and f else "-"
            diff = c.get("max_rel_diff") if c else None
            body.append([
                case_label(any_row), f"{any_row['n']} / {any_row['q']}", h, _ms(p), _ms(c), report.fmt(ratio, 2), _ms(f), bound, _mib(p), _mib(c),
                "-" if diff is None else f"{diff:.1e}",
            ])
        ratios = [p["pyg"]["median_ms"] / p["corgnn"]["median_ms"] for p in steady.values() if "pyg" in p and "corgnn" in p]
        parts.append(
            "PyG's model vs the same after `corgnn.optimize(copy.deepcopy(model))`, a new graph (or new edge weights) every call; "
            "ms per step, median (IQR) over interleaved rounds; speed-up = PyG / corgnn (> 1: corgnn faster); "
            "max rel diff = largest |corgnn - PyG| / max |PyG| of the outputs on the same input and parameters; "
            "no-aggregation ms = the PyG model without message passing (mini-batch cases: its MLPs, activations, pooling, loss and "
            "optimizer step only) and bound = PyG / no-aggregation, the speed-up corgnn would reach if its message passing, "
            "graph build included, cost nothing:\n\n"
            + report.md_table(
                ["case", "nodes / edges per call", "hidden", "PyG ms", "corgnn ms", "speed-up", "no-aggregation ms", "bound", "PyG peak MiB", "corgnn peak MiB", "max rel diff"],
                body,
            )
            + (f"\n\nGeometric mean speed-up over these cases: **{geomean(ratios):.2f}x**." if ratios else "")
        )
    first = {k: v for k, v in pairs.items() if k[0] == "first-call"}
    imports = _pairs(rows, "import")
    if first:
        body = []
        for k, v in first.items():
            p, c = v.get("pyg"), v.get("corgnn")
            ip, ic = imports.get(k, {}).get("pyg"), imports.get(k, {}).get("corgnn")
            body.append([case_label(next(iter(v.values()))), _ms(ip), _ms(ic), _ms(p), _ms(c), report.fmt(c["median_ms"] - p["median_ms"]) if p and c else "-"])
        parts.append(
            "First call of a fresh process (subprocess): imports (`torch_geometric`, plus `corgnn` for corgnn), then build + optimize + "
            "one forward/backward, ms, median (IQR) over processes:\n\n"
            + report.md_table(["case", "PyG import ms", "corgnn import ms", "PyG first call ms", "corgnn first call ms", "corgnn extra ms"], body)
        )
    parts.append(missing_md(rows, NAME))
    return "\n\n".join(parts)


def plots(rows, out):
    yield report.plot_bars(speedups(rows), out / "changing_graphs_speedup.png", title="Changing graphs: PyG time / corgnn time per case (> 1: corgnn faster; first call: per fresh process)", ylabel="speed-up (PyG / corgnn)")


SPEC = ExperimentSpec(
    name=NAME,
    help="PyG models on a new graph every call (mini-batches, sampled subgraphs, fresh tensors, explanation loop, first call) vs optimize()",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": ((MOLECULES, "PubMed", "OGB-Arxiv", "Cora"), {MOLECULES: (32, 128, 512), "PubMed": (512,), "OGB-Arxiv": (512,), "Cora": (16,)}),
        "quick": ((MOLECULES, "PubMed", "OGB-Arxiv", "Cora"), {MOLECULES: (32, 128, 512), "PubMed": (512,), "OGB-Arxiv": (512,), "Cora": (16,)}),
        "tiny": ((MOLECULES, "PubMed", "Cora"), {MOLECULES: (4,), "PubMed": (8,), "Cora": (4,)}),
    },
    # NOTE: estimated on the loaded 2-core VM, not idle: the quick run took 0.5 min
    # there with --threads 1 (3.4 min with both threads, contention-bound); the full
    # grid adds rounds (budget 1 s per variant and case) and 4 more fresh processes.
    expected_min={"full": 1.5, "quick": 0.5},
    measure=measure,
)
