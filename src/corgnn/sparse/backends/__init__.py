"""Kernel backends (see :mod:`corgnn.sparse.dispatch`): ``numba`` (CPU kernels),
``torch`` (portable reference), ``triton`` (GPU kernels), ``cusparse`` (single-head
SpMM through torch's sparse CSR tensors). Importing this package registers all four."""

from ..dispatch import register_backend
from .cusparse import CuSparseBackend
from .numba_cpu import NumbaBackend
from .torch_ref import TorchBackend
from .triton import TritonBackend

register_backend(NumbaBackend())
register_backend(TorchBackend())
register_backend(TritonBackend())
register_backend(CuSparseBackend())

__all__ = ["CuSparseBackend", "NumbaBackend", "TorchBackend", "TritonBackend"]
