"""The base of corgnn's layers: :class:`CorgnnConv` (input handling, validation, the
sparse-feature hand-off, PyG's explain masks), and the helpers every layer shares.

A layer subclasses :class:`CorgnnConv` and keeps only its own math (its ``__init__``,
``adjacency``, ``plan`` and ``forward``), as PyG's ``gcn_conv.py`` keeps only its own
over ``MessagePassing``. ``CorgnnConv`` is a PyG ``MessagePassing`` module, so PyG's
tools that look for message-passing layers find corgnn's (``Explainer``'s
``set_masks``, ``trim_to_layer``); its forward never calls ``propagate``: the
layers run the paper's schemes over sparse formats instead.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn
from torch_geometric.nn.conv import MessagePassing

from .._cache import Uncopied, tensor_state
from .._validate import check_features, check_finite, check_float_dtype, computed_in_model
from ..graph import Graph
from ..sparse.formats import CSR, SparseFormat, ptr_from_sorted
from ..sparse.torch_sparse import from_torch_sparse

__all__ = [
    "CorgnnConv", "dropout", "hidden_elu", "SPARSE_FEATURE_DENSITY", "SPARSE_FEATURE_DENSITY_WIDE", "WIDE_LAYER", "sparse_feature_density", "DENSE_STREAK", "DENSE_RECOUNT", "FeatureCheck", "FeatureCache", "row_pointer", "dense_to_csr", "SAMPLE_ROWS", "dense_sample_rules_out",
    "SparseView", "num_rows", "check_compiled_x", "UnsupportedOption", "check_message_passing_kwargs", "check_flow",
    "check_value_grad", "sparse_values_weigh", "message_passing_unsupported", "is_lazy", "not_parameters",
    "adopt_parameters", "linear_params", "parameter", "submodule", "weight_and_bias", "any_parameter_requires_grad",
]


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, same distribution as ``torch.nn.functional.dropout``.

    NOTE: built from ``rand_like`` and a comparison, which on CPU is about 3x faster
    than torch's Bernoulli-based dropout (59 ms vs 21 ms on Cora's 2708 x 1433
    features, 2 cores), the largest single cost of a Cora training epoch.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return nn.functional.dropout(x, p, True)
    keep = torch.rand_like(x) >= p
    return x * keep * (1.0 / (1.0 - p))


def hidden_elu(h: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.elu(h)`` of a hidden layer's output, in place when ``h`` is
    a fresh tensor, so that a training step keeps one ``(n, heads * hidden)``
    activation instead of ELU's input and output both (the attention models of
    :mod:`corgnn.nn`: 4.8 MB on PubMed, about 0.06 of compiled PyG's peak per step
    there). Not in place when ``h`` is a view (a custom Function's view output may not
    be modified in place: GAT's) or another tensor's base."""
    fresh = h._base is None and h.grad_fn is not None and not h.is_leaf
    return nn.functional.elu(h, inplace=fresh)


SPARSE_FEATURE_DENSITY = 0.12
"""Constant input features at or below this fraction of non-zeros are used as a sparse
matrix (Planetoid bag-of-words: Cora 1.3 %, CiteSeer 0.9 %, PubMed's TF-IDF ~10 %).

NOTE: measured on the 2-core CI machine, ``X (19717, 500)`` (PubMed's shape) at
density d, training's two products ``X W`` and ``X^T G`` (``W (500, k)``): corgnn's
CSR SpMMs over the dense GEMMs took 0.42 / 0.40 / 0.70 of the time at d = 10 % for
k = 16 / 64 / 256 (1 thread; 0.43 / 0.36 / 0.56 with 2), 0.51 / 0.46 / 0.79 at
12 %, and broke even at ~20-25 % (k <= 64) and ~15 % (k = 256); wider layers
break even earlier (:data:`SPARSE_FEATURE_DENSITY_WIDE`). It was 5 % until issue
25's measurements: raising it took a 2-layer model's training step on PubMed (real
graph, ~10 % dense features, 1 thread) from 23.7 to 12.0 ms (GCN), 91 to 75 ms
(GAT), 171 to 135-144 ms (GATv2) and 234 to 167 ms (TransformerConv)."""

WIDE_LAYER = 256
SPARSE_FEATURE_DENSITY_WIDE = 0.05
"""The limit for a layer of more than :data:`WIDE_LAYER` output columns (at most
:data:`SPARSE_FEATURE_DENSITY`; :func:`sparse_feature_density`).

NOTE: measured as :data:`SPARSE_FEATURE_DENSITY` (2 threads): at k = 512 / 1024 the
SpMMs took 0.65 / 0.62 of the GEMMs' time at 5 %, 0.77 / 0.90 at 8 %, and broke even
at 10 % (a 2-layer GCN of 512 and 1024 hidden on PubMed ran 137.8 -> 156.9 and 283.5
-> 297.2 ms a step with the 12 % limit for every width)."""


def sparse_feature_density(width: int | None) -> float:
    """The fraction of non-zeros at or below which constant features read by a layer
    of ``width`` output columns (``Θ (m, width)``; None: unknown) are used as a sparse
    matrix: :data:`SPARSE_FEATURE_DENSITY`, or :data:`SPARSE_FEATURE_DENSITY_WIDE` for
    a layer wider than :data:`WIDE_LAYER` (a negative :data:`SPARSE_FEATURE_DENSITY`,
    as the benchmarks set it: never)."""
    if width is not None and width > WIDE_LAYER:
        return min(SPARSE_FEATURE_DENSITY, SPARSE_FEATURE_DENSITY_WIDE)
    return SPARSE_FEATURE_DENSITY


class FeatureCheck(Uncopied):
    """Validates features once per tensor version (the dataset's ``x`` is checked on
    the first epoch only; a new tensor, or the same one modified in place or given
    new ``.data``, is checked again: :func:`corgnn.graph.tensor_state`, with the
    same limit as :class:`corgnn.graph.GraphCache` for writes through ``x.data[...]``
    or NumPy). Subclasses derive more per-version state in :meth:`derive`. The
    state is never pickled or deep-copied: a copy starts empty.

    Two tensors are kept (a training step's features and the evaluation's ``x``
    alternate in a script with an input dropout); a new one replaces the one with
    fewer calls. ``previous_seen_once``: the tensor that came before the current
    new one was used by a single call."""

    SLOTS = 2

    def __init__(self):
        self._slots: list[list] = []  # [weakref, tensor_state, derived state, calls], newest first
        self.previous_seen_once = False

    @property
    def newest(self):
        """State derived for the newest tensor seen (None before the first call)."""
        return self._slots[0][2] if self._slots else None

    def __call__(self, x: torch.Tensor, num_nodes: int, channels: int, width: int | None = None, training: bool = True):
        """Validate ``x (num_nodes, channels)`` and return its derived state; ``width``
        and ``training`` describe the layer reading it (see :meth:`derive`)."""
        key = tensor_state(x)
        for slot in self._slots:
            if slot[0]() is x and slot[1] == key:
                slot[3] += 1
                return slot[2]
        check_features("x", x, num_nodes, channels)
        self.previous_seen_once = bool(self._slots) and self._slots[0][3] == 1
        state = self.derive(x, width, training)
        if len(self._slots) >= self.SLOTS:
            del self._slots[max(range(len(self._slots)), key=lambda i: (-self._slots[i][3], i))]  # fewest calls, oldest first
        self._slots.insert(0, [weakref.ref(x), key, state, 1])
        return state

    def derive(self, x: torch.Tensor, width: int | None, training: bool):
        return None

    def skips(self, x: torch.Tensor, width: int | None) -> bool:
        """Whether ``x`` needs none of this cache's per-tensor work (then counted as
        seen): never here; :class:`FeatureCache` skips a long stream of too-dense
        activations."""
        return False


class FeatureCache(FeatureCheck):
    """Also keeps the CSR of constant features (no grad) that are at most
    :data:`SPARSE_FEATURE_DENSITY` non-zero, converted once per tensor version like
    the adjacency; ``None`` = use dense.

    When the previous tensor was used by one call only (features arrive as a new
    tensor every call, e.g. a dropout's output), a new one is converted only if
    :func:`corgnn.cost.plan_feature_conversion` says one call's saving covers the
    conversion for a layer of ``width`` output columns (``last_conversion``
    keeps that plan); without ``width`` the features count as reused.

    Such a stream of new tensors that keeps being too dense, or not worth converting
    for one use (activations under ``torch.no_grad``, about half non-zero; a sampled
    subgraph's rows of ~10 %-dense features), is counted only every
    :data:`DENSE_RECOUNT` th tensor once :data:`DENSE_STREAK` in a row were so: the
    others use the dense path without a count (a sparse tensor in such a stream is
    converted from the next recount on; the dense path is exact either way). "Not
    worth converting" includes a tensor for which even no non-zeros would not pay.
    Inside an ``optimize()``d model's forward under ``torch.no_grad``, a tensor the
    model computed skips the per-tensor bookkeeping too while its stream is known
    too dense (:meth:`__call__`)."""

    def __init__(self):
        super().__init__()
        self.last_conversion = None
        self._dense_run = 0  # new tensors in a row (a stream) found too dense to convert

    def __call__(self, x: torch.Tensor, num_nodes: int, channels: int, width: int | None = None, training: bool = True):
        if self.skips(x, width):
            check_features("x", x, num_nodes, channels)
            return None
        return super().__call__(x, num_nodes, channels, width, training)

    def skips(self, x: torch.Tensor, width: int | None) -> bool:
        # NOTE (issue 21): in a long stream of too-dense new tensors (derive's first
        # branch), a tensor the running optimize()d model computed (an activation
        # under no_grad: corgnn._validate.ModelInputs) gets derive's answer (dense)
        # without the per-tensor bookkeeping (its fingerprint, the slot search,
        # eviction and insertion: ~5 us a layer and call on a mini-batch); the caller
        # checks its shape. Every DENSE_RECOUNT-th is counted as derive counts.
        run = self._dense_run
        if run >= DENSE_STREAK and run % DENSE_RECOUNT and width is not None and self.previous_seen_once and computed_in_model(x):
            self._dense_run = run + 1
            return True
        return False

    def derive(self, x: torch.Tensor, width: int | None, training: bool) -> "CSR | None":
        if x.requires_grad or not x.numel():
            return None
        seen_once = self.previous_seen_once and width is not None
        if seen_once and self._dense_run >= DENSE_STREAK and self._dense_run % DENSE_RECOUNT:
            # (first: in a long stream of too-dense tensors, e.g. every layer's
            # activations under no_grad, this is all a call does)
            self._dense_run += 1
            return None
        n, m = x.shape
        limit = int(max(sparse_feature_density(width), 0.0) * x.numel())  # (benchmarks set a negative density: never sparse)
        if limit == 0:
            return None
        if seen_once:
            from ..cost.features import plan_feature_conversion
            from ..cost.gcn import rounded_size

            # the best case (no non-zeros) first: skip counting when even that loses
            # (at the size rounded as the scheme plans round it: a mini-batch's new
            # node count then hits the plans' memo; every cost is about linear in n)
            at = rounded_size(n)
            if not plan_feature_conversion(at, m, 0, width, training=training, uses=1).convert:
                self.last_conversion = plan_feature_conversion(at, m, int(limit * at / n), width, training=training, uses=1)
                self._dense_run += 1  # (a stream of such tensors counts as too dense: rechecked every DENSE_RECOUNT-th)
                return None
        ptr = None if dense_sample_rules_out(x, limit) else row_pointer(x)
        nnz = None if ptr is None else int(ptr[-1])
        if nnz is None or nnz > limit:
            self._dense_run = self._dense_run + 1 if seen_once else 0
            return None
        if seen_once:
            self.last_conversion = plan_feature_conversion(n, m, nnz, width, training=training, uses=1)
            if not self.last_conversion.convert:
                self._dense_run += 1  # (not worth converting once: a stream of such tensors counts as too dense)
                return None
        self._dense_run = 0
        return dense_to_csr(x, ptr)


DENSE_STREAK = 8
"""A stream of new feature tensors found too dense this many times in a row is then
counted only every :data:`DENSE_RECOUNT` th tensor (:class:`FeatureCache`)."""

DENSE_RECOUNT = 32
"""See :data:`DENSE_STREAK`.

NOTE (issue 21): 8 until 2026-11-29 (both); each recount costs a full count (~50 us
inside a training loop on a mini-batch of small graphs), 6 us a layer and call on
average every 8th, 1.5 every 32nd; a stream that turns sparse is converted from the
next recount on either way (the dense path is exact)."""

_NUMBA_DTYPES = (torch.float32, torch.float64)


def _numba_runs(x: torch.Tensor) -> bool:
    """Whether the parallel Numba conversion kernels run for ``x``: CPU float32/float64,
    in a process where the ``numba`` backend can run (not a child forked after
    Numba's OpenMP threads ran: :mod:`corgnn.sparse.backends.numba_threads`)."""
    if x.device.type != "cpu" or x.dtype not in _NUMBA_DTYPES:
        return False
    from ..sparse.backends.numba_threads import launch, unusable_reason
    from ..sparse.backends.numba_warmup import cold_reason

    if unusable_reason() is not None or cold_reason() is not None:
        return False
    launch()  # (the kernels below are parallel: launched keeping torch's thread count)
    return True


@functools.cache
def _tiers(kernel: str) -> dict:
    """A conversion kernel's serial first tiers per dtype
    (:func:`corgnn.sparse.backends.numba_warmup.tiers`), made at its first use."""
    from ..sparse.backends.numba_warmup import tiers

    return tiers(kernel)


SAMPLE_ROWS = 64
"""Rows of ``x`` :func:`dense_sample_rules_out` counts before a full count."""


def dense_sample_rules_out(x: torch.Tensor, limit: int) -> bool:
    """Whether :data:`SAMPLE_ROWS` evenly spaced rows of ``x (n, m)`` already hold
    more than twice the non-zeros (plus 16) that ``limit`` (for all of ``x``) allows
    them: then ``x`` is not sparse and the full count is skipped. Activations without
    autograd (inference, ``torch.no_grad``) reach every layer as new constant tensors
    about half non-zero; one count over 64 rows (~3 us) instead of a pass over ``x``
    per layer and call. A sparse ``x`` (Planetoid's ~1 % bag-of-words against the 12 %
    limit) is never ruled out by the margin; a wrong "not ruled out" only costs the
    full count."""
    n = x.size(0)
    if n <= 2 * SAMPLE_ROWS:
        return False
    rows = x[:: n // SAMPLE_ROWS]
    allowed = 2 * limit * rows.size(0) / n + 16
    return int(torch.count_nonzero(rows)) > allowed


def row_pointer(x: torch.Tensor) -> torch.Tensor:
    """CSR row pointer ``(n+1,)`` int64 of dense ``x (n, m)``'s non-zeros (one read:
    the parallel Numba row count on CPU for float32/float64, ``count_nonzero`` else)."""
    n = x.size(0)
    ptr = torch.zeros(n + 1, dtype=torch.long)
    if _numba_runs(x):
        from ..sparse.backends import numba_kernels as k
        from ..sparse.backends.numba_threads import launch_lock

        with launch_lock():
            _tiers("dense_row_counts")[x.dtype].run(k.dense_row_counts, k.dense_row_counts_serial, (x.detach().contiguous().numpy(), ptr[1:].numpy()), n)
    else:
        ptr = ptr.to(x.device)
        ptr[1:] = torch.count_nonzero(x.detach(), dim=1)
    return torch.cumsum(ptr, 0, out=ptr)


def dense_to_csr(x: torch.Tensor, ptr: torch.Tensor | None = None) -> CSR:
    """CSR ``(n, m)`` of dense ``x (n, m)``'s non-zeros (values copied, in row-major
    order; ``x`` untouched, no gradient link).

    Two reads of ``x`` on CPU (float32/float64): the row counts
    (:func:`row_pointer`, skipped when ``ptr``, its result, is given) and one
    parallel Numba pass writing the column indices and values; elsewhere
    ``x.nonzero()`` (already row-major) and a gather. Matches ``x.to_sparse_csr()``.
    """
    x = x.detach()
    n, m = x.shape
    if _numba_runs(x):
        from ..sparse.backends import numba_kernels as k
        from ..sparse.backends.numba_threads import launch_lock

        ptr = row_pointer(x) if ptr is None else ptr
        nnz = int(ptr[-1])
        col = torch.empty(nnz, dtype=torch.long)
        val = torch.empty(nnz, dtype=x.dtype)
        with launch_lock():
            _tiers("dense_to_csr_fill")[x.dtype].run(k.dense_to_csr_fill, k.dense_to_csr_fill_serial, (x.contiguous().numpy(), ptr.numpy(), col.numpy(), val.numpy()), n)
        return CSR(ptr, col, val, (n, m), check=False)
    row, col = x.nonzero(as_tuple=True)
    csr = CSR(ptr_from_sorted(row, n), col, x[row, col], (n, m), check=False)
    csr._row = row
    return csr


class SparseView:
    """Stands in for sparse-only features in :meth:`GCNConv.plan` (dtype, no grad)."""

    requires_grad = False

    def __init__(self, dtype):
        self.dtype = dtype


def num_rows(x) -> int | None:
    """Rows of features ``x`` (a 2-D tensor or a corgnn sparse matrix), else None."""
    if isinstance(x, SparseFormat):
        return x.shape[0]
    return x.size(0) if isinstance(x, torch.Tensor) and x.dim() == 2 else None


def check_compiled_x(x, in_channels: int, dtype) -> None:
    """The checks of ``x`` that need no tensor data (shapes and dtypes are static or
    guarded under ``torch.compile``)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        what = str(x.layout) if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"under torch.compile, x must be a dense torch.Tensor, got {what}; call x.to_dense() or run eagerly")
    if x.dim() != 2 or x.size(1) != in_channels:
        raise ValueError(f"x must have shape (num_nodes, {in_channels}), got {tuple(x.shape)}")
    check_float_dtype("x", x.dtype)
    if x.dtype != dtype:
        raise TypeError(f"x is {x.dtype} but the layer's parameters are {dtype}; call .to({x.dtype}) on the module")


class UnsupportedOption(NotImplementedError, ValueError):
    """A PyG constructor option that corgnn's layer accepts in its signature (to keep
    PyG's positional order) but does not implement; both a ``NotImplementedError``
    and a ``ValueError``."""


_MESSAGE_PASSING_NO_OPS = {
    "aggr": ("add", "sum"),
    "flow": ("source_to_target",),  # (GCNConv takes "target_to_source" too: check_flow)
    "node_dim": (-2, 0),  # the node axis of 2-D features either way
    "aggr_kwargs": (None, {}),
}
"""PyG ``MessagePassing`` options and the values that mean what corgnn computes;
``decomposed_layers`` (a memory/speed knob of PyG, same results) takes any int >= 1."""


def check_message_passing_kwargs(layer: str, kwargs: dict, fixed: tuple[str, ...] = ()) -> None:
    """Accept the ``**kwargs`` PyG's layer passes to ``MessagePassing`` where their
    values change nothing corgnn computes; raise :class:`UnsupportedOption` naming
    any other value and ``TypeError`` for a name PyG's layer would not take either
    (``fixed``: those PyG's layer sets itself, e.g. GATConv's ``node_dim``)."""
    for name, value in kwargs.items():
        if name in fixed:
            raise TypeError(f"{layer}.__init__() got multiple values for keyword argument {name!r} (fixed by the layer, as in PyG)")
        if name == "decomposed_layers":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{layer}: decomposed_layers must be an int >= 1, got {value!r}")
        elif name in _MESSAGE_PASSING_NO_OPS:
            if not any(type(value) is type(ok) and value == ok for ok in _MESSAGE_PASSING_NO_OPS[name]):
                ok = " or ".join(repr(v) for v in _MESSAGE_PASSING_NO_OPS[name])
                raise UnsupportedOption(f"{layer}: {name}={value!r} is not supported by corgnn (only {ok}); use torch_geometric.nn.{layer}")
        else:
            raise TypeError(f"{layer}.__init__() got an unexpected keyword argument {name!r}")


_FLOWS = ("source_to_target", "target_to_source")


def check_flow(layer: str, flow) -> None:
    """``flow`` must be one of PyG's two directions (as PyG's ``MessagePassing`` asserts)."""
    if not isinstance(flow, str) or flow not in _FLOWS:
        raise ValueError(f"{layer}: flow must be 'source_to_target' or 'target_to_source', got {flow!r}")


def sparse_values_weigh(graph: Graph) -> bool:
    """Whether ``graph`` came as a ``torch.sparse`` adjacency, whose stored values PyG's
    aggregation layers (``SAGEConv``, ``GINConv``) multiply their messages by (their
    ``message_and_aggregate`` runs ``spmm(adj_t, x)``; a ``SparseTensor``'s values are
    dropped there, an ``edge_index`` has none)."""
    return graph.sparse_input is not None and graph.sparse_input[0] == "torch" and graph.edge_weight is not None


def check_value_grad(graph: Graph) -> None:
    """Refuse (before any work) a sparse adjacency whose values require a gradient
    that cannot reach them: never drop it silently."""
    if getattr(graph, "value_grad_lost", False):
        raise ValueError(
            "the torch.sparse COO adjacency's values require grad but the tensor is not coalesced: the gradient "
            "cannot reach its values in stored order; call .coalesce() on it (differentiable), or pass "
            "edge_index and edge_weight"
        )


# ------------------------------------------------- conversions from PyG (optimize)

_MODULE_HOOKS = (
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook",
)
"""``torch.nn.Module`` hook state carried from a PyG layer to its replacement (the
forward and backward hooks a user registered on the layer itself)."""

_TORCH_MODULE_ATTRS = frozenset(vars(nn.Module()))


def message_passing_unsupported(layer, flows: tuple[str, ...] = ("source_to_target",), aggrs: tuple[str, ...] = ("add", "sum")) -> list[str]:
    """Options of PyG's ``MessagePassing`` base that the corgnn layer does not honour:
    a ``flow`` not in ``flows`` or another aggregation, hooks on its
    ``propagate``/``message``/... steps (corgnn has no such steps to run them on)."""
    unsupported = []
    if getattr(layer, "flow", "source_to_target") not in flows:
        unsupported.append(f"flow={layer.flow!r}")
    if not isinstance(getattr(layer, "aggr", "add"), str) or getattr(layer, "aggr", "add") not in aggrs:
        unsupported.append(f"aggr={layer.aggr!r}")
    hooks = sorted(k for k, v in vars(layer).items() if k.endswith("_hooks") and k not in _TORCH_MODULE_ATTRS and v)
    if hooks:
        unsupported.append(f"MessagePassing hooks ({', '.join(hooks)})")
    return unsupported


def is_lazy(layer: nn.Module) -> bool:
    """Whether ``layer`` still has lazy parameters (PyG ``in_channels=-1`` before its
    first forward): their shapes, hence the replacement's, are not known yet."""
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in layer.parameters())


def not_parameters(params: dict) -> list[str]:
    """Names in ``params`` whose value is neither None nor a plain ``nn.Parameter``
    (e.g. a ``torch.nn.utils.parametrize`` property): those cannot be shared."""
    return [f"{name} is not a Parameter" for name, p in params.items() if p is not None and not isinstance(p, nn.Parameter)]


def adopt_parameters(make, layer: nn.Module, params: dict) -> nn.Module:
    """``make()`` holding ``layer``'s own Parameter objects (``new.<name> = params[name]``,
    None entries skipped), in ``layer``'s training mode, with the forward and backward
    hooks registered on ``layer`` (the very same hook dicts, so their handles still
    remove them).

    ``make`` runs on the meta device: its own parameters are never allocated or
    initialised, so converting draws nothing from torch's random generator (a seeded
    run makes the same draws with and without ``optimize``).
    """
    with torch.device("meta"):
        new = make()
    for name, p in params.items():
        if p is not None:
            owner, _, attr = name.rpartition(".")
            setattr(new.get_submodule(owner), attr, p)
    left = [name for name, t in [*new.named_parameters(), *new.named_buffers()] if t.is_meta]
    if left:  # pragma: no cover - a converter missed a parameter
        raise RuntimeError(f"corgnn.optimize: {type(layer).__name__} -> {type(new).__name__} left {left} unset")
    for attr in _MODULE_HOOKS:
        if hasattr(layer, attr):
            setattr(new, attr, getattr(layer, attr))
    new.train(layer.training)
    return new


def parameter(module: nn.Module, name: str):
    """``getattr(module, name)`` for one of its parameters, read from its parameter
    dict (``Module.__getattr__`` costs ~1 us a read, and the layers read several
    per call: per-call overhead that counts on small mini-batch graphs); anything
    else (a buffer, a ``torch.nn.utils.parametrize`` property) through ``getattr``."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)


def any_parameter_requires_grad(module: nn.Module) -> bool:
    """Whether a parameter of ``module`` or of a module below it requires a gradient,
    as ``any(p.requires_grad for p in module.parameters())`` answers, read from the
    parameter and module dicts directly (``parameters()`` walks ``named_modules``
    through generators: ~3 us a call on a GIN layer with a 2-layer MLP, called once
    or twice per layer and call; this walk ~0.5 us). A shared module is visited once
    per path to it (the answer is the same)."""
    for p in module._parameters.values():
        if p is not None and p.requires_grad:
            return True
    for m in module._modules.values():
        if m is not None and any_parameter_requires_grad(m):
            return True
    return False


def submodule(module: nn.Module, name: str) -> nn.Module:
    """``getattr(module, name)`` for a child module, read from its module dict (as
    :func:`parameter`)."""
    mods = module._modules
    return mods[name] if name in mods else getattr(module, name)


def weight_and_bias(lin: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(lin.weight, lin.bias)`` of a Linear, read as :func:`parameter` reads them
    (``bias`` None when the Linear has none)."""
    return parameter(lin, "weight"), parameter(lin, "bias") if "bias" in lin._parameters else getattr(lin, "bias", None)


def linear_params(layer, names: tuple[str, ...]) -> dict:
    """``{"<lin>.weight", "<lin>.bias"}`` of ``layer``'s ``Linear`` submodules ``names``
    (absent ones skipped): the parameters a converted layer adopts."""
    return {f"{n}.{p}": getattr(getattr(layer, n), p, None) for n in names if getattr(layer, n, None) is not None for p in ("weight", "bias")}


class CorgnnConv(MessagePassing):
    """Base class of corgnn's layers: what every layer does with its inputs before
    its own math.

    - graph conversion once per ``edge_index`` (shared by every layer that sees the
      same tensor: :func:`corgnn.graph.shared_graph`), feature validation once per
      tensor version, the sparse-feature hand-off (bag-of-words features used as a
      CSR; ``torch.sparse`` features), dtype and device checks (:meth:`_inputs`);
    - PyG's explain masks: a ``torch_geometric.nn.MessagePassing`` module, so PyG's
      ``Explainer`` (``set_masks``) sets ``explain``, ``_edge_mask`` and
      ``_loop_mask`` on it; :meth:`explain_mask` gives the per-edge multiplier PyG's
      ``explain_message`` would apply, which layers fold into their matrix values.
      A layer that cannot apply it keeps ``SUPPORTS_EXPLAIN = False``: setting its
      ``explain`` raises :class:`UnsupportedOption` (a mask is never ignored).

    A subclass sets ``self._graphs`` (:class:`corgnn.graph.GraphCache`),
    ``self._features`` (:class:`FeatureCheck`), ``self.in_channels`` and
    ``self.lin.weight`` (or overrides :meth:`_dtype_param`), and implements
    ``forward``. Its ``repr`` is ``torch.nn.Module``'s (with ``extra_repr``).
    """

    SUPPORTS_EXPLAIN = False
    """Whether the layer applies PyG's explain edge masks (:meth:`explain_mask`)."""

    PYG_NAME: str | None = None
    """The ``torch_geometric.nn`` class this layer replaces in :func:`corgnn.optimize`
    (the registry line: setting it registers the class, :meth:`conversions`)."""

    PYG_LINEARS: tuple[str, ...] = ()
    """The PyG layer's ``Linear`` submodules whose parameters the replacement adopts."""

    PYG_BIASLESS: tuple[str, ...] = ()
    """Those of :attr:`PYG_LINEARS` PyG builds without a bias (one there is unsupported)."""

    PYG_AGGRS: tuple[str, ...] = ("add", "sum")
    """The PyG aggregations this layer runs (another is left to PyG)."""

    _registry: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("PYG_NAME"):
            CorgnnConv._registry[cls.PYG_NAME] = cls

    @staticmethod
    def conversions() -> dict:
        """``{PyG class name: corgnn layer class}`` of every registered layer."""
        return dict(CorgnnConv._registry)

    @classmethod
    def pyg_params(cls, layer) -> dict:
        """``{dotted name: Parameter or None}`` of PyG ``layer`` the replacement adopts."""
        return linear_params(layer, cls.PYG_LINEARS)

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        """Options of PyG ``layer`` this class does not support (empty: convertible):
        :func:`message_passing_unsupported` (other aggregations included), bipartite
        ``in_channels``, a bias PyG never builds, a non-Parameter weight."""
        unsupported = message_passing_unsupported(layer, aggrs=cls.PYG_AGGRS)
        if isinstance(getattr(layer, "in_channels", 0), (tuple, list)):
            unsupported.append(f"bipartite in_channels={tuple(layer.in_channels)}")
        if getattr(layer, "_cached_x", None) is not None:
            unsupported.append("cached=True with S^K X already computed")
        unsupported += [f"{n}.bias" for n in cls.PYG_BIASLESS if getattr(getattr(layer, n, None), "bias", None) is not None]
        return unsupported + not_parameters(linear_params(layer, cls.PYG_LINEARS))

    @classmethod
    def from_pyg(cls, layer) -> nn.Module:
        """This class's replacement for PyG ``layer`` (materialised, supported),
        holding its very Parameter objects (:func:`adopt_parameters`)."""
        return adopt_parameters(lambda: cls(**cls.pyg_arguments(layer)), layer, cls.pyg_params(layer))

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        """Constructor arguments reproducing PyG ``layer`` (for :meth:`from_pyg`)."""
        raise NotImplementedError(f"{cls.__name__} converts no PyG layer")  # pragma: no cover

    __repr__ = nn.Module.__repr__

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        """A no-op: PyG's ``MessagePassing.__init__`` renders a jinja specialisation of
        ``propagate`` per class (about 150 ms on a class's first construction, 2
        cores); corgnn's layers never run ``propagate``, so they skip it."""

    def __init__(self):
        super().__init__(aggr="add")
        # NOTE: the layers aggregate through their sparse matrices, never through
        # MessagePassing's aggregation module: it is dropped, so the module tree,
        # repr and state_dict are the layer's own (as before it was a MessagePassing).
        del self.aggr_module

    @property
    def explain(self) -> bool | None:
        """PyG's explain switch (``set_masks`` sets it True). Setting it True on a layer
        that cannot apply edge masks raises :class:`UnsupportedOption` at once, so an
        ``Explainer`` never runs with a mask silently ignored."""
        return self._explain

    @explain.setter
    def explain(self, value: bool | None) -> None:
        if value is True and not self.SUPPORTS_EXPLAIN:
            raise UnsupportedOption(
                f"corgnn.nn.{type(self).__name__} does not apply explain edge masks yet; explain the model with PyG's "
                f"{type(self).__name__} (or leave this layer unconverted)"
            )
        MessagePassing.explain.fset(self, value)

    def explain_mask(self, edge_index: torch.Tensor, num_nodes: int, loops: bool) -> torch.Tensor | None:
        """The multiplier ``(q,)`` (or ``(q' + num_nodes,)`` with ``loops``) PyG's explain
        machinery applies to this layer's messages, or None when not explaining.

        As PyG's ``MessagePassing.explain_message``: ``sigmoid(_edge_mask)`` (when
        ``_apply_sigmoid``) per edge of ``edge_index (2, q)``; with ``loops`` (the layer
        replaces existing self-loops by one per node) the edges without self-loops
        (``_loop_mask``) and then 1 for each node's loop.

        Raises:
            ValueError: no mask set, or one whose length is not ``q``.
        """
        if self._explain is not True:
            return None
        mask = self._edge_mask
        if mask is None:
            raise ValueError("explain is on but no edge mask was set (torch_geometric.explain.algorithm.utils.set_masks)")
        if self._apply_sigmoid:
            mask = mask.sigmoid()
        q = edge_index.size(1)
        if mask.dim() != 1 or mask.numel() != q:
            raise ValueError(f"the explain edge mask has shape {tuple(mask.shape)}, but edge_index has {q} edges")
        if loops:
            keep = self._loop_mask if self._loop_mask is not None else edge_index[0] != edge_index[1]
            mask = torch.cat([mask[keep], mask.new_ones(num_nodes)])
        return mask

    def _backward_will_run(self, x_grad: bool) -> bool:
        """Whether this call records a backward pass: autograd on and ``x`` or a
        parameter requires a gradient (the plans' ``training`` flag)."""
        return torch.is_grad_enabled() and (x_grad or any_parameter_requires_grad(self))

    def sparse_features(self, x: torch.Tensor, num_nodes: int | None = None) -> "CSR | None":
        """Validate ``x`` (once per tensor version) and return its cached CSR if it is
        constant (no grad) and at most :func:`sparse_feature_density` (of this layer's
        width) non-zero."""
        weight = self._dtype_param()
        return self._features(x, x.size(0) if num_nodes is None else num_nodes, self.in_channels, None if weight is None else weight.size(0))

    def sparse_features_allowed(self) -> bool:
        """Whether this layer can take sparse-only input features."""
        return True

    def _torch_sparse_features(self, x: torch.Tensor):
        """A ``torch.sparse`` feature matrix as the layer uses it: the corgnn CSR of its
        entries (the sparse-feature path), or ``x.to_dense()`` when ``x`` needs a
        gradient (the sparse path passes none to ``x``) or the layer cannot take
        sparse-only features (a forced GCN scheme other than transform-first+fused)."""
        if x.requires_grad or not self.sparse_features_allowed():
            return x.to_dense()
        try:
            return from_torch_sparse(x)
        except ValueError as e:
            raise ValueError(f"sparse x: {e}") from None

    def _inputs(self, x, edge_index, edge_weight=None):
        """``(graph, dense x or None, sparse x or None, dtype)``, validated before any work.

        ``x`` is a dense ``(n, in_channels)`` float tensor, a corgnn sparse matrix or a
        ``torch.sparse`` matrix (:meth:`_torch_sparse_features`).
        """
        weight = self._dtype_param()  # (its rows: the columns of X Θ, the products that read x)
        if isinstance(x, torch.Tensor) and x.layout == torch.strided and x.dim() == 2 and weight is not None and (
            x.grad_fn is not None or (not x.requires_grad and self._features.skips(x, weight.size(0)))
        ):
            # NOTE (issue 21): an activation (every layer but the first): of a training
            # step (a grad_fn), or of an evaluation in a stream known too dense to
            # convert (FeatureCache.skips), checked in one condition; the general path
            # below only for an error's message (~5 us less a layer and call on a
            # mini-batch of small graphs, where each layer's few microseconds of Python
            # are what corgnn adds to PyG's time; ~5x that in a training loop).
            # (weight.size(1): the width of the product x W^T, every layer's in_channels;
            # GINConv's in_channels is a property that finds nn's first Linear again)
            graph = self._graphs(edge_index, edge_weight, x.size(0))
            if x.size(0) == graph.num_nodes and x.size(1) == weight.size(1) and x.dtype is weight.dtype and (
                x.dtype is torch.float32 or x.dtype is torch.float64
            ) and x.device == graph.device:
                return graph, x, None, x.dtype
        if isinstance(x, torch.Tensor) and x.layout != torch.strided:
            x = self._torch_sparse_features(x)
        if isinstance(x, torch.Tensor) and x.grad_fn is not None:
            # NOTE: an activation (the previous layer's output): a new tensor every call
            # that needs a gradient, so it is never converted to a sparse matrix nor
            # scanned for NaN (check_features), and caching its checks cannot pay: the
            # same checks without FeatureCheck's per-tensor bookkeeping (~5 us of a
            # ~15 us input path per layer and call on a mini-batch).
            graph = self._graphs(edge_index, edge_weight, x.size(0) if x.dim() == 2 else None)
            check_features("x", x, graph.num_nodes, self.in_channels)
            dense, xs, dtype, device = x, None, x.dtype, x.device
        elif isinstance(x, SparseFormat):
            graph = self._graphs(edge_index, edge_weight, x.shape[0])
            if x.shape != (graph.num_nodes, self.in_channels) or x.val is None or x.val.dim() != 1:
                raise ValueError(f"sparse x must be ({graph.num_nodes}, {self.in_channels}) with values, got {x!r}")
            check_float_dtype("x", x.val.dtype)
            check_finite("x", x.val)
            xs, dense, dtype, device = x, None, x.val.dtype, x.device
        else:
            graph = self._graphs(edge_index, edge_weight, x.size(0) if isinstance(x, torch.Tensor) and x.dim() == 2 else None)
            width = weight.size(0) if weight is not None else self.in_channels
            xs = self._features(x, graph.num_nodes, self.in_channels, width, self._backward_will_run(getattr(x, "requires_grad", False)))
            dense, dtype, device = x, x.dtype, x.device
        if device != graph.device:
            raise ValueError(f"x is on {device} but edge_index is on {graph.device}")
        if weight is not None and weight.dtype != dtype:
            raise TypeError(f"x is {dtype} but the layer's parameters are {weight.dtype}; call .to({dtype}) on the module")
        return graph, dense, xs, dtype

    def _dtype_param(self) -> torch.Tensor | None:
        """The parameter whose dtype the input features must have (None: any)."""
        return parameter(submodule(self, "lin"), "weight")


