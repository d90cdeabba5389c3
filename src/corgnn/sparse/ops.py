"""Public sparse operators: one entry per operation, differentiable, any format.

* :func:`spmm`         ``C = op(A) @ B``, single-head or semi-batched (multi-head)
* :func:`sddmm`        ``D = A ⊙ (B C)`` sampled at ``A``'s pattern, single or semi-batched
* :func:`edge_softmax` softmax of per-entry scores over each row's entries

Each validates its arguments, then maps the format to the custom op that runs it
(:mod:`corgnn.sparse.library`; the op picks a backend at run time, see
:mod:`corgnn.sparse.dispatch`). Gradients flow to the dense operands and to the
values (``values``, or ``A.val`` when ``values`` is None); each backward is built
from these same public ops (the DGL pattern: the gradient of an SpMM is an SpMM on
the transposed pattern plus an SDDMM), so second derivatives work too. Without
autograd (no input requiring a gradient, or inside another Function's forward) the
op runs directly.

Format -> kernel: each format names its own kernels
(:meth:`~corgnn.sparse.SparseFormat.spmm_kernel`,
:meth:`~corgnn.sparse.SparseFormat.sddmm_kernels`: ELL and hybrid SpMM and SDDMM,
COO SDDMM); every other case, including every ``A^T`` product, walks the format's
cached row plan (:meth:`~corgnn.sparse.SparseFormat.row_plan`). Nothing here
depends on which format ``A`` is.

Paper: appendix "Common Sparse Operators" (Listings 1-2), §"Multi-head GAT".
"""

from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import library as L
from .dispatch import token as dispatch_token
from .formats import SparseFormat, values_version
from .registry import FORMATS

__all__ = ["spmm", "sddmm", "edge_softmax"]


# NOTE (measured on the synthetic OGB-Arxiv and PubMed stand-ins, f=64, 2 cores,
# output buffer reused): for a row-sorted COO the entry-balanced COO SpMM kernel
# takes 88 / 16 ms against 60 / 8 ms for the row plan, i.e. the CSR kernel over a
# row pointer built once from the sorted rows (it skips the per-entry row reads and
# chunk bookkeeping). Both give the same sums, so COO SpMM walks its row plan; the
# COO kernel serves the hybrid format's COO part, which must add into rows the CSR
# part already wrote. The ELL threshold: :data:`corgnn.sparse.ell.ELL_KERNEL_MAX_PADDING`.


# ------------------------------------------------------------------ raw (no autograd)


_WALK_VALUES = WeakIdKeyDictionary()
"""A format's own ``val`` tensor (held weakly) -> ``{id(perm): (perm, version, val[perm])}``."""


def _walk_values(val: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``val[perm]``: a format's values in a row plan's walk order, kept while ``val``
    is alive and unchanged in place (its version counter).

    NOTE (issue 12, lever 3; measured on the OGB-Arxiv stand-in, 2 threads, min of
    15): the transposed SpMM ``A^T B`` of a CSR walks its CSC arrays and read each
    value through ``perm``, a random 4-byte gather per entry that cost as much as the
    row gathers: 7.0 / 14.8 / 14.7 ms at f = 16 / 40 / 64 against 4.0 / 5.9 / 6.9 ms
    for ``A B``. The values in walk order cost ``nnz`` floats (5.3 MB there) once per
    matrix; only a format's own values are kept (per-step values such as GAT's
    attention are read through ``perm``, as one pass costs what it would save).
    Not used while ``torch.compile`` traces (a Python-side cache: the traced graph
    reads through ``perm``).
    """
    per = _WALK_VALUES.setdefault(val, {})
    hit = per.get(id(perm))
    if hit is None or hit[0] is not perm or hit[1] != values_version(val):
        with torch.no_grad():
            hit = per[id(perm)] = (perm, values_version(val), val.index_select(0, perm))
    return hit[2]


SCATTER_MIN_BYTES = 4 << 20
"""``A^T B`` walks ``A``'s rows (``spmm_scatter_rows``) instead of ``A^T``'s once
``B`` holds at least this many bytes ..."""
SCATTER_MAX_BYTES = 2 << 20
"""... and the per-thread ``(columns of A, f)`` accumulators together at most this many.

NOTE (measured, 2 threads, min of 9; the weight gradients ``X^T dP`` of sparse input
features): the transposed walk reads a row of ``B`` per entry at random, cheap while
``B`` stays in cache and slow once it does not; scattering into cached accumulators
reads ``B`` once, in order. PubMed's features (19717 x 500, 977k entries): 2.0 vs
2.3 ms at f = 16 (``B`` 1.3 MB), 6.5 vs 4.3 at 64 (5 MB), 14-25 vs 9.9 at 192;
Cora's and CiteSeer's (``B`` at most 3.4 MB at f = 256): the transposed walk is
faster at every f (0.4 vs 0.65 ms at Cora, f = 192)."""


def _scatter_pays(A: SparseFormat, B: torch.Tensor) -> bool:
    """Whether ``A^T B`` runs as ``spmm_scatter_rows`` (CPU, 2-D ``B``, the sizes of
    :data:`SCATTER_MIN_BYTES` / :data:`SCATTER_MAX_BYTES`)."""
    if B.dim() != 2 or B.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    row_bytes = B.size(1) * B.element_size()
    return B.size(0) * row_bytes >= SCATTER_MIN_BYTES and torch.get_num_threads() * A.shape[1] * row_bytes <= SCATTER_MAX_BYTES


def _spmm_raw(A: SparseFormat, B: torch.Tensor, val: torch.Tensor | None, transpose: bool, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``op(A) B (+ bias)``: the bias is the row kernel's epilogue; format kernels add it after.

    A product with ``A``'s own values (or its pattern) runs the kernel bound once per
    matrix and direction (:func:`corgnn.sparse.library.bind`: the row kernel, or the
    format's own where its backend offers a launcher, a COO's scatter), kept in
    ``A.plans`` (:func:`_launch_key`) for the next call.

    NOTE (issue 21, measured 2026-11-28 on the 2-core VM, 5-layer GIN and 3-layer
    GCN on mini-batches of 32 small graphs, ~780 nodes, 64 channels, interleaved in
    one process): a mini-batch's matrix is multiplied by every layer, forward and
    transposed in the backward, 9 times per step for the GIN; preparing the row
    plan's arrays, values and dispatch once per matrix and direction instead of per
    call took the GIN step 3.73 -> 3.59 ms and the GCN's 1.49 -> 1.42 ms."""
    key = _launch_key(A, B, val, transpose)
    if key is not None:
        hit = A.plans.get(key)
        if hit is not None and hit[0]() is val and hit[1] == values_version(val):
            if hit[2] is not None:
                return hit[2](B, bias)
            key = None  # (known to take the general path: not bound again)
    own = A.spmm_kernel(val, transpose)
    if own is not None and key is not None:  # (the format's own kernel bound as the row kernel is: a format picks the same kernel each time)
        try:
            launch = L.bind(own[0], *own[1], B)
        except ValueError:  # (the selected backend lacks the format's kernel, as can_run says: the row plan below)
            own = None
        else:
            A.plans[key] = _kept_launcher(val, launch)
            if launch is not None:
                return launch(B, bias)
            key = None
    elif own is not None and not L.can_run(own[0], *own[1], B):
        own = None
    if own is None and transpose and _scatter_pays(A, B):
        ptr, idx, perm = A.row_plan(False)
        if L.can_run("spmm_scatter_rows", ptr, idx, perm, val, B, A.shape[1]):
            out = L.spmm_scatter_rows(ptr, idx, perm, val, B, A.shape[1])
            return out if bias is None else out.add_(bias)
    if own is None:
        ptr, idx, perm = A.row_plan(transpose)
        if perm is not None and val is not None and val is A.val and not torch.compiler.is_compiling():
            val_walked, perm = _walk_values(val, perm), None
        else:
            val_walked = val
        if key is not None:
            launch = L.bind("spmm_rows", ptr, idx, perm, val_walked, B)
            A.plans[key] = _kept_launcher(val, launch)
            if launch is not None:
                return launch(B, bias)
        return L.spmm_rows(ptr, idx, perm, val_walked, B, bias)
    name, args = own
    out = getattr(L, name)(*args, B)
    return out if bias is None else out.add_(bias)


def _launch_key(A: SparseFormat, B: torch.Tensor, val: torch.Tensor | None, transpose: bool) -> tuple | None:
    """The key in ``A.plans`` of ``op(A) B``'s bound row kernel (with the values and
    their version checked on a hit), or None where none is kept: values other than
    ``A``'s own (per-call values: an attention, an explain mask), a 3-D ``B``,
    ``torch.compile`` tracing. ``B`` is on ``A``'s device; the thread count sets the
    row plan's task split, the dispatch token the backend; ``A``'s pattern without its
    values (``val`` None) has a launcher of its own. Not ``B``'s width: a launcher
    takes any (dispatch decides on the device, dtype and head layout only), so the
    layers of one model whose products differ in width (a first layer on the input
    features, a last one on the classes) share it: one bind per direction a batch."""
    if B.dim() != 2 or (val is not None and val is not A.val) or torch.compiler.is_compiling():
        return None
    return ("launch", transpose, val is None, B.dtype, torch.get_num_threads(), dispatch_token())


def _kept_launcher(val: torch.Tensor | None, launch) -> tuple:
    """``A.plans``' entry of a bound launcher (None: the general path) for values ``val``
    (held weakly with their version, checked on a hit: :func:`_spmm_raw`)."""
    return (_NO_VALUES if val is None else weakref.ref(val), values_version(val), launch)


def _NO_VALUES():
    """Stands for the weak reference of absent values (an all-ones pattern)."""
    return None


def _sddmm_raw(A: SparseFormat, B: torch.Tensor, Ct: torch.Tensor, val: torch.Tensor | None) -> torch.Tensor:
    """``val[e] <B[i], Ct[j]>`` at every entry ``e = (i, j)``, in ``A``'s order."""
    own = A.sddmm_kernels(val)
    if own is not None:
        parts = [getattr(L, name)(*args, B, Ct) for name, args in own]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    ptr, idx, perm = A.row_plan(False)
    if perm is not None:
        tptr, tidx, tperm = A.row_plan(True)
        if tperm is None:
            # NOTE: <B[i], C[j]> = <C[j], B[i]>: walking the columns of A (rows of A^T)
            # with B and C swapped visits the same entries and writes them in A's own
            # order, so no scattered writes through perm (CSC).
            return L.sddmm_rows(tptr, tidx, None, val, Ct, B)
    return L.sddmm_rows(ptr, idx, perm, val, B, Ct)


def _edge_softmax_raw(A: SparseFormat, s2: torch.Tensor) -> torch.Tensor:
    ptr, _, perm = A.row_plan(False)
    return L.edge_softmax_rows(ptr, perm, s2)


# ---------------------------------------------------------------------- autograd


def _needs_grad(a, b=None, c=None) -> bool:
    """Whether autograd is on and one of the (up to three) operands requires a gradient
    (no generator: this runs in every product)."""
    if not torch.is_grad_enabled():
        return False
    return (a is not None and a.requires_grad) or (b is not None and b.requires_grad) or (c is not None and c.requires_grad)


def _pattern_sddmm(A, B, Ct):
    """``<B[i], Ct[j]>`` per entry (pattern: values ignored), differentiable."""
    return sddmm(A, B, Ct if B.dim() == 3 else Ct.t(), values=_Ones)


class _SpMM(torch.autograd.Function):
    """``op(A) @ B + bias`` with values ``val``. Backward (``G = dL/dout``):
    ``dB = op(A)^T G`` (SpMM on the transposed walk),
    ``dval_e = <G[i], B[j]>`` for ``op(A) = A`` (``<B[i], G[j]>`` for ``A^T``), an SDDMM,
    and ``dbias = G^T 1`` (column sums)."""

    @staticmethod
    def forward(ctx, B, val, bias, A, transpose):
        ctx.A, ctx.transpose = A, transpose
        grads = ctx.needs_input_grad
        if grads[1] or (grads[0] and val is not None):  # (else nothing to keep: no call)
            ctx.save_for_backward(B if grads[1] else None, val if grads[0] else None)
        return _spmm_raw(A, B.contiguous(), val, transpose, bias)

    @staticmethod
    def backward(ctx, G):
        B, val = ctx.saved_tensors or (None, None)
        A, transpose = ctx.A, ctx.transpose
        gB = gval = None
        if ctx.needs_input_grad[0]:
            if torch.is_grad_enabled():  # (create_graph: a differentiable product)
                gB = spmm(A, G, transpose=not transpose, values=_Ones if val is None else val)
            else:  # (the operands are the forward's, already checked)
                gB = _spmm_raw(A, G.contiguous(), val, not transpose)
        if ctx.needs_input_grad[1]:
            gval = _pattern_sddmm(A, B, G) if transpose else _pattern_sddmm(A, G, B)
        gbias = G.sum(0) if ctx.needs_input_grad[2] else None
        return gB, gval, gbias, None, None


class _SDDMM(torch.autograd.Function):
    """``out_e = val_e <B[i], Ct[j]>``. Backward (``g = dL/dout``, ``w = g val``):
    ``dB = A_w Ct`` and ``dCt = A_w^T B`` (SpMMs with per-entry values ``w``),
    ``dval = g <B[i], Ct[j]>`` (an SDDMM)."""

    @staticmethod
    def forward(ctx, B, Ct, val, A):
        ctx.A = A
        ctx.save_for_backward(B, Ct, val)
        return _sddmm_raw(A, B.contiguous(), Ct.contiguous(), val)

    @staticmethod
    def backward(ctx, g):
        B, Ct, val = ctx.saved_tensors
        A = ctx.A
        w = g if val is None else g * val
        gB = spmm(A, Ct, values=w) if ctx.needs_input_grad[0] else None
        gC = spmm(A, B, transpose=True, values=w) if ctx.needs_input_grad[1] else None
        gval = g * _pattern_sddmm(A, B, Ct) if ctx.needs_input_grad[2] else None
        return gB, gC, gval, None


class _EdgeSoftmax(torch.autograd.Function):
    """``y = softmax_row(s)``. Backward: ``ds = y (g - rowsum(y g))``, the row sum an
    SpMM against a ones column and its broadcast back to the entries an SDDMM."""

    @staticmethod
    def forward(ctx, scores, A):
        ctx.A = A
        y = _edge_softmax_raw(A, scores.contiguous())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        A = ctx.A
        return y * (g - _row_broadcast(A, _row_sum(A, y * g))), None


def _row_sum(A, v):
    """``(n, h)``: per-row sums of per-entry ``v (nnz, h)``."""
    H = v.size(1)
    ones = v.new_ones(A.shape[1], H, 1)
    return spmm(A, ones, values=v).squeeze(-1)


def _row_broadcast(A, r):
    """``(nnz, h)``: each entry gets its row's ``r (n, h)``."""
    H = r.size(1)
    ones = r.new_ones(A.shape[1], H, 1)
    return sddmm(A, r.unsqueeze(-1), ones, values=_Ones)


class _OnesType:
    """Marker for "an all-ones pattern, whatever ``A.val`` holds"."""

    def __repr__(self) -> str:
        return "ones"


_Ones = _OnesType()


# ------------------------------------------------------------------------ public


def _check_sparse(A):
    if not isinstance(A, SparseFormat):
        names = ", ".join(cls.__name__ for cls in FORMATS.values())
        raise TypeError(f"A must be a corgnn sparse format ({names}), got {type(A).__name__}")


def _check_dense(name: str, t, device) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {getattr(t, 'dtype', type(t))}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}")


def _values(A: SparseFormat, values, heads: int | None, dtype, device):
    """Entry values in ``A``'s order, validated (``device``: ``A``'s); ``None`` = all-ones pattern."""
    if values is _Ones:
        return None
    val = A.val if values is None else values
    if val is None:
        return None
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        raise TypeError(f"values must be a floating tensor, got {getattr(val, 'dtype', type(val))}")
    want = (A.nnz,) if heads is None else (A.nnz, heads)
    if tuple(val.shape) != want:
        raise ValueError(f"values must have shape {want} (one per stored entry{', per head' if heads else ''}), got {tuple(val.shape)}")
    if val.dtype != dtype:
        raise TypeError(f"values dtype {val.dtype} does not match B dtype {dtype}")
    if val.device != device:
        raise ValueError(f"values are on {val.device} but A is on {device}")
    return val


def spmm(
    A: SparseFormat, B: torch.Tensor, *, transpose: bool = False, values: torch.Tensor | None = None, bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sparse-dense product ``op(A) @ B (+ bias)`` with ``op(A) = A^T if transpose else A``.

    Single-head: ``B (m, f)`` -> ``(n, f)`` with values ``(nnz,)``.
    Semi-batched (h heads sharing ``A``'s pattern): ``B (m, h, f)`` and values
    ``(nnz, h)`` -> ``(n, h, f)``; each head ``q`` computes ``A_q @ B[:, q]``.
    ``A^T B`` walks the transpose's cached compressed arrays (CSR/CSC duality) and
    reads ``A``'s values through a permutation; it never materialises ``A^T``.

    Differentiable w.r.t. ``B``, the values (``values``, else ``A.val``) and ``bias``.

    Args:
        A: sparse ``(n, m)`` matrix in any format.
        B: dense floating operand on ``A``'s device.
        transpose: multiply by ``A^T`` (shape ``(m, n)``) instead.
        values: per-entry values in ``A``'s entry order overriding ``A.val``
            (``None`` and no ``A.val``: an all-ones pattern).
        bias: ``(f,)`` added to every output row (single-head ``B`` only), the
            GCN layer's ``+ b``; the row kernels add it as they write each row
            (the epilogue of issue 12, lever 2), no second pass over the output.
            Its gradient is the column sum of ``dL/dout``.

    Returns:
        Dense tensor of ``B``'s dtype, ``(rows(op(A)), f)`` or ``(rows, h, f)``.

    Raises:
        TypeError: ``A`` not a sparse format; non-floating ``B``/values/``bias``; dtype mismatch.
        ValueError: shape or device mismatches between ``A``, ``B``, ``values`` and
            ``bias``; no backend can run the case (the message gives each backend's reason).
    """
    _check_sparse(A)
    device = A.device
    _check_dense("B", B, device)
    n, m = (A.shape[1], A.shape[0]) if transpose else A.shape
    if B.dim() not in (2, 3) or B.size(0) != m:
        raise ValueError(f"B must have shape ({m}, f) or ({m}, heads, f) to multiply op(A) of shape ({n}, {m}), got {tuple(B.shape)}")
    val = _values(A, values, B.size(1) if B.dim() == 3 else None, B.dtype, device)
    if bias is not None:
        _check_dense("bias", bias, device)
        if B.dim() != 2 or tuple(bias.shape) != (B.size(1),):
            raise ValueError(f"bias must have shape (f,) = ({B.size(-1)},) with a 2-D B, got bias {tuple(bias.shape)}, B {tuple(B.shape)}")
        if bias.dtype != B.dtype:
            raise TypeError(f"bias dtype {bias.dtype} does not match B dtype {B.dtype}")
        bias = bias.contiguous()
    if _needs_grad(B, val, bias):
        return _SpMM.apply(B, val, bias, A, bool(transpose))
    return _spmm_raw(A, B.contiguous(), val, bool(transpose), bias)


def sddmm(A: SparseFormat, B: torch.Tensor, C: torch.Tensor, *, values: torch.Tensor | None = None) -> torch.Tensor:
    """Sampled dense-dense product ``D = A ⊙ (B C)`` at ``A``'s stored entries.

    Single-head: ``B (n, f)``, ``C (f, m)`` (pass ``M.t()`` for a node matrix ``M (m, f)``;
    that view costs no copy) -> values ``(nnz,)``.
    Semi-batched: ``B (n, h, f)``, ``C (m, h, f)`` given row-wise per column node
    (``C[j, q]`` is column ``j`` of head ``q``'s right operand) -> ``(nnz, h)``.
    Entry ``e = (i, j)`` gets ``val[e] * <B[i], C[:, j]>`` (``val`` = ``values`` or
    ``A.val``; 1 for a pattern), in ``A``'s entry order.

    Differentiable w.r.t. ``B``, ``C`` and the values.

    Raises:
        TypeError / ValueError: as :func:`spmm`, for ``B``, ``C`` and ``values``.
    """
    _check_sparse(A)
    device = A.device
    _check_dense("B", B, device)
    _check_dense("C", C, device)
    n, m = A.shape
    if B.dim() == 2:
        if C.dim() != 2 or B.size(0) != n or C.size(1) != m or B.size(1) != C.size(0):
            raise ValueError(f"sddmm needs B ({n}, f) and C (f, {m}); got B {tuple(B.shape)}, C {tuple(C.shape)}")
        Ct, heads = C.t(), None
    elif B.dim() == 3:
        if C.dim() != 3 or B.size(0) != n or C.size(0) != m or B.shape[1:] != C.shape[1:]:
            raise ValueError(f"semi-batched sddmm needs B ({n}, h, f) and C ({m}, h, f); got B {tuple(B.shape)}, C {tuple(C.shape)}")
        Ct, heads = C, B.size(1)
    else:
        raise ValueError(f"B must be 2-D (n, f) or 3-D (n, h, f), got {tuple(B.shape)}")
    if B.dtype != C.dtype:
        raise TypeError(f"B dtype {B.dtype} does not match C dtype {C.dtype}")
    val = _values(A, values, heads, B.dtype, device)
    if _needs_grad(B, Ct, val):
        return _SDDMM.apply(B, Ct, val, A)
    return _sddmm_raw(A, B.contiguous(), Ct.contiguous(), val)


def edge_softmax(A: SparseFormat, scores: torch.Tensor) -> torch.Tensor:
    """Softmax of per-entry ``scores`` over each row of ``A`` (numerically stable).

    For a GAT adjacency (rows = destination nodes) this normalises the attention
    logits of every node's incoming edges (paper eq. "GAT Forward Pass"):
    ``alpha_e = exp(s_e - max_row) / sum_row exp(s - max_row)``. Differentiable
    w.r.t. ``scores``.

    Args:
        A: sparse pattern ``(n, m)``.
        scores: ``(nnz,)`` or ``(nnz, h)`` floating, in ``A``'s entry order.

    Returns:
        Tensor shaped like ``scores``; rows with no entries contribute nothing.

    Raises:
        TypeError: ``A`` not a sparse format, non-floating ``scores``.
        ValueError: ``scores`` not ``(nnz,)``/``(nnz, h)`` or on another device.
    """
    _check_sparse(A)
    _check_dense("scores", scores, A.device)
    if scores.dim() not in (1, 2) or scores.size(0) != A.nnz:
        raise ValueError(f"scores must have shape ({A.nnz},) or ({A.nnz}, h), got {tuple(scores.shape)}")
    s2 = scores if scores.dim() == 2 else scores.unsqueeze(1)
    if _needs_grad(s2):
        out = _EdgeSoftmax.apply(s2, A)
    else:
        out = _edge_softmax_raw(A, s2.contiguous())
    return out if scores.dim() == 2 else out.squeeze(1)
