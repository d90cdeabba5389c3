"""The paper's evaluation (§"Evaluation", appendix "GCN Evaluation") as ``corgnn bench``
experiments, run against PyTorch Geometric in the same process.

=============  ====================================================================
``gcn-layer``  one GCN layer on OGB-Arxiv (m = 128), output sizes 8..512, with and
               without input gradients: every scheme forced (with and without
               caching) and ``auto``; where each wins, whether ``auto`` matches the
               fastest (paper Figs. "Single GCN layer runtime", "caching benefits")
``gcn``        2-layer GCN (ReLU) vs every PyG baseline on the five datasets,
               hidden 16..1024: speedup over the fastest PyG per cell, geometric
               means (paper Fig. "GCN ... relative to the fastest PyG")
``gat-caching`` 2-layer 8-head GAT with each caching scheme (none, features,
               node_attention, edge_weights): time and memory, hidden 8..128
``gat``        2-layer 8-head GAT (ELU) vs the PyG baselines, hidden 8..128
               (plus ``corgnn:dense-x``, corgnn with dense input features, on Cora
               and CiteSeer; also in ``gcn``)
``formats``    GCN and the sparse products (SpMM, transposed SpMM, SDDMM) in every
               sparse format, runtime relative to CSC (paper Fig. "Data format")
``memory``     peak memory of one GCN layer on OGB-Arxiv per scheme and for PyG
               (paper Fig. "Single GCN layer memory use")
``all``        everything above into one directory
=============  ====================================================================

Every experiment takes ``--quick`` (a few minutes on 2 cores), the full grid by
default (trimmed to ~26 minutes on 2 cores: see :data:`PRESETS`), and the hidden
``--tiny`` (tests). Output: ``results.csv``/``results.json``,
``summary.md`` and PNG plots under ``--out`` (default
``benchmarks/results/<experiment>-<preset>-<time>``). Methodology: see
:mod:`corgnn.bench.harness` and ``benchmarks/README.md``.
"""

from __future__ import annotations

import gc
import math
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from . import report
from .baselines import GAT_HEADS, PYG_VARIANTS, GraphData, Unavailable, build, estimate_step_bytes
from .harness import Settings, StepTimeout, TrainStep, geomean, machine_info, time_interleaved, warm_up

__all__ = ["EXPERIMENTS", "Experiment", "CellSpec", "Runner", "PRESETS", "run_experiments", "plan_cells", "group_cells"]

POW2 = lambda lo, hi: tuple(2**i for i in range(lo, hi + 1))  # noqa: E731

GAT_CACHES = ("none", "features", "node_attention", "edge_weights")
FORMATS = ("coo", "csr", "csc", "ell", "hybrid")
OPS = ("spmm", "spmm_t", "sddmm")
ARXIV = ("OGB-Arxiv",)
ALL5 = ("Cora", "CiteSeer", "PubMed", "Flickr", "OGB-Arxiv")
SMALL3 = ("Cora", "CiteSeer", "PubMed")


@dataclass(frozen=True)
class Preset:
    """Repetition settings and per-experiment grids ``{experiment: (datasets, sizes)}``;
    ``sizes`` is a tuple or ``{dataset: sizes, "*": default}``; ``no_memory`` names the
    experiments that skip the memory step (``gcn-layer``: ``memory`` measures it)."""

    name: str
    settings: Settings
    grids: dict
    compile_warmup: int = 2
    no_memory: tuple = ("gcn-layer",)


BIG2 = {"Flickr", "OGB-Arxiv"}


def _sizes(small: tuple, big: tuple) -> dict:
    """Sizes per dataset: ``big`` for Flickr and OGB-Arxiv, ``small`` for the others."""
    return {"*": small, **{d: big for d in BIG2}}


# NOTE: the full grid is trimmed to fit ~25-30 minutes on 2 CPU cores (measured costs
# and what was left out are in benchmarks/README.md): the single layer stops at
# k = 512; on Flickr and OGB-Arxiv the 2-layer GCN runs hidden 16, 64, 256, 1024
# only; the GAT-vs-PyG comparison runs hidden 8, 32, 128 (Flickr 8, OGB-Arxiv 8 and
# 32; every PyG GAT compile costs 10-20 s); GAT caching skips Flickr and runs
# OGB-Arxiv at 8 and 32; formats skips Flickr. Cells whose estimated memory exceeds --mem-cap-gb are
# recorded as missing points, not run; variants slower than 8 s a step are timed once.
PRESETS = {
    "full": Preset(
        "full",
        Settings(warmup=1, min_reps=3, max_reps=20, budget_s=1.0, slow_step_s=8.0),
        {
            "gcn-layer": (ARXIV, POW2(3, 9)),
            "gcn": (ALL5, _sizes(POW2(4, 10), (16, 64, 256, 1024))),
            "gat-caching": (SMALL3 + ARXIV, _sizes(POW2(3, 7), (8, 32))),
            "gat": (ALL5, {"*": (8, 32, 128), "Flickr": (8,), "OGB-Arxiv": (8, 32)}),
            "formats": (SMALL3 + ARXIV, (16, 256)),
            "memory": (ARXIV, (16, 64, 256, 512)),
        },
    ),
    "quick": Preset(
        "quick",
        Settings(warmup=1, min_reps=2, max_reps=10, budget_s=0.3, slow_step_s=3.0),
        {
            "gcn-layer": (ARXIV, (32, 256)),
            "gcn": (ALL5, (16, 256)),
            "gat-caching": (SMALL3, (8, 64)),
            "gat": (SMALL3, (8, 64)),
            "formats": (("Cora", "PubMed"), (16, 256)),
            "memory": (ARXIV, (32, 256)),
        },
    ),
    "tiny": Preset(
        "tiny",
        Settings(warmup=1, min_reps=1, max_reps=1, budget_s=0.0),
        {
            "gcn-layer": (ARXIV, (4, 32)),
            "gcn": (("Cora", "OGB-Arxiv"), (4, 32)),
            "gat-caching": (("Cora",), (2, 4)),
            "gat": (("Cora",), (2, 4)),
            "formats": (("Cora",), (4,)),
            "memory": (ARXIV, (4, 32)),
        },
    ),
}
TINY_SHAPE = dict(nodes=120, edges=480, features=16)
"""Graph shape of every dataset under ``--tiny`` (seeded synthetic, labelled so)."""


@dataclass(frozen=True)
class CellSpec:
    """One measurement to make.

    ``kind``: ``"step"`` (timed training step + memory), ``"memory"`` (memory only)
    or ``"op"`` (one sparse product, forward only; ``model`` names the op).
    """

    experiment: str
    dataset: str
    model: str
    variant: str
    hidden: int
    input_grad: bool = False
    loss: str = "mse"
    kind: str = "step"


# ----------------------------------------------------------------------------- runner


class Runner:
    """Runs cells, turning every failure into a missing point with its reason."""

    def __init__(self, args, preset: Preset):
        self.args = args
        self.preset = preset
        s = preset.settings
        over = {k: getattr(args, k) for k in ("warmup", "min_reps", "max_reps", "budget_s", "slow_step_s") if getattr(args, k, None) is not None}
        if getattr(args, "no_memory", False):
            over["memory"] = False
        if over.get("min_reps") is not None and over.get("max_reps") is None:
            over["max_reps"] = max(s.max_reps, over["min_reps"])
        self.settings = replace(s, **over)
        if getattr(args, "threads", None):
            import numba

            torch.set_num_threads(args.threads)
            numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
        self.machine = machine_info(self.device)
        self.mem_cap = int(args.mem_cap_gb * 2**30) if args.mem_cap_gb else _default_mem_cap()
        self.rows: list[dict] = []
        self._data: dict[str, GraphData] = {}
        minutes = getattr(args, "deadline_min", None)
        self.deadline = time.perf_counter() + 60 * minutes if minutes else None

    # datasets ---------------------------------------------------------------
    def dataset(self, name: str) -> GraphData:
        """The benchmark graph for ``name`` (real when found, else synthetic), cached."""
        from ..datasets import canonical_name, load_dataset, synthetic

        canon = canonical_name(name)
        g = self._data.get(canon)
        if g is None:
            if self.preset.name == "tiny":
                data = synthetic(canon, self.args.seed, **TINY_SHAPE)
                data.name = f"{canon} (synthetic, tiny)"
            else:
                data = load_dataset(canon, self.args.root, self.args.seed)
            g = self._data[canon] = GraphData.from_pyg(data, self.device)
        return g

    # one cell ---------------------------------------------------------------
    def _base(self, c: CellSpec, g: GraphData) -> dict:
        heads = GAT_HEADS if c.model == "gat" else 1
        out = c.hidden if c.model in ("gcn-layer",) + OPS else g.num_classes
        return {
            "experiment": c.experiment,
            "dataset": g.name,
            "synthetic": g.synthetic,
            "n": g.n,
            "q": g.q,
            "m": g.m,
            "hidden": c.hidden,
            "out": out,
            "heads": heads,
            "model": c.model,
            "variant": c.variant,
            "family": "pyg" if c.variant.startswith("pyg") else "corgnn",
            "input_grad": c.input_grad,
            **self.machine,
        }

    def _missing(self, c: CellSpec, g: GraphData, reason: str) -> None:
        for phase in self._phases(c):
            self.rows.append({**self._base(c, g), "phase": phase, "median_ms": math.nan, "spread_ms": math.nan, "reps": 0, "peak_mem_bytes": None, "setup_s": math.nan, "status": "missing", "reason": reason, "scheme_used": ""})

    @staticmethod
    def _phases(c: CellSpec) -> tuple[str, ...]:
        return ("fwd",) if c.kind == "op" else ("total",) if c.kind == "memory" else ("fwd", "bwd", "total")

    def _skip_reason(self, c: CellSpec, g: GraphData) -> str | None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            return f"skipped: the run passed its --deadline-min of {self.args.deadline_min:g} min"
        if c.variant.endswith("-compiled") and self.args.no_compile:
            return "torch.compile disabled (--no-compile)"
        if c.kind != "op":
            est = estimate_step_bytes(c.variant, "gcn" if c.model == "gcn-layer" else c.model, g, c.hidden)
            if est > self.mem_cap:
                return f"skipped: estimated {est / 2**30:.1f} GiB per step > memory cap {self.mem_cap / 2**30:.1f} GiB (--mem-cap-gb)"
        return None

    @staticmethod
    def _failure(e: BaseException, compiled: bool) -> str:
        if isinstance(e, Unavailable):
            return f"unavailable: {e}"
        timeout = _caused_by(e, StepTimeout)  # dynamo wraps exceptions raised while it traces
        if timeout is not None:
            return f"torch.compile warm-up {timeout} (--compile-timeout)"
        msg = " ".join(str(e).split())[:300]
        return f"{'compile/run failed' if compiled else 'failed'}: {type(e).__name__}: {msg}"

    def _prepare(self, c: CellSpec, g: GraphData):
        """Build the cell's step, warm it up and measure its memory: ``(step, module, Timing)``."""
        mod = None
        if c.kind == "op":
            step = _op_step(c, g)
        else:
            mod, inputs = build(c.variant, c.model, g, c.hidden)
            step = TrainStep(mod, inputs, loss=c.loss, input_grad=c.input_grad, seed=self.args.seed)
        settings = self.settings
        if c.kind == "memory":
            settings = replace(settings, memory=True, min_reps=0, max_reps=0)
        elif c.experiment in self.preset.no_memory:
            settings = replace(settings, memory=False)
        if c.variant.endswith("-compiled"):
            torch._dynamo.reset()  # compile this cell from scratch (static shapes), as a user would
            t = warm_up(step, settings, warmup=max(settings.warmup, self.preset.compile_warmup), warmup_limit_s=self.args.compile_timeout)
        else:
            t = warm_up(step, settings)
        return step, mod, t

    def run_group(self, cells: list[CellSpec]) -> None:
        """Measure the variants of one comparison (same experiment, dataset, size, ...).

        Each variant is built, warmed up and memory-profiled in turn, then all are
        timed interleaved (:func:`~corgnn.bench.harness.time_interleaved`). Any
        failure makes that variant a missing point with its reason; the others go on.
        """
        g = self.dataset(cells[0].dataset)
        ready: dict = {}
        try:
            for c in cells:
                reason = self._skip_reason(c, g)
                if reason is None:
                    try:
                        ready[c] = self._prepare(c, g)
                    except Exception as e:  # noqa: BLE001 - any failure of a variant is a missing point, as in the paper
                        reason = self._failure(e, c.variant.endswith("-compiled"))
                if reason is not None:
                    self._missing(c, g, reason)
            timed = {c: v[0] for c, v in ready.items() if c.kind != "memory"}
            failed = time_interleaved(timed, {c: ready[c][2] for c in timed}, self.settings) if timed else {}
            for c, (step, mod, t) in ready.items():
                if c in failed:
                    self._missing(c, g, self._failure(failed[c], c.variant.endswith("-compiled")))
                    continue
                used = _scheme_used(mod)
                for phase in self._phases(c):
                    self.rows.append(
                        {
                            **self._base(c, g),
                            "phase": phase,
                            "median_ms": t.median(phase),
                            "spread_ms": t.spread(phase),
                            "reps": t.reps,
                            "peak_mem_bytes": t.peak_mem_bytes,
                            "setup_s": t.setup_s(),
                            "status": "ok",
                            "reason": "",
                            "scheme_used": used,
                        }
                    )
        finally:
            ready.clear()
            if any(c.variant.endswith("-compiled") for c in cells):
                torch._dynamo.reset()
            gc.collect()  # cheap: run_experiments froze the long-lived objects (gc.freeze)


def order_groups(groups: list[list[CellSpec]]) -> list[list[CellSpec]]:
    """Groups from the smallest graph and size to the largest (Table 5's order, then
    hidden size; stable otherwise), so a ``--deadline-min`` cuts the most expensive
    cells, across all experiments, rather than whole experiments."""
    return sorted(groups, key=lambda grp: (_order(grp[0].dataset), grp[0].hidden))


def group_cells(cells: list[CellSpec]) -> list[list[CellSpec]]:
    """Consecutive cells that differ only in ``variant`` (one comparison each)."""
    groups: list[list[CellSpec]] = []
    for c in cells:
        key = replace(c, variant="")
        if groups and replace(groups[-1][0], variant="") == key:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _caused_by(e: BaseException, kind: type) -> BaseException | None:
    """``e`` or the first exception of type ``kind`` in its cause/context chain."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _default_mem_cap() -> int:
    """Half of the currently available RAM (``MemAvailable``), at most 12 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return min(int(line.split()[1]) * 1024 // 2, 12 * 2**30)
    except OSError:
        pass
    return 8 * 2**30


def _scheme_used(mod) -> str:
    """corgnn's per-layer choice on the last call ('' for PyG)."""
    if mod is None:
        return ""
    if hasattr(mod, "schemes") and callable(mod.schemes):
        return "|".join(str(s) for s in mod.schemes())
    plan = getattr(mod, "last_plan", None)
    if plan is not None:
        return getattr(getattr(plan, "scheme", None), "name", str(getattr(plan, "scheme", "")))
    return ""


class _OpStep:
    """A sparse product as a 'step': forward runs it, backward does nothing."""

    def __init__(self, fn, x):
        self.fn, self.inputs = fn, (x,)

    def zero_grad(self):
        pass

    def forward(self):
        return self.fn()

    def backward(self, out):
        pass

    def __call__(self):
        self.fn()


def _op_step(c: CellSpec, g: GraphData) -> _OpStep:
    """SpMM ``A' B``, transposed SpMM ``A'^T B`` or SDDMM ``A' ⊙ (B C^T)`` with the GCN
    adjacency in format ``c.variant`` (``format=<fmt>``) and ``c.hidden`` columns."""
    from ..graph import Graph
    from ..sparse import sddmm, spmm

    fmt = c.variant.split("=", 1)[1]
    A = Graph(g.edge_index, num_nodes=g.n).gcn_adjacency(format=fmt)
    gen = torch.Generator().manual_seed(0)
    B = torch.randn(g.n, c.hidden, generator=gen).to(g.x.device)
    if c.model == "spmm":
        return _OpStep(lambda: spmm(A, B), B)
    if c.model == "spmm_t":
        return _OpStep(lambda: spmm(A, B, transpose=True), B)
    C = torch.randn(g.n, c.hidden, generator=gen).to(g.x.device)
    return _OpStep(lambda: sddmm(A, B, C.t()), B)


# ------------------------------------------------------------------------ experiments


@dataclass(frozen=True)
class Experiment:
    """One ``corgnn bench`` experiment: its cells, its summary and its plots."""

    name: str
    help: str

    def cells(self, datasets, sizes) -> list[CellSpec]:
        """Cells for ``datasets`` x ``sizes`` (a tuple, or ``{dataset: sizes}`` with a
        ``"*"`` default), grouped by dataset."""
        out: list[CellSpec] = []
        for d in datasets:
            s = sizes.get(d, sizes.get("*", ())) if isinstance(sizes, dict) else sizes
            out += _CELLS[self.name](self.name, (d,), tuple(s))
        return out

    def summarize(self, rows: list[dict]) -> str:
        return _SUMMARY[self.name](rows)

    def plot(self, rows: list[dict], out: Path) -> list[Path]:
        return [p for p in _PLOTS[self.name](rows, out) if p is not None]

    # CLI --------------------------------------------------------------------
    def add_arguments(self, p) -> None:
        add_common_arguments(p)

    def run(self, args) -> int:
        return run_experiments([self], args)


def _gcn_scheme_variants() -> list[str]:
    from ..cost.gcn import GCN_SCHEMES

    return ["corgnn"] + [f"corgnn:{s.name}" for s in GCN_SCHEMES]


def _cells_gcn_layer(exp, datasets, sizes):
    for d in datasets:
        for ig in (False, True):
            for k in sizes:
                for v in _gcn_scheme_variants():
                    yield CellSpec(exp, d, "gcn-layer", v, k, input_grad=ig, loss="sum")


SPARSE_X = ("Cora", "CiteSeer")
"""Datasets whose (bag-of-words) features corgnn uses as a sparse matrix; the
``corgnn:dense-x`` ablation runs there too."""


def _cells_versus(model):
    def cells(exp, datasets, sizes):
        extra = ("pyg-fused",) if model == "gat" else ()
        for d in datasets:
            ablation = ("corgnn:dense-x",) if d in SPARSE_X else ()
            for h in sizes:
                for v in ("corgnn",) + ablation + PYG_VARIANTS + extra:
                    yield CellSpec(exp, d, model, v, h)

    return cells


def _cells_gat_caching(exp, datasets, sizes):
    for d in datasets:
        for h in sizes:
            for cache in GAT_CACHES:
                yield CellSpec(exp, d, "gat", f"corgnn:cache={cache}", h)


def _cells_formats(exp, datasets, sizes):
    for d in datasets:
        for h in sizes:
            for f in FORMATS:
                yield CellSpec(exp, d, "gcn", f"corgnn:format={f}", h)
        for h in sizes:
            for op in OPS:
                for f in FORMATS:
                    yield CellSpec(exp, d, op, f"format={f}", h, kind="op")


def _cells_memory(exp, datasets, sizes):
    for d in datasets:
        for ig in (False, True):
            for k in sizes:
                for v in _gcn_scheme_variants() + ["pyg-coo", "pyg-csr"]:
                    yield CellSpec(exp, d, "gcn-layer", v, k, input_grad=ig, loss="sum", kind="memory")


_CELLS = {
    "gcn-layer": _cells_gcn_layer,
    "gcn": _cells_versus("gcn"),
    "gat-caching": _cells_gat_caching,
    "gat": _cells_versus("gat"),
    "formats": _cells_formats,
    "memory": _cells_memory,
}


# ---------------------------------------------------------------------- summaries


def _missing_md(rows: list[dict], experiment: str) -> str:
    seen = {}
    for r in rows:
        if r["experiment"] == experiment and r["status"] == "missing":
            key = (r["dataset"], r["hidden"], r["variant"], r.get("input_grad"), r["model"])
            seen.setdefault(key, r["reason"])
    if not seen:
        return "Missing points: none.\n"
    body = [[d, h, v + (" (input grad)" if ig else ""), reason] for (d, h, v, ig, _), reason in seen.items()]
    return f"Missing points ({len(body)}):\n\n" + report.md_table(["dataset", "hidden", "variant", "reason"], body) + "\n"


def _grid(rows, experiment, value, *, phase="total", key=("dataset", "hidden"), **eq):
    """``{key tuple: {variant: value(row)}}`` for ok rows."""
    out = defaultdict(dict)
    for r in report.ok_rows(rows, experiment, phase, **eq):
        out[tuple(r[k] for k in key)][r["variant"]] = value(r)
    return out


def _ms(r):
    return r["median_ms"]


def _mb(r):
    return None if r["peak_mem_bytes"] in (None, "") else r["peak_mem_bytes"] / 2**20


def _summary_gcn_layer(rows):
    from ..cost.gcn import GCN_SCHEMES, plan_gcn

    exp = "gcn-layer"
    out = [
        "Total ms per step (forward + sum loss + backward) of each forced scheme and of `auto`. "
        "'auto picked fastest?' compares scheme names; when they differ it gives the forced time of auto's "
        "choice relative to the fastest forced scheme (how much the wrong pick costs, noise included). "
        "'auto / fastest' compares the measured auto run with the fastest forced run. "
        "Caching benefit (paper Fig. 'caching benefits'): the adaptive choice among the uncached schemes "
        "vs auto (with caching): time ratio, and peak-memory ratio when the `memory` experiment ran too (> 1: caching better)."
    ]
    schemes = [f"corgnn:{s.name}" for s in GCN_SCHEMES]
    for ig in (False, True):
        t = _grid(rows, exp, _ms, key=("hidden",), input_grad=ig)
        if not t:
            continue
        mem = _grid(rows, "memory", _mb, key=("hidden",), input_grad=ig)
        used = {r["hidden"]: r["scheme_used"] for r in report.ok_rows(rows, exp, "total", input_grad=ig, variant="corgnn")}
        shape = next(r for r in report.ok_rows(rows, exp, "total", input_grad=ig))
        body = []
        for (k,) in sorted(t):
            v = t[(k,)]
            forced = {sch: v[sch] for sch in schemes if sch in v}
            best = min(forced, key=forced.get) if forced else None
            auto = v.get("corgnn")
            # the adaptive choice without caching: the plan's pick among the uncached schemes
            nocache = "corgnn:" + plan_gcn(shape["n"], shape["q"], shape["m"], k, input_grad=ig, candidates=tuple(x for x in GCN_SCHEMES if not x.cache)).scheme.name
            m = mem.get((k,), {})
            body.append(
                [k]
                + [v.get(sch) for sch in schemes]
                + [
                    auto,
                    used.get(k, "-"),
                    (best or "-").removeprefix("corgnn:"),
                    _chosen_vs_best(forced, used.get(k), best),
                    (auto / forced[best]) if auto and best else None,
                    (v[nocache] / auto) if v.get(nocache) and auto else None,
                    (m[nocache] / m["corgnn"]) if m.get(nocache) and m.get("corgnn") else None,
                ]
            )
        header = ["k"] + [x.removeprefix("corgnn:") for x in schemes] + ["auto", "auto chose", "fastest forced", "auto picked fastest?", "auto / fastest", "caching: time gain", "caching: memory gain"]
        out.append(f"### Input gradient {'computed' if ig else 'not computed'} (n={shape['n']}, q={shape['q']}, m={shape['m']})\n\n" + report.md_table(header, body))
    out.append(_missing_md(rows, exp))
    return "\n\n".join(out)


def _chosen_vs_best(forced: dict, chosen: str | None, best: str | None) -> str:
    if not best or not chosen:
        return "-"
    if chosen == best.removeprefix("corgnn:"):
        return "yes"
    t = forced.get(f"corgnn:{chosen}")
    return f"no ({t / forced[best]:.2f}x)" if t else "no"


def _versus_md(rows, exp, baselines, label):
    table = report.speedup_table(rows, exp, "corgnn", baselines)
    parts = [f"Speedup of corgnn over the fastest {label} per cell (total = forward + loss + backward; > 1: corgnn faster):\n\n" + report.speedup_markdown(table, "PyG")]
    fwd = report.speedup_table(rows, exp, "corgnn", baselines, phase="fwd")
    if fwd:
        parts.append("Forward pass only:\n\n" + report.speedup_markdown(fwd, "PyG"))
    dense = report.speedup_table(rows, exp, "corgnn:dense-x", baselines)
    if dense:
        parts.append(
            "Ablation `corgnn:dense-x` (corgnn with the bag-of-words features used dense, as PyG uses them; "
            "separates the sparse-feature path from reordering and caching), speedup over the fastest PyG:\n\n"
            + report.speedup_markdown(dense, "PyG")
        )
    t = _grid(rows, exp, _ms)
    if t:
        variants = ["corgnn"] + [b for b in ("corgnn:dense-x",) + baselines if any(b in v for v in t.values())]
        used = {(r["dataset"], r["hidden"]): r["scheme_used"] for r in report.ok_rows(rows, exp, "total", variant="corgnn")}
        body = [[d, h] + [t[(d, h)].get(v) for v in variants] + [used.get((d, h), "-")] for d, h in sorted(t, key=lambda k: (_order(k[0]), k[1]))]
        parts.append("Median ms per training step:\n\n" + report.md_table(["dataset", "hidden"] + variants + ["corgnn schemes"], body))
        mem = _grid(rows, exp, _mb)
        body = [[d, h] + [mem[(d, h)].get(v) for v in variants] for d, h in sorted(mem, key=lambda k: (_order(k[0]), k[1]))]
        parts.append("Peak memory of a step (MiB, beyond inputs/parameters/graph):\n\n" + report.md_table(["dataset", "hidden"] + variants, body))
    comp = [(r["dataset"], r["hidden"], r["setup_s"]) for r in report.ok_rows(rows, exp, "total", variant="pyg-coo-compiled")]
    if comp:
        parts.append("torch.compile warm-up time (s, excluded from the timings): " + ", ".join(f"{d} h={h}: {s:.1f}" for d, h, s in comp))
    parts.append(_missing_md(rows, exp))
    return "\n\n".join(parts)


def _order(name: str) -> int:
    return next((i for i, c in enumerate(ALL5) if name.startswith(c)), 99)


def _summary_gcn(rows):
    return _versus_md(rows, "gcn", PYG_VARIANTS, "PyG GCN baseline")


def _summary_gat(rows):
    return _versus_md(rows, "gat", PYG_VARIANTS + ("pyg-fused",), "PyG GAT baseline")


def _cache_speedups(rows):
    """``{(dataset, cache): speedup of that scheme over cache=none}`` per hidden, and
    the geometric mean per (dataset, cache)."""
    t = _grid(rows, "gat-caching", _ms)
    per = {}
    for (d, h), v in t.items():
        base = v.get("corgnn:cache=none")
        for c in GAT_CACHES:
            if base and v.get(f"corgnn:cache={c}"):
                per[(d, h, c)] = base / v[f"corgnn:cache={c}"]
    return per


def _summary_gat_caching(rows):
    exp = "gat-caching"
    per = _cache_speedups(rows)
    parts = []
    if per:
        datasets = sorted({k[0] for k in per}, key=_order)
        body = [[d] + [geomean(s for (dd, _, c), s in per.items() if dd == d and c == cache) for cache in GAT_CACHES] for d in datasets]
        parts.append("Speedup of each caching scheme over no caching (geometric mean over hidden sizes; total step time):\n\n" + report.md_table(["dataset"] + list(GAT_CACHES), body))
    t = _grid(rows, exp, _ms)
    mem = _grid(rows, exp, _mb)
    if t:
        variants = [f"corgnn:cache={c}" for c in GAT_CACHES]
        body = [[d, h] + [t[(d, h)].get(v) for v in variants] + [mem.get((d, h), {}).get(v) for v in variants] for d, h in sorted(t, key=lambda k: (_order(k[0]), k[1]))]
        parts.append("Median ms per step, then peak MiB per step, per caching scheme:\n\n" + report.md_table(["dataset", "hidden"] + [f"{c} ms" for c in GAT_CACHES] + [f"{c} MiB" for c in GAT_CACHES], body))
    parts.append(_missing_md(rows, exp))
    return "\n\n".join(parts)


def _format_ratios(rows, model_filter):
    """``{(dataset, hidden, model, fmt): t_fmt / t_csc}`` (> 1: CSC faster)."""
    t = defaultdict(dict)
    for r in report.ok_rows(rows, "formats", None):
        if r["phase"] != ("fwd" if r["model"] in OPS else "total") or not model_filter(r["model"]):
            continue
        fmt = r["variant"].split("=", 1)[1]
        t[(r["dataset"], r["hidden"], r["model"])][fmt] = r["median_ms"]
    out = {}
    for (d, h, mdl), v in t.items():
        if "csc" in v:
            for f, ms in v.items():
                out[(d, h, mdl, f)] = ms / v["csc"]
    return out


def _summary_formats(rows):
    ratios = _format_ratios(rows, lambda m: True)
    parts = []
    if ratios:
        keys = sorted({k[:3] for k in ratios}, key=lambda k: (k[2] != "gcn", k[2], _order(k[0]), k[1]))
        body = [[mdl, d, h] + [ratios.get((d, h, mdl, f)) for f in FORMATS] for d, h, mdl in keys]
        gm = [["geomean", "", ""] + [geomean(v for k, v in ratios.items() if k[3] == f) for f in FORMATS]]
        parts.append(
            "Runtime relative to CSC (> 1: CSC faster; GCN rows: full training step, op rows: one product with `hidden` columns):\n\n"
            + report.md_table(["model/op", "dataset", "hidden"] + list(FORMATS), body + gm)
        )
    parts.append(_missing_md(rows, "formats"))
    return "\n\n".join(parts)


def _summary_memory(rows):
    exp = "memory"
    parts = []
    for ig in (False, True):
        mem = _grid(rows, exp, _mb, key=("hidden",), input_grad=ig)
        if not mem:
            continue
        variants = sorted({v for d in mem.values() for v in d}, key=lambda v: (not v.startswith("corgnn"), v))
        body = [[k] + [mem[(k,)].get(v) for v in variants] for (k,) in sorted(mem)]
        parts.append(f"### Peak MiB of one GCN layer step, input gradient {'computed' if ig else 'not computed'}\n\n" + report.md_table(["k"] + [v.removeprefix("corgnn:") for v in variants], body))
    parts.append(_missing_md(rows, exp))
    return "\n\n".join(parts)


_SUMMARY = {
    "gcn-layer": _summary_gcn_layer,
    "gcn": _summary_gcn,
    "gat-caching": _summary_gat_caching,
    "gat": _summary_gat,
    "formats": _summary_formats,
    "memory": _summary_memory,
}


# ------------------------------------------------------------------------- plots


def _lines(rows, exp, value, *, panel_key, variants=None):
    series = defaultdict(lambda: defaultdict(list))
    for r in report.ok_rows(rows, exp, "total"):
        if variants is not None and r["variant"] not in variants:
            continue
        y = value(r)
        if y is not None and math.isfinite(y):
            series[r[panel_key]][r["variant"].removeprefix("corgnn:") if r["variant"] != "corgnn" else "corgnn (auto)"].append((r["hidden"], y))
    return series


def _plots_gcn_layer(rows, out):
    grad_title = {False: "no input gradient", True: "with input gradient"}
    yield report.plot_lines(_lines(rows, "gcn-layer", _ms, panel_key="input_grad"), out / "gcn_layer_schemes.png", title="Single GCN layer on OGB-Arxiv: total step time per scheme", xlabel="output features k", ylabel="ms / step", panels=grad_title)
    yield report.plot_stacked(
        rows, out / "gcn_layer_bars.png", experiment="gcn-layer", facet="input_grad", group="hidden", variants=_gcn_scheme_variants(),
        title="Single GCN layer on OGB-Arxiv per scheme", facet_titles=grad_title, xlabel="output features k",
    )


def _plots_versus(exp, baselines, model):
    def plots(rows, out):
        table = report.speedup_table(rows, exp, "corgnn", baselines)
        yield report.plot_speedup(table, out / f"{exp}_speedup.png", title=f"{model}: corgnn speedup over the fastest PyG baseline (geomean in black)")
        variants = ["corgnn"] + [v for v in ("corgnn:dense-x",) if any(r["variant"] == v for r in rows)] + list(baselines)
        yield report.plot_stacked(rows, out / f"{exp}_runtime.png", experiment=exp, facet="dataset", group="hidden", variants=variants, title=f"{model} runtime per step", facet_values=sorted({r["dataset"] for r in rows if r["experiment"] == exp}, key=_order))

    return plots


def _plots_gat_caching(rows, out):
    per = _cache_speedups(rows)
    gm = defaultdict(list)
    for (d, h, c), s in per.items():
        gm[(d, c)].append(s)
    table = {(d, c): (geomean(v), "", math.nan, math.nan) for (d, c), v in gm.items()}
    yield report.plot_speedup(table, out / "gat_caching_speedup.png", title="GAT caching schemes: speedup over no caching (geomean over hidden sizes)", ylabel="speedup over cache=none", legend_title="cache")
    datasets = sorted({r["dataset"] for r in rows if r["experiment"] == "gat-caching"}, key=_order)
    big = datasets[-1:] if datasets else []
    mem_rows = [r for r in rows if r["dataset"] in big]
    yield report.plot_lines(_lines(mem_rows, "gat-caching", _mb, panel_key="dataset"), out / "gat_caching_memory.png", title="GAT memory per caching scheme", xlabel="hidden per head", ylabel="peak MiB / step")
    yield report.plot_stacked(rows, out / "gat_caching_runtime.png", experiment="gat-caching", facet="dataset", group="hidden", variants=[f"corgnn:cache={c}" for c in GAT_CACHES], title="GAT runtime per caching scheme", facet_values=datasets)


def _plots_formats(rows, out):
    ratios = _format_ratios(rows, lambda m: m == "gcn")
    table = {(d, h): (r, "", math.nan, math.nan) for (d, h, _, f), r in ratios.items() if f == "coo"}
    yield report.plot_speedup(table, out / "formats_coo_vs_csc.png", title="GCN: runtime with COO relative to CSC (> 1: CSC faster; geomean in black)", ylabel="t(COO) / t(CSC)")
    yield report.plot_stacked(rows, out / "formats_runtime.png", experiment="formats", facet="dataset", group="hidden", variants=[f"corgnn:format={f}" for f in FORMATS], title="GCN runtime per sparse format", facet_values=sorted({r["dataset"] for r in rows if r["experiment"] == "formats"}, key=_order))


def _plots_memory(rows, out):
    yield report.plot_lines(_lines(rows, "memory", _mb, panel_key="input_grad"), out / "memory_gcn_layer.png", title="Single GCN layer on OGB-Arxiv: peak memory per step", xlabel="output features k", ylabel="peak MiB / step", panels={False: "no input gradient", True: "with input gradient"})


_PLOTS = {
    "gcn-layer": _plots_gcn_layer,
    "gcn": _plots_versus("gcn", PYG_VARIANTS, "2-layer GCN"),
    "gat-caching": _plots_gat_caching,
    "gat": _plots_versus("gat", PYG_VARIANTS + ("pyg-fused",), "2-layer 8-head GAT"),
    "formats": _plots_formats,
    "memory": _plots_memory,
}

EXPERIMENTS = {
    "gcn-layer": Experiment("gcn-layer", "single GCN layer on OGB-Arxiv: every scheme vs output size, auto vs fastest"),
    "gcn": Experiment("gcn", "2-layer GCN vs PyG (COO, CSR, compiled) on the five datasets"),
    "gat-caching": Experiment("gat-caching", "2-layer 8-head GAT: time and memory of the four caching schemes"),
    "gat": Experiment("gat", "2-layer 8-head GAT vs PyG (COO, CSR, compiled, dgNN fused)"),
    "formats": Experiment("formats", "GCN and SpMM/SDDMM in every sparse format, relative to CSC"),
    "memory": Experiment("memory", "peak memory of one GCN layer per scheme and for PyG"),
}


class _All:
    """``corgnn bench all``: every experiment into one directory."""

    name = "all"
    help = "run every experiment (gcn-layer, gcn, gat-caching, gat, formats, memory)"

    def add_arguments(self, p) -> None:
        add_common_arguments(p)

    def run(self, args) -> int:
        return run_experiments(list(EXPERIMENTS.values()), args)


ALL = _All()


class _Report:
    """``corgnn bench report DIR``: rewrite ``summary.md`` and the plots of a finished
    (or interrupted) run from its ``results.json``, without measuring anything."""

    name = "report"
    help = "rebuild summary.md and plots from a run directory's results.json"

    def add_arguments(self, p) -> None:
        p.add_argument("dir", type=Path, help="run directory holding results.json")

    def run(self, args) -> int:
        rows, meta = report.read_results(args.dir)
        experiments = [EXPERIMENTS[name] for name in meta.get("experiments", []) if name in EXPERIMENTS]
        for path in write_report(experiments, rows, meta, args.dir):
            print(path)
        return 0


REPORT = _Report()


# ---------------------------------------------------------------------- CLI + run


def add_common_arguments(p) -> None:
    """Options shared by every experiment."""
    import argparse

    p.add_argument("--quick", action="store_true", help="small grid and fewer repetitions: a few minutes on 2 cores")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: tiny synthetic graphs
    p.add_argument("--out", type=Path, default=None, help="output directory (default benchmarks/results/<experiment>-<preset>-<time>)")
    p.add_argument("--datasets", type=_csv_list, default=None, help="comma-separated dataset names overriding the preset's")
    p.add_argument("--sizes", type=_csv_ints, default=None, help="comma-separated hidden/output sizes overriding the preset's")
    p.add_argument("--variants", type=_csv_list, default=None, help="only run these variants (e.g. corgnn,pyg-csr)")
    p.add_argument("--root", default=None, help="data root with the real dataset files (default search: see corgnn.datasets)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic stand-ins, parameters' targets (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch and Numba CPU threads (default: their defaults, all cores)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps per cell (preset: 1; compiled models 3)")
    p.add_argument("--min-reps", type=int, default=None, help="fewest timed steps per cell")
    p.add_argument("--max-reps", type=int, default=None, help="most timed steps per cell")
    p.add_argument("--budget-s", type=float, default=None, help="seconds of timed steps per cell once --min-reps are done")
    p.add_argument("--no-memory", action="store_true", help="skip the profiled peak-memory step")
    p.add_argument("--slow-step-s", type=float, default=None, help="time variants slower than this (s per warm-up step) once (preset: full 8, quick 4)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline (recorded as missing)")
    p.add_argument("--compile-timeout", type=float, default=300.0, help="seconds allowed for torch.compile's warm-up steps (default 300)")
    p.add_argument("--mem-cap-gb", type=float, default=None, help="skip cells estimated to allocate more (default: half the available RAM, <= 12)")
    p.add_argument("--deadline-min", type=float, default=None, help="record the cells not started after this many minutes as missing (default: no deadline)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _csv_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _csv_ints(s: str) -> list[int]:
    import argparse

    try:
        v = [int(x) for x in _csv_list(s)]
    except ValueError:
        v = []
    if not v or min(v) <= 0:
        raise argparse.ArgumentTypeError(f"--sizes must be comma-separated positive integers, got {s!r}")
    return v


def _preset_name(args) -> str:
    if args.tiny:
        return "tiny"
    return "quick" if args.quick else "full"


def plan_cells(experiments, args, preset: Preset) -> list[CellSpec]:
    """Every cell the run will measure, in order."""
    from ..datasets import canonical_name

    cells = []
    for e in experiments:
        datasets, sizes = preset.grids[e.name]
        if args.datasets:
            datasets = tuple(canonical_name(d) for d in args.datasets)
        if args.sizes:
            sizes = tuple(args.sizes)
        for c in e.cells(datasets, sizes):
            if args.variants and c.variant not in args.variants and not (c.kind == "op" and "ops" in args.variants):
                continue
            cells.append(c)
    return cells


def write_report(experiments, rows, meta, out: Path) -> list[Path]:
    """``results.csv``/``results.json``, ``summary.md`` and the plots under ``out``."""
    paths = list(report.write_results(rows, out, meta))
    m = meta["machine"]
    head = [
        f"# corgnn benchmark: {', '.join(e.name for e in experiments)} ({meta['preset']} run)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, numba threads {m['numba_threads']}; "
        f"torch {m['torch']}, PyG {m['pyg']}, numba {m['numba']}; device {m['device']} {m['gpu']}".rstrip(),
        f"Settings: {meta['settings']}; wall time {meta.get('wall_s', math.nan) / 60:.1f} min.",
        "",
        "Datasets marked *(synthetic)* are seeded stand-ins with Table 5's shape (corgnn.datasets.synthetic), not the real graphs.",
        "Times are medians per training step (spread = IQR in results.csv); memory is the peak a step allocates beyond inputs, parameters and cached graph structures.",
    ]
    ds = {}
    for r in rows:
        ds.setdefault(r["dataset"], (r["n"], r["q"], r["m"], r["synthetic"]))
    if ds:
        head += ["", report.md_table(["dataset", "n", "q (edges, coalesced)", "m", "synthetic"], [[d, n, q, m, "yes" if s else "no"] for d, (n, q, m, s) in sorted(ds.items(), key=lambda kv: _order(kv[0]))])]
    body = [f"\n## {e.name}\n\n{e.summarize(rows)}" for e in experiments]
    for e in experiments:
        try:
            paths += e.plot(rows, out)
        except Exception as ex:  # noqa: BLE001 - a plot failing must not lose the results
            body.append(f"\n(plotting {e.name} failed: {type(ex).__name__}: {ex})")
    pngs = [p.name for p in paths if p.suffix == ".png"]
    if pngs:
        body.append("\n## Plots\n\n" + "\n".join(f"![{p}]({p})" for p in pngs))
    (out / "summary.md").write_text("\n".join(head + body) + "\n")
    paths.append(out / "summary.md")
    return paths


def run_experiments(experiments, args) -> int:
    """Plan, run (with a progress bar), and write results, summary and plots."""
    from tqdm.auto import tqdm

    preset = PRESETS[_preset_name(args)]
    runner = Runner(args, preset)
    cells = plan_cells(experiments, args, preset)
    name = "all" if len(experiments) > 1 else experiments[0].name
    out = args.out or Path("benchmarks") / "results" / f"{name}-{preset.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    custom = bool(args.datasets or args.sizes or args.variants)
    expected = sum(EXPECTED_MIN.get((e.name, preset.name), math.nan) for e in experiments)
    note = "custom grid: no estimate" if custom or not math.isfinite(expected) else f"expected about {expected + 0.5:.0f} min on an idle 2-core machine (estimate, see benchmarks/README.md)"
    print(f"corgnn bench {name} ({preset.name}): {len(cells)} cells, {note}; writing to {out}", file=sys.stderr, flush=True)
    meta = {"experiments": [e.name for e in experiments], "preset": preset.name, "settings": runner.settings.__dict__ | {"compile_warmup": preset.compile_warmup, "mem_cap_bytes": runner.mem_cap}, "machine": runner.machine}
    # NOTE: move everything alive now (torch, dynamo, PyG modules...) to the permanent
    # generation so the per-cell gc.collect() scans only what the cells create
    # (a full collection otherwise costs ~0.3 s here).
    gc.freeze()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # PyG's torch.sparse CSR path warns on every adjacency it builds; nothing to act on
            warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
            warnings.filterwarnings("ignore", message=".*Sparse invariant checks are implicitly disabled.*")
            with tqdm(total=len(cells), disable=args.no_progress, unit="cell", dynamic_ncols=True, file=sys.stderr) as bar:
                for group in order_groups(group_cells(cells)):
                    c = group[0]
                    bar.set_postfix_str(f"{c.experiment} {c.dataset} {c.model} h={c.hidden}" + (" +dx" if c.input_grad else ""), refresh=True)
                    runner.run_group(group)
                    bar.update(len(group))
    finally:
        meta["wall_s"] = time.perf_counter() - start
        write_report(experiments, runner.rows, meta, out)
    print(f"wrote {out}/results.csv, results.json, summary.md and plots ({meta['wall_s'] / 60:.1f} min)", file=sys.stderr)
    return 0


EXPECTED_MIN: dict = {
    ("gcn-layer", "full"): 2.8,
    ("gcn", "full"): 8.8,
    ("gat-caching", "full"): 3.0,
    ("gat", "full"): 9.1,
    ("formats", "full"): 0.9,
    ("memory", "full"): 1.2,
    ("gcn-layer", "quick"): 0.5,
    ("gcn", "quick"): 2.0,
    ("gat-caching", "quick"): 0.2,
    ("gat", "quick"): 1.9,
    ("formats", "quick"): 0.1,
    ("memory", "quick"): 0.4,
}
"""Expected wall minutes per (experiment, preset) with 2 threads on an otherwise idle
2-core machine (plus about half a minute of imports, dataset generation and plots
per run): per-cell step times and compile times measured on a 2-core AMD EPYC VM
(2 threads, some background load; 1-thread points scaled by 1/1.6), summed over the
grid with the preset's warm-up, memory and repetition rules, times 1.06 (the ratio
of measured to estimated wall time of the quick run); see benchmarks/README.md."""
