"""Small node-classification models of the original papers, built from corgnn's
layers (``corgnn train --model sage|gin|sgc|appnp``), and :data:`MODELS`, the one
registry of ``corgnn train``'s models (name -> builder and training defaults), used
by training, ``corgnn explain --model`` and the benchmarks' corgnn variants
(:func:`build_model`).

Each model takes ``x (n, in_channels)`` and an ``edge_index (2, q)`` or
:class:`corgnn.Graph` and returns logits ``(n, out_channels)``; ``schemes()``
names the plan each layer used on its last call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .aggregate import SAGEConv
from .base import dropout
from .gat import GAT
from .gcn import GCN
from .gin import GINConv
from .propagate import APPNP, SGConv
from .gatv2 import GATv2
from .transformer import Transformer

__all__ = ["SAGE", "GIN", "SGC", "APPNPNet", "ModelSpec", "MODELS", "build_model"]


def _check_dropout(p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {p}")
    return float(p)


class _Planned(nn.Module):
    def schemes(self) -> list[str]:
        """Name of the plan each planned layer used on its last call ("-" before one)."""
        out = []
        for m in self.modules():
            if hasattr(m, "last_plan"):
                p = m.last_plan
                out.append("-" if p is None else getattr(p, "scheme", p).name)
        return out


class SAGE(_Planned):
    """2-layer GraphSAGE-mean (Hamilton et al. 2017): ``SAGEConv -> ReLU -> dropout ->
    SAGEConv``; the input features stay constant (used sparse when mostly zeros)."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.5, *, scheme: str = "auto"):
        super().__init__()
        self.dropout = _check_dropout(dropout)
        self.conv1 = SAGEConv(in_channels, hidden_channels, scheme=scheme)
        self.conv2 = SAGEConv(hidden_channels, out_channels, scheme=scheme)

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        h = dropout(torch.relu(self.conv1(x, edge_index)), self.dropout, self.training)
        return self.conv2(h, edge_index)


class GIN(_Planned):
    """2-layer GIN (Xu et al. 2019) with 2-layer MLPs, ``train_eps``: ``GINConv ->
    ReLU -> dropout -> GINConv``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.5, *, scheme: str = "auto"):
        super().__init__()
        self.dropout = _check_dropout(dropout)

        def mlp(a, b, c):
            return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c))

        self.conv1 = GINConv(mlp(in_channels, hidden_channels, hidden_channels), train_eps=True, scheme=scheme)
        self.conv2 = GINConv(mlp(hidden_channels, hidden_channels, out_channels), train_eps=True, scheme=scheme)

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        h = dropout(torch.relu(self.conv1(x, edge_index)), self.dropout, self.training)
        return self.conv2(h, edge_index)


class SGC(_Planned):
    """SGC (Wu et al. 2019): one ``SGConv(K=2, cached=True)``, logistic regression on
    ``S^K X`` (kept across epochs)."""

    def __init__(self, in_channels: int, out_channels: int, K: int = 2, *, scheme: str = "auto"):
        super().__init__()
        self.conv = SGConv(in_channels, out_channels, K=K, cached=True, scheme=scheme)

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        return self.conv(x, edge_index)


class APPNPNet(_Planned):
    """APPNP (Gasteiger et al. 2019): a 2-layer MLP (dropout on its input and hidden
    features) predicting, then ``K=10`` steps of personalised propagation, ``alpha=0.1``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.5, K: int = 10, alpha: float = 0.1):
        super().__init__()
        self.dropout = _check_dropout(dropout)
        self.lin1 = nn.Linear(in_channels, hidden_channels)
        self.lin2 = nn.Linear(hidden_channels, out_channels)
        self.prop = APPNP(K, alpha)

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        h = torch.relu(self.lin1(dropout(x, self.dropout, self.training)))
        h = self.lin2(dropout(h, self.dropout, self.training))
        return self.prop(h, edge_index)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of :data:`MODELS`: how to build a model and how to train it.

    Attributes:
        build: ``build(in_channels, hidden_channels, out_channels, *, dropout, scheme,
            format, heads, **options) -> nn.Module`` (a model ignores the arguments it
            has no use for: SGC has no hidden layer or dropout).
        hidden, dropout, lr, weight_decay, epochs: the defaults of ``corgnn train``
            (the original papers' settings).
        distributed: partitioned training (``corgnn train --nproc``) runs this model.
        description: one line for help texts.
    """

    build: Callable[..., nn.Module]
    hidden: int
    dropout: float
    lr: float
    weight_decay: float
    epochs: int
    distributed: bool = False
    description: str = ""

    def defaults(self) -> dict:
        """The training defaults as a dict (keys hidden, dropout, lr, weight_decay, epochs)."""
        return dict(hidden=self.hidden, dropout=self.dropout, lr=self.lr, weight_decay=self.weight_decay, epochs=self.epochs)


def _gcn(i, h, o, *, dropout, scheme, format, heads, **options):
    return GCN(i, h, o, dropout=dropout, scheme=scheme, format=format, **options)


def _gat(i, h, o, *, dropout, scheme, format, heads, **options):
    return GAT(i, h, o, heads=heads, dropout=dropout, format=format, cache=scheme, **options)


def _sage(i, h, o, *, dropout, scheme, format, heads, **options):
    return SAGE(i, h, o, dropout=dropout, scheme=scheme, **options)


def _gin(i, h, o, *, dropout, scheme, format, heads, **options):
    return GIN(i, h, o, dropout=dropout, scheme=scheme, **options)


def _sgc(i, h, o, *, dropout, scheme, format, heads, **options):
    return SGC(i, o, scheme=scheme, **options)


def _appnp(i, h, o, *, dropout, scheme, format, heads, **options):
    return APPNPNet(i, h, o, dropout=dropout, **options)


def _gatv2(i, h, o, *, dropout, scheme, format, heads, **options):
    return GATv2(i, h, o, heads=heads, dropout=dropout, format=format, cache=scheme, **options)


def _transformer(i, h, o, *, dropout, scheme, format, heads, **options):
    return Transformer(i, h, o, heads=heads, dropout=dropout, format=format, cache=scheme, **options)


MODELS: dict[str, ModelSpec] = {
    # GCN: Kipf & Welling 2017; GAT: Velickovic et al. 2018 (8 heads x 8 hidden, dropout 0.6 on inputs and attention)
    "gcn": ModelSpec(_gcn, 16, 0.5, 0.01, 5e-4, 200, distributed=True, description="2-layer GCN (Kipf & Welling)"),
    "gat": ModelSpec(_gat, 8, 0.6, 0.005, 5e-4, 200, distributed=True, description="2-layer GAT, 8 heads (Velickovic et al.)"),
    # issue 14: GraphSAGE-mean, GIN, SGC (K=2, cached), APPNP (K=10, alpha=0.1)
    "sage": ModelSpec(_sage, 64, 0.5, 0.01, 5e-4, 200, description="2-layer GraphSAGE-mean"),
    "gin": ModelSpec(_gin, 64, 0.5, 0.01, 5e-4, 200, description="2-layer GIN"),
    "sgc": ModelSpec(_sgc, 0, 0.0, 0.2, 2e-4, 100, description="SGC, K=2 (no hidden layer)"),
    "appnp": ModelSpec(_appnp, 64, 0.5, 0.01, 5e-4, 200, description="APPNP, K=10, alpha=0.1"),
    # issue 25: GATv2 (Brody et al. 2022) with GAT's recipe (8 heads x 8 hidden, dropout 0.6)
    "gatv2": ModelSpec(_gatv2, 8, 0.6, 0.005, 5e-4, 200, description="2-layer GATv2, 8 heads (Brody et al.)"),
    # issue 25: TransformerConv (Shi et al. 2021, UniMP) on GAT's recipe, 8 heads x 8 hidden
    "transformer": ModelSpec(_transformer, 8, 0.6, 0.005, 5e-4, 200, description="2-layer graph transformer (TransformerConv), 8 heads"),
}
"""The models of ``corgnn train --model``: name -> :class:`ModelSpec`."""


def build_model(name: str, in_channels: int, out_channels: int, *, hidden: int | None = None, dropout: float | None = None,
                scheme: str = "auto", format: str = "csr", heads: int = 8, **options) -> nn.Module:
    """The model ``name`` of :data:`MODELS` mapping ``(n, in_channels)`` features to
    ``(n, out_channels)`` logits.

    Args:
        hidden, dropout: default (None): the registry's training defaults.
        scheme: the GCN-family scheme, or GAT's caching scheme, to force (``"auto"``).
        format: sparse format of GCN and GAT (the others use CSR).
        heads: GAT's first-layer heads.
        options: further keyword arguments of the model's class (e.g. GAT's ``out_heads``).

    Raises:
        ValueError: unknown ``name`` (and the model's own argument errors).
    """
    spec = MODELS.get(name)
    if spec is None:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return spec.build(in_channels, spec.hidden if hidden is None else hidden, out_channels,
                      dropout=spec.dropout if dropout is None else dropout, scheme=scheme, format=format, heads=heads, **options)
