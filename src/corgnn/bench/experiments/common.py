"""Vocabulary shared by the experiment specs: dataset lists and size ranges for the
grids, and the row queries, tables and line series their summaries and plots use.

Result rows are the dicts of :data:`corgnn.bench.report.COLUMNS` (times in ms per
step, memory in bytes; :func:`mb` gives MiB).
"""

from __future__ import annotations

import math
from collections import defaultdict

from .. import report

ARXIV = ("OGB-Arxiv",)
ALL5 = ("Cora", "CiteSeer", "PubMed", "Flickr", "OGB-Arxiv")
SMALL3 = ("Cora", "CiteSeer", "PubMed")
BIG2 = ("Flickr", "OGB-Arxiv")


def pow2(lo: int, hi: int) -> tuple[int, ...]:
    """``(2**lo, ..., 2**hi)``."""
    return tuple(2**i for i in range(lo, hi + 1))


def sizes_by_graph(small: tuple, big: tuple) -> dict:
    """Sizes per dataset (a :data:`~corgnn.bench.spec.Sizes` mapping): ``big`` for
    Flickr and OGB-Arxiv, ``small`` for the others."""
    return {"*": small, **{d: big for d in BIG2}}


def gcn_scheme_variants() -> list[str]:
    """``corgnn`` (auto) and ``corgnn:<scheme>`` for every GCN scheme of
    :data:`corgnn.cost.GCN_SCHEMES`."""
    from ...cost.gcn import GCN_SCHEMES

    return ["corgnn"] + [f"corgnn:{s.name}" for s in GCN_SCHEMES]


# ------------------------------------------------------------------- row queries


def ms(r: dict) -> float:
    """Median ms per step of a row."""
    return r["median_ms"]


def mb(r: dict) -> float | None:
    """Peak memory of a row's step in MiB (None when not measured)."""
    return None if r["peak_mem_bytes"] in (None, "") else r["peak_mem_bytes"] / 2**20


def grid(rows: list[dict], experiment: str, value, *, phase: str = "total", key=("dataset", "hidden"), **eq) -> dict:
    """``{key tuple: {variant: value(row)}}`` of the ok rows of ``experiment`` and
    ``phase`` whose fields equal ``eq``."""
    out = defaultdict(dict)
    for r in report.ok_rows(rows, experiment, phase, **eq):
        out[tuple(r[k] for k in key)][r["variant"]] = value(r)
    return out


def by_dataset_and_hidden(keys) -> list:
    """``(dataset, hidden, ...)`` keys sorted by Table 5's order, then hidden size."""
    return sorted(keys, key=lambda k: (report.dataset_rank(k[0]), k[1]))


def datasets_of(rows: list[dict], experiment: str) -> list[str]:
    """The datasets of ``experiment``'s rows, in Table 5's order."""
    return sorted({r["dataset"] for r in rows if r["experiment"] == experiment}, key=report.dataset_rank)


def missing_md(rows: list[dict], experiment: str) -> str:
    """Markdown list of ``experiment``'s missing points with their reasons."""
    seen = {}
    for r in rows:
        if r["experiment"] == experiment and r["status"] == "missing":
            key = (r["dataset"], r["hidden"], r["variant"], r.get("input_grad"), r["model"])
            seen.setdefault(key, r["reason"])
    if not seen:
        return "Missing points: none.\n"
    body = [[d, h, v + (" (input grad)" if ig else ""), reason] for (d, h, v, ig, _), reason in seen.items()]
    return f"Missing points ({len(body)}):\n\n" + report.md_table(["dataset", "hidden", "variant", "reason"], body) + "\n"


def lines(rows: list[dict], experiment: str, value, *, panel_key: str) -> dict:
    """Series for :func:`~corgnn.bench.report.plot_lines`: ``{row[panel_key]: {line:
    [(hidden, value(row)), ...]}}`` over ``experiment``'s ok total rows, one line per
    variant (``corgnn`` labelled ``corgnn (auto)``, ``corgnn:`` prefixes dropped)."""
    series = defaultdict(lambda: defaultdict(list))
    for r in report.ok_rows(rows, experiment, "total"):
        y = value(r)
        if y is not None and math.isfinite(y):
            series[r[panel_key]][r["variant"].removeprefix("corgnn:") if r["variant"] != "corgnn" else "corgnn (auto)"].append((r["hidden"], y))
    return series


INPUT_GRAD_TITLES = {False: "no input gradient", True: "with input gradient"}
"""Panel titles of plots split by ``input_grad``."""
