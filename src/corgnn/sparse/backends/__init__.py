"""Kernel backends (see :mod:`corgnn.sparse.dispatch`): ``numba`` (CPU kernels),
``torch`` (portable reference), ``triton`` (GPU kernels), ``cusparse`` (single-head
SpMM through torch's sparse CSR tensors). :data:`BACKENDS` holds one
instance of each, which dispatch registers; :mod:`.base` is what they implement.

Backends import :mod:`.base`, :mod:`corgnn.sparse.rng` and the formats only, never
dispatch, the library or the public ops (``tests/test_imports.py``)."""

from .base import Backend, Case
from .cusparse import CuSparseBackend
from .numba_cpu import NumbaBackend
from .torch_ref import TorchBackend
from .triton import TritonBackend

BACKENDS: tuple[Backend, ...] = (NumbaBackend(), TorchBackend(), TritonBackend(), CuSparseBackend())

__all__ = ["BACKENDS", "Backend", "Case", "CuSparseBackend", "NumbaBackend", "TorchBackend", "TritonBackend"]
