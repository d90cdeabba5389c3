"""What every backend implements: the kernel ops' signatures, the :class:`Case`
record dispatch decides on, and the :class:`Backend` base.

The bottom of :mod:`corgnn.sparse`'s import order: backends import this module,
:mod:`corgnn.sparse.rng` and the formats only; :mod:`corgnn.sparse.dispatch` imports
the backends, :mod:`corgnn.sparse.library` registers :data:`KERNEL_OPS` as
``torch.ops.corgnn.*`` custom ops (see there for what each op computes).

Each entry of :data:`KERNEL_OPS` (an :class:`OpSpec`) is the op's typed signature
(the custom op's schema is inferred from it), its fake implementation (output
shapes, for ``torch.compile`` and ``opcheck``), and which argument is the dense
operand whose device and dtype decide the backend.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor

__all__ = ["Case", "Backend", "TransientReason", "OpSpec", "KERNEL_OPS", "OP_NAMES"]


class Case(NamedTuple):
    """What a backend must be able to run: the op, the device type, the value dtype,
    and the head layout (``heads=None`` single-head 2-D operands, else the number of
    heads of semi-batched 3-D operands).

    NOTE: a NamedTuple (immutable, hashable), not a frozen dataclass: one is built per
    kernel call and is the key of dispatch's memo, and a tuple is built and hashed in
    C (a frozen dataclass's ``__init__`` and ``__hash__`` run in Python: per-call
    overhead that counts on the small graphs of mini-batch training)."""

    op: str
    device: str
    dtype: torch.dtype
    heads: int | None = None

    def __str__(self) -> str:
        layout = "single-head" if self.heads is None else f"semi-batched ({self.heads} heads)"
        return f"{self.op} on {self.device} {str(self.dtype).replace('torch.', '')} {layout}"


@dataclass
class OpSpec:
    """One kernel op: ``name``, typed ``signature`` (a function whose annotations and
    docstring define the op), ``fake`` implementation, ``dense`` (position of the
    dense operand deciding the backend) and ``semi_batched`` (the op always has a head
    dimension, ``dense.size(1)``; else it has one when ``dense`` is 3-D)."""

    name: str
    signature: Callable
    dense: int
    semi_batched: bool = False
    fake: Callable | None = None

    def case(self, *args) -> Case:
        """The :class:`Case` of one call with arguments ``args``."""
        D = args[self.dense]
        return Case(self.name, D.device.type, D.dtype, D.size(1) if self.semi_batched or D.dim() == 3 else None)


KERNEL_OPS: dict[str, OpSpec] = {}
"""Every kernel op by name, in definition order (filled below)."""


def _op(dense: int, semi_batched: bool = False):
    def register(sig):
        KERNEL_OPS[sig.__name__] = OpSpec(sig.__name__, sig, dense, semi_batched)
        return sig

    return register


def _fake_of(sig):
    def register(fake):
        KERNEL_OPS[sig.__name__].fake = fake
        return fake

    return register


def _out_rows(B: Tensor, rows) -> Tensor:
    return B.new_empty((rows,) + tuple(B.shape[1:]))


def _entries(B: Tensor, nnz) -> Tensor:
    return B.new_empty((nnz,) if B.dim() == 2 else (nnz, B.shape[1]))


# ----------------------------------------------------------------------------- SpMM


@_op(4)
def spmm_rows(ptr: Tensor, idx: Tensor, perm: Tensor | None, val: Tensor | None, B: Tensor, bias: Tensor | None = None) -> Tensor:
    """``bias`` (``B.shape[1:]``, or None): added to every output row as it is written
    (the epilogue of issue 12, lever 2: no second pass over the output)."""


@_fake_of(spmm_rows)
def _(ptr, idx, perm, val, B, bias=None):
    return _out_rows(B, ptr.shape[0] - 1)


@_op(4)
def spmm_scatter_rows(ptr: Tensor, idx: Tensor, perm: Tensor | None, val: Tensor | None, B: Tensor, cols: int) -> Tensor:
    """``A^T B`` walking the rows of ``A`` (its row plan ``ptr, idx, perm``, ``cols``
    its column count): ``out[idx[w]] += val[perm[w]] B[i]`` for the entries ``w`` of
    row ``i``, ``out (cols, f)``; 2-D ``B (rows of A, f)`` only."""


@_fake_of(spmm_scatter_rows)
def _(ptr, idx, perm, val, B, cols):
    return _out_rows(B, cols)


@_op(4)
def spmm_coo(row: Tensor, col: Tensor, val: Tensor | None, rows: int, B: Tensor) -> Tensor:
    """``out[row[e]] += val[e] B[col[e]]`` over COO entries in any order (an unsorted
    COO, e.g. an ``edge_index`` in edge order), ``out (rows,) + B.shape[1:]`` zeroed
    first; ``val (nnz,)`` or None (ones), one value per entry for every head of a
    3-D ``B``. No row plan is read or built: the product of a matrix used a few times
    only (:meth:`corgnn.sparse.COO.spmm_kernel`)."""


@_fake_of(spmm_coo)
def _(row, col, val, rows, B):
    return _out_rows(B, rows)


@_op(3)
def spmm_ell(col: Tensor, lengths: Tensor, V: Tensor | None, B: Tensor) -> Tensor:
    ...


@_fake_of(spmm_ell)
def _(col, lengths, V, B):
    return _out_rows(B, col.shape[0])


@_op(5)
def spmm_hybrid(head_ptr: Tensor, head_col: Tensor, tail_row: Tensor, tail_col: Tensor, val: Tensor | None, B: Tensor) -> Tensor:
    ...


@_fake_of(spmm_hybrid)
def _(head_ptr, head_col, tail_row, tail_col, val, B):
    return _out_rows(B, head_ptr.shape[0] - 1)


# ---------------------------------------------------------------------------- SDDMM


@_op(4)
def sddmm_rows(ptr: Tensor, idx: Tensor, perm: Tensor | None, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake_of(sddmm_rows)
def _(ptr, idx, perm, val, B, C):
    return _entries(B, idx.shape[0])


@_op(3)
def sddmm_coo(row: Tensor, col: Tensor, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake_of(sddmm_coo)
def _(row, col, val, B, C):
    return _entries(B, row.shape[0])


@_op(4)
def sddmm_ell(col: Tensor, lengths: Tensor, offsets: Tensor, val: Tensor | None, B: Tensor, C: Tensor) -> Tensor:
    ...


@_fake_of(sddmm_ell)
def _(col, lengths, offsets, val, B, C):
    ctx = torch.library.get_ctx()
    return _entries(B, ctx.new_dynamic_size())  # nnz = lengths.sum(), data-dependent


# ---------------------------------------------------------------------- edge softmax


@_op(2, semi_batched=True)
def edge_softmax_rows(ptr: Tensor, perm: Tensor | None, scores: Tensor) -> Tensor:
    ...


@_fake_of(edge_softmax_rows)
def _(ptr, perm, scores):
    return torch.empty_like(scores)


# ------------------------------------------------------------------------------ GAT


@_op(0, semi_batched=True)
def gat_node_scores(M: Tensor, a_src: Tensor, a_dst: Tensor) -> tuple[Tensor, Tensor]:
    ...


@_fake_of(gat_node_scores)
def _(M, a_src, a_dst):
    return M.new_empty(M.shape[:2]), M.new_empty(M.shape[:2])


@_op(5, semi_batched=True)
def gat_attention(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, s: Tensor, d: Tensor, M: Tensor,
    negative_slope: float, p: float, seed: Tensor, want_leaky: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake_of(gat_attention)
def _(ptr, idx, perm, s, d, M, negative_slope, p, seed, want_leaky):
    q, H = idx.shape[0], M.shape[1]
    leaky = M.new_empty((q if want_leaky else 0, H), dtype=torch.bool)
    return M.new_empty((ptr.shape[0] - 1,) + tuple(M.shape[1:])), M.new_empty((q, H)), leaky


@_op(7, semi_batched=True)
def gat_attention_backward(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, tptr: Tensor, tidx: Tensor, tperm: Tensor | None,
    G: Tensor, M: Tensor, a_src: Tensor, a_dst: Tensor,
    alpha: Tensor | None, leaky: Tensor | None, s: Tensor | None, d: Tensor | None,
    negative_slope: float, p: float, seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake_of(gat_attention_backward)
def _(ptr, idx, perm, tptr, tidx, tperm, G, M, a_src, a_dst, alpha, leaky, s, d, negative_slope, p, seed):
    return torch.empty_like(M), M.new_empty(M.shape[:2]), M.new_empty(M.shape[:2])


@_op(2, semi_batched=True)
def gat_head_weighted_sums(w1: Tensor, w2: Tensor, M: Tensor) -> tuple[Tensor, Tensor]:
    ...


@_fake_of(gat_head_weighted_sums)
def _(w1, w2, M):
    return M.new_empty(M.shape[1:]), M.new_empty(M.shape[1:])


# ---------------------------------------------------------------------------- GATv2


@_op(3, semi_batched=True)
def gatv2_attention(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, XL: Tensor, XR: Tensor, att: Tensor,
    negative_slope: float, p: float, seed: Tensor, want_alpha: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake_of(gatv2_attention)
def _(ptr, idx, perm, XL, XR, att, negative_slope, p, seed, want_alpha):
    n, H = ptr.shape[0] - 1, XL.shape[1]
    return XL.new_empty((n,) + tuple(XL.shape[1:])), XL.new_empty((idx.shape[0] if want_alpha else 0, H)), XL.new_empty((n, H))


@_op(7, semi_batched=True)
def gatv2_attention_backward(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, tptr: Tensor, tidx: Tensor, tperm: Tensor | None,
    G: Tensor, XL: Tensor, XR: Tensor, att: Tensor, alpha: Tensor | None, lse: Tensor | None,
    negative_slope: float, p: float, seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    ...


@_fake_of(gatv2_attention_backward)
def _(ptr, idx, perm, tptr, tidx, tperm, G, XL, XR, att, alpha, lse, negative_slope, p, seed):
    return torch.empty_like(XL), torch.empty_like(XR), XL.new_empty(XL.shape[1:])
# ---------------------------------------------------------- dot-product attention


@_op(3, semi_batched=True)
def transformer_attention(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, Q: Tensor, K: Tensor, V: Tensor, Qe: Tensor | None, attr: Tensor | None,
    scale: float, p: float, seed: Tensor, want_alpha: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused scaled dot-product attention over a row plan (TransformerConv's forward):
    ``out (n_dst, H, C)``, ``lse (n_dst, H)`` (the row's log-sum-exp of the scores, 0
    for an empty row), ``alpha (q, H)`` before dropout (``(0, H)`` unless ``want_alpha``)
    and, with edge features ``attr (q, F)`` (entry order) and ``Qe (n_dst, H, F)`` (the
    queries projected on them, adding ``<Qe_i, attr_e>`` to each score),
    ``Ae (n_dst, H, F) = sum_e drop(alpha_e) attr_e`` (else ``(0, H, 0)``)."""


@_fake_of(transformer_attention)
def _(ptr, idx, perm, Q, K, V, Qe, attr, scale, p, seed, want_alpha):
    n, H = ptr.shape[0] - 1, Q.shape[1]
    Ae = Q.new_empty((0, H, 0) if attr is None else (n, H, attr.shape[1]))
    return V.new_empty((n, H, V.shape[2])), Q.new_empty((n, H)), Q.new_empty((idx.shape[0] if want_alpha else 0, H)), Ae


@_op(4, semi_batched=True)
def transformer_attention_backward_rows(
    ptr: Tensor, idx: Tensor, perm: Tensor | None, G: Tensor, Q: Tensor, K: Tensor, V: Tensor,
    Qe: Tensor | None, Ge: Tensor | None, attr: Tensor | None, alpha: Tensor | None, lse: Tensor | None, scale: float, p: float, seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The row walk of ``transformer_attention``'s backward: ``(ea, dQ, dQe, dattr)``
    from ``G = dL/dout``, the attention read from ``alpha`` or recomputed from ``lse``
    (the softmax backward's row sums ``D = <G, out>`` from each row's entries: no
    ``out``). ``ea (q, 2, H)``: per entry ``de_e = alpha_e (dalpha_e - D_i)`` (``dalpha_e
    = drop_e <G_i, V_j>``) and the dropped attention ``drop_e alpha_e`` side by side,
    or ``(q, 1, H)``, ``de`` alone, when that attention is the given ``alpha`` itself
    (cached, no dropout). With edge features (``Ge (n_dst, H, F)``, ``G`` projected on
    them) ``dQe = sum_e de_e attr_e (n_dst, H, F)`` and ``dattr_e = sum_h (scale de_e Qe_i
    + drop(alpha_e) Ge_i) (q, F)`` (else empty). ``K`` and ``V`` are read here only: a
    caller may drop them before the column walk
    (:func:`transformer_attention_backward_cols`)."""


@_fake_of(transformer_attention_backward_rows)
def _(ptr, idx, perm, G, Q, K, V, Qe, Ge, attr, alpha, lse, scale, p, seed):
    H, q = Q.shape[1], idx.shape[0]
    dQe = Q.new_empty((0, H, 0) if attr is None else (Q.shape[0], H, attr.shape[1]))
    dattr = Q.new_empty((0, 0) if attr is None else tuple(attr.shape))
    return Q.new_empty((q, 2 if (p > 0 or alpha is None) else 1, H)), Q.new_empty(Q.shape), dQe, dattr


@_op(4, semi_batched=True)
def transformer_attention_backward_cols(
    tptr: Tensor, tidx: Tensor, tperm: Tensor | None, G: Tensor, Q: Tensor, ea: Tensor, alpha: Tensor | None, scale: float,
) -> tuple[Tensor, Tensor]:
    """The column walk of ``transformer_attention``'s backward (the transposed plan
    of ``A``): ``dK_j = scale sum_e de_e Q_i (n_src, H, C)`` and ``dV_j = sum_e drop_e
    alpha_e G_i (n_src, H, C_v)`` from the row walk's ``ea``; with ``ea (q, 1, H)`` the
    dropped attention is ``alpha (q, H)`` (the cached one; None otherwise)."""


@_fake_of(transformer_attention_backward_cols)
def _(tptr, tidx, tperm, G, Q, ea, alpha, scale):
    m, H = tptr.shape[0] - 1, Q.shape[1]
    return Q.new_empty((m, H, Q.shape[2])), G.new_empty((m, H, G.shape[2]))


OP_NAMES: tuple[str, ...] = tuple(KERNEL_OPS)
"""The declared op list: every backend implements each as a method of the same name."""


class TransientReason(str):
    """A :meth:`Backend.reason` that holds for now only (the backend is still starting,
    e.g. Numba compiling in the background): dispatch does not memoize a selection
    made past it, so the backend is asked again on the next call; a forced backend runs
    despite it."""


class Backend:
    """One implementation of the kernels.

    Subclasses set :attr:`name`, implement :meth:`unavailable` (why the backend
    cannot run on this machine at all, or ``None``), :meth:`supports` (why it
    cannot run one case, or ``None``) and provide each op of :attr:`ops` as a method
    of the same name (``spmm_rows``, ``sddmm_rows``, ...; see :data:`KERNEL_OPS`).
    """

    name = "?"
    ops: tuple[str, ...] = OP_NAMES
    """The ops this backend implements (default: all of :data:`OP_NAMES`)."""

    def unavailable(self) -> str | None:
        return None

    def supports(self, case: Case) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def reason(self, case: Case) -> str | None:
        """Why this backend cannot run ``case`` (machine, op list, then
        :meth:`supports`), or ``None`` when it can."""
        if case.op not in self.ops:
            return f"does not implement {case.op}"
        return self.unavailable() or self.supports(case)

    def kernel(self, op: str) -> Callable:
        """The implementation of ``op`` (called eagerly, inside the op)."""
        return getattr(self, op)

    def bind(self, op: str, *args) -> Callable | None:
        """``op`` with its leading arguments ``args`` bound: a launcher taking the
        remaining ones, whose per-pattern preparation (a row plan's arrays, its split
        into parallel tasks) is done here once, for a caller that runs one pattern
        many times (:func:`corgnn.sparse.ops.spmm` keeps one per matrix: a
        mini-batch's matrix serves every layer, forward and backward). ``None``
        (the default) where this backend offers none: the caller runs the op."""
        return None

    def traceable(self, op: str) -> Callable | None:
        """A form of ``op`` that ``torch.compile`` may trace into (a
        ``torch.library.triton_op``), or ``None``: the opaque custom op is traced and
        runs :meth:`kernel` when called."""
        return None
