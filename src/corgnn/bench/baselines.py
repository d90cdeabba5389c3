"""The models every experiment times: PyG baselines and corgnn, built per *variant*.

Variants (the ``variant`` column of the results):

================================  ==================================================
``corgnn``                        corgnn, ``scheme="auto"`` (GCN) / ``cache="auto"``
                                  (GAT, GATv2, TransformerConv)
``corgnn:<scheme>``               corgnn GCN with a forced scheme (``cost.GCN_SCHEMES``)
``corgnn:cache=<scheme>``         corgnn GAT/GATv2/Transformer with a forced caching scheme
``corgnn:format=<fmt>``           corgnn with the adjacency in format ``fmt``
``corgnn:dense-x``                ablation: corgnn with its sparse-input-feature path
                                  off (Cora/CiteSeer bag-of-words features are used
                                  dense, as PyG uses them), see :class:`DenseFeatures`
``pyg-coo``                       PyG layers, eager, ``edge_index`` (COO, gather/scatter)
``pyg-csr``                       PyG layers, eager, ``adj_t`` as a ``torch.sparse_csr``
                                  tensor (rows = targets; GCN runs ``torch.sparse.mm``)
``pyg-coo-compiled``              ``torch.compile(model)`` on ``edge_index`` (the only
                                  format PyG compiles, paper §"Baseline")
``pyg-fused``                     GAT only: PyG's dgNN ``FusedGATConv`` (CUDA + dgNN)
``dense-floor``                   GCN only: the dense-work floor, an MLP with the
                                  2-layer GCN's GEMM shapes and no sparse product
                                  (:class:`DenseFloor`); family ``"floor"``
================================  ==================================================

Each variant belongs to a *family* (the ``family`` column, :func:`family`): ``"pyg"``
(the baselines corgnn's speed-ups are taken over), ``"corgnn"``, or ``"floor"`` (a
reference for the work any scheme must do, never a baseline).

Models (the ``model`` argument of :func:`build`): ``"gcn"``, ``"gcn-layer"``, the
attention models of :data:`ATTENTION_MODELS` (2-layer 8-head networks of PyG's
``GATConv``, ``GATv2Conv`` or ``TransformerConv``, :class:`PygAttention`, against
corgnn's registry models ``gat``, ``gatv2``, ``transformer``) and the
:data:`LAYER_MODELS`.

PyG models use the same parameters as corgnn's (widths, heads, bias, self-loops,
normalisation). PyG's ``GCNConv`` is built with ``cached=True``: the normalised
adjacency is computed once, on the first (warm-up) call, as corgnn computes ``A'``
once per graph, so neither side pays for normalisation in the timed steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

__all__ = [
    "Unavailable",
    "DenseFeatures",
    "GraphData",
    "PygGCN",
    "PygAttention",
    "DenseFloor",
    "FLOOR",
    "family",
    "build",
    "estimate_step_bytes",
    "PYG_VARIANTS",
    "GAT_HEADS",
    "ATTENTION_MODELS",
]

PYG_VARIANTS = ("pyg-coo", "pyg-csr", "pyg-coo-compiled")
FLOOR = "dense-floor"
"""Variant name of the dense-work floor (:class:`DenseFloor`)."""
GAT_HEADS = 8
"""Heads of both layers of the attention models (paper §"Evaluation": two GAT layers
with 8 heads each; the first concatenates, the second averages)."""
ATTENTION_MODELS = ("gat", "gatv2", "transformer")
"""The 2-layer 8-head attention models: PyG's ``GATConv``, ``GATv2Conv`` and
``TransformerConv`` (:class:`PygAttention`) against corgnn's registry models of the
same names (:data:`corgnn.nn.models.MODELS`)."""


class Unavailable(RuntimeError):
    """A variant cannot run here (missing package, device or feature); the message
    is recorded as the reason of a missing point."""


@dataclass
class GraphData:
    """One dataset prepared for benchmarking.

    Duplicate edges are merged (``torch_geometric.utils.coalesce``) so every variant
    sees the same simple graph: PyG's CSR path would merge them anyway, its COO path
    would not (the synthetic stand-ins have about 1 % duplicates; the real Planetoid
    graphs none).

    Attributes:
        name: dataset name as reported (``"<Name> (synthetic)"`` for stand-ins,
            ``"PubMed (real graph, synthetic features)"`` for PubMed's real graph).
        synthetic: True for a seeded stand-in.
        x: ``(n, m) float32`` features.
        edge_index: ``(2, q) int64``, coalesced, source -> target.
        num_classes: output width of the full networks.
    """

    name: str
    synthetic: bool
    x: torch.Tensor
    edge_index: torch.Tensor
    num_classes: int
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_pyg(cls, data, device="cpu") -> "GraphData":
        from torch_geometric.utils import coalesce

        n = data.num_nodes
        ei = coalesce(data.edge_index, num_nodes=n)
        y = getattr(data, "y", None)
        c = int(y.max()) + 1 if y is not None and y.numel() else 1
        return cls(str(data.name), bool(getattr(data, "synthetic", False)), data.x.to(device, torch.float32).contiguous(), ei.to(device), c)

    @property
    def n(self) -> int:
        return self.x.size(0)

    @property
    def q(self) -> int:
        return self.edge_index.size(1)

    @property
    def m(self) -> int:
        return self.x.size(1)

    @cached_property
    def adj_t(self) -> torch.Tensor:
        """``(n, n)`` ``torch.sparse_csr`` with rows = targets, columns = sources
        (PyG's ``adj_t`` convention; what ``ToSparseTensor(layout=torch.sparse_csr)``
        builds)."""
        from torch_geometric.utils import to_torch_csr_tensor

        return to_torch_csr_tensor(self.edge_index.flip(0), size=(self.n, self.n))

    @cached_property
    def fused_gat_graph(self):
        """``(csr, csc, perm)`` of the graph with one self-loop per node, as PyG's
        ``FusedGATConv.to_graph_format`` builds it (self-loops are added here because
        that layer refuses ``add_self_loops=True``)."""
        from torch_geometric.nn.conv import FusedGATConv
        from torch_geometric.utils import add_self_loops, remove_self_loops

        ei, _ = remove_self_loops(self.edge_index)
        ei, _ = add_self_loops(ei, num_nodes=self.n)
        return FusedGATConv.to_graph_format(ei, size=(self.n, self.n))


class PygGCN(nn.Module):
    """The paper's 2-layer GCN from PyG's ``GCNConv``: ``conv -> ReLU -> conv``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=True)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


class PygAttention(nn.Module):
    """The paper's 2-layer, 8-head GAT recipe from PyG's attention layers:
    ``conv(heads, concat) -> ELU -> conv(heads, mean)``, each ``conv`` PyG's
    ``GATConv`` (``layer="gat"``; ``FusedGATConv`` with ``fused``), ``GATv2Conv``
    (``"gatv2"``) or ``TransformerConv`` (``"transformer"``), with PyG's defaults
    otherwise (GATv2: self-loops, separate source/target weights; TransformerConv: no
    self-loops, ``root_weight``, no ``beta``), as corgnn's models of the same name.

    Raises:
        ValueError: ``layer`` not in :data:`ATTENTION_MODELS`, or ``fused`` with a
            layer other than ``"gat"``.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, heads: int = GAT_HEADS, fused: bool = False, layer: str = "gat"):
        super().__init__()
        import torch_geometric.nn as pyg

        if layer not in ATTENTION_MODELS:
            raise ValueError(f"layer must be one of {ATTENTION_MODELS}, got {layer!r}")
        if fused and layer != "gat":
            raise ValueError("fused exists for layer='gat' only (PyG's FusedGATConv)")
        if fused:
            from torch_geometric.nn.conv import FusedGATConv as conv
        else:
            conv = {"gat": pyg.GATConv, "gatv2": pyg.GATv2Conv, "transformer": pyg.TransformerConv}[layer]
        kw = dict(add_self_loops=False) if fused else {}
        # NOTE: PyG 2.8.1's FusedGATConv.forward calls `self.lin_src`, which GATConv
        # only creates for bipartite (tuple) in_channels; passing (m, m) creates it
        # (lin_dst stays unused). Not exercised on CPU (needs CUDA + dgNN).
        def width(c):
            return (c, c) if fused else c

        self.conv1 = conv(width(in_channels), hidden_channels, heads=heads, concat=True, **kw)
        self.conv2 = conv(width(hidden_channels * heads), out_channels, heads=heads, concat=False, **kw)

    def forward(self, x, *graph):
        return self.conv2(nn.functional.elu(self.conv1(x, *graph)), *graph)


class DenseFloor(nn.Module):
    """The dense-work floor of the 2-layer GCN: ``Linear(m, h) -> ReLU -> Linear(h, c)``.

    The same GEMMs as :class:`PygGCN` and corgnn's GCN on dense features (forward
    ``X W1 (n, m) x (m, h)`` and ``H W2 (n, h) x (h, c)``; backward ``H^T G``,
    ``G W2^T`` and ``X^T G1``), the same biases, loss and backward, and no sparse
    product: the time every GCN scheme must spend on dense work. A GCN step within a
    small factor of it has little left to gain from the sparse part (issue 12's goal:
    corgnn within 1.25x of it, or 3x faster than the fastest PyG). It reads the same
    dense ``x`` as the other variants, also where corgnn uses bag-of-words features
    as a sparse matrix.

    Shapes:
        ``forward(x, *graph)``: ``x (n, m) float32``; the graph arguments are
        accepted (the benchmark passes ``edge_index``) and ignored; returns ``(n, c)``.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int):
        super().__init__()
        self.lin1 = nn.Linear(in_channels, hidden_channels)
        self.lin2 = nn.Linear(hidden_channels, out_channels)

    def forward(self, x, *graph):
        return self.lin2(torch.relu(self.lin1(x)))


def family(variant: str) -> str:
    """``"pyg"`` for ``pyg-*`` variants, ``"floor"`` for :data:`FLOOR`, else ``"corgnn"``."""
    if variant.startswith("pyg"):
        return "pyg"
    return "floor" if variant == FLOOR else "corgnn"


class DenseFeatures(nn.Module):
    """Ablation wrapper: a corgnn GCN/GAT that treats its input features as dense.

    corgnn keeps constant input features that are at most
    ``corgnn.nn.base.SPARSE_FEATURE_DENSITY`` non-zero (Cora 1.3 %, CiteSeer 0.9 %) as
    a sparse matrix and runs ``XΘ`` as an SpMM; PyG multiplies them dense. To separate
    that gain from the paper's reordering and caching, the first call (which decides
    and caches the choice per feature tensor) runs with the threshold set below zero;
    it then checks, through the public ``conv1.sparse_features``, that the features
    are used dense, and raises ``RuntimeError`` otherwise.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self._checked = False

    def forward(self, x, *graph):
        if self._checked:
            return self.inner(x, *graph)
        from ..nn import base as gcn_module  # (where the layers read SPARSE_FEATURE_DENSITY)

        old = gcn_module.SPARSE_FEATURE_DENSITY
        gcn_module.SPARSE_FEATURE_DENSITY = -1.0
        try:
            out = self.inner(x, *graph)
        finally:
            gcn_module.SPARSE_FEATURE_DENSITY = old
        if self.inner.conv1.sparse_features(x) is not None:
            raise RuntimeError("corgnn:dense-x ablation ineffective: corgnn still uses the features as sparse")
        self._checked = True
        return out

    def schemes(self) -> list[str]:
        return self.inner.schemes()


def _fused_gat_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "PyG's FusedGATConv runs dgNN's CUDA kernels only; this run is on CPU"
    try:
        import dgNN  # noqa: F401
    except ImportError:
        return "dgNN is not installed (needed by PyG's FusedGATConv)"
    return None


def build(variant: str, model: str, g: GraphData, hidden: int, *, out_channels: int | None = None):
    """Module and forward inputs of one variant.

    Args:
        variant: see the module docstring.
        model: ``"gcn"`` (2-layer GCN, ReLU), ``"gcn-layer"`` (one GCN layer
            ``m -> hidden``), one of :data:`ATTENTION_MODELS` (2-layer 8-head network,
            ELU) or of :data:`LAYER_MODELS`.
        g: the dataset.
        hidden: hidden width (per head for GAT; the output width for a layer).
        out_channels: output width of the full networks (default ``g.num_classes``).

    Returns:
        ``(module, inputs)`` with ``module(*inputs)`` one forward pass.

    Raises:
        Unavailable: the variant cannot run here (reason in the message).
        ValueError: unknown variant or model.
    """
    import corgnn.nn as cnn
    from corgnn.nn.models import build_model

    if model in LAYER_MODELS:
        return _layer_model(variant, model, g, hidden, g.num_classes if out_channels is None else out_channels)
    if model not in ("gcn", "gcn-layer") + ATTENTION_MODELS:
        raise ValueError(f"model must be one of {('gcn', 'gcn-layer') + ATTENTION_MODELS + LAYER_MODELS}, got {model!r}")
    c = g.num_classes if out_channels is None else out_channels
    m, device = g.m, g.x.device
    if variant == "corgnn" or variant.startswith("corgnn:"):
        opts = _corgnn_options(variant, model)
        if model == "gcn-layer":
            mod = cnn.GCNConv(m, hidden, **opts)
        else:  # the registry's model (corgnn.nn.models.MODELS), dropout 0 as in the paper's benchmarks
            if "cache" in opts:  # (an attention model's caching scheme is the registry's scheme)
                opts["scheme"] = opts.pop("cache")
            extra = {"heads": GAT_HEADS, "out_heads": GAT_HEADS} if model in ATTENTION_MODELS else {}
            mod = build_model(model, m, c, hidden=hidden, dropout=0.0, **extra, **opts)
        if variant == "corgnn:dense-x":
            if model == "gcn-layer":
                raise ValueError("corgnn:dense-x applies to the full GCN/GAT models")
            mod = DenseFeatures(mod)
        return mod.to(device), (g.x, g.edge_index)
    if variant == FLOOR:
        if model != "gcn":
            raise ValueError(f"{FLOOR} is the floor of the 2-layer GCN (model 'gcn'), got model {model!r}")
        return DenseFloor(m, hidden, c).to(device), (g.x, g.edge_index)
    if variant not in PYG_VARIANTS + ("pyg-fused",):
        raise ValueError(f"unknown variant {variant!r}; choose corgnn[:...], {FLOOR} or one of {PYG_VARIANTS + ('pyg-fused',)}")
    if variant == "pyg-fused":
        if model != "gat":
            raise Unavailable("pyg-fused exists for GAT only")
        reason = _fused_gat_reason(device)
        if reason:
            raise Unavailable(reason)
        return PygAttention(m, hidden, c, fused=True).to(device), (g.x,) + tuple(g.fused_gat_graph)
    if model == "gcn":
        mod = PygGCN(m, hidden, c)
    elif model == "gcn-layer":
        from torch_geometric.nn import GCNConv

        mod = GCNConv(m, hidden, cached=True)
    else:
        mod = PygAttention(m, hidden, c, layer=model)
    mod = mod.to(device)
    graph = g.adj_t if variant == "pyg-csr" else g.edge_index
    if variant == "pyg-coo-compiled":
        # NOTE: one eager call first fills GCNConv's normalisation cache (cached=True);
        # compiling afterwards traces the steady-state branch only, instead of
        # compiling the first-call branch and recompiling on the second call.
        with torch.no_grad():
            mod(g.x, graph)
        mod = torch.compile(mod)
    return mod, (g.x, graph)


LAYER_MODELS = ("sage", "gin", "sgc", "appnp")
"""Models of ``corgnn bench layers`` (issue 14): PyG's own models, and the same
model after :func:`corgnn.optimize` as the ``corgnn`` variant."""


def _layer_model(variant: str, model: str, g: GraphData, hidden: int, c: int):
    """PyG's 2-layer ``GraphSAGE`` / ``GIN`` (``torch_geometric.nn.models``), SGC
    (``SGConv(K=2, cached=True)``) or APPNP (2-layer MLP + ``APPNP(K=10, alpha=0.1)``)
    on ``edge_index``; variant ``"corgnn"`` is that model after ``corgnn.optimize``."""
    import torch_geometric.nn as pyg
    from torch_geometric.nn.models import GIN, MLP, GraphSAGE

    from ..interop import optimize

    if variant not in ("pyg-coo", "corgnn"):
        raise Unavailable(f"{model}: only pyg-coo and corgnn (PyG's model after optimize) are measured")
    m = g.m
    if model == "sage":
        mod = GraphSAGE(m, hidden, 2, c)
    elif model == "gin":
        mod = GIN(m, hidden, 2, c)
    elif model == "sgc":
        mod = pyg.SGConv(m, c, K=2, cached=True)
    else:
        mod = pyg.Sequential("x, edge_index", [(MLP([m, hidden, c]), "x -> x"), (pyg.APPNP(10, 0.1), "x, edge_index -> x")])
    if variant == "corgnn":
        mod = optimize(mod)
    return mod.to(g.x.device), (g.x, g.edge_index)


def _corgnn_options(variant: str, model: str) -> dict:
    """Constructor options of a ``corgnn[:...]`` variant."""
    if variant in ("corgnn", "corgnn:dense-x"):
        return {}
    spec = variant.split(":", 1)[1]
    if spec.startswith("format="):
        return {"format": spec.split("=", 1)[1]}
    if spec.startswith("cache="):
        if model not in ATTENTION_MODELS:
            raise ValueError(f"{variant}: cache= applies to the attention models {ATTENTION_MODELS} only")
        return {"cache": spec.split("=", 1)[1]}
    if model in ATTENTION_MODELS:
        raise ValueError(f"{variant}: {model} variants are corgnn:cache=<scheme> or corgnn:format=<fmt>")
    return {"scheme": spec}


def estimate_step_bytes(variant: str, model: str, g: GraphData, hidden: int) -> int:
    """Rough estimate (bytes, on the high side) of the peak one training step allocates.

    Used only to skip cells that would exhaust RAM (recorded as missing points). The
    gather/scatter variants materialise per-edge messages of ``width`` floats (the
    widest layer's: ``max(hidden, classes)`` for GCN, ``heads x`` that for the
    attention models) for each of the ``q + n`` edges (self-loops included): PyG's
    COO GCN keeps about two such tensors alive at its peak, PyG's GATs (COO, CSR and
    compiled alike) about four, its eager GATv2 and TransformerConv about ten
    (compiled: about three); the estimate allows 3, 5, 11 and 4. Every variant also
    holds node-sized arrays: about eight ``n x max(m, width)``. (Measured on the
    synthetic OGB-Arxiv: PyG COO GCN at hidden 256 peaks at 2.9 GiB, estimated 5.1
    GiB; PyG GAT at hidden 8, 7.6 GiB, estimated 9.9 GiB. On the 20k-node 200k-edge
    ``Random-20k`` at hidden 8: PyG GATv2 COO 544 MiB, compiled 168 MiB.)
    """
    # the widest layer: hidden, or the output layer (classes; 8 x 40 per edge for the GAT on OGB-Arxiv)
    width = max(hidden, g.num_classes) * (GAT_HEADS if model in ATTENTION_MODELS else 1)
    e = g.q + g.n
    if model == "gat" and variant in PYG_VARIANTS:
        per_edge = 5
    elif model in ATTENTION_MODELS and variant in PYG_VARIANTS:
        per_edge = 4 if variant == "pyg-coo-compiled" else 11
    elif variant == "pyg-coo":
        per_edge = 3
    else:
        per_edge = 0
    return 4 * (per_edge * e * width + 8 * g.n * max(g.m, width))
