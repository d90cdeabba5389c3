"""Modules: GCN, GAT, GraphSAGE, GraphConv, GIN, SGC, APPNP, GATv2 and TransformerConv layers and the paper's 2-layer models."""

from .aggregate import GraphConv, SAGEConv
from .gat import GAT, GATConv
from .gcn import GCN, GCNConv, UnsupportedOption
from . import models
from .gin import GINConv
from .propagate import APPNP, SGConv
from .gatv2 import GATv2, GATv2Conv
from .transformer import Transformer, TransformerConv

__all__ = ["GCNConv", "GCN", "GATConv", "GAT", "UnsupportedOption", "SAGEConv", "GraphConv", "SGConv", "APPNP", "GINConv", "GATv2Conv", "GATv2", "TransformerConv", "Transformer"]
