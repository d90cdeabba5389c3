"""The ``numba`` backend: parallel Numba kernels on CPU tensors (float32 / float64).

Each method implements the custom op of the same name (:mod:`corgnn.sparse.library`)
on NumPy views of the tensors (no copies; contiguous inputs are made contiguous
once), allocating the outputs as torch tensors. The kernels themselves are
:mod:`.numba_kernels` (SpMM / SDDMM / softmax per format) and
:mod:`.numba_gat_kernels` (the fused GAT passes).
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import torch

from ..rng import dropout_kernel_args
from .base import Backend, Case
from . import numba_gat_kernels as gk
from . import numba_gatv2_kernels as g2k
from . import numba_transformer_kernels as tk
from . import numba_kernels as k
from . import numba_threads, numba_warmup

__all__ = ["NumbaBackend"]

_DTYPES = (torch.float32, torch.float64)
_SPMM_TIERS = numba_warmup.tiers("spmm_rows")
"""The CSR SpMM's serial first tier per dtype (:class:`.numba_warmup.Tier`)."""
_COO_TIERS = numba_warmup.tiers("spmm_coo_scatter")
"""The unsorted-COO SpMM's serial first tier per dtype."""
_NOPERM = np.empty(0, dtype=np.int64)


def _np(t: torch.Tensor) -> np.ndarray:
    if t.requires_grad or not t.is_contiguous():  # (else one view, not three: this runs per operand and call)
        t = t.detach().contiguous()
    return t.numpy()


def _runner(tier: numba_warmup.Tier, parallel, serial):
    """``run(args, tasks)`` for a launcher: ``parallel(*args)`` directly once ``tier``
    runs the parallel kernel for good (the tier's bookkeeping is then only a cost,
    paid per product), else ``tier.run``."""
    if tier.parallel():
        return lambda args, tasks: parallel(*args)
    return lambda args, tasks: tier.run(parallel, serial, args, tasks)


def _perm(perm) -> np.ndarray:
    return _NOPERM if perm is None else _np(perm)


_EMPTY = {(dt, nd): np.empty((0,) * nd, dtype=_np_dtype_of) for dt, _np_dtype_of in ((torch.float32, np.float32), (torch.float64, np.float64)) for nd in range(4)}
"""The kernels' "none" operand per (dtype, ndim): an empty array, never written."""


def _vals(val, dense: torch.Tensor) -> np.ndarray:
    """Values as an array, or an empty one (all-ones pattern) shaped for the kernel."""
    if val is None:
        return _EMPTY[dense.dtype, dense.dim() - 1]
    return _np(val)


def _np_dtype(dtype: torch.dtype):
    return np.float32 if dtype == torch.float32 else np.float64


def _scalar(v: float, dtype: torch.dtype):
    """``v`` as a NumPy scalar of ``dtype`` (so float32 kernels compute in float32)."""
    return _np_dtype(dtype)(v)


def _chunks() -> int:
    """Entry chunks of the COO kernel: 8 per thread, so a slow thread is caught up."""
    return 8 * numba.get_num_threads()


_WALK_ATTR = "_corgnn_numba_walk"
"""Attribute of a pattern's ``ptr`` tensor holding its arrays as the kernels take them
(:func:`_walk`): it lives and dies with the pattern, and a lookup is one attribute
read (a weakly keyed dictionary cost ~1 us per kernel call, a tenth of this
backend's per-call overhead on the small graphs of mini-batch training)."""


CHUNK_MIN_WORK = 1024
"""Least ``entries + rows`` per parallel task: a small graph (a mini-batch of small
graphs) runs as few tasks, so it pays no per-task cost it cannot win back.

NOTE (issue 21, measured with 2 threads on this 2-core VM, 5-layer GIN and 3-layer
GCN on batches of 32 graphs of 15-35 nodes, ~5,000 entries + rows per product,
interleaved in one process, median per batch): 4096 ran such a product as one task
on one thread; 1024 splits it, GIN 5.06 / 4.07 / 5.82 -> 4.46 / 3.66 / 5.34 ms
(three runs), GCN 1.75 -> 1.70 ms; 512 and 2048 were no better."""


SCATTER_PARALLEL_WORK = 1 << 15
"""``entries x columns`` per task of an unsorted COO's SpMM (``spmm_coo``): a
product splits its output rows over up to one task per thread, each at least this
much work (one task: the serial kernel, no parallel launch).

NOTE (measured 2026-11-29, 2-core VM, min of 9, mini-batches of 32 / 128 molecule
graphs, 4k / 17k entries with the diagonal): one thread scattered them in 12.5 /
48 us at 16 columns and 32 / 130 us at 64; two tasks (each reads every entry and
adds its own rows' ones) 10 / 29 and 18 / 75 us."""


def _make_chunks(ptr: np.ndarray, threads: int) -> np.ndarray:
    n = ptr.shape[0] - 1
    total = int(ptr[-1]) + n
    # (a multiple of the thread count, so equal-work tasks keep every thread busy)
    return _split_rows(ptr, max(1, min(n, 16 * threads, threads * (total // (threads * CHUNK_MIN_WORK)))))


def _split_rows(ptr: np.ndarray, tasks: int) -> np.ndarray:
    """Row bounds ``(tasks + 1,)`` of ``tasks`` parts of about equal ``entries + rows``."""
    n = ptr.shape[0] - 1
    tasks = max(1, min(n, tasks))
    if tasks == 1:
        return np.array([0, n], dtype=np.int64)
    return k.split_rows(ptr, tasks)


def _walk(ptr, idx, perm) -> tuple:
    """``(ptr, idx, perm, row chunks)`` arrays of a row plan for the kernels, computed
    once per pattern (kept on ``ptr``: :data:`_WALK_ATTR`) and torch thread count
    (Numba's follows it: :func:`.numba_threads.launch`); recomputed when ``ptr`` was
    modified in place or rebound (its version and address), or comes with another
    ``idx`` / ``perm``, as a pattern is walked by several products per step."""
    key = (torch.get_num_threads(), ptr.data_ptr(), None if ptr.is_inference() else ptr._version)  # (an inference tensor has no version)
    hit = getattr(ptr, _WALK_ATTR, None)
    if hit is not None and hit[0] == key and hit[1] is idx and hit[2] is perm:
        return hit[3]
    p = _np(ptr)
    # (row chunks: tasks of about equal ``entries + rows``, degrees being skewed, for
    # Numba's thread count: :func:`_make_chunks`)
    arrays = (p, _np(idx), _perm(perm), _make_chunks(p, numba.get_num_threads()))
    if not torch.compiler.is_compiling():
        setattr(ptr, _WALK_ATTR, (key, idx, perm, arrays))
    return arrays


def _heads_last(X: torch.Tensor) -> np.ndarray:
    """``X (n, H, C)`` as a contiguous ``(n, C, H)`` array (one copy, ~0.5 ms for 20k x 8 x 8
    float32; none when ``X`` is stored heads-last already, as the CPU projections store
    the transformer's queries, keys and values and GATv2's ``XL`` and ``XR``:
    :func:`corgnn.functional.projection.stacked_projections`): the layout the
    attention kernels gather per-node rows in, so that their per-entry loops run over
    heads in one vector."""
    return X.detach().transpose(1, 2).contiguous().numpy()


def _slotted(a) -> np.ndarray:
    """A per-entry ``(q, H)`` tensor or array as the ``(q, 1, H)`` array the transformer
    kernels index like their ``(q, 2, H)`` ones (one head helper for both; a reshape
    inside a kernel would need ``numba.np.arrayobj`` to load it)."""
    a = _np(a) if isinstance(a, torch.Tensor) else a
    return a.reshape(a.shape[0], 1, a.shape[1])


def _edge_arrays(Qe, attr, H: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(Qe (n, H, F), attr (q, F))`` arrays of the attention kernels' edge features,
    or empty ones (no edge features)."""
    if attr is None:
        return np.empty((0, H, 0), dtype=_np_dtype(dtype)), np.empty((0, 0), dtype=_np_dtype(dtype))
    return _np(Qe), _np(attr)


def _seed(p: float, seed: torch.Tensor, dtype) -> tuple:
    """``(thresh, scale, seed_lo, seed_hi)`` of attention dropout as the kernels take them."""
    thresh, scale, lo, hi = dropout_kernel_args(p, seed)
    return thresh, _scalar(scale, dtype), lo, hi


def _serialised(fn):
    """``fn`` run under the kernel-launch lock (the ``workqueue`` layer runs one
    parallel kernel at a time; see :mod:`.numba_threads`)."""

    @functools.wraps(fn)
    def run(*args):
        with numba_threads.launch_lock():
            return fn(*args)

    return run


class NumbaBackend(Backend):
    """Numba kernels for every op, CPU tensors, float32 and float64."""

    name = "numba"

    def unavailable(self) -> str | None:
        numba_threads.launch()  # once, when dispatch first considers this backend
        return None

    def __init__(self):
        self._serial: dict = {}

    def kernel(self, op: str):
        if not numba_threads.serialised():
            return getattr(self, op)
        fn = self._serial.get(op)
        if fn is None:
            fn = self._serial[op] = _serialised(getattr(self, op))
        return fn

    def supports(self, case: Case) -> str | None:
        if case.device != "cpu":
            return f"runs on CPU tensors only, got {case.device}"
        unusable = numba_threads.unusable_reason() or numba_warmup.cold_reason()
        if unusable is not None:
            return unusable
        if case.dtype not in _DTYPES:
            return f"kernels are compiled for float32/float64, got {case.dtype}"
        return None

    # SpMM -------------------------------------------------------------------
    def spmm_rows(self, ptr, idx, perm, val, B, bias=None):
        if B.dim() == 2:
            return self._rows_launcher(ptr, idx, perm, val, B)(B, bias)
        out = torch.empty((ptr.numel() - 1,) + tuple(B.shape[1:]), dtype=B.dtype)
        p, i, pm, chunks = _walk(ptr, idx, perm)
        k.spmm_rows_heads(p, i, _vals(val, B), pm, chunks, _np(B), out.numpy())
        return out if bias is None else out.add_(bias)

    def bind(self, op, *args):
        # (under a serialised threading layer every launch takes the lock: kernel())
        if numba_threads.serialised() or args[-1].dim() != 2:
            return None
        if op == "spmm_rows" and len(args) == 5:
            return self._rows_launcher(*args)
        if op == "spmm_coo":
            return self._coo_launcher(*args)
        return None

    @staticmethod
    def _rows_launcher(ptr, idx, perm, val, B):
        """``launch(B, bias=None) -> out``: :meth:`spmm_rows` of this row plan and values
        for 2-D operands of ``B``'s dtype, the plan's arrays and task split made here."""
        p, i, pm, chunks = _walk(ptr, idx, perm)
        v, tasks, shape, dt = _vals(val, B), chunks.shape[0] - 1, (ptr.numel() - 1, B.shape[1]), B.dtype
        run = _runner(_SPMM_TIERS[B.dtype], k.spmm_rows, k.spmm_rows_serial)

        def launch(B, bias=None):
            out = torch.empty(shape if B.shape[1] == shape[1] else (shape[0], B.shape[1]), dtype=dt)
            run((p, i, v, pm, chunks, _np(B), out.numpy(), _vals(bias, B)), tasks)
            return out

        return launch

    def spmm_scatter_rows(self, ptr, idx, perm, val, B, cols):
        # (one task and one (cols, f) accumulator per thread, summed here)
        p = _np(ptr)
        chunks = _split_rows(p, numba.get_num_threads())
        acc = torch.empty(chunks.shape[0] - 1, cols, B.shape[1], dtype=B.dtype)
        k.spmm_scatter_rows(p, _np(idx), _vals(val, B), _perm(perm), chunks, _np(B), acc.numpy())
        return acc.sum(0) if acc.shape[0] > 1 else acc[0]

    def spmm_coo(self, row, col, val, rows, B):
        if B.dim() == 3:  # (one value per entry for every head: the heads are columns)
            return self.spmm_coo(row, col, val, rows, B.reshape(B.size(0), -1)).view((rows,) + tuple(B.shape[1:]))
        return self._coo_launcher(row, col, val, rows, B)(B)

    @staticmethod
    def _coo_launcher(row, col, val, rows, B):
        """``launch(B, bias=None) -> out``: :meth:`spmm_coo` of these entries for 2-D
        operands of ``B``'s dtype (the arrays made once: a mini-batch's edge list
        serves every layer's product)."""
        r, c, v, dt, nnz = _np(row), _np(col), _vals(val, B), B.dtype, row.numel()
        threads = numba.get_num_threads()
        run = _runner(_COO_TIERS[B.dtype], k.spmm_coo_scatter, k.spmm_coo_scatter_serial)

        def launch(B, bias=None):
            out = torch.empty(rows, B.shape[1], dtype=dt)
            parts = min(threads, rows, max(1, nnz * B.shape[1] // SCATTER_PARALLEL_WORK))
            run((r, c, v, _np(B), out.numpy(), parts), parts)
            return out if bias is None else out.add_(bias)

        return launch

    def spmm_ell(self, col, lengths, V, B):
        out = torch.empty((col.size(0),) + tuple(B.shape[1:]), dtype=B.dtype)
        Vn = np.empty((0, 0, 1)[: B.dim()], dtype=_np_dtype(B.dtype)) if V is None else _np(V)
        (k.spmm_ell if B.dim() == 2 else k.spmm_ell_heads)(_np(col), _np(lengths), Vn, _np(B), out.numpy())
        return out

    def spmm_hybrid(self, head_ptr, head_col, tail_row, tail_col, val, B):
        heads = B.dim() == 3
        out = torch.empty((head_ptr.numel() - 1,) + tuple(B.shape[1:]), dtype=B.dtype)
        q1 = head_col.numel()
        v, Bn, o = _vals(val, B), _np(B), out.numpy()
        p, i, pm, chunks = _walk(head_ptr, head_col, None)
        if heads:
            k.spmm_rows_heads(p, i, v[:q1], pm, chunks, Bn, o)
        else:
            k.spmm_rows(p, i, v[:q1], pm, chunks, Bn, o, _vals(None, B))
        (k.spmm_coo_heads if heads else k.spmm_coo)(_np(tail_row), _np(tail_col), v[q1:], Bn, o, _chunks(), True)
        return out

    # SDDMM ------------------------------------------------------------------
    def sddmm_rows(self, ptr, idx, perm, val, B, C):
        out = torch.empty((idx.numel(),) + tuple(B.shape[1:-1]), dtype=B.dtype)
        kern = k.sddmm_rows if B.dim() == 2 else k.sddmm_rows_heads
        p, i, pm, chunks = _walk(ptr, idx, perm)
        kern(p, i, _vals(val, B), pm, chunks, _np(B), _np(C), out.numpy())
        return out

    def sddmm_coo(self, row, col, val, B, C):
        out = torch.empty((row.numel(),) + tuple(B.shape[1:-1]), dtype=B.dtype)
        (k.sddmm_coo if B.dim() == 2 else k.sddmm_coo_heads)(_np(row), _np(col), _vals(val, B), _np(B), _np(C), out.numpy())
        return out

    def sddmm_ell(self, col, lengths, offsets, val, B, C):
        nnz = int(lengths.sum())
        out = torch.empty((nnz,) + tuple(B.shape[1:-1]), dtype=B.dtype)
        kern = k.sddmm_ell if B.dim() == 2 else k.sddmm_ell_heads
        kern(_np(col), _np(lengths), _np(offsets), _vals(val, B), _np(B), _np(C), out.numpy())
        return out

    # softmax ----------------------------------------------------------------
    def edge_softmax_rows(self, ptr, perm, scores):
        out = torch.empty_like(scores, memory_format=torch.contiguous_format)
        k.edge_softmax_rows(_np(ptr), _perm(perm), _np(scores), out.numpy())
        return out

    # GAT --------------------------------------------------------------------
    def gat_node_scores(self, M, a_src, a_dst):
        n, H, K = M.shape
        s = torch.empty(n, H, dtype=M.dtype)
        d = torch.empty(n, H, dtype=M.dtype)
        gk.node_scores(_np(M), _np(a_src.reshape(H, K)), _np(a_dst.reshape(H, K)), s.numpy(), d.numpy())
        return s, d

    def gat_attention(self, ptr, idx, perm, s, d, M, negative_slope, p, seed, want_leaky):
        n, H, K = M.shape
        q, dt = idx.numel(), M.dtype
        alpha = torch.empty(q, H, dtype=dt)
        leaky = torch.empty(q if want_leaky else 0, H, dtype=torch.bool)
        out = torch.empty(ptr.numel() - 1, H, K, dtype=dt)
        thresh, scale, lo, hi = _seed(p, seed, dt)
        gk.gat_forward_rows(
            *_walk(ptr, idx, perm), _np(s), _np(d), _np(M), _scalar(negative_slope, dt),
            thresh, scale, lo, hi, alpha.numpy(), leaky.numpy(), out.numpy(),
        )
        return out, alpha, leaky

    def gat_attention_backward(self, ptr, idx, perm, tptr, tidx, tperm, G, M, a_src, a_dst, alpha, leaky, s, d, negative_slope, p, seed):
        n, H, K = M.shape
        q, dt = idx.numel(), M.dtype
        thresh, scale, lo, hi = _seed(p, seed, dt)
        have_cache = alpha is not None and leaky is not None
        none = np.empty((0, H), dtype=_np_dtype(dt))
        alpha_np = _np(alpha) if have_cache else none
        leaky_np = _np(leaky) if have_cache else np.empty((0, H), dtype=np.bool_)
        s_np = _np(s) if s is not None else none
        d_np = _np(d) if d is not None else none
        # the dropped attention is written out unless the cached alpha can be read as is
        alpha_d = torch.empty(q if (p > 0 or not have_cache) else 0, H, dtype=dt)
        dy = torch.empty(q, H, dtype=dt)
        dd = torch.empty(n, H, dtype=dt)
        gk.gat_backward_rows(
            *_walk(ptr, idx, perm), _np(G), _np(M), alpha_np, leaky_np, s_np, d_np,
            _scalar(negative_slope, dt), thresh, scale, lo, hi, alpha_d.numpy(), dy.numpy(), dd.numpy(),
        )
        dM = torch.empty(n, H, K, dtype=dt)
        ds = torch.empty(n, H, dtype=dt)
        ad_np = alpha_d.numpy() if alpha_d.size(0) else alpha_np
        gk.gat_backward_cols(
            *_walk(tptr, tidx, tperm), _heads_last(G), ad_np, dy.numpy(), dd.numpy(),
            _np(a_src.reshape(H, K)), _np(a_dst.reshape(H, K)), dM.numpy(), ds.numpy(),
        )
        return dM, ds, dd

    def gat_head_weighted_sums(self, w1, w2, M):
        n, H, K = M.shape
        T = max(1, min(4 * numba.get_num_threads(), n))
        part1 = torch.empty(T, H, K, dtype=M.dtype)
        part2 = torch.empty(T, H, K, dtype=M.dtype)
        out1 = torch.empty(H, K, dtype=M.dtype)
        out2 = torch.empty(H, K, dtype=M.dtype)
        gk.head_weighted_sums(_np(w1), _np(w2), _np(M), part1.numpy(), part2.numpy(), out1.numpy(), out2.numpy())
        return out1, out2

    # GATv2 ------------------------------------------------------------------
    def gatv2_attention(self, ptr, idx, perm, XL, XR, att, negative_slope, p, seed, want_alpha):
        H, K = XL.shape[1:]
        n, dt = ptr.numel() - 1, XL.dtype
        alpha = torch.empty(idx.numel() if want_alpha else 0, H, dtype=dt)
        lse = torch.empty(n, H, dtype=dt)
        out = torch.empty(n, H, K, dtype=dt)
        thresh, scale, lo, hi = _seed(p, seed, dt)
        XLl = _heads_last(XL)
        g2k.gatv2_forward_rows(
            *_walk(ptr, idx, perm), XLl, XLl if XR is XL else _heads_last(XR), _np(att.reshape(H, K)), _scalar(negative_slope, dt),
            thresh, scale, lo, hi, alpha.numpy(), lse.numpy(), out.numpy(),
        )
        return out, alpha, lse

    def gatv2_attention_backward(self, ptr, idx, perm, tptr, tidx, tperm, G, XL, XR, att, alpha, lse, negative_slope, p, seed):
        H, K = XL.shape[1:]
        q, dt = idx.numel(), XL.dtype
        thresh, scale, lo, hi = _seed(p, seed, dt)
        cached = alpha is not None
        alpha_w = torch.empty(0 if cached else q, H, dtype=dt)
        alpha_np = _np(alpha) if cached else np.empty((0, H), dtype=_np_dtype(dt))
        lse_np = np.empty((0, H), dtype=_np_dtype(dt)) if lse is None else _np(lse)
        de = torch.empty(q, H, dtype=dt)
        dXR = torch.empty(XR.shape, dtype=dt)
        walk = _walk(ptr, idx, perm)
        datt = torch.empty(walk[3].shape[0] - 1, H, K, dtype=dt)  # one partial per task
        # (XL and XR heads last: no copy when the projection stored them so, on CPU
        # corgnn.functional.gatv2 does)
        XLl = _heads_last(XL)
        XRl = XLl if XR is XL else _heads_last(XR)
        an, sl = _np(att.reshape(H, K)), _scalar(negative_slope, dt)
        Gl = _heads_last(G)  # (one copy for both kernels, from any layout: the head mean's expanded G too)
        g2k.gatv2_backward_rows(*walk, Gl, XLl, XRl, an, alpha_np, lse_np, sl, thresh, scale, lo, hi, alpha_w.numpy(), de.numpy(), dXR.numpy(), datt.numpy())
        dXL = torch.empty(XL.shape, dtype=dt)
        g2k.gatv2_backward_cols(
            *_walk(tptr, tidx, tperm), Gl, XRl, XLl, an, alpha_np if cached else alpha_w.numpy(), de.numpy(),
            sl, thresh, scale, lo, hi, dXL.numpy(),
        )
        return dXL, dXR, datt.sum(0)
    # dot-product attention (TransformerConv) ----------------------------------
    def transformer_attention(self, ptr, idx, perm, Q, K, V, Qe, attr, scale, p, seed, want_alpha):
        n, H = ptr.numel() - 1, Q.shape[1]
        dt = Q.dtype
        out = torch.empty(n, H, V.shape[2], dtype=dt)
        lse = torch.empty(n, H, dtype=dt)
        alpha = torch.empty(idx.numel() if want_alpha else 0, H, dtype=dt)
        Ae = torch.empty((0, H, 0) if attr is None else (n, H, attr.shape[1]), dtype=dt)
        Qe_n, attr_n = _edge_arrays(Qe, attr, H, dt)
        thresh, dscale, lo, hi = _seed(p, seed, dt)
        tk.dot_attention_forward_rows(
            *_walk(ptr, idx, perm), _heads_last(Q), _heads_last(K), _heads_last(V), Qe_n, attr_n, _scalar(scale, dt), thresh, dscale, lo, hi,
            lse.numpy(), _slotted(alpha), out.numpy(), Ae.numpy(),
        )
        return out, lse, alpha, Ae

    def transformer_attention_backward_rows(self, ptr, idx, perm, G, Q, K, V, Qe, Ge, attr, alpha, lse, scale, p, seed):
        H = Q.shape[1]
        q, dt = idx.numel(), Q.dtype
        thresh, dscale, lo, hi = _seed(p, seed, dt)
        none = np.empty((0, H), dtype=_np_dtype(dt))
        cached = alpha is not None
        # (de and the dropped attention per entry, side by side; de alone when that is the cached alpha)
        ea = torch.empty(q, 1 if cached and p == 0 else 2, H, dtype=dt)
        dQ = torch.empty(Q.shape, dtype=dt)
        dQe = torch.empty((0, H, 0) if attr is None else (Q.shape[0], H, attr.shape[1]), dtype=dt)
        dattr = torch.empty((0, 0) if attr is None else tuple(attr.shape), dtype=dt)
        Qe_n, attr_n = _edge_arrays(Qe, attr, H, dt)
        Ge_n, _ = _edge_arrays(Ge, attr, H, dt)
        tk.dot_attention_backward_rows(
            *_walk(ptr, idx, perm), _np(G), _heads_last(Q), _heads_last(K), _heads_last(V), Qe_n, Ge_n, attr_n, _slotted(alpha if cached else none),
            none if lse is None else _np(lse), _scalar(scale, dt), thresh, dscale, lo, hi, ea.numpy(), dQ.numpy(), dQe.numpy(), dattr.numpy(),
        )
        return ea, dQ, dQe, dattr

    def transformer_attention_backward_cols(self, tptr, tidx, tperm, G, Q, ea, alpha, scale):
        H, dt = Q.shape[1], Q.dtype
        m = tptr.numel() - 1
        dK = torch.empty((m, H, Q.shape[2]), dtype=dt)
        dV = torch.empty((m, H, G.shape[2]), dtype=dt)
        ad = _slotted(alpha if ea.shape[1] == 1 else np.empty((0, H), dtype=_np_dtype(dt)))
        tk.dot_attention_backward_cols(*_walk(tptr, tidx, tperm), _heads_last(G), _heads_last(Q), _np(ea), ad, _scalar(scale, dt), dK.numpy(), dV.numpy())
        return dK, dV
