"""The ``triton`` backend slot: GPU kernels in Triton (not written yet).

Dispatch tries this backend first on CUDA tensors (:data:`corgnn.sparse.dispatch.PRIORITY`).
It declares itself unavailable, with the reason, until its kernels exist, so CUDA
tensors run on the ``torch`` backend and ``use_backend("triton")`` raises a clear
``ValueError``. A kernel added here implements the op of the same name in
:mod:`corgnn.sparse.library` (register it with ``torch.library.triton_op`` so
``torch.compile`` can see into it) and :meth:`TritonBackend.supports` lists the
cases it runs.
"""

from __future__ import annotations

import importlib.util

from ..dispatch import Backend, Case

__all__ = ["TritonBackend"]


class TritonBackend(Backend):
    name = "triton"

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed"
        return "no Triton kernels are implemented yet (the GPU backend is future work)"

    def supports(self, case: Case) -> str | None:
        return self.unavailable()
