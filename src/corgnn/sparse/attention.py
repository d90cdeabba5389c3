"""Fused multi-head GAT attention operators (raw: no autograd).

:class:`corgnn.functional.gat.GATFunction` calls them in both passes; each is one
custom op of :mod:`corgnn.sparse.library` (Numba kernels on CPU, the torch reference
elsewhere; see :mod:`corgnn.sparse.dispatch`), fed the adjacency's row plans.
Every backend uses the same entry order and the same dropout mask, so every
device gives the same answer.

* :func:`node_scores`        ``s = <M, a_src>``, ``d = <M, a_dst>`` per node and head
* :func:`attention_forward`  edge logits -> LeakyReLU -> row softmax -> dropout -> SpMM
* :func:`attention_backward` SDDMM -> dropout/softmax/LeakyReLU backward -> ``ds, dd, dM``
* :func:`head_weighted_sums` ``sum_i w[i, h] M[i, h]`` (the attention-vector gradients)
* :func:`dropout_keep_mask`  the attention-dropout mask the kernels draw, in torch ops

Conventions: ``A`` is the GAT adjacency (rows = destination nodes, columns = source
nodes, a pattern, duplicates kept); per-edge arrays ``(q, h)`` follow ``A``'s own
entry order; node arrays are ``(n, h)`` and features ``(n, h, k)`` (head in the
middle, paper §"Multi-head GAT").

Paper: appendix "GAT Forward Pass", "GAT Backward Pass", "GAT Operator Reordering".
"""

from __future__ import annotations

import torch

from . import library as L
from .formats import SparseFormat
from .rng import NO_DROPOUT, DropoutSpec, dropout_keep_mask, dropout_kernel_args

__all__ = [
    "DropoutSpec",
    "check_head_operands",
    "node_scores",
    "attention_forward",
    "attention_backward",
    "head_weighted_sums",
    "dropout_keep_mask",
    "dropout_kernel_args",
    "gatv2_attention_forward",
    "gatv2_attention_backward",
]

def check_head_operands(A: SparseFormat, dst: dict, src: dict, att: torch.Tensor | None = None, att_name: str = "att") -> None:
    """Raise ``ValueError`` (naming the argument) unless every tensor of ``dst`` is
    ``(n_dst, h, c)`` and every one of ``src`` ``(n_src, h, c)`` for ``A (n_dst, n_src)``,
    ``(h, c)`` those of the first tensor (of ``dst``, else of ``src``; and ``att`` has
    ``h * c`` values): the
    fused attention kernels read each at those sizes. Sizes that are not plain ints
    (``torch.compile``'s symbolic ones) are not compared."""
    n, m = A.shape
    named = [(name, t, n) for name, t in dst.items()] + [(name, t, m) for name, t in src.items()]
    for name, t, _ in named:
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (nodes, heads, channels), got shape {tuple(t.shape)}")
    first, lead = next(iter(dst.items())) if dst else next(iter(src.items()))
    h, c = lead.shape[1:]
    for name, t, rows in named:
        want, got = (rows, h, c), tuple(t.shape)
        if all(isinstance(v, int) for v in got + want) and got != want:
            raise ValueError(f"{name} must have shape {want} for A of shape {(n, m)} and {first}'s (heads, channels) {(h, c)}, got {got}")
    if att is not None and all(isinstance(v, int) for v in (att.numel(), h, c)) and att.numel() != h * c:
        raise ValueError(f"{att_name} must have {h} x {c} values (heads x channels), got shape {tuple(att.shape)}")


def _check_shape(name: str, t: torch.Tensor, *want) -> None:
    """Raise ``ValueError`` (naming ``name``) unless ``t`` has shape ``want`` (the GAT
    kernels' operands; symbolic sizes are not compared)."""
    got = tuple(t.shape)
    if t.dim() != len(want) or (all(isinstance(v, int) for v in got + want) and got != want):
        raise ValueError(f"{name} must have shape {want}, got {got}")


def node_scores(M: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Node attention ``s[i, h] = <M[i, h], att_src[h]>`` and ``d`` likewise.

    Paper appendix "GAT Operator Reordering": ``a^T [m_i || m_j]`` split into a
    source and a destination term, computed once per node (``O(nhk)``) instead of
    once per edge (``O(qhk)``).

    Args:
        M: ``(n, h, k)`` transformed features.
        att_src, att_dst: ``(h, k)`` (or PyG's ``(1, h, k)``), ``M``'s dtype and device.

    Returns:
        ``(s, d)``, each ``(n, h)``.

    Raises:
        ValueError: ``M`` not 3-D, or ``att_src``/``att_dst`` without ``h * k`` values.
    """
    if M.dim() != 3:
        raise ValueError(f"M must be 3-D (nodes, heads, channels), got shape {tuple(M.shape)}")
    H, K = M.shape[1:]
    for name, a in (("att_src", att_src), ("att_dst", att_dst)):
        if a.numel() != H * K:
            raise ValueError(f"{name} must have {H} x {K} values (heads x channels), got shape {tuple(a.shape)}")
    return L.gat_node_scores(M.contiguous(), att_src.reshape(H, K).contiguous(), att_dst.reshape(H, K).contiguous())


def attention_forward(
    A: SparseFormat,
    s: torch.Tensor,
    d: torch.Tensor,
    M: torch.Tensor,
    negative_slope: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    want_leaky: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Attention and aggregation of one GAT layer, fused per destination row.

    ``y_e = s[src_e] + d[dst_e]``; ``alpha = softmax_row(LeakyReLU(y))`` over each
    destination's incoming entries; ``out[i] = sum_e dropout(alpha_e) M[src_e]``
    (semi-batched SpMM, no ``(q, h, k)`` messages in the kernel backends).

    Args:
        A: GAT adjacency ``(n, n)`` pattern (rows = destinations).
        s, d: ``(n, h)`` source / destination node attention.
        M: ``(n, h, k)`` transformed features.
        negative_slope: LeakyReLU slope.
        drop: attention dropout (inactive by default).
        want_leaky: also return the LeakyReLU mask ``y > 0``.

    Returns:
        ``(out (n, h, k), alpha (q, h) before dropout, leaky (q, h) bool or None)``.

    Raises:
        ValueError: ``M`` not ``(n_src, h, k)``, ``s`` not ``(n_src, h)`` or ``d`` not
            ``(n_dst, h)`` for ``A (n_dst, n_src)``, before any kernel runs.
    """
    check_head_operands(A, {}, {"M": M})
    _check_shape("s", s, A.shape[1], M.shape[1])
    _check_shape("d", d, A.shape[0], M.shape[1])
    ptr, idx, perm = A.row_plan(False)
    out, alpha, leaky = L.gat_attention(
        ptr, idx, perm, s.contiguous(), d.contiguous(), M.contiguous(), float(negative_slope), drop.p, drop.seed, want_leaky
    )
    return out, alpha, leaky if want_leaky else None


def attention_backward(
    A: SparseFormat,
    G: torch.Tensor,
    M: torch.Tensor,
    att_src: torch.Tensor,
    att_dst: torch.Tensor,
    negative_slope: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    alpha: torch.Tensor | None = None,
    leaky: torch.Tensor | None = None,
    s: torch.Tensor | None = None,
    d: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`attention_forward` (+ the node-attention products).

    Paper appendix "GAT Backward Pass", with ``G = dL/dout (n, h, k)``:
    ``dalpha = SDDMM(G, M)`` (times the dropout mask and scale);
    ``dw = alpha (dalpha - sum_row alpha dalpha)``; ``dy = f'(y) dw``;
    ``dd = sum_row dy``; ``ds = sum_col dy``;
    ``dM = ds a_src + dd a_dst + A_drop^T G``.

    What the forward cached decides the inputs (paper Table 4): ``alpha`` and
    ``leaky`` (scheme "edge_weights"), or ``s`` and ``d`` from which both are
    recomputed (the other schemes). One destination-row pass computes ``dy`` and
    ``dd``; one source-column pass (``A``'s transposed walk) computes ``ds`` and ``dM``.

    Returns:
        ``(dM (n, h, k), ds (n, h), dd (n, h))``.

    Raises:
        ValueError: neither ``alpha`` + ``leaky`` nor ``s`` + ``d`` given; ``G``, ``M``,
            ``att_src``, ``att_dst``, ``alpha``, ``leaky``, ``s``, ``d`` not shaped as the
            forward's (``(n_dst, h, k)``, ``(n_src, h, k)``, ``h * k`` values, ``(q, h)``,
            ``(n_src, h)``, ``(n_dst, h)``), before any kernel runs.
    """
    if (alpha is None or leaky is None) and (s is None or d is None):
        raise ValueError("attention_backward needs the cached alpha and leaky mask, or s and d to recompute them")
    if alpha is None or leaky is None:
        alpha = leaky = None
    check_head_operands(A, {}, {"M": M}, att_src, "att_src")  # (M sets the heads and channels)
    H, K = M.shape[1:]
    if att_dst.numel() != H * K:
        raise ValueError(f"att_dst must have {H} x {K} values (heads x channels), got shape {tuple(att_dst.shape)}")
    _check_shape("G", G, A.shape[0], H, K)
    for name, t, rows in (("alpha", alpha, A.nnz), ("leaky", leaky, A.nnz), ("s", s, A.shape[1]), ("d", d, A.shape[0])):
        if t is not None:
            _check_shape(name, t, rows, H)
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    return L.gat_attention_backward(
        *A.row_plan(False), *A.row_plan(True), G.contiguous(), M.contiguous(),
        att_src.reshape(H, K).contiguous(), att_dst.reshape(H, K).contiguous(),
        c(alpha), c(leaky), c(s), c(d), float(negative_slope), drop.p, drop.seed,
    )


def head_weighted_sums(w1: torch.Tensor, w2: torch.Tensor, M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_i w1[i, h] M[i, h], sum_i w2[i, h] M[i, h])``, each ``(h, k)``.

    With ``w1 = dL/ds``, ``w2 = dL/dd`` these are ``dL/da_src = M^T ds`` and
    ``dL/da_dst = M^T dd`` (paper appendix "GAT Backward Pass"), per head.

    Raises:
        ValueError: ``M`` not 3-D ``(n, h, k)`` or ``w1``/``w2`` not ``(n, h)``.
    """
    if M.dim() != 3:
        raise ValueError(f"M must be 3-D (nodes, heads, channels), got shape {tuple(M.shape)}")
    for name, w in (("w1", w1), ("w2", w2)):
        _check_shape(name, w, M.shape[0], M.shape[1])
    return L.gat_head_weighted_sums(w1.contiguous(), w2.contiguous(), M.contiguous())


def gatv2_attention_forward(
    A: SparseFormat,
    XL: torch.Tensor,
    XR: torch.Tensor,
    att: torch.Tensor,
    negative_slope: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    want_alpha: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """GATv2 attention and aggregation, fused per destination row (PyG ``GATv2Conv``).

    ``s_e = <a, LeakyReLU(XL[j] + XR[i])>`` per head for entry ``e = (i, j)`` of ``A``;
    ``alpha = softmax_row(s)`` (Triton: an online softmax, FlashAttention's running
    max and sum; Numba: the row's scores in a buffer); ``out[i] = sum_e dropout(alpha_e) XL[j]``. The kernel backends never store
    a ``(q, h, k)`` value.

    Args:
        A: attention pattern ``(n_dst, n_src)`` (rows = destinations).
        XL: ``(n_src, h, k)`` source side ``x W_l^T + b_l``.
        XR: ``(n_dst, h, k)`` target side ``x W_r^T + b_r`` (may be ``XL`` itself).
        att: ``(h, k)`` (or PyG's ``(1, h, k)``) attention vector ``a``.
        negative_slope: LeakyReLU slope.
        drop: attention dropout (inactive by default).
        want_alpha: also return ``alpha``.

    Returns:
        ``(out (n_dst, h, k), alpha (q, h) before dropout in A's entry order or None,
        lse (n_dst, h))``, ``lse`` each row's log-sum-exp of the scores (0 for an
        empty row), from which :func:`gatv2_attention_backward` recomputes ``alpha``.

    Raises:
        ValueError: ``XL (n_src, h, k)``, ``XR (n_dst, h, k)`` and ``att`` (``h * k``
            values) not fitting ``A`` and one another (:func:`check_head_operands`).
    """
    check_head_operands(A, {"XR": XR}, {"XL": XL}, att)
    H, K = XL.shape[1:]
    ptr, idx, perm = A.row_plan(False)
    out, alpha, lse = L.gatv2_attention(
        ptr, idx, perm, XL, XR, att.reshape(H, K).contiguous(), float(negative_slope), drop.p, drop.seed, want_alpha,
    )
    return out, alpha if want_alpha else None, lse


def gatv2_attention_backward(
    A: SparseFormat,
    G: torch.Tensor,
    XL: torch.Tensor,
    XR: torch.Tensor,
    att: torch.Tensor,
    negative_slope: float,
    drop: DropoutSpec = NO_DROPOUT,
    *,
    alpha: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of :func:`gatv2_attention_forward`, with ``G = dL/dout (n_dst, h, k)``
    and ``f`` = LeakyReLU (derivation as the paper's appendix "GAT Backward Pass"):

    * ``dalpha_e = <G_i, XL_j>`` (SDDMM; times the dropout keep and scale);
    * ``de_e = alpha_e (dalpha_e - sum_row alpha dalpha)`` (softmax backward);
    * per edge and channel ``t = XL_j + XR_i``, ``g = de_e a f'(t)``:
      ``dXR_i += g``, ``dXL_j += g + drop(alpha_e) G_i`` (the latter the transposed
      SpMM ``A_alpha^T G``), ``da += de_e f(t)``.

    One walk of the destination rows computes ``de``, ``dXR`` and ``da``; one walk of
    the source columns (``A``'s transposed row plan) computes ``dXL``; no ``(q, h, k)``
    value is stored. ``alpha`` is the cached attention (scheme "edge_weights"), or
    recomputed per entry as ``exp(s_e - lse_i)`` from the forward's ``lse``.

    Returns:
        ``(dXL (n_src, h, k), dXR (n_dst, h, k), datt (h, k))``.

    Raises:
        ValueError: neither ``alpha`` nor ``lse`` given; ``G``, ``XL``, ``XR``, ``att``
            not shaped as the forward's (:func:`check_head_operands`).
    """
    if alpha is None and lse is None:
        raise ValueError("gatv2_attention_backward needs the cached alpha or the forward's lse to recompute it")
    check_head_operands(A, {"XR": XR, "G": G}, {"XL": XL}, att)
    H, K = XL.shape[1:]
    c = lambda t: None if t is None else t.contiguous()  # noqa: E731
    return L.gatv2_attention_backward(
        *A.row_plan(False), *A.row_plan(True), G, XL, XR, att.reshape(H, K).contiguous(),
        c(alpha), None if alpha is not None else c(lse), float(negative_slope), drop.p, drop.seed,
    )
