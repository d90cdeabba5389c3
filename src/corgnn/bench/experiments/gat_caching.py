"""``gat-caching``: 2-layer 8-head GAT with each caching scheme forced (none, features,
node_attention, edge_weights): time and memory, hidden 8..128 per head (paper Figs.
"Speedup between GAT caching schemes", "GAT memory use").
"""

from __future__ import annotations

import math
from collections import defaultdict

from .. import report
from ..harness import geomean
from ..spec import CellSpec, ExperimentSpec
from .common import ARXIV, SMALL3, by_dataset_and_hidden, datasets_of, grid, lines, mb, missing_md, ms, pow2, sizes_by_graph

NAME = "gat-caching"
GAT_CACHES = ("none", "features", "node_attention", "edge_weights")
VARIANTS = [f"corgnn:cache={c}" for c in GAT_CACHES]


def cells(dataset, sizes):
    for h in sizes:
        for v in VARIANTS:
            yield CellSpec("gat", v, h)


def _cache_speedups(rows) -> dict:
    """``{(dataset, hidden, cache): t(cache=none) / t(cache)}`` (> 1: that scheme faster)."""
    t = grid(rows, NAME, ms)
    per = {}
    for (d, h), v in t.items():
        base = v.get("corgnn:cache=none")
        for c in GAT_CACHES:
            if base and v.get(f"corgnn:cache={c}"):
                per[(d, h, c)] = base / v[f"corgnn:cache={c}"]
    return per


def summary(rows):
    per = _cache_speedups(rows)
    parts = []
    if per:
        datasets = sorted({k[0] for k in per}, key=report.dataset_rank)
        body = [[d] + [geomean(s for (dd, _, c), s in per.items() if dd == d and c == cache) for cache in GAT_CACHES] for d in datasets]
        parts.append("Speedup of each caching scheme over no caching (geometric mean over hidden sizes; total step time):\n\n" + report.md_table(["dataset"] + list(GAT_CACHES), body))
    t = grid(rows, NAME, ms)
    mem = grid(rows, NAME, mb)
    if t:
        body = [[d, h] + [t[(d, h)].get(v) for v in VARIANTS] + [mem.get((d, h), {}).get(v) for v in VARIANTS] for d, h in by_dataset_and_hidden(t)]
        parts.append("Median ms per step, then peak MiB per step, per caching scheme:\n\n" + report.md_table(["dataset", "hidden"] + [f"{c} ms" for c in GAT_CACHES] + [f"{c} MiB" for c in GAT_CACHES], body))
    parts.append(missing_md(rows, NAME))
    return "\n\n".join(parts)


def plots(rows, out):
    gm = defaultdict(list)
    for (d, h, c), s in _cache_speedups(rows).items():
        gm[(d, c)].append(s)
    table = {(d, c): (geomean(v), "", math.nan, math.nan) for (d, c), v in gm.items()}
    yield report.plot_speedup(table, out / "gat_caching_speedup.png", title="GAT caching schemes: speedup over no caching (geomean over hidden sizes)", ylabel="speedup over cache=none", legend_title="cache")
    datasets = datasets_of(rows, NAME)
    mem_rows = [r for r in rows if r["dataset"] in datasets[-1:]]  # the largest graph
    yield report.plot_lines(lines(mem_rows, NAME, mb, panel_key="dataset"), out / "gat_caching_memory.png", title="GAT memory per caching scheme", xlabel="hidden per head", ylabel="peak MiB / step")
    yield report.plot_stacked(rows, out / "gat_caching_runtime.png", experiment=NAME, facet="dataset", group="hidden", variants=VARIANTS, title="GAT runtime per caching scheme", facet_values=datasets)


SPEC = ExperimentSpec(
    name=NAME,
    help="2-layer 8-head GAT: time and memory of the four caching schemes",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": (SMALL3 + ARXIV, sizes_by_graph(pow2(3, 7), (8, 32))),  # skips Flickr; OGB-Arxiv at 8 and 32
        "quick": (SMALL3, (8, 64)),
        "tiny": (("Cora",), (2, 4)),
    },
    expected_min={"full": 3.0, "quick": 0.2},
)
