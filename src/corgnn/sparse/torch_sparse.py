"""``torch.sparse`` matrices as corgnn formats."""

from __future__ import annotations

import torch

from .formats import CSR

__all__ = ["from_torch_sparse"]

def from_torch_sparse(t: torch.Tensor):
    """corgnn :class:`~corgnn.sparse.CSR` of a 2-D ``torch.sparse`` matrix (COO, CSR,
    CSC, BSR or BSC layout): same shape, values, dtype and device; the entries of an
    uncoalesced COO tensor are summed per position, as ``t.to_dense()`` does. The
    values are taken as constants (no autograd link to ``t``).

    Raises:
        TypeError: ``t`` is not a sparse tensor.
        ValueError: not 2-D, or hybrid (values with dense dimensions).
    """
    if not isinstance(t, torch.Tensor) or t.layout == torch.strided:
        what = f"a dense {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"expected a torch.sparse tensor, got {what}")
    if t.dim() != 2 or t.dense_dim() != 0:
        raise ValueError(f"expected a 2-D sparse matrix with scalar values, got shape {tuple(t.shape)} with {t.dense_dim()} dense dim(s) ({t.layout})")
    t = t.detach()
    shape = (int(t.size(0)), int(t.size(1)))
    if t.layout == torch.sparse_csr:
        return CSR(t.crow_indices().long().contiguous(), t.col_indices().long().contiguous(), t.values().contiguous(), shape)
    if t.layout != torch.sparse_coo:
        t = t.to_sparse_coo()
    t = t.coalesce()  # sorted row-major, duplicates summed
    row, col = t.indices()
    return CSR.from_coo(row, col, t.values(), shape)
