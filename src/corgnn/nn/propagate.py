"""SGC and APPNP: K steps of GCN propagation, ordered and cached across calls.

``SGConv``: ``X' = S^K X Θ^T + b`` with ``S = D^-1/2 (A + I) D^-1/2`` (Wu et al.
2019). :func:`corgnn.cost.propagate.plan_propagation` picks transform-first (the
``K`` SpMMs on ``k`` columns) or propagate-first (on ``m`` columns); with a
constant input (no gradient) propagate-first keeps ``S^K X`` across calls, keyed
by the input tensor's version and the graph, so after the first call no SpMM runs.

``APPNP``: ``H_0 = X``, ``H_{t+1} = (1 - alpha) S H_t + alpha X`` for ``K`` steps
(Gasteiger et al. 2019): propagation only, its output kept across calls the same way
when the input is constant (and no edge dropout runs).

Both differentiate through the public :func:`corgnn.sparse.spmm` (whose backward is
one transposed SpMM and keeps no tensor), so the only saved activation is the
Linear's input (SGC).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear

from ..cost.propagate import PROPAGATION_ORDERS, PropagationPlan, plan_propagation
from ..functional.gcn import gcn_values
from .._cache import Uncopied, tensor_state
from ..graph import Graph, GraphCache
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import CorgnnConv, FeatureCheck, UnsupportedOption, check_message_passing_kwargs, check_value_grad

__all__ = ["SGConv", "APPNP"]


class _Kept(Uncopied):
    """A result computed from one constant input on one propagation matrix, kept
    across calls (weak references: it never keeps the input or the graph alive).
    ``get(x, A, any_input=True)`` returns it whatever ``x`` is now (SGC's
    ``cached=True``, as PyG). Not pickled or deep-copied: a copy starts empty."""

    def __init__(self):
        self._key = None
        self._value = None

    @property
    def value(self) -> torch.Tensor | None:
        """The kept result (None: nothing kept). One kept under ``torch.inference_mode``
        is copied to a normal tensor once when read outside it (autograd refuses
        inference tensors)."""
        v = self._value
        if v is not None and v.is_inference() and not torch.is_inference_mode_enabled():
            v = self._value = v.clone()
        return v

    def get(self, x: torch.Tensor, A, any_input: bool = False) -> torch.Tensor | None:
        if self._key is None:
            return None
        ref_x, ref_a, state = self._key
        if any_input or (ref_x() is x and ref_a() is A and state == tensor_state(x)):
            return self.value
        return None

    def put(self, x: torch.Tensor, A, value: torch.Tensor) -> None:
        self._key = (weakref.ref(x), weakref.ref(A), tensor_state(x))
        self._value = value.detach()

    def clear(self) -> None:
        self._key = self._value = None


class _Propagation(CorgnnConv):
    """Input handling and the propagation matrix shared by SGConv and APPNP."""

    SUPPORTS_EXPLAIN = True  # (each hop's messages times the edge mask, loops times 1, as PyG's)

    def _setup(self, K: int, add_self_loops: bool, normalize: bool, scheme: str, format: str, kwargs: dict) -> None:
        name = type(self).__name__
        check_message_passing_kwargs(name, kwargs)
        if isinstance(K, bool) or not isinstance(K, int) or K < 0:
            raise ValueError(f"{name}: K must be an int >= 0, got {K!r}")
        check_format_name(format, allow_auto=False)
        self.K, self.add_self_loops, self.normalize = K, bool(add_self_loops), bool(normalize)
        self.scheme, self.format = scheme, format
        self._graphs = GraphCache()
        self._features = FeatureCheck()
        self._kept = _Kept()
        self.last_plan: PropagationPlan | None = None

    def sparse_features_allowed(self) -> bool:
        return False  # torch.sparse features are used dense

    def _prepare(self, x, edge_index, edge_weight):
        """``(graph, dense x, S, values or None)``, validated before any work."""
        graph, dense, xs, dtype = self._inputs(x, edge_index, edge_weight)
        if dense is None:
            dense = xs.to_dense()
        check_value_grad(graph)
        opts = dict(add_self_loops=self.add_self_loops and self.normalize, normalize=self.normalize)  # (PyG: no loops without gcn_norm)
        A = graph.gcn_adjacency(dtype=dtype, **opts, format=self.format)
        values = None
        ew = graph.edge_weight
        mask = self.explain_mask(graph.edge_index, graph.num_nodes, loops=opts["add_self_loops"])
        if mask is not None or (ew is not None and ew.requires_grad and torch.is_grad_enabled()):
            if mask is not None and graph.loops != "remaining":
                raise UnsupportedOption(f"{type(self).__name__}: explaining a call with a sparse adjacency is not supported; pass edge_index")
            values = gcn_values(A, graph.edge_index, ew, **opts, loops=graph.loops, edge_mask=mask)
        return graph, dense, A, values

    def reset_parameters(self) -> None:
        self._kept.clear()


class SGConv(_Propagation):
    r"""Simple graph convolution ``X' = S^K X Θ^T + b`` (Wu et al. 2019) with the order
    of the ``K`` SpMMs chosen per call and ``S^K X`` kept across calls for a constant
    input (module docstring).

    A drop-in for ``torch_geometric.nn.SGConv``: its signature, ``lin`` (weight and
    bias, init, ``state_dict`` keys), outputs and gradients (also w.r.t.
    ``edge_weight``, through PyG's ``gcn_norm``).

    Args (PyG's): ``in_channels`` m, ``out_channels`` k, ``K`` hops (default 1),
    ``cached`` (default False; True keeps the first call's ``S^K X`` for every later
    call, whatever the input, as PyG: transductive use), ``add_self_loops`` (default
    True), ``bias`` (default True), ``**kwargs`` as :class:`corgnn.nn.GCNConv`.

    Keyword-only: ``scheme`` ``"auto"`` (default), ``"transform-first"`` or
    ``"propagate-first"``; ``format`` of ``S`` (``"csr"`` default).

    Shapes: ``x (n, in_channels)`` float, ``edge_index (2, q)`` / Graph / sparse
    ``adj_t``, optional ``edge_weight (q,)`` -> ``(n, out_channels)``.

    Raises (before any work): TypeError / ValueError naming the argument.
    """

    PYG_NAME = "SGConv"
    PYG_LINEARS = ("lin",)

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        w = layer.lin.weight
        return dict(
            in_channels=w.size(1), out_channels=w.size(0), K=layer.K, cached=layer.cached, add_self_loops=layer.add_self_loops,
            bias=getattr(layer.lin, "bias", None) is not None,
        )

    def __init__(
        self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False, add_self_loops: bool = True, bias: bool = True,
        *, scheme: str = "auto", format: str = "csr", **kwargs,
    ):
        super().__init__()
        if in_channels <= 0 or out_channels <= 0:
            raise ValueError(f"in_channels and out_channels must be positive, got {in_channels}, {out_channels}")
        if scheme != "auto" and scheme not in PROPAGATION_ORDERS:
            raise ValueError(f"SGConv: scheme must be 'auto' or one of {list(PROPAGATION_ORDERS)}, got {scheme!r}")
        self._setup(K, add_self_loops, True, scheme, format, kwargs)
        self.in_channels, self.out_channels, self.cached = in_channels, out_channels, bool(cached)
        self.lin = Linear(in_channels, out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin.reset_parameters()

    def forward(self, x, edge_index, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        if self.cached and self._kept.value is not None:
            # NOTE: PyG's cached=True: the first call's S^K X serves every later call
            # whatever its inputs (PyG reads none of them then), so neither validation
            # nor a plan runs: the step is PyG's, the Linear on the kept features.
            return self.lin(self._kept.value)
        graph, x, A, values = self._prepare(x, edge_index, edge_weight)
        kept = self._kept.get(x, A, any_input=self.cached) if values is None or self.cached else None
        x_grad = x.requires_grad and kept is None
        training = self._backward_will_run(x_grad) or values is not None
        constant = kept is not None or self.cached or (values is None and not x.requires_grad)
        scheme = "propagate-first" if self.cached and kept is None and self.scheme == "auto" else self.scheme
        plan = plan_propagation(
            graph.num_nodes, A.nnz, self.in_channels, self.out_channels, self.K, training and x_grad,
            training=training, constant_input=constant, scheme=scheme, layer="SGConv",
        )
        self.last_plan = plan
        if plan.order == "transform-first":
            h = torch.mm(x, self.lin.weight.t())
            for _ in range(self.K):
                h = spmm(A, h, values=values)
            return h if self.lin.bias is None else h + self.lin.bias
        if kept is None:
            kept = x
            for _ in range(self.K):
                kept = spmm(A, kept, values=values)
            if constant:
                self._kept.put(x, A, kept)
        return self.lin(kept)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.K}, scheme={self.scheme!r}"


class APPNP(_Propagation):
    r"""Personalised-PageRank propagation ``H_{t+1} = (1 - alpha) S H_t + alpha X``,
    ``K`` steps from ``H_0 = X`` (Gasteiger et al. 2019), the output kept across
    calls for a constant input (module docstring).

    A drop-in for ``torch_geometric.nn.APPNP`` (no parameters; outputs and gradients
    as PyG's, also w.r.t. ``edge_weight``). Edge dropout (``dropout > 0`` in
    training) drops the stored entries of ``S`` (duplicate edges merged into one
    entry are dropped together), each step anew; PyG drops each edge.

    Args (PyG's): ``K`` steps, ``alpha`` teleport probability in [0, 1],
    ``dropout`` edge dropout in [0, 1) (default 0), ``cached`` (accepted: ``S`` is
    always cached per graph), ``add_self_loops``, ``normalize`` (default True),
    ``**kwargs`` as :class:`corgnn.nn.GCNConv`; keyword-only ``format`` of ``S``.

    Shapes: ``x (n, f)`` float, ``edge_index (2, q)`` / Graph / sparse ``adj_t``,
    optional ``edge_weight (q,)`` -> ``(n, f)``.

    Raises (before any work): TypeError / ValueError naming the argument.
    """

    in_channels = None  # any feature width

    PYG_NAME = "APPNP"

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        unsupported = super().pyg_unsupported(layer)
        if not 0.0 <= float(layer.dropout) < 1.0:
            unsupported.append(f"dropout={layer.dropout!r} (corgnn's APPNP takes [0, 1))")
        return unsupported

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        return dict(
            K=layer.K, alpha=layer.alpha, dropout=layer.dropout, cached=layer.cached, add_self_loops=layer.add_self_loops,
            normalize=layer.normalize,
        )

    def __init__(
        self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False, add_self_loops: bool = True, normalize: bool = True,
        *, format: str = "csr", **kwargs,
    ):
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"APPNP: alpha must be in [0, 1], got {alpha!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"APPNP: dropout must be in [0, 1), got {dropout!r}")
        self._setup(K, add_self_loops, normalize, "auto", format, kwargs)
        self.alpha, self.dropout, self.cached = float(alpha), float(dropout), bool(cached)

    def _dtype_param(self) -> None:
        return None

    def forward(self, x, edge_index, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        graph, x, A, values = self._prepare(x, edge_index, edge_weight)
        drop = self.dropout > 0 and self.training
        constant = values is None and not x.requires_grad and not drop
        training = self._backward_will_run(x.requires_grad) or values is not None
        self.last_plan = plan_propagation(
            graph.num_nodes, A.nnz, x.size(1), None, self.K, training and x.requires_grad,
            training=training, constant_input=constant, layer="APPNP",
        )
        kept = self._kept.get(x, A) if constant else None
        if kept is not None:
            return kept.clone()
        h = x
        for _ in range(self.K):
            v = values
            if drop:
                v = nn.functional.dropout(A.val if v is None else v, p=self.dropout)
            x = spmm(A, x, values=v) * (1 - self.alpha) + self.alpha * h
        if constant:
            self._kept.put(h, A, x)
        return x

    def extra_repr(self) -> str:
        return f"K={self.K}, alpha={self.alpha}"
