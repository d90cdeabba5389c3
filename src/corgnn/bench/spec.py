"""What a ``corgnn bench`` experiment is, as data.

* :class:`ExperimentSpec` - one experiment: its name and help, the cells it measures,
  its section of ``summary.md``, its plots, and its grid per preset. Each experiment
  module under :mod:`corgnn.bench.experiments` defines one (``SPEC``); the registry
  :data:`corgnn.bench.experiments.EXPERIMENTS` lists them.
* :class:`CellSpec` - one measurement (a variant at a dataset and size).
* :class:`Preset` / :data:`PRESETS` - the repetition settings of ``--tiny``,
  ``--quick`` and the full run; an experiment's ``grids`` are keyed by these names.

Nothing here measures anything: :mod:`corgnn.bench.runner` plans and runs the cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .harness import Settings

__all__ = ["CellSpec", "ExperimentSpec", "Preset", "PRESETS", "TINY_SHAPE", "OPS", "Sizes", "Grid"]

OPS = ("spmm", "spmm_t", "sddmm")
"""Sparse products an ``"op"`` cell can time (its ``model``): SpMM ``A' B``, transposed
SpMM ``A'^T B`` and SDDMM ``A' ⊙ (B C^T)``."""

Sizes = tuple[int, ...] | Mapping[str, tuple[int, ...]]
"""Hidden (or output) sizes of a grid: one tuple for every dataset, or
``{dataset: sizes, "*": default}``."""

Grid = tuple[tuple[str, ...], Sizes]
"""``(datasets, sizes)``: dataset names (Table 5's spelling) and their sizes."""


@dataclass(frozen=True)
class CellSpec:
    """One measurement to make.

    Attributes:
        model: ``"gcn"`` (2-layer GCN), ``"gat"`` (2-layer 8-head GAT), ``"gcn-layer"``
            (one GCN layer ``m -> hidden``) or, for ``kind="op"``, one of :data:`OPS`.
        variant: what is measured (see :mod:`corgnn.bench.baselines`); for op cells
            ``"format=<fmt>"``, the adjacency's sparse format.
        hidden: hidden width (per head for GAT; the output width ``k`` of a single
            layer; the dense operand's column count of an op).
        input_grad: whether the step also computes the gradient of the input
            features ``x (n, m)``.
        loss: ``"mse"`` (full networks) or ``"sum"`` (single layers), see
            :class:`~corgnn.bench.harness.TrainStep`.
        kind: ``"step"`` (timed training step + memory), ``"memory"`` (memory only)
            or ``"op"`` (one sparse product, forward only).
        batch: graphs per mini-batch or seed nodes per sampled batch (0: the cell
            runs on the whole graph); what an experiment with a ``measure`` hook
            varies instead of ``hidden``.
        experiment, dataset: filled in by :meth:`ExperimentSpec.plan`.
    """

    model: str
    variant: str
    hidden: int
    input_grad: bool = False
    loss: str = "mse"
    kind: str = "step"
    batch: int = 0
    experiment: str = ""
    dataset: str = ""


@dataclass(frozen=True, eq=False)
class ExperimentSpec:
    """One ``corgnn bench`` experiment, declared in one place.

    Attributes:
        name: the subcommand (``corgnn bench NAME``) and the ``experiment`` column.
        help: one-line help of the subcommand.
        cells: ``cells(dataset, sizes) -> iterable of CellSpec``: the cells of one
            dataset at the given sizes, in measuring order (``experiment`` and
            ``dataset`` are left empty; :meth:`plan` fills them in).
        summary: ``summary(rows) -> str``: the experiment's Markdown section of
            ``summary.md`` from all result rows of the run (dicts with the
            :data:`~corgnn.bench.report.COLUMNS`; other experiments' rows included,
            so one section may use another experiment's measurements).
        plots: ``plots(rows, out_dir) -> iterable of Path | None``: writes the PNG
            plots under ``out_dir``; None for a plot without data.
        grids: ``{preset name: (datasets, sizes)}`` for every preset of
            :data:`PRESETS` (``"full"``, ``"quick"``, ``"tiny"``); see :data:`Grid`.
        expected_min: ``{preset name: minutes}``, the expected wall time of the
            experiment's cells on an idle 2-core machine with 2 threads (estimate
            printed before a run; see ``benchmarks/README.md``); absent = unknown.
        memory: whether its steps also measure peak memory (one extra profiled step
            per cell); the ``kind="memory"`` cells always do.
        measure: runner hook, None for the runner's own measurement (a
            :class:`~corgnn.bench.harness.TrainStep` of a model of
            :mod:`corgnn.bench.baselines` on one fixed graph). Otherwise
            ``measure(cells, runner)`` measures one comparison group itself (cells
            that differ only in ``variant``; datasets, models and steps of its own
            choosing) and records one or more rows per cell with
            :meth:`~corgnn.bench.runner.Runner.record` (``runner.settings``,
            ``runner.preset``, ``runner.args`` and ``runner.shared`` are there for
            it); an exception it raises makes the group's cells missing points.
    """

    name: str
    help: str
    cells: Callable[[str, tuple[int, ...]], Iterable[CellSpec]]
    summary: Callable[[list[dict]], str]
    plots: Callable[[list[dict], Path], Iterable[Path | None]]
    grids: Mapping[str, Grid]
    expected_min: Mapping[str, float] = field(default_factory=dict)
    memory: bool = True
    measure: Callable[[list[CellSpec], object], None] | None = None

    def plan(self, datasets: Iterable[str], sizes: Sizes) -> list[CellSpec]:
        """Cells for ``datasets`` x ``sizes``, grouped by dataset."""
        out: list[CellSpec] = []
        for d in datasets:
            s = sizes.get(d, sizes.get("*", ())) if isinstance(sizes, Mapping) else sizes
            out += [replace(c, experiment=self.name, dataset=d) for c in self.cells(d, tuple(s))]
        return out

    def plot(self, rows: list[dict], out: Path) -> list[Path]:
        """The plots written under ``out`` (those without data are left out)."""
        return [p for p in self.plots(rows, out) if p is not None]


@dataclass(frozen=True)
class Preset:
    """Repetition settings of a run size (``--tiny``, ``--quick``, default full).

    Attributes:
        name: ``"full"``, ``"quick"`` or ``"tiny"``; selects each experiment's grid.
        settings: warm-up, repetitions and time budget per cell.
        compile_warmup: warm-up steps of ``torch.compile``d variants (at least).
    """

    name: str
    settings: Settings
    compile_warmup: int = 2


# NOTE: the full settings and grids are trimmed to fit ~25-30 minutes on 2 CPU cores
# (measured costs and what was left out are in benchmarks/README.md; each
# experiment's grid says what it trims). Cells whose estimated memory exceeds
# --mem-cap-gb are recorded as missing points, not run; variants slower than 8 s a
# step are timed once.
PRESETS = {
    "full": Preset("full", Settings(warmup=1, min_reps=3, max_reps=20, budget_s=1.0, slow_step_s=8.0)),
    "quick": Preset("quick", Settings(warmup=1, min_reps=2, max_reps=10, budget_s=0.3, slow_step_s=3.0)),
    "tiny": Preset("tiny", Settings(warmup=1, min_reps=1, max_reps=1, budget_s=0.0)),
}
"""The presets by name: ``full`` (default), ``quick`` (a few minutes on 2 cores) and
``tiny`` (the hidden ``--tiny``, for tests: every dataset is a :data:`TINY_SHAPE`
synthetic graph)."""

TINY_SHAPE = dict(nodes=120, edges=480, features=16)
"""Graph shape of every dataset under ``--tiny`` (seeded synthetic, labelled so)."""
