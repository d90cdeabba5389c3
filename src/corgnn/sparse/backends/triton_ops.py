"""Launchers of the Triton kernels, registered as ``torch.library.triton_op``
(``torch.ops.corgnn.triton_<op>``), one per kernel op of :mod:`corgnn.sparse.library`.

Imported on first use by the ``triton`` backend (:mod:`.triton`), never by
``import corgnn``: Triton decides at kernel definition whether kernels run compiled
(CUDA) or in its interpreter (``TRITON_INTERPRET=1``, CPU tensors), so the variable
must be set before this module is first imported.

Each launcher allocates the outputs, picks the launch grid from the shapes only
(so ``torch.compile`` can trace it: no data-dependent sizes, no host syncs) and
launches :mod:`.triton_kernels`. Its fake implementation is the op's own
(:data:`corgnn.sparse.backends.base.KERNEL_OPS`), so every backend's op has the
same output metadata. ``gat_node_scores`` and ``gat_head_weighted_sums`` are dense
reductions: they run as torch ops (cuBLAS-backed einsums), not Triton kernels.

Tuning constants (set without a GPU measurement; every specialization they produce
compiles for sm_80/sm_90, see ``corgnn bench triton-aot`` and benchmarks/README.md):

* :data:`BLOCK_E` entries per inner step, :data:`MAX_BLOCK_F` feature columns per
  program, :data:`MAX_BLOCK_K` per-head features per program;
* :data:`SPLIT_CHUNK`: rows longer than this many entries are split across
  programs (:mod:`.triton_kernels`, "Load balancing").
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import triton
from torch import Tensor
from torch.library import triton_op, wrap_triton
from triton.runtime.interpreter import InterpretedFunction as _INTERPRETED

from ..rng import dropout_kernel_args
from .base import KERNEL_OPS
from . import triton_gatv2_kernels as K2
from . import triton_kernels as K
from . import triton_transformer_kernels as TK
from .torch_ref import TorchBackend

__all__ = ["LAUNCHERS", "TRACEABLE", "interpreted"]

BLOCK_E = 32
MAX_BLOCK_F = 128
MAX_BLOCK_K = 64
SPLIT_CHUNK = 256

LAUNCHERS: dict = {}
"""Op name -> launcher (what the backend runs eagerly): the registered op's own
function, called directly on its operands' device (no dispatcher round trip: under
cProfile on an H100, the custom-op call around these launchers took about 0.5 ms of
Python per GAT op, benchmarks/results/gpu-h100-20261127)."""
TRACEABLE: dict = {}
"""Op name -> the registered ``triton_op`` (what ``torch.compile`` traces into)."""


def interpreted() -> bool:
    """Whether the kernels were defined for Triton's interpreter (CPU tensors)."""
    return isinstance(K.spmm_rows_kernel, _INTERPRETED)


def _register(name: str):
    """Register the launcher as ``corgnn::triton_<name>`` with the library op's
    (typed) signature and fake."""

    def deco(fn):
        spec = KERNEL_OPS[name]
        fn.__signature__ = inspect.signature(spec.signature)  # the schema is inferred from it
        op = triton_op(f"corgnn::triton_{name}", fn, mutates_args=())
        op.register_fake(spec.fake)
        LAUNCHERS[name] = _on_operands_device(fn)
        TRACEABLE[name] = op
        return op

    return deco


def _on_operands_device(fn):
    """``fn`` run as the registered op's eager path runs it: with its first tensor
    argument's CUDA device current (Triton launches on the current device) and with
    ``wrap_triton`` launching the kernels directly rather than through its
    higher-order op (about 1 ms of Python per launch: on an H200, 2026-11-27, that
    dispatch was most of a GAT step's host time, benchmarks/results/gpu-h200-20261127)."""

    @functools.wraps(fn)
    def launch(*args):
        dev = next((a.device for a in args if isinstance(a, Tensor)), None)
        with _direct_kernel_calls():
            if dev is not None and dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device():
                with torch.cuda.device(dev):
                    return fn(*args)
            return fn(*args)

    return launch


_WRAP_SWITCH = getattr(getattr(torch._library, "triton", None), "set_wrap_triton_enabled", None)
"""torch's switch between ``wrap_triton``'s higher-order op and direct kernel calls
(what ``triton_op`` enters around its eager calls), looked up once; None on a torch
without it."""


def _direct_kernel_calls():
    """The context in which ``wrap_triton(kernel)[grid](...)`` calls the kernel
    itself (:data:`_WRAP_SWITCH` off); a no-op context on a torch without the switch."""
    return _WRAP_SWITCH(False) if _WRAP_SWITCH is not None else contextlib.nullcontext()


def _wrap(kernel):
    """``wrap_triton(kernel)`` (what ``torch.compile`` traces through), or the kernel
    itself when it is interpreted (``TRITON_INTERPRET=1``): torch before mid-2026
    rejects interpreted kernels in ``wrap_triton`` (pytorch/pytorch#152868; on the
    H200's torch 2.11 every interpreted launch failed)."""
    return kernel if isinstance(kernel, _INTERPRETED) else wrap_triton(kernel)


def _pow2(x: int, cap: int) -> int:
    return max(2, min(cap, triton.next_power_of_2(max(1, x))))


def _iters(n: int) -> int:
    """Bisection steps that find a row among ``n`` (``>= ceil(log2 n) + 1``)."""
    return max(1, int(n).bit_length() + 1)


def _acc64(t: Tensor) -> bool:
    return t.dtype == torch.float64


def _heads(B: Tensor) -> tuple[int, int, int]:
    """``(F, H, K)``: a row's width, heads and per-head width of a 2-D/3-D operand."""
    if B.dim() == 3:
        return B.shape[1] * B.shape[2], B.shape[1], B.shape[2]
    return B.shape[1], 1, B.shape[1]


def _spmm(ptr, idx, perm, val, B: Tensor, out: Tensor, *, ell_width: int = 0, accumulate: bool = False, bias: Tensor | None = None) -> Tensor:
    """Launch the SpMM of one row plan (``ell_width > 0``: ELLPACK, ``ptr`` = lengths)
    into ``out`` (``accumulate``: add to it; ``bias``: added in the store epilogue)."""
    n = out.shape[0]
    F, H, Kh = _heads(B)
    if n == 0 or F == 0:
        return out
    B = B.contiguous()
    BF = _pow2(F, MAX_BLOCK_F)
    ftiles = triton.cdiv(F, BF)
    flags = dict(HAS_PERM=perm is not None, HAS_VAL=val is not None, MULTI_HEAD=B.dim() == 3, ACC64=_acc64(B))
    val_arg = B if val is None else val.contiguous()
    perm_arg = idx if perm is None else perm
    q = idx.shape[0]
    split = ell_width == 0 and q > SPLIT_CHUNK
    part = out
    if split:
        chunks = triton.cdiv(q, SPLIT_CHUNK)
        part = torch.empty(chunks * 2 * F, dtype=torch.float64 if _acc64(B) else torch.float32, device=B.device)
        _wrap(K.spmm_chunks_kernel)[(chunks, ftiles)](
            ptr, idx, perm_arg, val_arg, B, part, n, F, Kh, H, SPLIT_CHUNK, _iters(n), **flags, BLOCK_E=BLOCK_E, BLOCK_F=BF,
        )
    _wrap(K.spmm_rows_kernel)[(n, ftiles)](
        ptr, idx, perm_arg, val_arg, B, part, out, B if bias is None else bias.contiguous(), n, F, Kh, H, SPLIT_CHUNK, ell_width, **flags,
        ELL=ell_width > 0, SPLIT=split, ACCUMULATE=accumulate, HAS_BIAS=bias is not None, BLOCK_E=BLOCK_E, BLOCK_F=BF,
    )
    return out


def _rows_out(B: Tensor, n: int) -> Tensor:
    return torch.empty((n,) + tuple(B.shape[1:]), dtype=B.dtype, device=B.device)


# ----------------------------------------------------------------------------- SpMM


@_register("spmm_rows")
def spmm_rows(ptr, idx, perm, val, B, bias=None):
    return _spmm(ptr, idx, perm, val, B, _rows_out(B, ptr.shape[0] - 1), bias=bias)


@_register("spmm_ell")
def spmm_ell(col, lengths, V, B):
    out = _rows_out(B, col.shape[0])
    if col.shape[1] == 0:
        return out.zero_()
    return _spmm(lengths, col, None, V, B, out, ell_width=col.shape[1])


@_register("spmm_hybrid")
def spmm_hybrid(head_ptr, head_col, tail_row, tail_col, val, B):
    n, q1 = head_ptr.shape[0] - 1, head_col.shape[0]
    out = _spmm(head_ptr, head_col, None, None if val is None else val[:q1], B, _rows_out(B, n))
    # the COO part is sorted by row: its row pointer is a bisection of the row array
    tail_ptr = torch.searchsorted(tail_row, torch.arange(n + 1, device=tail_row.device, dtype=tail_row.dtype))
    return _spmm(tail_ptr, tail_col, None, None if val is None else val[q1:], B, out, accumulate=True)


# ---------------------------------------------------------------------------- SDDMM


def _sddmm(mode: int, rows, idx, perm, val, B: Tensor, C: Tensor, slots: int, nnz: int, ell_width: int = 0) -> Tensor:
    _, H, Kh = _heads(B)
    out = torch.empty((nnz,) + tuple(B.shape[1:-1]), dtype=B.dtype, device=B.device)
    if slots == 0:
        return out
    BE = max(BLOCK_E, 64)
    _wrap(K.sddmm_kernel)[(triton.cdiv(slots, BE), H)](
        rows, idx, idx if perm is None else perm, B if val is None else val.contiguous(), B.contiguous(), C.contiguous(), out,
        slots, B.shape[0], H, Kh, _iters(B.shape[0]), ell_width,
        MODE=mode, HAS_PERM=perm is not None, HAS_VAL=val is not None, ACC64=_acc64(B), BLOCK_E=BE, BLOCK_K=_pow2(Kh, MAX_BLOCK_K),
    )
    return out


@_register("sddmm_rows")
def sddmm_rows(ptr, idx, perm, val, B, C):
    return _sddmm(0, ptr, idx, perm, val, B, C, idx.shape[0], idx.shape[0])


@_register("sddmm_coo")
def sddmm_coo(row, col, val, B, C):
    return _sddmm(1, row, col, None, val, B, C, row.shape[0], row.shape[0])


@_register("sddmm_ell")
def sddmm_ell(col, lengths, offsets, val, B, C):
    # NOTE: the entry count is data-dependent (one host sync); ELLPACK is an eager-only format
    nnz = int(lengths.sum())
    return _sddmm(2, offsets, col, None, val, B, C, col.numel(), nnz, max(1, col.shape[1]))


# ---------------------------------------------------------------------- edge softmax


@_register("edge_softmax_rows")
def edge_softmax_rows(ptr, perm, scores):
    out = torch.zeros_like(scores, memory_format=torch.contiguous_format)  # padding entries stay 0
    n, H = ptr.shape[0] - 1, scores.shape[1]
    if n == 0 or scores.shape[0] == 0:
        return out
    _wrap(K.edge_softmax_kernel)[(n,)](
        ptr, ptr if perm is None else perm, scores.contiguous(), out, H,
        HAS_PERM=perm is not None, ACC64=_acc64(scores), BLOCK_E=BLOCK_E, BLOCK_H=_pow2(H, 1 << 16),
    )
    return out


# ------------------------------------------------------------------------------ GAT


@functools.lru_cache(maxsize=64)
def _device_pair(a: float, b: float, device: torch.device) -> Tensor:
    return torch.tensor([a, b], dtype=torch.float64, device=device)


def _pair(a: float, b: float, ref: Tensor) -> Tensor:
    """The float64 tensor ``[a, b]`` on ``ref``'s device, made once per values and
    device: building it per call is a pageable host-to-device copy, a host sync on
    CUDA (measured on an H100: 4 per GAT training step). Made fresh while tracing
    (``ref`` a fake or functional tensor, or under ``torch.compile``), where a kept
    real tensor may not enter the graph."""
    if type(ref) is not torch.Tensor or torch.compiler.is_compiling():
        return torch.tensor([a, b], dtype=torch.float64, device=ref.device)
    return _device_pair(float(a), float(b), ref.device)


def _consts(negative_slope: float, p: float, M: Tensor) -> tuple[Tensor, int]:
    """The float64 ``[slope, scale]`` tensor the GAT kernels read, and the dropout threshold."""
    thresh, scale, _, _ = dropout_kernel_args(p, torch.zeros(1, dtype=torch.long))
    return _pair(negative_slope, scale, M), thresh


@_register("gat_attention")
def gat_attention(ptr, idx, perm, s, d, M, negative_slope, p, seed, want_leaky):
    n, H, Kh = M.shape
    q = idx.shape[0]
    alpha = torch.zeros(q, H, dtype=M.dtype, device=M.device)  # padding entries stay 0
    leaky = torch.zeros(q if want_leaky else 0, H, dtype=torch.bool, device=M.device)
    out = torch.empty(ptr.shape[0] - 1, H, Kh, dtype=M.dtype, device=M.device)
    if out.numel() == 0:
        return out, alpha, leaky
    consts, thresh = _consts(negative_slope, p, M)
    BK = _pow2(Kh, MAX_BLOCK_K)
    _wrap(K.gat_forward_kernel)[(out.shape[0], H, triton.cdiv(Kh, BK))](
        ptr, idx, idx if perm is None else perm, s.contiguous(), d.contiguous(), M.contiguous(), alpha,
        leaky if want_leaky else alpha, out, H, Kh, consts, seed, thresh,
        HAS_PERM=perm is not None, WANT_LEAKY=want_leaky, DROP=p > 0, ACC64=_acc64(M), BLOCK_E=BLOCK_E, BLOCK_K=BK,
    )
    return out, alpha, leaky


@_register("gat_attention_backward")
def gat_attention_backward(ptr, idx, perm, tptr, tidx, tperm, G, M, a_src, a_dst, alpha, leaky, s, d, negative_slope, p, seed):
    n, H, Kh = M.shape
    q = idx.shape[0]
    cached = alpha is not None and leaky is not None
    write_ad = p > 0 or not cached
    alpha_d = torch.empty(q if write_ad else 0, H, dtype=M.dtype, device=M.device)
    dy = torch.empty(q, H, dtype=M.dtype, device=M.device)
    dd = torch.empty(n, H, dtype=M.dtype, device=M.device)
    dM = torch.empty_like(M, memory_format=torch.contiguous_format)
    ds = torch.empty(n, H, dtype=M.dtype, device=M.device)
    if M.numel() == 0:
        return dM, ds.zero_(), dd.zero_()
    consts, thresh = _consts(negative_slope, p, M)
    G, M = G.contiguous(), M.contiguous()
    BK = _pow2(Kh, MAX_BLOCK_K)
    any_ = alpha_d if write_ad else alpha
    _wrap(K.gat_backward_rows_kernel)[(n, H)](
        ptr, idx, idx if perm is None else perm, G, M,
        alpha if cached else any_, leaky if cached else any_, s if s is not None else any_, d if d is not None else any_,
        any_, dy, dd, H, Kh, consts, seed, thresh,
        HAS_PERM=perm is not None, CACHED=cached, DROP=p > 0, WRITE_AD=write_ad, ACC64=_acc64(M), BLOCK_E=BLOCK_E, BLOCK_K=BK,
    )
    _wrap(K.gat_backward_cols_kernel)[(n, H, triton.cdiv(Kh, BK))](
        tptr, tidx, tidx if tperm is None else tperm, G, any_, dy, dd, a_src.contiguous(), a_dst.contiguous(), dM, ds, H, Kh,
        HAS_PERM=tperm is not None, ACC64=_acc64(M), BLOCK_E=BLOCK_E, BLOCK_K=BK,
    )
    return dM, ds, dd


@_register("gatv2_attention")
def gatv2_attention(ptr, idx, perm, XL, XR, att, negative_slope, p, seed, want_alpha):
    H, Kh = XL.shape[1:]
    n, q = ptr.shape[0] - 1, idx.shape[0]
    alpha = torch.zeros(q if want_alpha else 0, H, dtype=XL.dtype, device=XL.device)  # padding entries stay 0
    lse = torch.zeros(n, H, dtype=XL.dtype, device=XL.device)
    out = torch.zeros(n, H, Kh, dtype=XL.dtype, device=XL.device)
    if out.numel() == 0:
        return out, alpha, lse
    consts, thresh = _consts(negative_slope, p, XL)
    _wrap(K2.gatv2_forward_kernel)[(n, H)](
        ptr, idx, idx if perm is None else perm, XL.contiguous(), XR.contiguous(), att.contiguous(), alpha if want_alpha else lse,
        lse, out, H, Kh, consts, seed, thresh,
        HAS_PERM=perm is not None, WANT_ALPHA=want_alpha, DROP=p > 0, ACC64=_acc64(XL), BLOCK_E=BLOCK_E, BLOCK_K=_pow2(Kh, 1 << 16),
    )
    return out, alpha, lse


@_register("gatv2_attention_backward")
def gatv2_attention_backward(ptr, idx, perm, tptr, tidx, tperm, G, XL, XR, att, alpha, lse, negative_slope, p, seed):
    H, Kh = XL.shape[1:]
    n, q = ptr.shape[0] - 1, idx.shape[0]
    cached = alpha is not None
    alpha = alpha.contiguous() if cached else torch.zeros(q, H, dtype=XL.dtype, device=XL.device)
    de = torch.zeros(q, H, dtype=XL.dtype, device=XL.device)
    dXL = torch.zeros_like(XL, memory_format=torch.contiguous_format)
    dXR = torch.zeros_like(XR, memory_format=torch.contiguous_format)
    datt_rows = torch.zeros(n, H, Kh, dtype=torch.float64 if _acc64(XL) else torch.float32, device=XL.device)
    if H * Kh == 0:
        return dXL, dXR, datt_rows.sum(0).to(XL.dtype)
    consts, thresh = _consts(negative_slope, p, XL)
    G, XL, XR, att = G.contiguous(), XL.contiguous(), XR.contiguous(), att.contiguous()
    BK = _pow2(Kh, 1 << 16)
    flags = dict(DROP=p > 0, ACC64=_acc64(XL), BLOCK_E=BLOCK_E, BLOCK_K=BK)
    if n:
        _wrap(K2.gatv2_backward_rows_kernel)[(n, H)](
            ptr, idx, idx if perm is None else perm, G, XL, XR, att, alpha, alpha if lse is None else lse.contiguous(),
            de, dXR, datt_rows, H, Kh, consts, seed, thresh, HAS_PERM=perm is not None, CACHED=cached, **flags,
        )
    if XL.shape[0]:
        _wrap(K2.gatv2_backward_cols_kernel)[(XL.shape[0], H)](
            tptr, tidx, tidx if tperm is None else tperm, G, XL, XR, att, alpha, de, dXL, H, Kh, consts, seed, thresh,
            HAS_PERM=tperm is not None, **flags,
        )
    return dXL, dXR, datt_rows.sum(0).to(XL.dtype)


# dense reductions: torch ops on every device (cuBLAS on GPU), no Triton kernel
LAUNCHERS["gat_node_scores"] = TorchBackend().gat_node_scores
LAUNCHERS["gat_head_weighted_sums"] = TorchBackend().gat_head_weighted_sums


# ---------------------------------------------------------- dot-product attention


def _dot_consts(scale: float, p: float, seed: Tensor, ref: Tensor) -> tuple[Tensor, Tensor, int]:
    """The float64 ``[scale, dropout scale]`` tensor, the int64 ``[seed_lo, seed_hi]``
    tensor (device ops, no host sync) and the dropout threshold the attention kernels
    read; on ``ref``'s device."""
    thresh, dscale, _, _ = dropout_kernel_args(p, torch.zeros(1, dtype=torch.long))
    halves = torch.cat([seed.reshape(1) & 0xFFFFFFFF, (seed.reshape(1) >> 32) & 0xFFFFFFFF]).to(ref.device)
    return _pair(scale, dscale, ref), halves, thresh


def _edge_args(Qe, attr, ref: Tensor) -> tuple[Tensor, Tensor, int]:
    """``(Qe, attr, F)`` as the attention kernels take them (``ref`` stands in for
    absent edge features, never read)."""
    if attr is None:
        return ref, ref, 0
    return Qe.contiguous(), attr.contiguous(), attr.shape[1]


@_register("transformer_attention")
def transformer_attention(ptr, idx, perm, Q, K, V, Qe, attr, scale, p, seed, want_alpha):
    n, H, C = ptr.shape[0] - 1, Q.shape[1], Q.shape[2]
    out = torch.empty(n, H, V.shape[2], dtype=Q.dtype, device=Q.device)
    lse = torch.zeros(n, H, dtype=Q.dtype, device=Q.device)
    alpha = torch.zeros(idx.shape[0] if want_alpha else 0, H, dtype=Q.dtype, device=Q.device)  # padding entries stay 0
    Ae = torch.zeros((0, H, 0) if attr is None else (n, H, attr.shape[1]), dtype=Q.dtype, device=Q.device)
    if out.numel() == 0:
        return out, lse, alpha, Ae
    consts, halves, thresh = _dot_consts(scale, p, seed, Q)
    Qe_, attr_, F = _edge_args(Qe, attr, lse)
    _wrap(TK.dot_attention_forward_kernel)[(n, H)](
        ptr, idx, idx if perm is None else perm, Q.contiguous(), K.contiguous(), V.contiguous(), Qe_, attr_, lse,
        alpha if want_alpha else lse, out, Ae if attr is not None else lse, H, C, F, consts, halves, thresh,
        HAS_PERM=perm is not None, WANT_ALPHA=want_alpha, DROP=p > 0, HAS_EDGE=attr is not None, ACC64=_acc64(Q),
        BLOCK_E=BLOCK_E, BLOCK_C=_pow2(C, 1 << 16), BLOCK_F=_pow2(F, 1 << 16),
    )
    return out, lse, alpha, Ae


@_register("transformer_attention_backward_rows")
def transformer_attention_backward_rows(ptr, idx, perm, G, Q, K, V, Qe, Ge, attr, alpha, lse, scale, p, seed):
    n, H, C = Q.shape
    q = idx.shape[0]
    cached = alpha is not None
    write_ad = p > 0 or not cached
    de = torch.zeros(q, H, dtype=Q.dtype, device=Q.device)
    alpha_d = torch.zeros(q if write_ad else 0, H, dtype=Q.dtype, device=Q.device)
    dQ = torch.zeros_like(Q, memory_format=torch.contiguous_format)
    dQe = torch.zeros((0, H, 0) if attr is None else (n, H, attr.shape[1]), dtype=Q.dtype, device=Q.device)
    dattr = torch.zeros((0, 0) if attr is None else tuple(attr.shape), dtype=Q.dtype, device=Q.device)
    if n == 0:
        return _entry_pair(de, alpha_d, write_ad), dQ, dQe, dattr
    consts, halves, thresh = _dot_consts(scale, p, seed, Q)
    G, Q, K, V = G.contiguous(), Q.contiguous(), K.contiguous(), V.contiguous()
    Qe_, attr_, F = _edge_args(Qe, attr, de)
    Ge_ = Ge.contiguous() if attr is not None else de
    BC, BF = _pow2(C, 1 << 16), _pow2(F, 1 << 16)
    any_ = alpha_d if write_ad else alpha
    has_edge = attr is not None
    _wrap(TK.dot_attention_backward_rows_kernel)[(n, H)](
        ptr, idx, idx if perm is None else perm, G, Q, K, V, Qe_, Ge_, attr_, alpha if cached else any_,
        lse if lse is not None else any_, de, any_, dQ, dQe if has_edge else de, H, G.shape[1], C, F, consts, halves, thresh,
        HAS_PERM=perm is not None, CACHED=cached, DROP=p > 0, WRITE_AD=write_ad, HAS_EDGE=has_edge, ACC64=_acc64(Q),
        BLOCK_E=BLOCK_E, BLOCK_C=BC, BLOCK_F=BF,
    )
    if has_edge and q:
        _wrap(TK.dot_attention_edge_grad_kernel)[(n,)](
            ptr, idx if perm is None else perm, Qe_, Ge_, de, any_, dattr, H, F, consts,
            HAS_PERM=perm is not None, ACC64=_acc64(Q), BLOCK_E=BLOCK_E, BLOCK_F=BF,
        )
    return _entry_pair(de, alpha_d, write_ad), dQ, dQe, dattr


def _entry_pair(de: Tensor, alpha_d: Tensor, write_ad: bool) -> Tensor:
    """The op's ``ea`` from the kernels' separate ``(q, H)`` buffers.

    NOTE: a copy (the Triton kernels index ``de`` and ``alpha_d`` with entry stride
    ``H``; the op's ``(q, 2, H)`` layout is the Numba kernels'): passing an entry
    stride to the three kernels would save it; not measured on a GPU yet."""
    return torch.stack((de, alpha_d), 1) if write_ad else de.unsqueeze(1)


@_register("transformer_attention_backward_cols")
def transformer_attention_backward_cols(tptr, tidx, tperm, G, Q, ea, alpha, scale):
    m, H, C = tptr.shape[0] - 1, Q.shape[1], Q.shape[2]
    de = ea[:, 0].contiguous()
    ad = ea[:, 1].contiguous() if ea.shape[1] == 2 else alpha
    dK = torch.zeros(m, H, C, dtype=Q.dtype, device=Q.device)
    dV = torch.zeros(m, H, G.shape[2], dtype=G.dtype, device=G.device)
    if m == 0:
        return dK, dV
    consts = _pair(scale, 1.0, Q)  # (the kernel reads the scale only)
    _wrap(TK.dot_attention_backward_cols_kernel)[(m, H)](
        tptr, tidx, tidx if tperm is None else tperm, G.contiguous(), Q.contiguous(), ad.contiguous(), de.contiguous(), dK, dV, H, G.shape[1], C, consts,
        HAS_PERM=tperm is not None, ACC64=_acc64(Q), BLOCK_E=BLOCK_E, BLOCK_C=_pow2(C, 1 << 16),
    )
    return dK, dV
