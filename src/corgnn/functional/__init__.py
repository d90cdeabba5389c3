"""Autograd functions of the layers (explicit backward formulas of the paper's appendix)."""

from .gat import GATFunction, gat_conv
from .gcn import GCNFunction, gcn_conv
from .gatv2 import GATv2Function, gatv2_conv

__all__ = ["GCNFunction", "gcn_conv", "GATFunction", "gat_conv", "GATv2Function", "gatv2_conv"]
