"""Attention dropout's random bits: the seed record and the counter-based keep mask.

Shared by the GAT operators (:mod:`corgnn.sparse.attention`) and every backend
(:mod:`corgnn.sparse.backends`), which draw the same mask from the same seed, so
every device gives the same answer. Imports torch only.
"""

from __future__ import annotations

import torch

__all__ = ["DropoutSpec", "NO_DROPOUT", "dropout_keep_mask", "dropout_kernel_args"]

_M32 = 0xFFFFFFFF


class DropoutSpec:
    """Attention dropout of one call: probability ``p`` and the 64-bit ``seed`` of the
    counter-based mask (:func:`dropout_keep_mask`). ``p == 0`` means no dropout.

    ``seed`` is an int64 tensor of one element (an int is converted);
    ``seed=None`` draws one from torch's default generator (so ``torch.manual_seed``
    makes runs reproducible). A tensor, not a Python int, so that drawing it under
    ``torch.compile`` is a graph op rather than a data-dependent ``.item()``.
    """

    __slots__ = ("p", "seed")

    def __init__(self, p: float = 0.0, seed: "int | torch.Tensor | None" = None, device=None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        if seed is None:
            seed = torch.randint(0, 2**62, (1,), device=device) if p > 0 else torch.zeros(1, dtype=torch.long, device=device)
        elif not isinstance(seed, torch.Tensor):
            seed = torch.tensor([int(seed)], dtype=torch.long, device=device)
        self.seed = seed.reshape(1)

    @property
    def active(self) -> bool:
        return self.p > 0.0

    def __repr__(self) -> str:
        return f"DropoutSpec(p={self.p}, seed={self.seed.tolist()[0]})"


def dropout_kernel_args(p: float, seed: torch.Tensor) -> tuple[int, float, int, int]:
    """``(thresh, scale, seed_lo, seed_hi)`` as the kernels take them (run-time side
    of the ops: reads the seed tensor)."""
    if p <= 0.0:
        return 0, 1.0, 0, 0
    s = int(seed.reshape(-1)[0])
    thresh = max(1, min(_M32, round(p * 2**32)))
    return thresh, 1.0 / (1.0 - p), s & _M32, (s >> 32) & _M32


NO_DROPOUT = DropoutSpec(0.0, 0)


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def dropout_keep_mask(q: int, heads: int, p: float, seed: torch.Tensor, device=None) -> torch.Tensor:
    """The attention-dropout keep mask ``(q, heads)`` bool (all True if ``p == 0``),
    exactly as the kernels draw it (:func:`corgnn.sparse.backends.numba_gat_kernels.keep_edge`):
    entry ``(e, h)`` is kept when a 32-bit hash of ``(e * heads + h, seed)`` is at
    least ``round(p * 2**32)``. Built in torch ops (any device); costs ``q * heads``
    int64 temporaries, so the Numba kernels never build it.
    """
    if p <= 0.0:
        return torch.ones(q, heads, dtype=torch.bool, device=device)
    thresh, _, lo, hi = dropout_kernel_args(p, seed)
    flat = torch.arange(q * heads, dtype=torch.long, device=device)
    x = _mix32_t((flat & _M32) ^ lo)
    x = _mix32_t(x ^ ((flat >> 32) & _M32) ^ hi)
    return (x >= thresh).view(q, heads)
