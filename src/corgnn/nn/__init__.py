"""Modules: GCN and GAT layers and the paper's 2-layer models."""

from .gcn import GCN, GCNConv

__all__ = ["GCNConv", "GCN"]
