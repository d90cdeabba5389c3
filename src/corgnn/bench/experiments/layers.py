"""``layers``: PyG's own GraphSAGE, GIN, SGC and APPNP models against the same
models after ``corgnn.optimize`` (issue 14), one training step (forward + MSE loss
+ backward), timed interleaved in one process. corgnn's layers plan each
aggregation as the GCN product (:mod:`corgnn.nn.aggregate`, :mod:`corgnn.nn.gin`)
or the K-hop propagation (:mod:`corgnn.nn.propagate`); the scheme column names
their choices.
"""

from __future__ import annotations

from .. import report
from ..baselines import LAYER_MODELS
from ..spec import CellSpec, ExperimentSpec
from .common import missing_md, ms

NAME = "layers"
VARIANTS = ("pyg-coo", "corgnn")


def cells(dataset, sizes):
    for hidden in sizes:
        for model in LAYER_MODELS:
            for v in VARIANTS:
                yield CellSpec(model, v, hidden)


def summary(rows):
    body = []
    for r in report.ok_rows(rows, NAME, "total", variant="corgnn"):
        pyg = report.ok_rows(rows, NAME, "total", variant="pyg-coo", model=r["model"], dataset=r["dataset"], hidden=r["hidden"])
        t_pyg = ms(pyg[0]) if pyg else None
        body.append([r["dataset"], r["model"], r["hidden"], t_pyg, ms(r), (t_pyg / ms(r)) if t_pyg else None, r.get("scheme_used") or "-"])
    out = [
        "Median ms per training step (forward + MSE loss + backward) of PyG's model and of the same model after "
        "`corgnn.optimize` (timed interleaved, same process); speedup = PyG / corgnn (> 1: corgnn faster).",
        report.md_table(["dataset", "model", "hidden", "PyG ms", "corgnn ms", "speedup", "corgnn schemes"], body),
        missing_md(rows, NAME),
    ]
    return "\n\n".join(out)


def plots(rows, out):
    return ()


SPEC = ExperimentSpec(
    name=NAME,
    help="PyG's GraphSAGE, GIN, SGC and APPNP models vs the same models after corgnn.optimize",
    cells=cells,
    summary=summary,
    plots=plots,
    grids={
        "full": (("Cora", "CiteSeer", "PubMed"), (64,)),
        "quick": (("Cora", "CiteSeer"), (64,)),
        "tiny": (("Cora",), (16,)),
    },
    expected_min={"quick": 1.0},
)
