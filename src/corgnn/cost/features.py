"""Whether dense input features are worth converting to a sparse matrix (CSR).

A layer can run the products that read its input features ``X (n, m)`` as SpMMs over
``X``'s non-zeros instead of dense GEMMs: the forward ``X Θ`` and, in training, the
fused-propagate backward ``X^T P`` (``Θ (m, k)``, ``P (n, k)``; see
:mod:`corgnn.cost.gcn`). That saves ``t_dense - t_sparse`` per use, but the
conversion itself reads ``X`` twice (count the non-zeros per row, then fill the CSR:
:func:`corgnn.nn.base.dense_to_csr`), writes the CSR and, in training, sorts its
entries once more for the transposed product ``X^T P`` (a CSC permutation). Constant features (a
dataset's ``x``) are converted once and used every step; a tensor that is new on
every call (e.g. the output of a dropout) is used once, so it is converted only
when one use saves more than the conversion costs.

Times come from the same :class:`~corgnn.cost.gcn.MachineModel` as the scheme plan
(``FLOPs / flop_rate + bytes / bandwidth``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .gcn import MachineModel, gemm_cost, spmm_cost

__all__ = ["ConversionPlan", "plan_feature_conversion"]


@dataclass(frozen=True)
class ConversionPlan:
    """The decision for one feature tensor, with its estimated times (seconds).

    Attributes:
        convert: use the CSR of ``X`` (True) or keep ``X`` dense.
        conversion_s: the dense-to-CSR conversion (two reads of ``X``, one CSR write,
            in training the transposition sort).
        dense_s, sparse_s: the products reading ``X`` in one call, dense vs sparse.
        uses: calls the conversion is paid over (None: reused, cost amortised).
        reason: one line saying why.
    """

    convert: bool
    conversion_s: float
    dense_s: float
    sparse_s: float
    uses: int | None
    reason: str

    def line(self) -> str:
        """One line for ``corgnn explain``."""
        return (
            f"feature conversion: {'CSR' if self.convert else 'dense'} (convert {self.conversion_s * 1e3:.3g} ms; per call dense "
            f"{self.dense_s * 1e3:.3g} ms vs sparse {self.sparse_s * 1e3:.3g} ms; {self.reason})"
        )


def plan_feature_conversion(
    n: int, m: int, nnz: int, k: int, *, training: bool, uses: int | None = None, machine: MachineModel = MachineModel()
) -> ConversionPlan:
    """Decide whether to convert dense features ``X (n, m)`` with ``nnz`` non-zeros,
    read by a layer of width ``k`` (``Θ (m, k)``; GAT: ``heads * out_channels``).

    Args:
        n, m, nnz, k: sizes (``0 <= nnz <= n * m``).
        training: whether the backward ``X^T P`` also reads ``X``.
        uses: how many calls will use this tensor (1: a tensor seen once); None =
            reused for many calls (converted whenever one call is cheaper sparse).
        machine: rates turning FLOPs and bytes into time.

    Raises:
        ValueError: negative sizes, ``nnz > n * m``, ``uses < 1``.
    """
    return _plan(n, m, nnz, k, training, uses, machine)


@functools.lru_cache(maxsize=4096)
def _plan(n: int, m: int, nnz: int, k: int, training: bool, uses: int | None, machine: MachineModel) -> ConversionPlan:
    """:func:`plan_feature_conversion`, memoised: a pure function of its (hashable)
    arguments that layers ask for on every new feature tensor (~6 us each, most of it
    the ``reason`` text); a plan is frozen, so the memo hands out the same object."""
    for name, v in (("n", n), ("m", m), ("nnz", nnz), ("k", k)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if nnz > n * m:
        raise ValueError(f"nnz={nnz} exceeds n*m={n * m}")
    if uses is not None and uses < 1:
        raise ValueError(f"uses must be None or >= 1, got {uses}")
    mm = machine
    passes = 2 if training else 1  # X Θ, and X^T P in backward
    t = lambda fb: fb[0] / mm.flop_rate + fb[1] / mm.bandwidth  # noqa: E731
    dense_s = passes * t(gemm_cost(n, m, k, mm))
    sparse_s = t(spmm_cost(nnz, n, m, k, mm)) + (t(spmm_cost(nnz, m, n, k, mm)) if training else 0.0)
    conversion_bytes = 2 * n * m * mm.value_bytes + nnz * (mm.index_bytes + mm.value_bytes) + (n + 1) * mm.index_bytes
    if training and nnz > 1:  # the transposed plan of X^T P: a sort, ~log2(nnz) passes over keys and permutation
        conversion_bytes += math.ceil(math.log2(nnz)) * nnz * 2 * mm.index_bytes
    conversion_s = conversion_bytes / mm.bandwidth
    saving = dense_s - sparse_s
    if uses is None:
        convert = saving > 0
        reason = "reused features: converted once" if convert else "sparse products no cheaper than dense"
    else:
        convert = uses * saving > conversion_s
        reason = f"{uses} use(s) save {uses * saving * 1e3:.3g} ms {'>' if convert else '<='} conversion"
    return ConversionPlan(convert, conversion_s, dense_s, sparse_s, uses, reason)
