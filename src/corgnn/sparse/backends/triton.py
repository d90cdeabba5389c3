"""The ``triton`` backend: Triton kernels for every sparse op (GPU).

Dispatch tries it on CUDA tensors after ``cusparse``, which takes only the
single-head SpMM (:data:`corgnn.sparse.dispatch.PRIORITY`); the ``torch`` gather
fallback runs a CUDA case only when this backend declines it,
and :func:`corgnn.sparse.dispatch.select` says why. The kernels are
:mod:`.triton_kernels`, launched by :mod:`.triton_ops` (each registered with
``torch.library.triton_op`` as ``corgnn::triton_<op>``, so ``torch.compile`` traces
into them; see :meth:`TritonBackend.traceable`).

CPU tensors: with ``TRITON_INTERPRET=1`` set before the kernels are first used,
Triton's interpreter runs them on CPU tensors, one program at a time (slow: tests
on tiny graphs). The backend then accepts CPU cases when forced
(``use_backend("triton")`` or ``CORGNN_BACKEND=triton``); automatic dispatch on CPU
keeps Numba first. Without the interpreter it declines CPU tensors, with the
reason. Under the interpreter ``torch.compile`` cannot trace the kernels (the
interpreter runs them on fake tensors), so the opaque op is traced instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from .base import OP_NAMES, Backend, Case

__all__ = ["TritonBackend"]

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _ops():
    """The launchers module (imports Triton and defines the kernels on first use)."""
    from . import triton_ops

    return triton_ops


def _interpreter_on() -> bool:
    """Whether the kernels run (or, not yet defined, would run) in Triton's interpreter."""
    if __package__ + ".triton_ops" in sys.modules:
        return _ops().interpreted()
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(Backend):
    """Triton kernels on CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``),
    float32/float64 and bfloat16/float16 (accumulated in float32)."""

    name = "triton"
    ops = tuple(op for op in OP_NAMES if op not in ("spmm_scatter_rows", "spmm_coo"))
    """(``A^T B`` by ``A``'s rows pays off through CPU caches; a GPU runs the transposed
    walk, ``spmm_rows``, and :mod:`corgnn.sparse.ops` asks for it on CPU only; an
    unsorted COO's scatter runs on the ``torch`` backend there, ``index_add_`` as PyG)"""

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed"
        return None

    def supports(self, case: Case) -> str | None:
        if case.device == "cpu":
            if not _interpreter_on():
                return "runs on CUDA tensors (CPU tensors only through Triton's interpreter: TRITON_INTERPRET=1 set before the first Triton kernel runs)"
        elif case.device != "cuda":
            return f"runs on CUDA tensors, got {case.device}"
        if case.dtype not in _DTYPES:
            return f"kernels take float32/float64/float16/bfloat16, got {case.dtype}"
        return None

    def kernel(self, op: str):
        return _ops().LAUNCHERS[op]

    def traceable(self, op: str):
        ops = _ops()
        return None if ops.interpreted() else ops.TRACEABLE.get(op)
