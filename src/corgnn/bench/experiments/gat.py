"""``gat``: 2-layer 8-head GAT (ELU) vs the PyG baselines (COO, CSR, compiled COO and
dgNN's fused GAT), hidden 8..128 per head (paper Fig. "GAT comparison against
baselines").
"""

from __future__ import annotations

from functools import partial

from ..baselines import PYG_VARIANTS
from ..spec import ExperimentSpec
from . import versus
from .common import ALL5, SMALL3

NAME = "gat"
BASELINES = PYG_VARIANTS + ("pyg-fused",)

SPEC = ExperimentSpec(
    name=NAME,
    help="2-layer 8-head GAT vs PyG (COO, CSR, compiled, dgNN fused)",
    cells=partial(versus.cells, "gat", BASELINES),
    summary=partial(versus.summary, NAME, BASELINES, "PyG GAT baseline"),
    plots=partial(versus.plots, NAME, BASELINES, "2-layer 8-head GAT"),
    grids={
        # every PyG GAT compile costs 10-20 s: Flickr runs hidden 8 only, OGB-Arxiv 8 and 32
        "full": (ALL5, {"*": (8, 32, 128), "Flickr": (8,), "OGB-Arxiv": (8, 32)}),
        "quick": (SMALL3, (8, 64)),
        "tiny": (("Cora",), (2, 4)),
    },
    expected_min={"full": 9.1, "quick": 1.9},
)
