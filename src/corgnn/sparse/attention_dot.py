"""Fused graph dot-product attention operators (raw: no autograd), the kernels of
PyG's ``TransformerConv`` (Shi et al. 2021, "Masked Label Prediction: Unified Message
Passing Model for Semi-Supervised Classification", UniMP).

:class:`corgnn.functional.transformer.TransformerFunction` calls them in both passes;
each is one custom op of :mod:`corgnn.sparse.library` (Numba kernels on CPU, Triton
on GPU, the torch reference elsewhere; see :mod:`corgnn.sparse.dispatch`), fed the
attention pattern's row plans. Every backend uses the same entry order and the same
attention-dropout mask (:mod:`corgnn.sparse.rng`), so every device gives the same answer.

* :func:`dot_attention_forward`   scores ``<Q_i, K_j> * scale`` -> row softmax -> dropout -> SpMM with ``V``
* :func:`dot_attention_backward`  SDDMM -> dropout and softmax backward -> ``dQ, dK, dV``

Conventions: ``A`` is the attention pattern ``(n_dst, n_src)`` (rows = destination
nodes, columns = source nodes, a pattern, duplicates kept); per-edge arrays ``(q, h)``
follow ``A``'s own entry order; ``Q (n_dst, h, c)``, ``K, V (n_src, h, c)`` (head in
the middle, as the GAT kernels).
"""

from __future__ import annotations

import torch

from . import library as L
from .attention import check_head_operands
from .formats import SparseFormat
from .rng import NO_DROPOUT, DropoutSpec

__all__ = ["dot_attention_forward", "dot_attention_backward", "dot_attention_backward_rows", "dot_attention_backward_cols"]


def dot_attention_forward(
    A: SparseFormat,
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    scale: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    want_alpha: bool = False,
    Qe: torch.Tensor | None = None,
    attr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Scaled dot-product attention over ``A``'s entries, fused per destination row.

    ``s_e = <Q[i], K[j]> * scale`` per head for entry ``e = (i, j)``;
    ``alpha = softmax_row(s)`` over each destination's incoming entries;
    ``out[i] = sum_e dropout(alpha_e) V[j]``: one kernel per row (Triton: one pass
    with an online softmax, FlashAttention's running max and sum; Numba: the row's
    scores in a buffer, then their exps, then the aggregation), no ``(q, h, c)``
    messages in the kernel backends.

    Args:
        A: attention pattern ``(n_dst, n_src)``.
        Q: ``(n_dst, h, c)`` queries; K, V: ``(n_src, h, c)`` keys and values.
        scale: score scale (``1 / sqrt(c)`` in ``TransformerConv``).
        drop: attention dropout (inactive by default).
        want_alpha: also return the attention weights.
        Qe, attr: edge features, both or neither: ``attr (q, f)`` per entry in ``A``'s
            order and ``Qe (n_dst, h, f)`` the queries projected on them
            (``Qe_i = W_e^T Q_i`` per head for PyG's ``lin_edge`` ``W_e``), so that
            ``s_e = (<Q_i, K_j> + <Qe_i, attr_e>) * scale = <Q_i, K_j + W_e attr_e> * scale``.

    Returns:
        ``(out (n_dst, h, c), lse (n_dst, h), alpha (q, h) before dropout or None,
        Ae (n_dst, h, f) or None)``: ``lse`` the row's ``log sum_e exp(s_e)`` (0 for a
        row without entries), from which the backward pass can recompute
        ``alpha_e = exp(s_e - lse_i)``; ``Ae_i = sum_e dropout(alpha_e) attr_e`` with
        edge features (the caller adds ``W_e Ae_i``, PyG's ``+ W_e attr_e`` on the values).

    Raises:
        ValueError: ``Q``, ``K``, ``V`` not shaped ``(n_dst, h, c)``, ``(n_src, h, c)``
            for ``A (n_dst, n_src)`` (values as wide as queries and keys).
    """
    check_head_operands(A, {"Q": Q}, {"K": K, "V": V})
    ptr, idx, perm = A.row_plan(False)
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    # (Q, K and V in any layout: each backend reads them as it needs, Numba heads-last)
    out, lse, alpha, Ae = L.transformer_attention(
        ptr, idx, perm, Q, K, V, c(Qe), c(attr), float(scale), drop.p, drop.seed, bool(want_alpha)
    )
    return out, lse, alpha if want_alpha else None, Ae if attr is not None else None


def dot_attention_backward(
    A: SparseFormat,
    G: torch.Tensor,
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    scale: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    alpha: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    Qe: torch.Tensor | None = None,
    Ge: torch.Tensor | None = None,
    attr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Backward of :func:`dot_attention_forward`, with ``G = dL/dout (n_dst, h, c)``.

    Per entry ``e = (i, j)`` and head (``drop_e`` the dropout factor, 0 or ``1/(1-p)``):

    * ``dalpha_e = drop_e <G_i, V_j>`` (SDDMM)
    * ``de_e = alpha_e (dalpha_e - D_i)`` with ``D_i = sum_row alpha dalpha = <G_i, out_i>``,
      summed over the row's own entries (so the caller keeps no ``out``)
    * ``dQ_i = scale * sum_e de_e K_j`` (the row walk)
    * ``dK_j = scale * sum_e de_e Q_i`` and ``dV_j = sum_e drop_e alpha_e G_i`` (the
      transposed walk of ``A``)

    Args:
        A: the forward's pattern. G: ``(n_dst, h, c)``, or ``(n_dst, 1, c)``: one
            gradient for every head (a head-mean output's, never expanded to ``h``
            copies). Q, K, V: as the forward.
        alpha: ``(q, h)`` the forward's attention before dropout (cached), or None
            and ``lse (n_dst, h)`` to recompute it from.
        Qe, Ge, attr: edge features (all or none): ``attr (q, f)``, ``Qe`` as the
            forward and ``Ge (n_dst, h, f) = W_e^T G_i`` per head; ``dalpha_e`` gains
            ``drop_e <Ge_i, attr_e>``.

    Returns:
        ``(dQ, dK, dV, dQe, dattr)``: ``dQ, dK, dV`` shaped as ``Q, K, V`` (``dQ``
        without the edge term ``scale W_e dQe``, which the caller adds); with edge
        features ``dQe_i = sum_e de_e attr_e (n_dst, h, f)`` and
        ``dattr_e = sum_h (scale de_e Qe_i + drop_e alpha_e Ge_i) (q, f)``, else None.

    Raises:
        ValueError: neither ``alpha`` nor ``lse`` given; ``G, Q, K, V`` not shaped as
            the forward's.
    """
    ea, dQ, dQe, dattr = dot_attention_backward_rows(A, G, Q, K, V, scale, drop, alpha=alpha, lse=lse, Qe=Qe, Ge=Ge, attr=attr)
    dK, dV = dot_attention_backward_cols(A, G, Q, ea, alpha, scale)
    return dQ, dK, dV, dQe, dattr


def dot_attention_backward_rows(
    A: SparseFormat,
    G: torch.Tensor,
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    scale: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    alpha: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    Qe: torch.Tensor | None = None,
    Ge: torch.Tensor | None = None,
    attr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The row walk of :func:`dot_attention_backward` (same arguments): ``(ea, dQ,
    dQe, dattr)`` with ``ea (q, 2, h)`` the per-entry ``de`` and dropped attention
    ``drop_e alpha_e`` side by side, in ``A``'s entry order, or ``(q, 1, h)`` (``de``)
    when that attention is ``alpha`` itself (cached, no dropout), for
    :func:`dot_attention_backward_cols`. ``K`` and ``V``
    are not read after it: a caller holding the only references may drop them
    before the column walk (the transformer's backward does, issue 25's memory goal).

    Raises:
        ValueError: as :func:`dot_attention_backward`.
    """
    if alpha is None and lse is None:
        raise ValueError("dot_attention_backward needs the cached alpha, or lse to recompute it")
    one_head = G.dim() == 3 and G.size(1) == 1 and Q.dim() == 3  # (checked as its h-head view)
    check_head_operands(A, {"Q": Q, "G": G.expand(-1, Q.size(1), -1) if one_head else G}, {"K": K, "V": V})
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    ea, dQ, dQe, dattr = L.transformer_attention_backward_rows(
        *A.row_plan(False), G.contiguous(), Q, K, V,
        c(Qe), c(Ge), c(attr), c(alpha), None if alpha is not None else c(lse), float(scale), drop.p, drop.seed,
    )
    return (ea, dQ) + ((dQe, dattr) if attr is not None else (None, None))


def dot_attention_backward_cols(
    A: SparseFormat, G: torch.Tensor, Q: torch.Tensor, ea: torch.Tensor, alpha: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The column walk of :func:`dot_attention_backward` (the transposed plan of
    ``A``): ``(dK (n_src, h, c), dV (n_src, h, c_v))`` from
    :func:`dot_attention_backward_rows`' ``ea``, and the cached ``alpha (q, h)`` when
    ``ea`` holds ``de`` alone.

    Raises:
        ValueError: ``ea`` not ``(nnz, 1 or 2, h)`` with ``h`` as ``Q``'s heads; ``ea``
            with one slot and no ``alpha``.
    """
    h = Q.size(1)
    if ea.dim() != 3 or ea.size(0) < A.nnz or ea.size(1) not in (1, 2) or ea.size(2) != h:
        raise ValueError(f"ea: expected ({A.nnz}, 1 or 2, {h}) per-entry values of the row walk, got {tuple(ea.shape)}")
    if ea.size(1) == 1 and alpha is None:
        raise ValueError("alpha: ea holds de alone (the row walk read a cached alpha); pass that alpha")
    return L.transformer_attention_backward_cols(
        *A.row_plan(True), G, Q, ea, None if ea.size(1) == 2 else alpha.contiguous(), float(scale),
    )
