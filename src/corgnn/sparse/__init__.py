"""Sparse layer: formats (COO, CSR, CSC, ELL, hybrid), the differentiable public ops
``spmm`` / ``sddmm`` / ``edge_softmax``, and the backend controls.

Layers, each importing only those below it (no cycle, imports inside functions
included; checked by ``tests/test_imports.py``): public ops (:mod:`.ops`,
:mod:`.attention`) -> custom ops (:mod:`.library`, ``torch.ops.corgnn.*``) ->
backend chosen at run time (:mod:`.dispatch`) -> kernels (:mod:`.backends`) ->
what every backend implements (:mod:`.backends.base`: the op signatures, ``Case``,
``Backend``), the dropout bits (:mod:`.rng`) and the formats (:mod:`.formats`,
:mod:`.ell`, listed by :mod:`.registry`).
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
