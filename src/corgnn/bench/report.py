"""Results files, Markdown tables and plots in the paper's style (matplotlib, Agg).

Results: ``results.csv`` (one row per measurement, :data:`COLUMNS`) and
``results.json`` (``{"machine": ..., "settings": ..., "rows": [...]}``). Plots:

* :func:`plot_stacked` - per-variant bars, the forward part darker, total height =
  forward + loss + backward (paper Figs. "Detailed GCN/GAT runtime results");
* :func:`plot_speedup` - speedup per dataset and hidden size, geometric mean per
  dataset marked in black (paper Figs. "GCN/GAT comparison against baselines");
* :func:`plot_lines` - a value against the output size, one line per variant
  (scheme-vs-size and memory figures);
* :func:`plot_bars` - one bar per labelled case against a reference line
  (speedups of the ``changing-graphs`` cases).
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from collections import defaultdict
from pathlib import Path

from .harness import geomean

__all__ = [
    "short_variant",
    "COLUMNS",
    "write_results",
    "read_results",
    "md_table",
    "fmt",
    "ok_rows",
    "dataset_rank",
    "speedup_table",
    "NOISY",
    "speedup_markdown",
    "plot_stacked",
    "plot_speedup",
    "plot_lines",
    "plot_bars",
]

COLUMNS = (
    "experiment",
    "dataset",
    "synthetic",
    "n",
    "q",
    "m",
    "hidden",
    "out",
    "heads",
    "model",
    "variant",
    "family",
    "input_grad",
    "batch",
    "phase",
    "median_ms",
    "spread_ms",
    "reps",
    "peak_mem_bytes",
    "setup_s",
    "status",
    "reason",
    "scheme_used",
    "max_rel_diff",
    "cpu",
    "cores",
    "torch_threads",
    "numba_threads",
    "torch",
    "pyg",
    "numba",
    "python",
    "device",
    "gpu",
    "allocator",
)
"""Columns of ``results.csv``: what was measured (experiment ... phase), the result
(``median_ms`` per step and ``spread_ms`` = interquartile range, over ``reps`` timed
steps; ``peak_mem_bytes`` of one step; ``setup_s`` = warm-up time beyond steady
steps, i.e. compilation and lazy caches), ``status`` ``ok`` or ``missing`` with the
``reason``, corgnn's ``scheme_used`` per layer, and the machine. ``batch``: graphs
per mini-batch or seed nodes per sampled batch (0 or empty: whole-graph cells);
``max_rel_diff``: largest ``|output - PyG's output| / max |PyG's output|`` of a
variant on the same input and parameters (experiments that check it, e.g.
``changing-graphs``)."""

_INT = {"n", "q", "m", "hidden", "out", "heads", "batch", "reps", "peak_mem_bytes", "cores", "torch_threads", "numba_threads"}
_FLOAT = {"median_ms", "spread_ms", "setup_s", "max_rel_diff"}
_BOOL = {"synthetic", "input_grad"}


def write_results(rows: list[dict], out_dir: Path, meta: dict) -> tuple[Path, Path]:
    """Write ``results.csv`` and ``results.json`` under ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "results.csv", out_dir / "results.json"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None or (isinstance(r.get(k), float) and math.isnan(r[k])) else r[k]) for k in COLUMNS})
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
    json_path.write_text(json.dumps({**meta, "rows": clean}, indent=1))
    return csv_path, json_path


def read_results(path: Path) -> tuple[list[dict], dict]:
    """Rows and metadata from a ``results.json`` (or the directory holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json at {path}")
    doc = json.loads(path.read_text())
    rows = doc.pop("rows")
    for r in rows:
        for k in _FLOAT:
            if r.get(k) is None:
                r[k] = math.nan
    return rows, doc


def fmt(v, digits: int = 3) -> str:
    """Compact number for tables ('-' for missing)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def md_table(header: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(lines)


def ok_rows(rows: list[dict], experiment: str | None = None, phase: str | None = "total", **eq) -> list[dict]:
    """Rows with status ok, optionally filtered by experiment, phase and equal fields."""
    out = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        if experiment is not None and r["experiment"] != experiment:
            continue
        if phase is not None and r["phase"] != phase:
            continue
        if all(r.get(k) == v for k, v in eq.items()):
            out.append(r)
    return out


NOISY = 0.25
"""A cell is flagged noisy when a compared variant's interquartile range exceeds this
fraction of its median (load from other processes during that cell)."""


def speedup_table(rows: list[dict], experiment: str, ours: str, baselines: tuple[str, ...], phase: str = "total") -> dict:
    """Speedup of ``ours`` over the fastest baseline per (dataset, hidden).

    Returns:
        ``{(dataset, hidden): (speedup, fastest_baseline, t_ours_ms, t_base_ms,
        noisy)}``; speedup > 1 means ``ours`` is faster; ``noisy`` when the spread of
        ``ours`` or of that baseline exceeds :data:`NOISY` of its median. Cells where
        ``ours`` or every baseline is missing are left out.
    """
    t = defaultdict(dict)
    for r in ok_rows(rows, experiment, phase):
        if math.isfinite(r["median_ms"]):
            t[(r["dataset"], r["hidden"])][r["variant"]] = (r["median_ms"], r.get("spread_ms", math.nan))
    out = {}
    for key, v in t.items():
        base = {b: v[b][0] for b in baselines if b in v}
        if ours not in v or not base:
            continue
        best = min(base, key=base.get)
        noisy = any(sp > NOISY * med for med, sp in (v[ours], v[best]) if math.isfinite(sp))
        out[key] = (base[best] / v[ours][0], best, v[ours][0], base[best], noisy)
    return out


def dataset_rank(name: str) -> int:
    """Position of a reported dataset name (``"Cora"``, ``"PubMed (synthetic)"``,
    ``"PubMed (real graph, synthetic features)"``...) in
    :data:`corgnn.datasets.DATASET_ORDER` (Table 5's order with the synthetic-only
    stand-ins placed by size; smallest graph first); 99 for other names."""
    from ..datasets import DATASET_ORDER

    return next((i for i, c in enumerate(DATASET_ORDER) if name.startswith(c)), 99)


def _datasets_in_order(keys) -> list[str]:
    return sorted({k[0] for k in keys}, key=dataset_rank)


def speedup_markdown(table: dict, what: str) -> str:
    """Markdown: dataset x hidden speedups (fastest baseline in brackets), geometric
    mean per dataset and overall."""
    if not table:
        return f"No {what} speedups (missing points only).\n"
    datasets = _datasets_in_order(table)
    hiddens = sorted({k[1] for k in table})
    header = ["dataset"] + [f"h={h}" for h in hiddens] + ["geomean"]
    body = []
    for d in datasets:
        cells = []
        for h in hiddens:
            s = table.get((d, h))
            cells.append("-" if s is None else f"{s[0]:.2f} ({short_variant(s[1])})" + (" †" if len(s) > 4 and s[4] else ""))
        gm = geomean(table[(d, h)][0] for h in hiddens if (d, h) in table)
        body.append([d] + cells + [f"**{gm:.2f}**"])
    overall = geomean(v[0] for v in table.values())
    slower = sum(1 for v in table.values() if v[0] < 1.0)
    noisy = sum(1 for v in table.values() if len(v) > 4 and v[4])
    return (
        md_table(header, body)
        + f"\n\nOverall geometric mean speedup: **{overall:.2f}x** over {len(table)} cells; "
        f"corgnn slower (< 1.0) in {slower}. In brackets: the fastest {what} baseline of the cell "
        f"(coo = pyg-coo, csr = pyg-csr, comp = pyg-coo-compiled, fused = pyg-fused)."
        + (f" † ({noisy} cells): an interquartile range above {NOISY:.0%} of the median (machine load during the cell); rerun those." if noisy else "")
        + "\n"
    )


def short_variant(variant: str) -> str:
    """The short name of a PyG variant in tables (``pyg-coo`` -> ``coo``, ...)."""
    return {"pyg-coo": "coo", "pyg-csr": "csr", "pyg-coo-compiled": "comp", "pyg-fused": "fused"}.get(variant, variant)


# --------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, **tight) -> Path:
    """Lay out ``fig`` (``tight_layout(**tight)``), write it to ``path`` (110 dpi), close it."""
    fig.tight_layout(**tight)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _colors(names):
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def plot_stacked(
    rows: list[dict],
    path: Path,
    *,
    experiment: str,
    facet: str,
    group: str,
    variants: list[str],
    title: str,
    facet_values=None,
    facet_titles: dict | None = None,
    xlabel: str | None = None,
) -> Path | None:
    """Stacked bars: for each facet value (a subplot) and group value (x position),
    one bar per variant; the darker lower part is the forward time, the full height
    forward + loss + backward (medians, ms, log scale). Missing points are left blank."""
    med = {}
    for r in rows:
        if r["experiment"] == experiment and r["status"] == "ok" and r["phase"] in ("fwd", "total") and math.isfinite(r["median_ms"]):
            med[(r[facet], r[group], r["variant"], r["phase"])] = r["median_ms"]
    if not med:
        return None
    plt = _plt()
    facets = facet_values or sorted({k[0] for k in med}, key=str)
    facets = [f for f in facets if any(k[0] == f for k in med)]
    variants = [v for v in variants if any(k[2] == v for k in med)]
    fig, axes = plt.subplots(len(facets), 1, figsize=(max(7, 1.1 * len(variants) * 2), 2.6 * len(facets) + 0.9), squeeze=False)
    colors = _colors(variants)
    width = 0.8 / max(len(variants), 1)
    for ax, fv in zip(axes[:, 0], facets):
        groups = sorted({k[1] for k in med if k[0] == fv})
        for j, v in enumerate(variants):
            xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(groups))]
            tot = [med.get((fv, g, v, "total"), math.nan) for g in groups]
            fwd = [med.get((fv, g, v, "fwd"), math.nan) for g in groups]
            ax.bar(xs, tot, width, color=colors[v], alpha=0.45, label=v)
            ax.bar(xs, fwd, width, color=colors[v], alpha=1.0)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([str(g) for g in groups])
        ax.set_yscale("log")
        ax.set_ylabel("ms / step")
        ax.set_title((facet_titles or {}).get(fv, str(fv)), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel(xlabel or group)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    ncol = min(len(variants), 4)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.suptitle(textwrap.fill(title, 90) + "\n(dark: forward; full bar: forward + loss + backward)", fontsize=10)
    legend_rows = -(-len(variants) // ncol)
    return _save(fig, path, rect=(0, min(0.3, 0.035 * legend_rows * 3 / len(facets)), 1, 1))


def plot_speedup(
    table: dict, path: Path, *, title: str, ylabel: str = "speedup over fastest PyG", legend_title: str = "hidden", goal: float | None = None
) -> Path | None:
    """Bars of ``table`` (from :func:`speedup_table` or the same shape) per dataset
    (groups) and hidden size (bars); geometric mean per dataset as a black marker and
    overall as a dashed black line; 1.0 marked, and ``goal`` (if given) as a dotted
    red line."""
    if not table:
        return None
    plt = _plt()
    datasets = _datasets_in_order(table)
    hiddens = sorted({k[1] for k in table})
    colors = _colors(hiddens)
    width = 0.8 / len(hiddens)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets)) + 1.4, 3.6))
    for j, h in enumerate(hiddens):
        xs = [i + (j - (len(hiddens) - 1) / 2) * width for i in range(len(datasets))]
        ys = [table.get((d, h), (math.nan,))[0] for d in datasets]
        ax.bar(xs, ys, width, color=colors[h], label=f"{h}")
    for i, d in enumerate(datasets):
        gm = geomean(table[(d, h)][0] for h in hiddens if (d, h) in table)
        ax.plot([i - 0.42, i + 0.42], [gm, gm], color="black", lw=2)
    overall = geomean(v[0] for v in table.values())
    ax.axhline(overall, color="black", ls="--", lw=1, label=f"geomean {overall:.2f}")
    ax.axhline(1.0, color="grey", lw=0.8)
    if goal is not None:
        ax.axhline(goal, color="tab:red", ls=":", lw=1.5, label=f"goal {goal:g}")
    ax.set_xticks(range(len(datasets)))
    ax.set_xticklabels([d.replace(" (", "\n(", 1) for d in datasets], fontsize=8)  # "PubMed\n(real graph, synthetic features)"
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(textwrap.fill(title, 70), fontsize=9)
    ax.legend(title=legend_title, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_lines(series: dict, path: Path, *, title: str, xlabel: str, ylabel: str, panels: dict | None = None, logy: bool = True) -> Path | None:
    """Line plot(s): ``series`` = ``{panel: {line: [(x, y), ...]}}`` (one panel per key,
    titled by ``panels[key]`` if given); log-2 x axis."""
    series = {p: {k: v for k, v in lines.items() if v} for p, lines in series.items()}
    series = {p: lines for p, lines in series.items() if lines}
    if not series:
        return None
    plt = _plt()
    names = sorted({name for lines in series.values() for name in lines})
    colors = _colors(names)
    fig, axes = plt.subplots(1, len(series), figsize=(5.2 * len(series), 3.8), squeeze=False)
    for ax, (p, lines) in zip(axes[0], series.items()):
        for name, pts in sorted(lines.items()):
            pts = sorted(pts)
            style = dict(lw=2.5, ls="--", color="black") if name in ("corgnn", "corgnn (auto)") else dict(lw=1.3, color=colors[name], marker="o", ms=3)
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=name, **style)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title((panels or {}).get(p, str(p)), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 90), fontsize=10)
    return _save(fig, path)


def plot_bars(values: dict, path: Path, *, title: str, ylabel: str, reference: float = 1.0) -> Path | None:
    """One bar per ``{label: value}`` (in the dict's order; non-finite values left
    blank), its value written above it, and a dashed line at ``reference``; None when
    nothing is finite."""
    if not any(isinstance(v, (int, float)) and math.isfinite(v) for v in values.values()):
        return None
    plt = _plt()
    labels = list(values)
    ys = [values[k] if isinstance(values[k], (int, float)) and math.isfinite(values[k]) else math.nan for k in labels]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(labels) + 1.5), 4.2))
    colors = ["tab:green" if y >= reference else "tab:red" for y in ys]
    ax.bar(range(len(labels)), ys, 0.7, color=colors)
    for i, y in enumerate(ys):
        if math.isfinite(y):
            ax.text(i, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(reference, color="black", ls="--", lw=1)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(textwrap.fill(title, 80), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)
