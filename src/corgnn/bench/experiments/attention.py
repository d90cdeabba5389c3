"""``gatv2`` and ``transformer``: 2-layer 8-head GATv2 and graph-transformer
(``TransformerConv``) networks vs PyG's (COO, CSR, compiled COO), time and peak memory
per training step, with issue 25's goals per cell.

Both experiments are the ``gat`` comparison (:mod:`.versus`: cells, tables, plots) with
another model, plus :func:`goal_table`. They are two experiments, not one with two
models, because every table and plot of :mod:`.versus` is keyed by (dataset, hidden)
within one experiment: one experiment per layer reuses them unchanged, and each
layer can be run (``corgnn bench gatv2``) and reported on its own. :func:`spec`
builds both specs from the model name, so they share every line.

The models (:class:`~corgnn.bench.baselines.PygAttention` for PyG; corgnn's registry
models ``gatv2`` / ``transformer`` with dropout 0): ``conv(8 heads, concat) -> ELU ->
conv(8 heads, mean)``, as the ``gat`` experiment; GATv2 adds self-loops,
TransformerConv (PyG's default) does not and adds its root weight.

Issue 25's goals (:func:`goal_table`): corgnn's step at least :data:`GOAL_SPEEDUP`
times faster than the fastest PyG baseline on every graph beyond Cora's size
(PubMed, ``Random-20k``: 20k nodes and 200k edges, and the larger stand-ins), never
slower (>= 1.0) on the Cora-sized graphs (:data:`CORA_SIZED`), and its peak memory
at most :data:`GOAL_MEMORY` of the lowest PyG baseline's, everywhere.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import report
from ..baselines import PYG_VARIANTS
from ..harness import geomean
from ..spec import ExperimentSpec
from . import versus
from .common import by_dataset_and_hidden, grid, mb

__all__ = ["SPECS", "spec", "Goal", "goal_table", "goal_markdown", "memory_table", "GOAL_SPEEDUP", "GOAL_MEMORY", "CORA_SIZED", "DATASETS"]

GOAL_SPEEDUP = 2.0
"""Issue 25: corgnn at least this much faster than the fastest PyG beyond Cora's size ..."""
GOAL_MEMORY = 0.5
"""... and its peak memory per step at most this fraction of the lowest PyG peak ..."""
CORA_SIZED = ("Cora", "CiteSeer")
"""... and never slower (speedup >= 1.0) on these graphs (a few thousand nodes)."""

DATASETS = ("Cora", "CiteSeer", "PubMed", "Random-20k", "Flickr", "OGB-Arxiv")
"""The full grid's graphs (:data:`corgnn.datasets.DATASET_ORDER`): the two Cora-sized
ones, PubMed, issue 25's 20k/200k stand-in and the larger stand-ins."""

LABELS = {"gatv2": ("GATv2", "GATv2Conv"), "transformer": ("graph transformer", "TransformerConv")}
"""Per model: how the text names it, and PyG's layer."""


def _cora_sized(dataset: str) -> bool:
    from ...datasets import canonical_name

    try:
        return canonical_name(dataset) in CORA_SIZED
    except ValueError:
        return False


class Goal(NamedTuple):
    """Issue 25's goals in one cell (see :func:`goal_table`)."""

    speedup: float
    fastest: str
    speed_goal: float
    memory_ratio: float
    lowest: str
    memory_ratio_coo: float
    meets: bool


def goal_table(rows, exp: str, baselines: tuple[str, ...] = PYG_VARIANTS) -> dict:
    """Issue 25's goals per cell, from the ``total`` rows of ``exp``.

    Returns:
        ``{(dataset, hidden): Goal}`` for every cell with corgnn and at least one
        baseline timed: ``speedup`` = t(fastest of ``baselines``, ``fastest``) /
        t(corgnn); ``speed_goal`` 1.0 on :data:`CORA_SIZED` graphs, else
        :data:`GOAL_SPEEDUP`; ``memory_ratio`` = corgnn's peak / the lowest peak
        among the baselines (``lowest``; NaN and "" when a peak is missing);
        ``memory_ratio_coo`` = corgnn's peak / ``pyg-coo``'s (PyG's default form;
        NaN when missing); ``meets`` = ``speedup >= speed_goal`` and
        ``memory_ratio <= GOAL_MEMORY`` (a missing memory ratio does not meet it).
    """
    speed = report.speedup_table(rows, exp, "corgnn", baselines)
    mem = grid(rows, exp, mb)
    out = {}
    for key, (s, best, *_rest) in speed.items():
        peaks = {v: p for v, p in mem.get(key, {}).items() if p is not None and p > 0}
        base = {b: peaks[b] for b in baselines if b in peaks}
        lowest = min(base, key=base.get) if base else ""
        ours = peaks.get("corgnn", math.nan)
        ratio = ours / base[lowest] if base else math.nan
        coo = ours / peaks["pyg-coo"] if "pyg-coo" in peaks else math.nan
        need = 1.0 if _cora_sized(key[0]) else GOAL_SPEEDUP
        out[key] = Goal(s, best, need, ratio, lowest, coo, s >= need and ratio <= GOAL_MEMORY)
    return out


def goal_markdown(table: dict, label: str) -> str:
    """Markdown of :func:`goal_table`: one row per cell, then how many cells meet
    the goals, and each goal's count."""
    if not table:
        return "No cells with corgnn and a PyG baseline measured: issue 25's goals cannot be judged.\n"
    body = []
    for key in by_dataset_and_hidden(table):
        g = table[key]
        body.append([
            key[0], key[1], f"{g.speedup:.2f} ({report.short_variant(g.fastest)})", f">= {g.speed_goal:g}", "yes" if g.speedup >= g.speed_goal else "no",
            "-" if not math.isfinite(g.memory_ratio) else f"{g.memory_ratio:.2f} ({report.short_variant(g.lowest)})",
            "yes" if g.memory_ratio <= GOAL_MEMORY else "no", "-" if not math.isfinite(g.memory_ratio_coo) else f"{g.memory_ratio_coo:.2f}",
            "yes" if g.meets else "no",
        ])
    n = len(table)
    fast = sum(1 for g in table.values() if g.speedup >= g.speed_goal)
    small = sum(1 for g in table.values() if g.memory_ratio <= GOAL_MEMORY)
    met = sum(1 for g in table.values() if g.meets)
    gm = geomean(g.memory_ratio for g in table.values())
    return (
        f"Issue 25's goals per cell for the 2-layer 8-head {label}: time = t(fastest PyG) / t(corgnn), at least "
        f"{GOAL_SPEEDUP:g}x beyond Cora's size and at least 1.0 (never slower) on {', '.join(CORA_SIZED)}; "
        f"memory = corgnn's peak per step / the lowest PyG peak, at most {GOAL_MEMORY:g} (and, for reference, / pyg-coo's, "
        "PyG's default form). In brackets: the PyG variant compared.\n\n"
        + report.md_table(["dataset", "hidden", "time ratio", "time goal", "met", "memory ratio", f"met (<= {GOAL_MEMORY:g})", "memory / pyg-coo", "both met"], body)
        + f"\n\n**{met} of {n} cells meet both goals** (time: {fast} of {n}; memory: {small} of {n}, geometric mean memory ratio {gm:.2f}).\n"
    )


def memory_table(rows, exp: str, baselines: tuple[str, ...] = PYG_VARIANTS) -> dict:
    """``{(dataset, hidden): (memory_ratio, lowest)}`` of :func:`goal_table` (cells with
    a ratio), the shape :func:`~corgnn.bench.report.plot_speedup` draws."""
    return {k: (g.memory_ratio, g.lowest) for k, g in goal_table(rows, exp, baselines).items() if math.isfinite(g.memory_ratio)}


def summary(exp: str, label: str, rows) -> str:
    """Issue 25's goal table, then the ``gat`` experiment's tables (:func:`.versus.summary`)."""
    pyg_layer = LABELS.get(exp, (label, label))[1]
    return goal_markdown(goal_table(rows, exp), label) + "\n\n" + versus.summary(exp, PYG_VARIANTS, f"PyG {pyg_layer} baseline", rows)


def plots(exp: str, label: str, rows, out):
    """:func:`.versus.plots` (``<exp>_speedup.png``, ``<exp>_runtime.png``) and
    ``<exp>_memory.png``: corgnn's peak memory over the lowest PyG peak per cell."""
    title = f"2-layer 8-head {label}"
    yield from versus.plots(exp, PYG_VARIANTS, title, rows, out)
    yield report.plot_speedup(
        memory_table(rows, exp), out / f"{exp}_memory.png", title=f"{title}: peak memory per step, corgnn / lowest PyG baseline (geomean in black)",
        ylabel="peak memory corgnn / PyG", goal=GOAL_MEMORY,
    )


def spec(model: str) -> ExperimentSpec:
    """The experiment of ``model`` (``"gatv2"`` or ``"transformer"``; also its name)."""
    from functools import partial

    label, pyg_layer = LABELS[model]
    return ExperimentSpec(
        name=model,
        help=f"2-layer 8-head {label} vs PyG's {pyg_layer} (COO, CSR, compiled): time and peak memory, issue 25's goals",
        cells=partial(versus.cells, model, PYG_VARIANTS),
        summary=partial(summary, model, label),
        plots=partial(plots, model, label),
        grids={
            "full": (DATASETS, (8,)),
            "quick": (("Cora", "PubMed", "Random-20k"), (8,)),
            "tiny": (("Cora", "PubMed"), (2,)),
        },
        # full: 2.1-2.2 min each on the idle 2-core machine with torch.compile's on-disk cache
        # warm, plus 1-1.5 min of PyG compiles on a cold one (5.5-6 min each under a load of 3-4)
        expected_min={"full": 3.5, "quick": 1.2},
    )


SPECS = (spec("gatv2"), spec("transformer"))
"""The ``gatv2`` and ``transformer`` experiments."""
