"""The comparison the ``gcn`` and ``gat`` experiments share: corgnn (``auto``) against
PyG baselines on full 2-layer networks, per dataset and hidden size, plus the
``corgnn:dense-x`` ablation on the datasets with sparse input features.

:func:`cells`, :func:`summary` and :func:`plots` take the experiment's model,
baselines and labels first; each experiment module binds them with
``functools.partial``.
"""

from __future__ import annotations

from .. import report
from ..spec import CellSpec
from .common import by_dataset_and_hidden, datasets_of, grid, mb, missing_md, ms

SPARSE_X = ("Cora", "CiteSeer")
"""Datasets whose (bag-of-words) features corgnn uses as a sparse matrix; the
``corgnn:dense-x`` ablation runs there too."""

DENSE_X = "corgnn:dense-x"


def cells(model: str, baselines: tuple[str, ...], dataset: str, sizes):
    """``corgnn``, the ablation (on :data:`SPARSE_X`) and every baseline per size."""
    ablation = (DENSE_X,) if dataset in SPARSE_X else ()
    for h in sizes:
        for v in ("corgnn",) + ablation + baselines:
            yield CellSpec(model, v, h)


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
    t = grid(rows, exp, ms)
    if t:
        variants = ["corgnn"] + [b for b in (DENSE_X,) + baselines if any(b in v for v in t.values())]
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
    variants = ["corgnn"] + [v for v in (DENSE_X,) if any(r["variant"] == v for r in rows)] + list(baselines)
    yield report.plot_stacked(rows, out / f"{exp}_runtime.png", experiment=exp, facet="dataset", group="hidden", variants=variants, title=f"{title} runtime per step", facet_values=datasets_of(rows, exp))
