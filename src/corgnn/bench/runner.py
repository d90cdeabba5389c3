"""Plans, runs and reports any list of :class:`~corgnn.bench.spec.ExperimentSpec`.

* :func:`plan_cells` - every cell of a run, from the specs' grids (or the
  ``--datasets``/``--sizes``/``--variants`` overrides);
* :class:`Runner` - measures one comparison group at a time (same experiment,
  dataset and size, one variant each), turning every failure into a missing point;
  a spec's ``measure`` hook, where it has one, measures the group instead and
  records its rows through :meth:`Runner.record`;
* :func:`run_experiments` - the whole run with a progress bar, then
  :func:`write_report`: ``results.csv``/``results.json``, ``summary.md`` (a header,
  then each spec's ``summary``) and each spec's ``plots``;
* :func:`add_common_arguments` - the options every experiment subcommand takes.

Nothing here knows a particular experiment. Methodology: :mod:`corgnn.bench.harness`
and ``benchmarks/README.md``.
"""

from __future__ import annotations

import gc
import math
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from . import report
from .baselines import ATTENTION_MODELS, GAT_HEADS, GraphData, Unavailable, build, estimate_step_bytes, family
from .harness import StepTimeout, TrainStep, default_mem_cap, machine_info, time_interleaved, warm_up
from .spec import OPS, PRESETS, TINY_SHAPE, CellSpec, ExperimentSpec, Preset

__all__ = ["Runner", "plan_cells", "group_cells", "order_groups", "run_experiments", "write_report", "rebuild_report", "add_common_arguments"]


class Runner:
    """Runs cells, turning every failure into a missing point with its reason.

    Args:
        args: the parsed options of :func:`add_common_arguments`.
        preset: the run's preset (settings; ``--warmup`` etc. override them).
        experiments: the specs being run (their ``memory`` flags apply).
    """

    def __init__(self, args, preset: Preset, experiments=()):
        self.args = args
        self.preset = preset
        self.no_memory = {e.name for e in experiments if not e.memory}
        self.hooks = {e.name: e.measure for e in experiments if e.measure is not None}
        self.shared: dict = {}
        """Scratch space of the specs' ``measure`` hooks for the run (e.g. loaded graphs)."""
        s = preset.settings
        over = {k: getattr(args, k) for k in ("warmup", "min_reps", "max_reps", "budget_s", "slow_step_s") if getattr(args, k, None) is not None}
        if getattr(args, "no_memory", False):
            over["memory"] = False
        if over.get("min_reps") is not None and over.get("max_reps") is None:
            over["max_reps"] = max(s.max_reps, over["min_reps"])
        self.settings = replace(s, **over)
        if getattr(args, "threads", None):
            import numba

            # NOTE: Numba first: launching its OpenMP threading layer (on the first
            # set_num_threads or parallel kernel) resets the OpenMP thread count that
            # torch shares, so a torch setting made before it would be lost.
            numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
            torch.set_num_threads(args.threads)
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
        self.machine = machine_info(self.device)
        self.mem_cap = int(args.mem_cap_gb * 2**30) if args.mem_cap_gb else default_mem_cap()
        self.rows: list[dict] = []
        self._data: dict[str, GraphData] = {}
        minutes = getattr(args, "deadline_min", None)
        self.deadline = time.perf_counter() + 60 * minutes if minutes else None

    # datasets ---------------------------------------------------------------
    def graph(self, name: str):
        """The PyG ``Data`` of dataset ``name`` for this run, cached: the real graph
        when found, else the synthetic stand-in (:func:`corgnn.datasets.load_dataset`);
        under ``--tiny`` a :data:`~corgnn.bench.spec.TINY_SHAPE` stand-in named
        ``"<Name> (synthetic, tiny)"``."""
        from ..datasets import canonical_name, load_dataset, synthetic

        canon = canonical_name(name)
        key = ("data", canon)
        if key not in self.shared:
            if self.preset.name == "tiny":
                data = synthetic(canon, self.args.seed, **TINY_SHAPE)
                data.name = f"{canon} (synthetic, tiny)"
            else:
                data = load_dataset(canon, self.args.root, self.args.seed)
            self.shared[key] = data
        return self.shared[key]

    def dataset(self, name: str) -> GraphData:
        """:meth:`graph` as the runner's models take it (a cached ``GraphData``)."""
        from ..datasets import canonical_name

        canon = canonical_name(name)
        g = self._data.get(canon)
        if g is None:
            g = self._data[canon] = GraphData.from_pyg(self.graph(canon), self.device)
        return g

    # one cell ---------------------------------------------------------------
    def record(self, c: CellSpec, phase: str, **fields) -> None:
        """Append one result row (:data:`~corgnn.bench.report.COLUMNS`) of cell ``c``.

        The cell's fields (experiment, dataset, model, variant, family, hidden,
        batch, input_grad), the machine and ``phase`` are filled in; ``fields``
        gives the rest (``n``, ``q``, ``m``, ``out``, ``median_ms``, ``status``...;
        ``dataset`` and ``heads`` may override the cell's). Columns not given are
        left empty.
        """
        row = dict.fromkeys(report.COLUMNS)
        row.update(
            experiment=c.experiment,
            dataset=c.dataset,
            hidden=c.hidden,
            heads=1,
            model=c.model,
            variant=c.variant,
            family=family(c.variant),
            input_grad=c.input_grad,
            batch=c.batch,
            reason="",
            scheme_used="",
        )
        row.update(self.machine)
        row.update(fields, phase=phase)
        self.rows.append(row)

    def _row(self, c: CellSpec, g: GraphData, phase: str, **result) -> None:
        """:meth:`record` with the shape of graph ``g``."""
        out = c.hidden if c.model in ("gcn-layer",) + OPS else g.num_classes
        self.record(c, phase, dataset=g.name, synthetic=g.synthetic, n=g.n, q=g.q, m=g.m, out=out, heads=GAT_HEADS if c.model in ATTENTION_MODELS else 1, **result)

    def _missing(self, c: CellSpec, g: GraphData, reason: str) -> None:
        for phase in self._phases(c):
            self._row(c, g, phase, median_ms=math.nan, spread_ms=math.nan, reps=0, peak_mem_bytes=None, setup_s=math.nan, status="missing", reason=reason, scheme_used="")

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
        elif c.experiment in self.no_memory:
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
        hook = self.hooks.get(cells[0].experiment)
        if hook is not None:
            return self._run_hook(hook, cells)
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
                    self._row(c, g, phase, median_ms=t.median(phase), spread_ms=t.spread(phase), reps=t.reps, peak_mem_bytes=t.peak_mem_bytes, setup_s=t.setup_s(), status="ok", reason="", scheme_used=used)
        finally:
            ready.clear()
            if any(c.variant.endswith("-compiled") for c in cells):
                torch._dynamo.reset()
            gc.collect()  # cheap: run_experiments froze the long-lived objects (gc.freeze)


    def _run_hook(self, hook, cells: list[CellSpec]) -> None:
        """A spec's own ``measure`` hook on one group; a deadline passed or an
        exception makes the group's cells (those without rows yet) missing points."""
        reason = None
        if self.deadline is not None and time.perf_counter() > self.deadline:
            reason = f"skipped: the run passed its --deadline-min of {self.args.deadline_min:g} min"
        else:
            start = len(self.rows)
            try:
                hook(cells, self)
            except Exception as e:  # noqa: BLE001 - a failing group is a missing point, the run goes on
                reason = self._failure(e, False)
                done = {(r["model"], r["variant"]) for r in self.rows[start:]}
                cells = [c for c in cells if (c.model, c.variant) not in done]
            finally:
                gc.collect()
        if reason is not None:
            for c in cells:
                self.record(c, "total", median_ms=math.nan, spread_ms=math.nan, reps=0, setup_s=math.nan, status="missing", reason=reason)


def plan_cells(experiments: list[ExperimentSpec], args, preset: Preset) -> list[CellSpec]:
    """Every cell the run will measure, in order: each spec's grid for ``preset``,
    with ``args.datasets`` / ``args.sizes`` replacing its datasets / sizes and only the
    ``args.variants`` kept (``"ops"`` keeps the op cells), where given."""
    from ..datasets import canonical_name

    cells = []
    for e in experiments:
        datasets, sizes = e.grids[preset.name]
        if args.datasets:
            own = {d.lower(): d for grid in e.grids.values() for d in grid[0]}  # names of its own (e.g. "molecules")
            datasets = tuple(own.get(d.lower()) or canonical_name(d) for d in args.datasets)
        if args.sizes:
            sizes = tuple(args.sizes)
        for c in e.plan(datasets, sizes):
            if args.variants and c.variant not in args.variants and not (c.kind == "op" and "ops" in args.variants):
                continue
            cells.append(c)
    return cells


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


def order_groups(groups: list[list[CellSpec]]) -> list[list[CellSpec]]:
    """Groups from the smallest graph and size to the largest (Table 5's order, then
    hidden size; stable otherwise), so a ``--deadline-min`` cuts the most expensive
    cells, across all experiments, rather than whole experiments."""
    return sorted(groups, key=lambda grp: (report.dataset_rank(grp[0].dataset), grp[0].hidden))


def _caused_by(e: BaseException, kind: type) -> BaseException | None:
    """``e`` or the first exception of type ``kind`` in its cause/context chain."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _scheme_used(mod) -> str:
    """corgnn's per-layer choice on the last call ('' for PyG)."""
    if mod is None:
        return ""
    if hasattr(mod, "schemes") and callable(mod.schemes):
        return "|".join(str(s) for s in mod.schemes())
    # a layer's plan, or those of corgnn layers inside a model (a PyG model after optimize)
    plans = [m.last_plan for m in mod.modules() if getattr(m, "last_plan", None) is not None]
    return "|".join(getattr(getattr(p, "scheme", p), "name", str(getattr(p, "scheme", ""))) for p in plans)


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


# ---------------------------------------------------------------------- CLI + run


def add_common_arguments(p) -> None:
    """Options shared by every experiment (and ``all``)."""
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


def write_report(experiments: list[ExperimentSpec], rows: list[dict], meta: dict, out: Path) -> list[Path]:
    """``results.csv``/``results.json``, ``summary.md`` and the plots under ``out``."""
    paths = list(report.write_results(rows, out, meta))
    m = meta["machine"]
    head = [
        f"# corgnn benchmark: {', '.join(e.name for e in experiments)} ({meta['preset']} run)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, numba threads {m['numba_threads']}; "
        f"torch {m['torch']}, PyG {m['pyg']}, numba {m['numba']}; CPU allocator {m.get('allocator', 'default')} (corgnn.runtime, all variants alike); "
        f"device {m['device']} {m['gpu']}".rstrip(),
        f"Settings: {meta['settings']}; wall time {meta.get('wall_s', math.nan) / 60:.1f} min.",
        "",
        "Datasets marked *(synthetic)* are seeded stand-ins with Table 5's shape (corgnn.datasets.synthetic; Random-20k: corgnn.datasets.STANDINS), not the real graphs; "
        "*PubMed (real graph, synthetic features)* is PubMed's real citation graph with seeded synthetic features and labels (corgnn.datasets.load_pubmed_graph).",
        "Times are medians per training step (spread = IQR in results.csv); memory is the peak a step allocates beyond inputs, parameters and cached graph structures.",
    ]
    ds = {}
    for r in rows:
        ds.setdefault(r["dataset"], (r["n"], r["q"], r["m"], r["synthetic"]))
    if ds:
        table = [[d, n, q, m, "yes" if s else "no"] for d, (n, q, m, s) in sorted(ds.items(), key=lambda kv: report.dataset_rank(kv[0]))]
        head += ["", report.md_table(["dataset", "n", "q (edges, coalesced)", "m", "synthetic"], table)]
    body = [f"\n## {e.name}\n\n{e.summary(rows)}" for e in experiments]
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


def rebuild_report(registry: list[ExperimentSpec], args) -> int:
    """``corgnn bench report DIR``: rewrite ``summary.md`` and the plots of a finished
    (or interrupted) run from ``args.dir``'s ``results.json``, measuring nothing; the
    run's experiments are looked up by name in ``registry``."""
    rows, meta = report.read_results(args.dir)
    by_name = {e.name: e for e in registry}
    experiments = [by_name[name] for name in meta.get("experiments", []) if name in by_name]
    for path in write_report(experiments, rows, meta, args.dir):
        print(path)
    return 0


def run_experiments(experiments: list[ExperimentSpec], args) -> int:
    """Plan, run (with a progress bar), and write results, summary and plots."""
    from tqdm.auto import tqdm

    preset = PRESETS[_preset_name(args)]
    runner = Runner(args, preset, experiments)
    cells = plan_cells(experiments, args, preset)
    name = "all" if len(experiments) > 1 else experiments[0].name
    out = args.out or Path("benchmarks") / "results" / f"{name}-{preset.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    custom = bool(args.datasets or args.sizes or args.variants)
    expected = sum(e.expected_min.get(preset.name, math.nan) for e in experiments)
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
