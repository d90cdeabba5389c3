"""Modules: GCN and GAT layers and the paper's 2-layer models."""

from .gat import GAT, GATConv
from .gcn import GCN, GCNConv, UnsupportedOption

__all__ = ["GCNConv", "GCN", "GATConv", "GAT", "UnsupportedOption"]
