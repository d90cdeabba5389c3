"""``gcn-layer``: one GCN layer on OGB-Arxiv (m = 128), output sizes k = 8..512, with
and without input gradients: every scheme forced and ``auto``; where each wins,
whether ``auto`` matches the fastest, and what caching gains (paper Figs. "Single GCN
layer runtime" (+ "using caching"), "caching benefits"). Timing only: the ``memory``
experiment measures the same steps' memory.
"""

from __future__ import annotations

from .. import report
from ..spec import CellSpec, ExperimentSpec
from .common import ARXIV, INPUT_GRAD_TITLES, gcn_scheme_variants, grid, lines, mb, missing_md, ms, pow2

NAME = "gcn-layer"


def layer_cells(sizes, variants, kind: str = "step"):
    """One GCN layer (sum loss) per input-gradient setting, output size and variant."""
    for input_grad in (False, True):
        for k in sizes:
            for v in variants:
                yield CellSpec("gcn-layer", v, k, input_grad=input_grad, loss="sum", kind=kind)


def cells(dataset, sizes):
    return layer_cells(sizes, gcn_scheme_variants())


def summary(rows):
    from ...cost.gcn import GCN_SCHEMES, plan_gcn

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
        t = grid(rows, NAME, ms, key=("hidden",), input_grad=ig)
        if not t:
            continue
        mem = grid(rows, "memory", mb, key=("hidden",), input_grad=ig)
        used = {r["hidden"]: r["scheme_used"] for r in report.ok_rows(rows, NAME, "total", input_grad=ig, variant="corgnn")}
        shape = next(r for r in report.ok_rows(rows, NAME, "total", input_grad=ig))
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
    out.append(missing_md(rows, NAME))
    return "\n\n".join(out)


def _chosen_vs_best(forced: dict, chosen: str | None, best: str | None) -> str:
    if not best or not chosen:
        return "-"
    if chosen == best.removeprefix("corgnn:"):
        return "yes"
    t = forced.get(f"corgnn:{chosen}")
    return f"no ({t / forced[best]:.2f}x)" if t else "no"


def plots(rows, out):
    yield report.plot_lines(lines(rows, NAME, ms, panel_key="input_grad"), out / "gcn_layer_schemes.png", title="Single GCN layer on OGB-Arxiv: total step time per scheme", xlabel="output features k", ylabel="ms / step", panels=INPUT_GRAD_TITLES)
    yield report.plot_stacked(
        rows, out / "gcn_layer_bars.png", experiment=NAME, facet="input_grad", group="hidden", variants=gcn_scheme_variants(),
        title="Single GCN layer on OGB-Arxiv per scheme", facet_titles=INPUT_GRAD_TITLES, xlabel="output features k",
    )


SPEC = ExperimentSpec(
    name=NAME,
    help="single GCN layer on OGB-Arxiv: every scheme vs output size, auto vs fastest",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": (ARXIV, pow2(3, 9)),  # stops at k = 512 (see benchmarks/README.md)
        "quick": (ARXIV, (32, 256)),
        "tiny": (ARXIV, (4, 32)),
    },
    expected_min={"full": 2.8, "quick": 0.5},
    memory=False,  # the `memory` experiment measures these steps' memory
)
