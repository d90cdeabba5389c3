"""Sparse layer: formats (COO, CSR, CSC, ELL, hybrid), the differentiable public ops
``spmm`` / ``sddmm`` / ``edge_softmax``, and the backend controls.

Layers below this package (one direction): public op (:mod:`.ops`) -> custom op
(:mod:`.library`, ``torch.ops.corgnn.*``) -> backend chosen at run time
(:mod:`.dispatch`) -> kernel (:mod:`.backends`).
"""

from .dispatch import available_backends, use_backend
from .ell import ELL, Hybrid
from .formats import COO, CSC, CSR, SparseFormat
from .ops import edge_softmax, sddmm, spmm
from .registry import FORMAT_NAMES, FORMATS, convert

__all__ = [
    "SparseFormat", "COO", "CSR", "CSC", "ELL", "Hybrid", "FORMATS", "FORMAT_NAMES", "convert",
    "spmm", "sddmm", "edge_softmax", "use_backend", "available_backends",
]
