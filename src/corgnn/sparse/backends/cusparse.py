"""The ``cusparse`` backend: single-head SpMM through PyTorch's sparse CSR tensors.

``torch.sparse.mm`` / ``torch.addmm`` on a ``torch.sparse_csr`` tensor run cuSPARSE's
SpMM on CUDA tensors (and PyTorch's own CPU sparse CSR kernels on CPU tensors).
This backend runs the one op those calls express, ``spmm_rows`` (a row plan, with
or without values, with the bias as ``addmm``'s added matrix), and declines every
other op with the reason:

* semi-batched (multi-head) operands: a CSR tensor has one value per entry, and
  ``torch.sparse.mm`` takes 2-D dense operands only;
* ``spmm_ell`` / ``spmm_hybrid``: their own layouts (the row plan of the same
  matrix runs here: ``ops`` walks it for every other format);
* SDDMM, edge softmax and the fused GAT kernels: no cuSPARSE call through torch
  computes them.

Dispatch (:data:`corgnn.sparse.dispatch.PRIORITY`) tries it first on CUDA, before
``triton`` and the ``torch`` gather fallback: on an H100 (2026-11-27,
``benchmarks/results/gpu-h100-20261127``) this SpMM took 0.348 ms on the OGB-Arxiv
shape at f = 64 against 0.472 ms for the Triton row kernel, 0.074 against 0.236 ms on
PubMed's graph. On CPU it runs only when forced
(``use_backend("cusparse")`` or ``CORGNN_BACKEND=cusparse``), float32/float64: the
same calls then run PyTorch's CPU CSR path, which is how the tests compare it with
the other backends without a GPU.

What is kept per row plan: ``q = ptr[-1]`` (reading it is a host sync on CUDA) and
the all-ones values of the pattern (``val=None``), per dtype, while the plan's
``ptr`` tensor lives (held weakly, as the other backends key per-plan state; the
formats keep the plans themselves). The ``torch.sparse_csr`` tensor is a
zero-copy wrapper of ``ptr``, ``idx[:q]`` and the values (about 4 µs to build,
measured on CPU), made per call: kept in a cache keyed on ``ptr`` it would hold
``ptr`` alive (its row pointer *is* ``ptr``), and the entry would never be freed.
Values given through ``perm`` are gathered once per call (``val[perm]``; a format's
own values reach the op already in walk order, see :mod:`corgnn.sparse.ops`).
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .base import Backend, Case

__all__ = ["CuSparseBackend"]

_CUDA_DTYPES = (torch.float32, torch.float64, torch.float16)
_CPU_DTYPES = (torch.float32, torch.float64)

_PLANS = WeakIdKeyDictionary()
"""Row plan ``ptr`` (held weakly) -> ``[q, {dtype: ones (q,)}]``."""


def _csr(ptr, idx, perm, val, columns: int, dtype: torch.dtype) -> torch.Tensor:
    """The row plan ``(ptr, idx, perm)`` with values ``val`` (format order; None =
    ones) as a ``torch.sparse_csr`` tensor ``(rows, columns)`` of ``dtype``."""
    plan = _PLANS.get(ptr)
    if plan is None:
        plan = _PLANS[ptr] = [int(ptr[-1]), {}]
    q, ones = plan
    if val is None:
        v = ones.get(dtype)
        if v is None:
            v = ones[dtype] = torch.ones(q, dtype=dtype, device=ptr.device)
    else:
        v = (val[:q] if perm is None else val.index_select(0, perm[:q])).to(dtype)
    return torch.sparse_csr_tensor(ptr, idx[:q], v, (ptr.numel() - 1, columns), check_invariants=False)


class CuSparseBackend(Backend):
    """``spmm_rows`` (single-head) as ``torch.sparse.mm`` / ``torch.addmm`` on a CSR
    tensor: cuSPARSE on CUDA (float32/float64/float16), PyTorch's CPU CSR kernels on
    CPU tensors when forced (float32/float64)."""

    name = "cusparse"

    def supports(self, case: Case) -> str | None:
        if case.op != "spmm_rows":
            return f"runs the single-head row-plan SpMM only (torch.sparse.mm on a CSR tensor); {case.op} has no cuSPARSE call through torch"
        if case.heads is not None:
            return "torch.sparse.mm takes 2-D dense operands: no semi-batched (multi-head) layout"
        if case.device == "cuda":
            ok = _CUDA_DTYPES
        elif case.device == "cpu":
            ok = _CPU_DTYPES
        else:
            return f"runs on CUDA tensors (CPU tensors when forced), got {case.device}"
        if case.dtype not in ok:
            names = "/".join(str(d).replace("torch.", "") for d in ok)
            return f"sparse CSR matmul on {case.device} takes {names}, got {case.dtype}"
        return None

    def spmm_rows(self, ptr, idx, perm, val, B, bias=None):
        n = ptr.numel() - 1
        if n == 0 or B.size(1) == 0 or B.size(0) == 0:
            out = torch.zeros(n, B.size(1), dtype=B.dtype, device=B.device)
            return out if bias is None else out.add_(bias)
        A = _csr(ptr, idx, perm, val, B.size(0), B.dtype)
        B = B.contiguous()
        out = torch.sparse.mm(A, B) if bias is None else torch.addmm(bias.expand(n, B.size(1)), A, B)
        return out.contiguous()  # the op's (and the other backends') row-major layout
