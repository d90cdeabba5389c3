"""Fused multi-head GAT attention operators, dispatched by device.

Raw operators (no autograd; :class:`corgnn.functional.gat.GATFunction` calls them in
both passes). On CPU they run the Numba kernels of :mod:`corgnn.sparse.cpu_gat`; on
other devices (CUDA) the same maths in torch gather/scatter ops, with the same entry
order and the same dropout mask, so every device gives the same answer.

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

import numba
import numpy as np
import torch

from . import cpu_gat
from .formats import SparseFormat

__all__ = [
    "DropoutSpec",
    "node_scores",
    "attention_forward",
    "attention_backward",
    "head_weighted_sums",
    "dropout_keep_mask",
]

_M32 = 0xFFFFFFFF


class DropoutSpec:
    """Attention dropout of one call: probability ``p`` and the 64-bit ``seed`` of the
    counter-based mask (:func:`dropout_keep_mask`). ``p == 0`` means no dropout.

    ``seed=None`` draws one from torch's default generator (so ``torch.manual_seed``
    makes runs reproducible).
    """

    __slots__ = ("p", "seed")

    def __init__(self, p: float = 0.0, seed: int | None = None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,))) if p > 0 else 0
        self.seed = int(seed)

    @property
    def active(self) -> bool:
        return self.p > 0.0

    def kernel_args(self) -> tuple[int, float, int, int]:
        """``(thresh, scale, seed_lo, seed_hi)`` as the kernels take them."""
        if not self.active:
            return 0, 1.0, 0, 0
        thresh = max(1, min(_M32, round(self.p * 2**32)))
        return thresh, 1.0 / (1.0 - self.p), self.seed & _M32, (self.seed >> 32) & _M32

    def __repr__(self) -> str:
        return f"DropoutSpec(p={self.p}, seed={self.seed})"


NO_DROPOUT = DropoutSpec(0.0, 0)


def _use_kernels(t: torch.Tensor) -> bool:
    """Whether ``t``'s device runs the Numba kernels (CPU) or the torch path (tests
    monkeypatch this to run the torch path on CPU)."""
    return t.device.type == "cpu"


def _np(t: torch.Tensor):
    return t.detach().numpy()


def _plan_np(A: SparseFormat, transpose: bool):
    """``(ptr, idx, perm, chunks)`` of ``op(A)``'s row walk as NumPy arrays; ``chunks``
    (T+1,) splits the rows into parallel tasks of about equal ``entries + rows``
    (degrees are skewed: equal row counts would leave one thread with the hubs)."""
    ptr, idx, perm = A.row_plan(transpose)
    if perm is None:
        perm = torch.empty(0, dtype=torch.long)
    ptr = _np(ptr)
    n = ptr.shape[0] - 1
    tasks = max(1, min(n, 16 * numba.get_num_threads()))
    key = ("gat_chunks", bool(transpose), tasks)
    chunks = A._plans.get(key)  # the pattern's lazy plan cache (see SparseFormat.row_plan)
    if chunks is None:
        work = ptr + np.arange(n + 1)  # entries + rows before each row, increasing
        chunks = np.searchsorted(work, np.linspace(0, work[-1], tasks + 1), side="left").astype(np.int64)
        chunks[0], chunks[-1] = 0, n
        A._plans[key] = chunks
    return ptr, _np(idx), _np(perm), chunks


def _scalar(v: float, dtype: torch.dtype):
    """``v`` as a NumPy scalar of ``dtype`` (so float32 kernels compute in float32)."""
    return np.float32(v) if dtype == torch.float32 else np.float64(v)


def _empty(*shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


def _endpoints(A: SparseFormat):
    """``(dst, src)`` node of every entry, in ``A``'s entry order (torch path)."""
    coo = A.to_coo()
    return coo.row, coo.col


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def dropout_keep_mask(q: int, heads: int, drop: DropoutSpec, device=None) -> torch.Tensor:
    """The attention-dropout keep mask ``(q, heads)`` bool of ``drop`` (all True if
    inactive), exactly as the CPU kernels draw it (:func:`corgnn.sparse.cpu_gat.keep_edge`):
    entry ``(e, h)`` is kept when a 32-bit hash of ``(e * heads + h, seed)`` is at
    least ``round(p * 2**32)``. Built in torch ops (any device); costs ``q * heads``
    int64 temporaries, so the CPU path never builds it.
    """
    if not drop.active:
        return torch.ones(q, heads, dtype=torch.bool, device=device)
    thresh, _, lo, hi = drop.kernel_args()
    flat = torch.arange(q * heads, dtype=torch.long, device=device)
    x = _mix32_t((flat & _M32) ^ lo)
    x = _mix32_t(x ^ ((flat >> 32) & _M32) ^ hi)
    return (x >= thresh).view(q, heads)


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
    """
    n, H, K = M.shape
    a_s = att_src.detach().reshape(H, K)
    a_d = att_dst.detach().reshape(H, K)
    if not _use_kernels(M):
        return (M * a_s).sum(-1), (M * a_d).sum(-1)
    M = M.detach().contiguous()
    s = torch.empty(n, H, dtype=M.dtype)
    d = torch.empty(n, H, dtype=M.dtype)
    cpu_gat.node_scores(_np(M), _np(a_s.contiguous()), _np(a_d.contiguous()), _np(s), _np(d))
    return s, d


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
    (semi-batched SpMM, no ``(q, h, k)`` messages).

    Args:
        A: GAT adjacency ``(n, n)`` pattern (rows = destinations).
        s, d: ``(n, h)`` source / destination node attention.
        M: ``(n, h, k)`` transformed features.
        negative_slope: LeakyReLU slope.
        drop: attention dropout (inactive by default).
        want_leaky: also return the LeakyReLU mask ``y > 0``.

    Returns:
        ``(out (n, h, k), alpha (q, h) before dropout, leaky (q, h) bool or None)``.
    """
    n, H, K = M.shape
    q = A.nnz
    dev, dt = M.device, M.dtype
    if not _use_kernels(M):
        dst, src = _endpoints(A)
        y = s.index_select(0, src) + d.index_select(0, dst)
        w = torch.nn.functional.leaky_relu(y, negative_slope)
        alpha = _segment_softmax(w, dst, n)
        ad = alpha
        if drop.active:
            ad = alpha * dropout_keep_mask(q, H, drop, dev).to(dt) * (1.0 / (1.0 - drop.p))
        out = torch.zeros(n, H, K, dtype=dt, device=dev)
        out.index_add_(0, dst, M.index_select(0, src) * ad.unsqueeze(-1))
        return out, alpha, (y > 0) if want_leaky else None
    alpha = torch.empty(q, H, dtype=dt)
    leaky = torch.empty(q if want_leaky else 0, H, dtype=torch.bool)
    out = torch.empty(n, H, K, dtype=dt)
    thresh, scale, lo, hi = drop.kernel_args()
    cpu_gat.gat_forward_rows(
        *_plan_np(A, False), _np(s.contiguous()), _np(d.contiguous()), _np(M.detach().contiguous()),
        _scalar(negative_slope, dt), thresh, _scalar(scale, dt), lo, hi, _np(alpha), _np(leaky), _np(out),
    )
    return out, alpha, leaky if want_leaky else None


def _segment_softmax(w: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    H = w.size(1)
    idx = index.unsqueeze(1).expand_as(w)
    mx = torch.full((n, H), float("-inf"), dtype=w.dtype, device=w.device).scatter_reduce(0, idx, w, "amax")
    ex = (w - mx.index_select(0, index)).exp()
    den = torch.zeros(n, H, dtype=w.dtype, device=w.device).index_add_(0, index, ex)
    return ex / den.index_select(0, index)


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
        ValueError: neither ``alpha`` + ``leaky`` nor ``s`` + ``d`` given.
    """
    n, H, K = M.shape
    q = A.nnz
    dev, dt = M.device, M.dtype
    if (alpha is None or leaky is None) and (s is None or d is None):
        raise ValueError("attention_backward needs the cached alpha and leaky mask, or s and d to recompute them")
    a_s = att_src.detach().reshape(H, K)
    a_d = att_dst.detach().reshape(H, K)
    G = G.detach().contiguous()
    M = M.detach().contiguous()
    if not _use_kernels(M):
        dst, src = _endpoints(A)
        if alpha is None or leaky is None:
            y = s.index_select(0, src) + d.index_select(0, dst)
            if alpha is None:
                alpha = _segment_softmax(torch.nn.functional.leaky_relu(y, negative_slope), dst, n)
            if leaky is None:
                leaky = y > 0
        dalpha = (G.index_select(0, dst) * M.index_select(0, src)).sum(-1)  # SDDMM
        ad = alpha
        if drop.active:
            keep = dropout_keep_mask(q, H, drop, dev).to(dt) * (1.0 / (1.0 - drop.p))
            dalpha = dalpha * keep
            ad = alpha * keep
        ad_dot = torch.zeros(n, H, dtype=dt, device=dev).index_add_(0, dst, alpha * dalpha)
        dy = alpha * (dalpha - ad_dot.index_select(0, dst))
        dy = torch.where(leaky, dy, dy * negative_slope)
        dd = torch.zeros(n, H, dtype=dt, device=dev).index_add_(0, dst, dy)
        ds = torch.zeros(n, H, dtype=dt, device=dev).index_add_(0, src, dy)
        dM = torch.zeros(n, H, K, dtype=dt, device=dev).index_add_(0, src, G.index_select(0, dst) * ad.unsqueeze(-1))
        dM += ds.unsqueeze(-1) * a_s + dd.unsqueeze(-1) * a_d
        return dM, ds, dd
    thresh, scale, lo, hi = drop.kernel_args()
    have_cache = alpha is not None and leaky is not None
    alpha_np = _np(alpha.contiguous()) if have_cache else _np(_empty(0, H, dtype=dt, device=dev))
    leaky_np = _np(leaky.contiguous()) if have_cache else _np(_empty(0, H, dtype=torch.bool, device=dev))
    sd = _np(_empty(0, H, dtype=dt, device=dev))
    s_np = _np(s.contiguous()) if s is not None else sd
    d_np = _np(d.contiguous()) if d is not None else sd
    # the dropped attention is written out unless the cached alpha can be read as is
    alpha_d = torch.empty(q if (drop.active or not have_cache) else 0, H, dtype=dt)
    dy = torch.empty(q, H, dtype=dt)
    dd = torch.empty(n, H, dtype=dt)
    cpu_gat.gat_backward_rows(
        *_plan_np(A, False), _np(G), _np(M), alpha_np, leaky_np, s_np, d_np,
        _scalar(negative_slope, dt), thresh, _scalar(scale, dt), lo, hi, _np(alpha_d), _np(dy), _np(dd),
    )
    dM = torch.empty(n, H, K, dtype=dt)
    ds = torch.empty(n, H, dtype=dt)
    ad_np = _np(alpha_d) if alpha_d.size(0) else alpha_np
    cpu_gat.gat_backward_cols(
        *_plan_np(A, True), _np(G), ad_np, _np(dy), _np(dd),
        _np(a_s.contiguous()), _np(a_d.contiguous()), _np(dM), _np(ds),
    )
    return dM, ds, dd


def head_weighted_sums(w1: torch.Tensor, w2: torch.Tensor, M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_i w1[i, h] M[i, h], sum_i w2[i, h] M[i, h])``, each ``(h, k)``.

    With ``w1 = dL/ds``, ``w2 = dL/dd`` these are ``dL/da_src = M^T ds`` and
    ``dL/da_dst = M^T dd`` (paper appendix "GAT Backward Pass"), per head.
    """
    n, H, K = M.shape
    if not _use_kernels(M):
        return torch.einsum("nh,nhk->hk", w1, M), torch.einsum("nh,nhk->hk", w2, M)
    T = max(1, min(4 * numba.get_num_threads(), n))
    part1 = torch.empty(T, H, K, dtype=M.dtype)
    part2 = torch.empty(T, H, K, dtype=M.dtype)
    out1 = torch.empty(H, K, dtype=M.dtype)
    out2 = torch.empty(H, K, dtype=M.dtype)
    cpu_gat.head_weighted_sums(
        _np(w1.contiguous()), _np(w2.contiguous()), _np(M.detach().contiguous()), _np(part1), _np(part2), _np(out1), _np(out2)
    )
    return out1, out2
