"""Several projections of one input as one GEMM (the attention layers' ``Q, K, V`` and
GATv2's two sides).

``x W_1^T, ..., x W_s^T`` (+ biases) with the weights stacked ``(s * d, m)``: one GEMM
reads ``x (n, m)`` once instead of ``s`` times (PubMed's ``x``, 19717 x 500 floats, is
39 MB), and its backward is one GEMM for the stacked weight gradient ``dP^T x`` and
one for ``dP W`` (``dP`` the stacked output gradients). The outputs are column blocks
of the one product, each copied out contiguous once (the fused kernels read
contiguous operands).
"""

from __future__ import annotations

import torch

__all__ = ["stacked_projections", "stacked_projection_grads"]


def stacked_projections(x: torch.Tensor, weights: tuple, biases: tuple, heads: int) -> tuple[torch.Tensor, ...]:
    """``(x W_i^T + b_i).unflatten(1, (heads, -1))`` for every ``W_i (d, m)`` of
    ``weights`` (all of one shape), biases ``(d,)`` each or all None; one GEMM."""
    w = torch.cat(weights)
    out = torch.mm(x, w.t()) if biases[0] is None else torch.addmm(torch.cat(biases), x, w.t())
    # (each block made contiguous once here: the kernels would copy a strided block per call)
    return tuple(p.contiguous().unflatten(1, (heads, -1)) for p in out.chunk(len(weights), dim=1))


def stacked_projection_grads(grads: tuple, x: torch.Tensor | None, weights: tuple, need_weights: bool, need_x: bool):
    """``(dW_1, ..., dW_s, dx)`` of :func:`stacked_projections` for the output gradients
    ``grads`` (each ``(n, d)``), ``x`` (needed for the weight gradients); a gradient not
    needed is None. Two GEMMs at most."""
    dP = torch.cat(grads, dim=1)
    dws = torch.mm(dP.t(), x).chunk(len(grads), dim=0) if need_weights else (None,) * len(grads)
    dx = torch.mm(dP, torch.cat(weights)) if need_x else None
    return (*dws, dx)
