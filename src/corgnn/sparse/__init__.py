"""Sparse layer: formats (COO, CSR, CSC, ELL, hybrid) and their SpMM/SDDMM kernels."""

from .ell import ELL, Hybrid
from .formats import COO, CSC, CSR, FORMAT_NAMES, SparseFormat, convert
from .ops import edge_softmax, sddmm, spmm

__all__ = ["SparseFormat", "COO", "CSR", "CSC", "ELL", "Hybrid", "FORMAT_NAMES", "convert", "spmm", "sddmm", "edge_softmax"]
