"""Modules: GCN, GAT, GraphSAGE, GraphConv, GIN, SGC and APPNP layers and the paper's 2-layer models."""

from .aggregate import GraphConv, SAGEConv

from .gat import GAT, GATConv
from .gcn import GCN, GCNConv, UnsupportedOption
from . import models
from .gin import GINConv
from .propagate import APPNP, SGConv
from .transformer import Transformer, TransformerConv

__all__ = ["GCNConv", "GCN", "GATConv", "GAT", "UnsupportedOption", "SAGEConv", "GraphConv", "SGConv", "APPNP", "GINConv", "TransformerConv", "Transformer"]
