"""``formats``: the 2-layer GCN and the sparse products (SpMM, transposed SpMM, SDDMM)
with the adjacency in every sparse format (COO, CSR, CSC, ELL, hybrid), runtime
relative to CSC (paper Fig. "Data format comparison").
"""

from __future__ import annotations

import math
from collections import defaultdict

from ...sparse.registry import FORMAT_NAMES
from .. import report
from ..harness import geomean
from ..spec import OPS, CellSpec, ExperimentSpec
from .common import ARXIV, SMALL3, datasets_of, missing_md

NAME = "formats"
FORMATS = FORMAT_NAMES  # the list of corgnn.sparse.registry


def cells(dataset, sizes):
    """The GCN in every format per size, then every op in every format per size."""
    for h in sizes:
        for f in FORMATS:
            yield CellSpec("gcn", f"corgnn:format={f}", h)
    for h in sizes:
        for op in OPS:
            for f in FORMATS:
                yield CellSpec(op, f"format={f}", h, kind="op")


def _format_ratios(rows) -> dict:
    """``{(dataset, hidden, model, fmt): t_fmt / t_csc}`` (> 1: CSC faster); GCN rows
    by total step time, op rows by their (forward-only) time."""
    t = defaultdict(dict)
    for r in report.ok_rows(rows, NAME, None):
        if r["phase"] != ("fwd" if r["model"] in OPS else "total"):
            continue
        fmt = r["variant"].split("=", 1)[1]
        t[(r["dataset"], r["hidden"], r["model"])][fmt] = r["median_ms"]
    out = {}
    for (d, h, mdl), v in t.items():
        if "csc" in v:
            for f, ms in v.items():
                out[(d, h, mdl, f)] = ms / v["csc"]
    return out


def summary(rows):
    ratios = _format_ratios(rows)
    parts = []
    if ratios:
        keys = sorted({k[:3] for k in ratios}, key=lambda k: (k[2] != "gcn", k[2], report.dataset_rank(k[0]), k[1]))
        body = [[mdl, d, h] + [ratios.get((d, h, mdl, f)) for f in FORMATS] for d, h, mdl in keys]
        gm = [["geomean", "", ""] + [geomean(v for k, v in ratios.items() if k[3] == f) for f in FORMATS]]
        parts.append(
            "Runtime relative to CSC (> 1: CSC faster; GCN rows: full training step, op rows: one product with `hidden` columns):\n\n"
            + report.md_table(["model/op", "dataset", "hidden"] + list(FORMATS), body + gm)
        )
    parts.append(missing_md(rows, NAME))
    return "\n\n".join(parts)


def plots(rows, out):
    table = {(d, h): (r, "", math.nan, math.nan) for (d, h, mdl, f), r in _format_ratios(rows).items() if mdl == "gcn" and f == "coo"}
    yield report.plot_speedup(table, out / "formats_coo_vs_csc.png", title="GCN: runtime with COO relative to CSC (> 1: CSC faster; geomean in black)", ylabel="t(COO) / t(CSC)")
    yield report.plot_stacked(rows, out / "formats_runtime.png", experiment=NAME, facet="dataset", group="hidden", variants=[f"corgnn:format={f}" for f in FORMATS], title="GCN runtime per sparse format", facet_values=datasets_of(rows, NAME))


SPEC = ExperimentSpec(
    name=NAME,
    help="GCN and SpMM/SDDMM in every sparse format, relative to CSC",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": (SMALL3 + ARXIV, (16, 256)),  # skips Flickr
        "quick": (("Cora", "PubMed"), (16, 256)),
        "tiny": (("Cora",), (4,)),
    },
    expected_min={"full": 0.9, "quick": 0.1},
)
