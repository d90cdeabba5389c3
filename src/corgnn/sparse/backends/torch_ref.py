"""The ``torch`` backend: every op in plain torch ops, any device and floating dtype.

The portable reference (and the fallback where no kernel backend runs a case):
gathers and ``index_add_`` over the row plan. It builds the ``(q, f)`` (or
``(q, h, f)``) message tensor the fused kernels avoid, the memory and traffic the
paper removes, so dispatch tries it last. Half-precision inputs (bfloat16,
float16) are computed in float32 and returned in their own dtype, as cuSPARSE and
PyG accumulate.
"""

from __future__ import annotations

import torch

from ..rng import dropout_keep_mask
from .base import Backend, Case

__all__ = ["TorchBackend"]

_HALF = (torch.float16, torch.bfloat16)


def _rows(ptr: torch.Tensor) -> torch.Tensor:
    """Row of every walked entry ``(nnz,)`` int64."""
    counts = ptr[1:] - ptr[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=ptr.device), counts)


def _walk(ptr, idx, perm):
    """``(row, idx, perm)`` of the ``q = ptr[-1]`` walked entries. Per-entry arrays
    may carry padding past position ``q`` (the compiled adjacency, see
    :mod:`corgnn.graph`); valid entries always sit at format positions ``< q``."""
    row = _rows(ptr)
    q = row.numel()
    return row, idx[:q], None if perm is None else perm[:q]


def _in_format_order(t: torch.Tensor, perm) -> torch.Tensor:
    """Walk-ordered per-entry ``t`` moved to the format's own order."""
    return t if perm is None else torch.empty_like(t).index_copy_(0, perm, t)


def _endpoints(ptr, idx, perm):
    """``(row, col)`` of the ``q`` valid entries in the format's own order."""
    row, idx, perm = _walk(ptr, idx, perm)
    return _in_format_order(row, perm), _in_format_order(idx, perm)


def _pad_entries(out: torch.Tensor, size: int) -> torch.Tensor:
    """Per-entry output ``out`` padded with zeros to ``size`` entries (the op's shape)."""
    if out.size(0) == size:
        return out
    return torch.cat([out, out.new_zeros((size - out.size(0),) + tuple(out.shape[1:]))])


def _f32(*ts):
    return tuple(None if t is None else (t.float() if t.dtype in _HALF else t) for t in ts)


def _spmm(row, col, val, B, n):
    """``out[row[e]] += val[e] * B[col[e]]``; semi-batched when ``B`` is 3-D."""
    msg = B.index_select(0, col)
    if val is not None:
        msg = msg * val.unsqueeze(-1)
    return torch.zeros((n,) + tuple(B.shape[1:]), dtype=B.dtype, device=B.device).index_add_(0, row, msg)


def _segment_softmax(w: torch.Tensor, row: torch.Tensor, n: int) -> torch.Tensor:
    H = w.size(1)
    mx = torch.full((n, H), float("-inf"), dtype=w.dtype, device=w.device)
    mx = mx.scatter_reduce(0, row.unsqueeze(1).expand_as(w), w, "amax")
    ex = (w - mx.index_select(0, row)).exp()
    den = torch.zeros(n, H, dtype=w.dtype, device=w.device).index_add_(0, row, ex)
    return ex / den.index_select(0, row)


def _row_logsumexp(score: torch.Tensor, row: torch.Tensor, n: int) -> torch.Tensor:
    """``log sum_row exp(score)`` per row and head ``(n, H)``; 0 for an empty row."""
    H = score.size(1)
    mx = torch.full((n, H), float("-inf"), dtype=score.dtype, device=score.device)
    mx = mx.scatter_reduce(0, row.unsqueeze(1).expand_as(score), score, "amax")
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    tot = torch.zeros(n, H, dtype=score.dtype, device=score.device).index_add_(0, row, (score - mx.index_select(0, row)).exp())
    return torch.where(tot > 0, mx + tot.log(), torch.zeros_like(mx))


class TorchBackend(Backend):
    """Reference implementation of every op in torch ops."""

    name = "torch"

    def supports(self, case: Case) -> str | None:
        if not case.dtype.is_floating_point:
            return f"needs floating values, got {case.dtype}"
        return None

    # SpMM -------------------------------------------------------------------
    def spmm_rows(self, ptr, idx, perm, val, B, bias=None):
        dt = B.dtype
        val, B, bias = _f32(val, B, bias)
        row, idx, perm = _walk(ptr, idx, perm)
        if val is not None:
            val = val[: row.numel()] if perm is None else val.index_select(0, perm)
        out = _spmm(row, idx, val, B, ptr.numel() - 1)
        return (out if bias is None else out.add_(bias)).to(dt)

    def spmm_scatter_rows(self, ptr, idx, perm, val, B, cols):
        dt = B.dtype
        val, B = _f32(val, B)
        row, idx, perm = _walk(ptr, idx, perm)
        if val is not None:
            val = val[: row.numel()] if perm is None else val.index_select(0, perm)
        return _spmm(idx, row, val, B, cols).to(dt)  # (A^T: rows and columns swapped)

    def spmm_coo(self, row, col, val, rows, B):
        dt = B.dtype
        val, B = _f32(val, B)
        if val is not None and B.dim() == 3:  # (one value per entry for every head)
            val = val.unsqueeze(1).expand(-1, B.size(1))
        return _spmm(row, col, val, B, rows).to(dt)

    def spmm_ell(self, col, lengths, V, B):
        dt = B.dtype
        V, B = _f32(V, B)
        mask = col >= 0  # row-major: ELL entry order
        row = torch.arange(col.size(0), device=col.device).unsqueeze(1).expand_as(col)[mask]
        val = None if V is None else V[mask]
        return _spmm(row, col[mask].long(), val, B, col.size(0)).to(dt)

    def spmm_hybrid(self, head_ptr, head_col, tail_row, tail_col, val, B):
        dt = B.dtype
        val, B = _f32(val, B)
        row = torch.cat([_rows(head_ptr), tail_row])
        return _spmm(row, torch.cat([head_col, tail_col]), val, B, head_ptr.numel() - 1).to(dt)

    # SDDMM ------------------------------------------------------------------
    def sddmm_coo(self, row, col, val, B, C):
        dt = B.dtype
        val, B, C = _f32(val, B, C)
        out = (B.index_select(0, row) * C.index_select(0, col)).sum(-1)
        return (out if val is None else out * val).to(dt)

    def sddmm_rows(self, ptr, idx, perm, val, B, C):
        row, col = _endpoints(ptr, idx, perm)
        out = self.sddmm_coo(row, col, None if val is None else val[: row.numel()], B, C)
        return _pad_entries(out, idx.numel())

    def sddmm_ell(self, col, lengths, offsets, val, B, C):
        mask = col >= 0
        row = torch.arange(col.size(0), device=col.device).unsqueeze(1).expand_as(col)[mask]
        return self.sddmm_coo(row, col[mask].long(), val, B, C)

    # softmax ----------------------------------------------------------------
    def edge_softmax_rows(self, ptr, perm, scores):
        row = _rows(ptr)
        row = _in_format_order(row, None if perm is None else perm[: row.numel()])
        (s,) = _f32(scores[: row.numel()])
        return _pad_entries(_segment_softmax(s, row, ptr.numel() - 1).to(scores.dtype), scores.size(0))

    # GAT --------------------------------------------------------------------
    def gat_node_scores(self, M, a_src, a_dst):
        H, K = M.shape[1:]
        return (M * a_src.reshape(H, K)).sum(-1), (M * a_dst.reshape(H, K)).sum(-1)

    def gat_attention(self, ptr, idx, perm, s, d, M, negative_slope, p, seed, want_leaky):
        n, H, _ = M.shape
        dst, src = _endpoints(ptr, idx, perm)
        y = s.index_select(0, src) + d.index_select(0, dst)
        alpha = _segment_softmax(torch.nn.functional.leaky_relu(y, negative_slope), dst, ptr.numel() - 1)
        ad = alpha
        if p > 0:
            ad = alpha * dropout_keep_mask(dst.numel(), H, p, seed, M.device).to(M.dtype) * (1.0 / (1.0 - p))
        out = _spmm(dst, src, ad, M, ptr.numel() - 1)
        leaky = _pad_entries(y > 0, idx.numel()) if want_leaky else torch.empty(0, H, dtype=torch.bool, device=M.device)
        return out, _pad_entries(alpha, idx.numel()), leaky

    def gat_attention_backward(self, ptr, idx, perm, tptr, tidx, tperm, G, M, a_src, a_dst, alpha, leaky, s, d, negative_slope, p, seed):
        n, H, K = M.shape
        dst, src = _endpoints(ptr, idx, perm)
        q = dst.numel()
        if alpha is not None and leaky is not None:
            alpha, leaky = alpha[:q], leaky[:q]
        else:
            y = s.index_select(0, src) + d.index_select(0, dst)
            alpha = _segment_softmax(torch.nn.functional.leaky_relu(y, negative_slope), dst, n)
            leaky = y > 0
        dalpha = (G.index_select(0, dst) * M.index_select(0, src)).sum(-1)  # SDDMM
        ad = alpha
        if p > 0:
            keep = dropout_keep_mask(q, H, p, seed, M.device).to(M.dtype) * (1.0 / (1.0 - p))
            dalpha = dalpha * keep
            ad = alpha * keep
        ad_dot = torch.zeros(n, H, dtype=M.dtype, device=M.device).index_add_(0, dst, alpha * dalpha)
        dy = alpha * (dalpha - ad_dot.index_select(0, dst))
        dy = torch.where(leaky, dy, dy * negative_slope)
        dd = torch.zeros(n, H, dtype=M.dtype, device=M.device).index_add_(0, dst, dy)
        ds = torch.zeros(n, H, dtype=M.dtype, device=M.device).index_add_(0, src, dy)
        dM = _spmm(src, dst, ad, G, n)  # A_alpha^T G
        dM += ds.unsqueeze(-1) * a_src.reshape(H, K) + dd.unsqueeze(-1) * a_dst.reshape(H, K)
        return dM, ds, dd

    def gat_head_weighted_sums(self, w1, w2, M):
        return torch.einsum("nh,nhk->hk", w1, M), torch.einsum("nh,nhk->hk", w2, M)

    # GATv2 ------------------------------------------------------------------
    def gatv2_attention(self, ptr, idx, perm, XL, XR, att, negative_slope, p, seed, want_alpha):
        """Builds the ``(q, h, k)`` pre-activations the fused kernels avoid."""
        H, K = XL.shape[1:]
        n, dt = ptr.numel() - 1, XL.dtype
        XL, XR, att = _f32(XL, XR, att)
        dst, src = _endpoints(ptr, idx, perm)
        t = XL.index_select(0, src) + XR.index_select(0, dst)
        score = (torch.nn.functional.leaky_relu(t, negative_slope) * att.reshape(1, H, K)).sum(-1)
        alpha = _segment_softmax(score, dst, n)
        mx = torch.zeros(n, H, dtype=score.dtype, device=score.device).scatter_reduce(0, dst.unsqueeze(1).expand_as(score), score, "amax", include_self=False)
        den = torch.zeros(n, H, dtype=score.dtype, device=score.device).index_add_(0, dst, (score - mx.index_select(0, dst)).exp())
        lse = torch.where(den > 0, mx + den.clamp_min(1e-300 if score.dtype == torch.float64 else 1e-30).log(), torch.zeros_like(mx))
        ad = alpha
        if p > 0:
            ad = alpha * dropout_keep_mask(dst.numel(), H, p, seed, XL.device).to(alpha.dtype) * (1.0 / (1.0 - p))
        out = _spmm(dst, src, ad, XL, n)
        alpha = _pad_entries(alpha, idx.numel()) if want_alpha else alpha.new_empty(0, H)
        return out.to(dt), alpha.to(dt), lse.to(dt)

    def gatv2_attention_backward(self, ptr, idx, perm, tptr, tidx, tperm, G, XL, XR, att, alpha, lse, negative_slope, p, seed):
        H, K = XL.shape[1:]
        n, dt = ptr.numel() - 1, XL.dtype
        G, XL, XR, att, alpha, lse = _f32(G, XL, XR, att, alpha, lse)
        att = att.reshape(1, H, K)
        dst, src = _endpoints(ptr, idx, perm)
        q = dst.numel()
        t = XL.index_select(0, src) + XR.index_select(0, dst)
        f = torch.nn.functional.leaky_relu(t, negative_slope)
        if alpha is not None:
            alpha = alpha[:q]
        else:
            alpha = ((f * att).sum(-1) - lse.index_select(0, dst)).exp()
        dalpha = (G.index_select(0, dst) * XL.index_select(0, src)).sum(-1)  # SDDMM
        ad = alpha
        if p > 0:
            keep = dropout_keep_mask(q, H, p, seed, XL.device).to(alpha.dtype) * (1.0 / (1.0 - p))
            dalpha, ad = dalpha * keep, alpha * keep
        dot = torch.zeros(n, H, dtype=alpha.dtype, device=alpha.device).index_add_(0, dst, alpha * dalpha)
        de = alpha * (dalpha - dot.index_select(0, dst))
        g = de.unsqueeze(-1) * att * torch.ones_like(t).masked_fill_(t <= 0, negative_slope)  # LeakyReLU'(t)
        dXR = torch.zeros_like(XR).index_add_(0, dst, g)
        dXL = torch.zeros_like(XL).index_add_(0, src, g) + _spmm(src, dst, ad, G, XL.size(0))
        datt = (de.unsqueeze(-1) * f).sum(0)
        return dXL.to(dt), dXR.to(dt), datt.to(dt)
    # dot-product attention (TransformerConv) ----------------------------------
    def transformer_attention(self, ptr, idx, perm, Q, K, V, Qe, attr, scale, p, seed, want_alpha):
        dt = Q.dtype
        Q, K, V, Qe, attr = _f32(Q, K, V, Qe, attr)
        n, H = ptr.numel() - 1, Q.shape[1]
        dst, src = _endpoints(ptr, idx, perm)
        q = dst.numel()
        score = (Q.index_select(0, dst) * K.index_select(0, src)).sum(-1)  # SDDMM (q, H)
        if attr is not None:
            score = score + (Qe.index_select(0, dst) * attr[:q].unsqueeze(1)).sum(-1)
        score = score * scale
        alpha = _segment_softmax(score, dst, n)
        lse = _row_logsumexp(score, dst, n)
        ad = alpha
        if p > 0:
            ad = alpha * dropout_keep_mask(q, H, p, seed, Q.device).to(alpha.dtype) * (1.0 / (1.0 - p))
        out = _spmm(dst, src, ad, V, n)
        if attr is not None:
            Ae = torch.zeros(n, H, attr.shape[1], dtype=Q.dtype, device=Q.device).index_add_(0, dst, ad.unsqueeze(-1) * attr[:q].unsqueeze(1))
        else:
            Ae = Q.new_empty(0, H, 0)
        alpha = _pad_entries(alpha, idx.numel()) if want_alpha else alpha.new_empty(0, H)
        return out.to(dt), lse.to(dt), alpha.to(dt), Ae.to(dt)

    def transformer_attention_backward_rows(self, ptr, idx, perm, G, Q, K, V, Qe, Ge, attr, alpha, lse, scale, p, seed):
        dt = Q.dtype
        cached = alpha is not None
        G, Q, K, V, Qe, Ge, attr, alpha, lse = _f32(G, Q, K, V, Qe, Ge, attr, alpha, lse)
        n, H = Q.shape[:2]
        G = G.expand(n, H, G.shape[2])  # ((n, 1, c): one gradient for every head)
        dst, src = _endpoints(ptr, idx, perm)
        q = dst.numel()
        if cached:
            alpha = alpha[:q]
        else:
            score = (Q.index_select(0, dst) * K.index_select(0, src)).sum(-1)
            if attr is not None:
                score = score + (Qe.index_select(0, dst) * attr[:q].unsqueeze(1)).sum(-1)
            alpha = (score * scale - lse.index_select(0, dst)).exp()
        dalpha = (G.index_select(0, dst) * V.index_select(0, src)).sum(-1)  # SDDMM
        if attr is not None:
            dalpha = dalpha + (Ge.index_select(0, dst) * attr[:q].unsqueeze(1)).sum(-1)
        ad = alpha
        if p > 0:
            keep = dropout_keep_mask(q, H, p, seed, Q.device).to(alpha.dtype) * (1.0 / (1.0 - p))
            dalpha = dalpha * keep
            ad = alpha * keep
        # (the softmax backward's row sum D_i = sum_e alpha_e dalpha_e = <G_i, out_i>)
        D = torch.zeros(n, H, dtype=alpha.dtype, device=alpha.device).index_add_(0, dst, alpha * dalpha)
        de = alpha * (dalpha - D.index_select(0, dst))
        dQ = _spmm(dst, src, de * scale, K, n)
        if attr is not None:
            dQe = torch.zeros(n, H, attr.shape[1], dtype=Q.dtype, device=Q.device).index_add_(0, dst, de.unsqueeze(-1) * attr[:q].unsqueeze(1))
            dattr = ((de * scale).unsqueeze(-1) * Qe.index_select(0, dst) + ad.unsqueeze(-1) * Ge.index_select(0, dst)).sum(1)
            dattr = _pad_entries(dattr, attr.shape[0])
        else:
            dQe, dattr = Q.new_empty(0, H, 0), Q.new_empty(0, 0)
        ea = torch.stack([de, ad], 1) if (p > 0 or not cached) else de.unsqueeze(1)
        return _pad_entries(ea, idx.numel()).to(dt), dQ.to(dt), dQe.to(dt), dattr.to(dt)

    def transformer_attention_backward_cols(self, tptr, tidx, tperm, G, Q, ea, alpha, scale):
        dt = Q.dtype
        G, Q, ea, alpha = _f32(G, Q, ea, alpha)
        m, H = tptr.numel() - 1, Q.shape[1]
        de, ad = ea[:, 0], (ea[:, 1] if ea.shape[1] == 2 else alpha)
        G = G.expand(G.shape[0], H, G.shape[2])
        src, dst = _endpoints(tptr, tidx, tperm)  # (the transposed plan: rows are sources; entries in the format's order)
        q = src.numel()
        dK = _spmm(src, dst, de[:q] * scale, Q, m)
        dV = _spmm(src, dst, ad[:q], G, m)
        return dK.to(dt), dV.to(dt)
