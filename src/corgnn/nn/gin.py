"""GIN: ``nn((1 + eps) x_i + sum_{j -> i} x_j)`` with the first Linear of ``nn`` reordered.

With ``nn`` starting with a Linear ``W x + b`` (a ``torch.nn.Sequential`` whose first
module is one, or PyG's ``MLP``), ``W((1 + eps) X + A X) + b = (A + (1 + eps) I) X W^T + b``
is the GCN product for the matrix ``A + (1 + eps) I`` (Xu et al. 2019; paper
§"Analysis of the GCN Computational Graph"): it runs
:class:`~corgnn.functional.gcn.GCNFunction` under the scheme
:func:`~corgnn.cost.gcn.plan_gcn` picks, so the Linear moves before the aggregation
(transform-first: the SpMM on ``k`` columns) when that is cheaper. A trainable
``eps`` enters as the diagonal values of that matrix; its gradient is the sum of
the diagonal of the SDDMM ``dL/dA'`` the Function already computes. The rest of
``nn`` then runs as is.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear as PygLinear
from torch_geometric.nn.inits import reset

from .._cache import Uncopied
from ..cost.gcn import GCN_SCHEMES, GCNPlan, parse_scheme, plan_gcn
from ..functional.gcn import GCNFunction, composed_first, entry_values, row_tails, runs_composed
from ..graph import Graph, GraphCache
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import CorgnnConv, FeatureCache, SparseView, UnsupportedOption, check_message_passing_kwargs, parameter, sparse_values_weigh, submodule, weight_and_bias

__all__ = ["GINConv"]

_LINEARS = (nn.Linear, PygLinear)
_IDENTITY = nn.Identity()


def first_linear(module: nn.Module) -> tuple[nn.Module | None, str | None] | None:
    """``(container, key)`` of the Linear that ``module`` applies first to its input:
    the first module of a ``torch.nn.Sequential``, ``lins[0]`` of PyG's ``MLP``,
    ``(None, None)`` when ``module`` is a Linear itself; None for any other module
    (its first operation is not known)."""
    from torch_geometric.nn.models import MLP

    if isinstance(module, _LINEARS):
        return None, None
    if type(module) is nn.Sequential and len(module) and isinstance(module[0], _LINEARS):
        return module, next(iter(module._modules))
    if type(module) is MLP and isinstance(module.lins[0], _LINEARS):
        return module.lins, "0"
    return None


def _linear_at(module: nn.Module, slot) -> nn.Module:
    return module if slot[0] is None else slot[0]._modules[slot[1]]


def _run_without(net: nn.Module, container: nn.Module, key: str, h: torch.Tensor) -> torch.Tensor:
    """``net(h)`` with ``container``'s module ``key`` replaced by an identity for the
    duration (its output ``h`` is computed already); restored on exit, also on an
    exception. (A plain try/finally: a ``contextmanager`` costs ~2 us per call.)

    A plain ``torch.nn.Sequential`` ``net`` whose first module is that one and that
    has no hooks of its own runs its other modules in turn, as its ``forward``
    does, without the swap and the identity's call (~6 us a layer and call on a
    mini-batch of small graphs)."""
    if container is net and type(net) is nn.Sequential and next(iter(net._modules)) == key and not _has_hooks(net):
        for i, module in enumerate(net._modules.values()):
            if i:
                h = module(h)
        return h
    kept = container._modules[key]
    container._modules[key] = _IDENTITY
    try:
        return net(h)
    finally:
        container._modules[key] = kept


def _has_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` runs more than its ``forward``: hooks (its own or
    torch's global module hooks), or a compiled forward (``module.compile()``)."""
    # (torch's own attribute names: one missing in another torch version counts as a
    # hook, so the call then goes through the module's __call__, never skipping one;
    # read from the instance dict, where Module.__init__ sets them, without a
    # generator: ~0.5 us instead of ~1.4 per layer and call)
    if getattr(module, "_compiled_call_impl", True):  # (a class attribute until module.compile())
        return True
    own = module.__dict__
    for name in _OWN_HOOKS:
        if own.get(name, True):
            return True
    for name in _GLOBAL_HOOKS:
        if getattr(_TORCH_MODULE, name, True):
            return True
    return False


_OWN_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
"""A module's own hook registries (``torch.nn.Module`` sets them in its ``__init__``)."""
_TORCH_MODULE = nn.modules.module


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks")
"""torch's process-wide module hook registries (``torch.nn.modules.module``)."""


class _DiagonalMask(Uncopied):
    """1 at the diagonal entries of a matrix, 0 elsewhere ``(nnz,)`` in its entry
    order, kept for the last matrix seen (held weakly)."""

    def __init__(self):
        self._ref, self._mask = None, None

    def __call__(self, A) -> torch.Tensor:
        if self._ref is None or self._ref() is not A:
            coo = A.to_coo()
            self._ref, self._mask = weakref.ref(A), (coo.row == coo.col).to(A.val.dtype)
        return self._mask


class _ConstantDiagonal(Uncopied):
    """``1 + eps`` as a float for an ``eps`` that takes no gradient, read once per
    ``eps`` state (the tensor, its in-place version and data address: one host read
    per optimizer change, none per call): a frozen ``eps`` makes GIN's matrix
    ``A + (1 + eps) I`` a constant of the graph, built once and shared by every layer
    with that value (:meth:`corgnn.Graph.aggr_adjacency`'s ``diagonal_value``).

    NOTE: the key is checked in every call of every GIN layer, so it is the three
    values a value read depends on, not a :class:`~corgnn._cache.TensorKey` (~3 us)."""

    def __init__(self):
        self._ref, self._state, self._value = None, None, None

    def __call__(self, eps: torch.Tensor) -> float:
        state = (None if eps.is_inference() else eps._version, eps.data_ptr())
        if self._ref is None or self._ref() is not eps or self._state != state:
            self._value = 1.0 + float(eps.detach().reshape(()))
            self._ref, self._state = weakref.ref(eps), state
        return self._value


class GINConv(CorgnnConv):
    r"""Graph isomorphism operator ``x'_i = nn((1 + eps) x_i + sum_{j -> i} x_j)``
    (Xu et al. 2019) with ``nn``'s first Linear planned as a GCN product (module
    docstring).

    A drop-in for ``torch_geometric.nn.GINConv``: its signature, ``nn`` and ``eps``
    (a Parameter with ``train_eps``, else a buffer), outputs and gradients (also
    w.r.t. ``eps``). Without a leading Linear in ``nn`` the aggregation runs first
    as one SpMM with ``A + (1 + eps) I``, then ``nn``. Edge weights of a graph are
    ignored, as PyG's GINConv ignores them. Under propagate-first+split+cache where
    it composes (:func:`corgnn.functional.gcn.composes`: small products, calls without
    a backward, a mini-batch's edge list; the plan prefers it on a tie) the
    aggregation runs first and then ``nn`` as is. Otherwise, while the layer runs,
    ``nn``'s first Linear is swapped for an identity (its product is computed here),
    so hooks on that Linear module do not run and ``nn`` must not run concurrently
    elsewhere.

    Args (PyG's): ``nn`` a module mapping ``(n, in)`` to ``(n, out)``; ``eps``
    initial value (default 0); ``train_eps`` (default False); ``**kwargs`` as
    :class:`corgnn.nn.GCNConv` (``aggr="add"/"sum"`` only).
    Keyword-only: ``scheme`` (``"auto"`` or a :data:`corgnn.cost.GCN_SCHEMES` name),
    ``format`` of the matrix (``"csr"`` default).

    Shapes: ``x (n, in)`` float (or a corgnn / torch.sparse matrix with a leading
    Linear), ``edge_index (2, q)`` / Graph / sparse ``adj_t`` -> ``nn``'s output.

    Raises (before any work): TypeError / ValueError naming the argument.
    """

    PYG_NAME = "GINConv"
    SUPPORTS_EXPLAIN = True

    @classmethod
    def pyg_params(cls, layer) -> dict:
        return {"nn": layer.nn, "eps": layer.eps}  # (its very nn module, and eps)

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        return dict(nn=torch.nn.Identity(), eps=layer.initial_eps, train_eps=isinstance(layer.eps, torch.nn.Parameter))

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False, *, scheme: str = "auto", format: str = "csr", **kwargs):
        super().__init__()
        check_message_passing_kwargs(type(self).__name__, kwargs)
        if scheme != "auto":
            parse_scheme(scheme)
        check_format_name(format, allow_auto=False)
        self.nn = nn
        self.initial_eps = float(eps)
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.scheme, self.format = scheme, format
        self._graphs = GraphCache()
        self._features = FeatureCache()
        self._diag = _DiagonalMask()
        self._constant_diagonal = _ConstantDiagonal()
        self.last_plan: GCNPlan | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def _first(self) -> tuple:
        """``(nn, slot, linear)``: ``nn``, :func:`first_linear` of it and that Linear
        (``slot`` and ``linear`` None without one), memoised on ``nn``, its first
        child, that child's first child and the Linear's place (one lookup per call
        instead of one per use; a replaced module is seen)."""
        net = submodule(self, "nn")  # (not self.nn, Module.__getattr__: this runs several times per call)
        first = next(iter(net._modules.values()), None)
        inner = None if first is None else next(iter(first._modules.values()), None)
        hit = self.__dict__.get("_first_memo")
        if hit is not None and hit[0] is net and hit[1] is first and hit[2] is inner:
            slot, lin = hit[3], hit[4]
            if slot is None or slot[0] is None or slot[0]._modules.get(slot[1]) is lin:
                return net, slot, lin
        slot = first_linear(net)
        lin = None if slot is None else _linear_at(net, slot)
        self.__dict__["_first_memo"] = (net, first, inner, slot, lin)
        return net, slot, lin

    @property
    def in_channels(self) -> int | None:
        w = self._dtype_param()
        return None if w is None else w.size(1)

    def _dtype_param(self) -> torch.Tensor | None:
        lin = self._first()[2]
        return None if lin is None else parameter(lin, "weight")

    def sparse_features_allowed(self) -> bool:
        return self._first()[1] is not None

    def adjacency(self, graph: Graph, dtype: torch.dtype, diagonal_value: float = 0.0, columns: int | None = None):
        """The pattern of ``A + I`` with ``A``'s values plus ``diagonal_value`` on the
        diagonal (``A + c I``; the diagonal of a node without a self-loop is ``c``),
        cached on ``graph``; ``A`` holds the stored values of a ``torch.sparse``
        adjacency (as PyG's ``spmm(adj_t, x)``), else ones. With ``columns`` (the
        product's width) a graph not built yet may hand out its edge list instead
        (:meth:`corgnn.Graph.aggr_adjacency`)."""
        return graph.aggr_adjacency(
            "sum", dtype=dtype, weighted=sparse_values_weigh(graph), diagonal=True, format=self.format, diagonal_value=diagonal_value,
            columns=columns,
        )

    def _constant_eps(self, mask: torch.Tensor | None) -> float | None:
        """``1 + eps`` (a float) when GIN's matrix is a constant of the graph in this
        call (no explain mask, no gradient for ``eps``), else None."""
        eps = self._eps()
        if mask is not None or (eps.requires_grad and torch.is_grad_enabled()):
            return None
        return self._constant_diagonal(eps)

    def _eps(self) -> torch.Tensor:
        """``self.eps`` (a Parameter or a buffer) without ``Module.__getattr__``."""
        eps = self._parameters.get("eps")
        return self._buffers["eps"] if eps is None else eps

    def _values(self, A, graph: Graph, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Values of ``A + (1 + eps) I`` in ``A``'s entry order (differentiable w.r.t.
        ``eps``); with PyG's explain edge ``mask`` each edge's message is scaled by it
        (the ``(1 + eps) x_i`` term is not a message: unscaled, as PyG's)."""
        val = A.val
        if mask is not None:
            w = mask.to(val.dtype)
            if sparse_values_weigh(graph):
                w = w * graph.edge_weight.detach().to(val.dtype)
            val = entry_values(A, graph.edge_index, w)
        if self.format == "csr":
            diag = graph.diagonal_mask("sum", dtype=val.dtype, weighted=sparse_values_weigh(graph), matrix=A)
        else:
            diag = self._diag(A)  # (another format's entry order)
        return val + (1 + self.eps.to(val.dtype)) * diag

    def plan(self, graph: Graph, x, x_nnz: int | None = None) -> GCNPlan | None:
        """The scheme of ``(A + (1 + eps) I) x W^T + b`` (``W``, ``b``: ``nn``'s first
        Linear) for ``x`` on ``graph`` now; None without a leading Linear."""
        lin = self._first()[2]
        if lin is None:
            return None
        W = parameter(lin, "weight")
        c = self._constant_eps(self.explain_mask(graph.edge_index, graph.num_nodes, loops=False))
        # (the matrix this call multiplies by: A + cI for a frozen eps, else A's pattern
        # with its diagonal; the same entries either way, but only that one is built)
        return self._plan(self.adjacency(graph, x.dtype, 0.0 if c is None else c), W, x, x_nnz)

    def _plan(self, A, W: torch.Tensor, x, x_nnz: int | None) -> GCNPlan:
        """:meth:`plan` for the matrix ``A`` this call multiplies by and the first
        Linear's ``W`` (the forward has both at hand)."""
        dense = isinstance(x, torch.Tensor)
        x_grad = dense and x.requires_grad
        training = self._backward_will_run(x_grad)
        return plan_gcn(
            A.shape[0], A.nnz, W.size(1), W.size(0), input_grad=training and x_grad, training=training, scheme=self.scheme,
            candidates=composed_first(GCN_SCHEMES, A.shape[0], W.size(1), W.size(0), row_tails(training, A)) if dense else GCN_SCHEMES[:1],
            x_nnz=x_nnz, approximate=True,
        )

    def forward(self, x, edge_index, size=None) -> torch.Tensor:
        """``x (n, in)``, ``edge_index (2, q)`` / Graph / sparse ``adj_t`` -> ``nn``'s output ``(n, out)``."""
        if size is not None:
            raise UnsupportedOption(f"GINConv: size={size!r} (bipartite message passing) is not supported by corgnn")
        graph, dense, xs, dtype = self._inputs(x, edge_index)
        mask = self.explain_mask(graph.edge_index, graph.num_nodes, loops=False)
        if graph.sparse_input is not None and sparse_values_weigh(graph) and graph.edge_weight.requires_grad and torch.is_grad_enabled():
            raise UnsupportedOption(
                "GINConv: the values of the torch.sparse adjacency require a gradient, which corgnn's GINConv does not "
                "propagate to them; use torch_geometric.nn.GINConv, or detach the adjacency's values"
            )
        c = self._constant_eps(mask)
        # (the product's width, for the graph's setup plan; an explain mask's values
        # follow the built matrix's entries: no edge list then)
        columns = None if mask is not None else dense.size(1) if dense is not None else self.in_channels
        if c is not None:  # A + (1 + eps) I: a constant of the graph, its own values
            A, values = self.adjacency(graph, dtype, c, columns), None
        else:
            A = self.adjacency(graph, dtype, columns=columns)
            values = self._values(A, graph, mask)
        net, slot, lin = self._first()
        state = self.__dict__  # (last_plan: not a Parameter or module, so no Module.__setattr__, ~1 us)
        if lin is None:
            state["last_plan"] = None
            return net(spmm(A, dense, values=values))
        W, b = weight_and_bias(lin)
        plan = self._plan(A, W, dense if dense is not None else SparseView(dtype), None if xs is None else xs.nnz)
        state["last_plan"] = plan
        if runs_composed(plan.scheme, dense, W, xs, row_tails(plan.training, A)):  # (A'X, then nn itself, first Linear included)
            return net(spmm(A, dense, values=values))
        h = GCNFunction.apply(dense, W, b, A, plan.scheme, xs, values)
        if slot[0] is None:  # nn is the Linear
            return h
        return _run_without(net, *slot, h)

    def extra_repr(self) -> str:
        return f"scheme={self.scheme!r}, format={self.format!r}"
