"""``gcn``: 2-layer GCN (ReLU) vs every PyG baseline (COO, CSR, compiled COO) on the
five datasets, hidden 16..1024: speedup over the fastest PyG per cell, geometric
means (paper Figs. "GCN ... relative to the fastest PyG", "Detailed GCN runtime").

Every cell also times ``dense-floor`` (:class:`~corgnn.bench.baselines.DenseFloor`,
family ``"floor"``): an MLP with the GCN's GEMM shapes and no sparse product, the
dense work every scheme must do. It is a reference, not a baseline (never "the
fastest PyG"); the summary reports corgnn / floor per cell and issue 12's goal
(speedup >= 3x or within 1.25x of the floor, :func:`versus.goal_table`).
"""

from __future__ import annotations

from functools import partial

from ..baselines import FLOOR, PYG_VARIANTS
from ..spec import ExperimentSpec
from . import versus
from .common import ALL5, pow2, sizes_by_graph

NAME = "gcn"

SPEC = ExperimentSpec(
    name=NAME,
    help="2-layer GCN vs PyG (COO, CSR, compiled) on the five datasets",
    cells=partial(versus.cells, "gcn", PYG_VARIANTS, references=(FLOOR,)),
    summary=partial(versus.summary, NAME, PYG_VARIANTS, "PyG GCN baseline"),
    plots=partial(versus.plots, NAME, PYG_VARIANTS, "2-layer GCN"),
    grids={
        "full": (ALL5, sizes_by_graph(pow2(4, 10), (16, 64, 256, 1024))),  # Flickr, OGB-Arxiv: 4 sizes only
        "quick": (ALL5, (16, 256)),
        "tiny": (("Cora", "OGB-Arxiv"), (4, 32)),
    },
    expected_min={"full": 8.8, "quick": 2.0},
)
