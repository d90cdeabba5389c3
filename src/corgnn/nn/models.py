"""Small node-classification models of the original papers, built from corgnn's
layers (``corgnn train --model sage|gin|sgc|appnp``).

Each takes ``x (n, in_channels)`` and an ``edge_index (2, q)`` or
:class:`corgnn.Graph` and returns logits ``(n, out_channels)``; ``schemes()``
names the plan each layer used on its last call.
"""

from __future__ import annotations

import torch
from torch import nn

from .aggregate import SAGEConv
from .base import dropout
from .gin import GINConv
from .propagate import APPNP, SGConv

__all__ = ["SAGE", "GIN", "SGC", "APPNPNet"]


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
