"""The comparison the ``gcn`` and ``gat`` experiments share: corgnn (``auto``) against
PyG baselines on full 2-layer networks, per dataset and hidden size, plus the
``corgnn:dense-x`` ablation on the datasets with sparse input features and, where an
experiment adds it (``gcn``), the ``dense-floor`` reference
(:class:`~corgnn.bench.baselines.DenseFloor`) with issue 12's goal per cell
(:func:`goal_table`).

Only the ``baselines`` an experiment passes (``pyg-*`` variants) are candidates for
"the fastest PyG" of a cell; references such as the floor are never among them.

:func:`cells`, :func:`summary` and :func:`plots` take the experiment's model,
baselines and labels first; each experiment module binds them with
``functools.partial``.
"""

from __future__ import annotations

import math

from .. import report
from ..baselines import FLOOR
from ..harness import geomean
from ..spec import CellSpec
from .common import by_dataset_and_hidden, datasets_of, grid, mb, missing_md, ms

SPARSE_X = ("Cora", "CiteSeer")
"""Datasets whose (bag-of-words) features corgnn uses as a sparse matrix; the
``corgnn:dense-x`` ablation runs there too."""

DENSE_X = "corgnn:dense-x"


GOAL_SPEEDUP = 3.0
"""Issue 12's goal per GCN cell: corgnn at least this much faster than the fastest PyG ..."""
GOAL_FLOOR_RATIO = 1.25
"""... or corgnn's step at most this multiple of the dense-work floor's."""


def cells(model: str, baselines: tuple[str, ...], dataset: str, sizes, *, references: tuple[str, ...] = ()):
    """``corgnn``, the ablation (on :data:`SPARSE_X`), every baseline and every
    reference (e.g. :data:`~corgnn.bench.baselines.FLOOR`) per size."""
    ablation = (DENSE_X,) if dataset in SPARSE_X else ()
    for h in sizes:
        for v in ("corgnn",) + ablation + baselines + references:
            yield CellSpec(model, v, h)


def goal_table(rows, exp: str, baselines: tuple[str, ...]) -> dict:
    """Issue 12's goal per cell, from the ``total`` rows of ``exp``.

    Returns:
        ``{(dataset, hidden): (speedup, fastest_baseline, floor_ratio, meets)}`` for
        every cell of :func:`~corgnn.bench.report.speedup_table` (corgnn and at least
        one baseline measured): ``speedup`` = t(fastest of ``baselines``) / t(corgnn),
        ``floor_ratio`` = t(corgnn) / t(:data:`~corgnn.bench.baselines.FLOOR`) (NaN
        when the floor is missing), ``meets`` = ``speedup >=`` :data:`GOAL_SPEEDUP`
        or ``floor_ratio <=`` :data:`GOAL_FLOOR_RATIO`.
    """
    speed = report.speedup_table(rows, exp, "corgnn", baselines)
    floor = {(r["dataset"], r["hidden"]): r["median_ms"] for r in report.ok_rows(rows, exp, "total", variant=FLOOR) if math.isfinite(r["median_ms"])}
    out = {}
    for key, (s, best, t_ours, _t_best, _noisy) in speed.items():
        ratio = t_ours / floor[key] if key in floor else math.nan
        out[key] = (s, best, ratio, s >= GOAL_SPEEDUP or ratio <= GOAL_FLOOR_RATIO)
    return out


def goal_markdown(table: dict) -> str:
    """Markdown of :func:`goal_table`: one row per cell, then the count of cells meeting
    the goal and the geometric mean speedup (goal: at least :data:`GOAL_SPEEDUP`)."""
    if not table:
        return "No cells with corgnn and a PyG baseline measured.\n"
    body = [
        [d, h, f"{s:.2f} ({report.short_variant(best)})", "-" if not math.isfinite(r) else f"{r:.2f}", "yes" if ok else "no"]
        for (d, h), (s, best, r, ok) in ((k, table[k]) for k in by_dataset_and_hidden(table))
    ]
    met = sum(1 for v in table.values() if v[3])
    gm = geomean(v[0] for v in table.values())
    return (
        report.md_table(["dataset", "hidden", "speedup over fastest PyG", "corgnn / floor", "meets goal"], body)
        + f"\n\n{met} of {len(table)} cells meet issue 12's goal (speedup >= {GOAL_SPEEDUP:g}x over the fastest PyG, "
        f"or corgnn within {GOAL_FLOOR_RATIO:g}x of the dense-work floor); geometric mean speedup **{gm:.2f}x** "
        f"(goal: >= {GOAL_SPEEDUP:g}x, {'met' if gm >= GOAL_SPEEDUP else 'not met'}).\n"
    )


def summary(exp: str, baselines: tuple[str, ...], label: str, rows) -> str:
    """Speedup tables (total and forward), the ablation's, times, memory, compile times
    and missing points; ``label`` names the baselines in the text."""
    table = report.speedup_table(rows, exp, "corgnn", baselines)
    parts = [f"Speedup of corgnn over the fastest {label} per cell (total = forward + loss + backward; > 1: corgnn faster):\n\n" + report.speedup_markdown(table, "PyG")]
    fwd = report.speedup_table(rows, exp, "corgnn", baselines, phase="fwd")
    if fwd:
        parts.append("Forward pass only:\n\n" + report.speedup_markdown(fwd, "PyG"))
    dense = report.speedup_table(rows, exp, DENSE_X, baselines)
    if dense:
        parts.append(
            "Ablation `corgnn:dense-x` (corgnn with the bag-of-words features used dense, as PyG uses them; "
            "separates the sparse-feature path from reordering and caching), speedup over the fastest PyG:\n\n"
            + report.speedup_markdown(dense, "PyG")
        )
    if report.ok_rows(rows, exp, "total", variant=FLOOR):
        parts.append(
            f"Dense-work floor (`{FLOOR}`: an MLP with the 2-layer GCN's GEMM shapes and no sparse product) and "
            "issue 12's goal per cell (corgnn / floor = corgnn's step time over the floor's; 1.0 = nothing left but dense work):\n\n"
            + goal_markdown(goal_table(rows, exp, baselines))
        )
    t = grid(rows, exp, ms)
    if t:
        variants = ["corgnn"] + [b for b in (DENSE_X,) + baselines + (FLOOR,) if any(b in v for v in t.values())]
        used = {(r["dataset"], r["hidden"]): r["scheme_used"] for r in report.ok_rows(rows, exp, "total", variant="corgnn")}
        body = [[d, h] + [t[(d, h)].get(v) for v in variants] + [used.get((d, h), "-")] for d, h in by_dataset_and_hidden(t)]
        parts.append("Median ms per training step:\n\n" + report.md_table(["dataset", "hidden"] + variants + ["corgnn schemes"], body))
        mem = grid(rows, exp, mb)
        body = [[d, h] + [mem[(d, h)].get(v) for v in variants] for d, h in by_dataset_and_hidden(mem)]
        parts.append("Peak memory of a step (MiB, beyond inputs/parameters/graph):\n\n" + report.md_table(["dataset", "hidden"] + variants, body))
    comp = [(r["dataset"], r["hidden"], r["setup_s"]) for r in report.ok_rows(rows, exp, "total", variant="pyg-coo-compiled")]
    if comp:
        parts.append("torch.compile warm-up time (s, excluded from the timings): " + ", ".join(f"{d} h={h}: {s:.1f}" for d, h, s in comp))
    parts.append(missing_md(rows, exp))
    return "\n\n".join(parts)


def plots(exp: str, baselines: tuple[str, ...], title: str, rows, out):
    """``<exp>_speedup.png`` and ``<exp>_runtime.png``; ``title`` names the model."""
    table = report.speedup_table(rows, exp, "corgnn", baselines)
    yield report.plot_speedup(table, out / f"{exp}_speedup.png", title=f"{title}: corgnn speedup over the fastest PyG baseline (geomean in black)")
    variants = ["corgnn"] + [v for v in (DENSE_X,) if any(r["variant"] == v for r in rows)] + list(baselines) + [v for v in (FLOOR,) if any(r["variant"] == v for r in rows)]
    yield report.plot_stacked(rows, out / f"{exp}_runtime.png", experiment=exp, facet="dataset", group="hidden", variants=variants, title=f"{title} runtime per step", facet_values=datasets_of(rows, exp))
