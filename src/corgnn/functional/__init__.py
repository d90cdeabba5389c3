"""Autograd functions of the layers (explicit backward formulas of the paper's appendix)."""

from .gcn import GCNFunction, gcn_conv

__all__ = ["GCNFunction", "gcn_conv"]
