"""Kernel backends (see :mod:`corgnn.sparse.dispatch`): ``numba`` (CPU kernels),
``torch`` (portable reference), ``triton`` (GPU slot). Importing this package
registers all three."""

from ..dispatch import register_backend
from .numba_cpu import NumbaBackend
from .torch_ref import TorchBackend
from .triton import TritonBackend

register_backend(NumbaBackend())
register_backend(TorchBackend())
register_backend(TritonBackend())

__all__ = ["NumbaBackend", "TorchBackend", "TritonBackend"]
