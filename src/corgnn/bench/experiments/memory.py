"""``memory``: peak memory of one GCN layer step on OGB-Arxiv (m = 128) per scheme
forced, ``auto`` and PyG (COO, CSR), with and without input gradients (paper Fig.
"Single GCN layer memory use"). Memory only (``kind="memory"`` cells, no timing);
the ``gcn-layer`` summary also reads these rows for its caching memory gain.
"""

from __future__ import annotations

from .. import report
from ..spec import ExperimentSpec
from .common import ARXIV, INPUT_GRAD_TITLES, gcn_scheme_variants, grid, lines, mb, missing_md
from .gcn_layer import layer_cells

NAME = "memory"


def cells(dataset, sizes):
    return layer_cells(sizes, gcn_scheme_variants() + ["pyg-coo", "pyg-csr"], kind="memory")


def summary(rows):
    parts = []
    for ig in (False, True):
        mem = grid(rows, NAME, mb, key=("hidden",), input_grad=ig)
        if not mem:
            continue
        variants = sorted({v for d in mem.values() for v in d}, key=lambda v: (not v.startswith("corgnn"), v))
        body = [[k] + [mem[(k,)].get(v) for v in variants] for (k,) in sorted(mem)]
        parts.append(f"### Peak MiB of one GCN layer step, input gradient {'computed' if ig else 'not computed'}\n\n" + report.md_table(["k"] + [v.removeprefix("corgnn:") for v in variants], body))
    parts.append(missing_md(rows, NAME))
    return "\n\n".join(parts)


def plots(rows, out):
    yield report.plot_lines(lines(rows, NAME, mb, panel_key="input_grad"), out / "memory_gcn_layer.png", title="Single GCN layer on OGB-Arxiv: peak memory per step", xlabel="output features k", ylabel="peak MiB / step", panels=INPUT_GRAD_TITLES)


SPEC = ExperimentSpec(
    name=NAME,
    help="peak memory of one GCN layer per scheme and for PyG",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": (ARXIV, (16, 64, 256, 512)),
        "quick": (ARXIV, (32, 256)),
        "tiny": (ARXIV, (4, 32)),
    },
    expected_min={"full": 1.2, "quick": 0.4},
)
