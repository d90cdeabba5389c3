"""GCN layer and the paper's 2-layer GCN model."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros

from .._validate import check_features, check_finite
from ..cost.gcn import GCN_SCHEMES, GCNPlan, parse_scheme, plan_gcn, static_scheme_name
from ..cost.io import choose_format
from ..functional.gcn import GCNFunction, gcn_values
from ..graph import Graph, GraphCache, compiled_gcn_adjacency, tensor_state
from ..sparse.formats import CSR, SparseFormat
from ..sparse.registry import check_format_name

__all__ = ["GCNConv", "GCN", "dropout"]


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


SPARSE_FEATURE_DENSITY = 0.05
"""Constant input features at or below this fraction of non-zeros are used as a sparse
matrix (Planetoid bag-of-words: Cora 1.3 %, CiteSeer 0.9 %). A dense GEMM runs tens
of times more FLOP/s than a gather-based SpMM, so the switch pays off only well
below ~10 % density."""


class _FeatureCheck:
    """Validates features once per tensor version (the dataset's ``x`` is checked on
    the first epoch only; a new tensor, or the same one modified in place or given
    new ``.data``, is checked again: :func:`corgnn.graph.tensor_state`, with the
    same limit as :class:`corgnn.graph.GraphCache` for writes through ``x.data[...]``
    or NumPy). Subclasses derive more per-version state in :meth:`derive`. The
    state is never pickled or deep-copied: a copy starts empty."""

    def __init__(self):
        self._ref = None
        self._state_key = None
        self._state = None

    def __reduce__(self):
        return (type(self), ())

    def __call__(self, x: torch.Tensor, num_nodes: int, channels: int):
        key = tensor_state(x)
        if self._ref is not None and self._ref() is x and key == self._state_key:
            return self._state
        check_features("x", x, num_nodes, channels)
        state = self.derive(x)
        self._ref, self._state_key, self._state = weakref.ref(x), key, state
        return state

    def derive(self, x: torch.Tensor):
        return None


class _FeatureCache(_FeatureCheck):
    """Also keeps the CSR of constant features (no grad) that are mostly zeros,
    converted once per tensor version like the adjacency; ``None`` = use dense."""

    def derive(self, x: torch.Tensor) -> "CSR | None":
        if x.requires_grad or not x.numel():
            return None
        nnz = int(torch.count_nonzero(x))
        return dense_to_csr(x, nnz) if nnz <= SPARSE_FEATURE_DENSITY * x.numel() else None


def dense_to_csr(x: torch.Tensor, nnz: int | None = None) -> CSR:
    """CSR ``(n, m)`` of a dense matrix's non-zeros (values copied, x untouched)."""
    row, col = x.nonzero(as_tuple=True) if nnz is None or nnz else (x.new_empty(0, dtype=torch.long),) * 2
    return CSR.from_coo(row, col, x[row, col], tuple(x.shape))


class _SparseView:
    """Stands in for sparse-only features in :meth:`GCNConv.plan` (dtype, no grad)."""

    requires_grad = False

    def __init__(self, dtype):
        self.dtype = dtype


def _check_compiled_x(x, in_channels: int, dtype) -> None:
    """The checks of ``x`` that need no tensor data (shapes and dtypes are static or
    guarded under ``torch.compile``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"under torch.compile, x must be a dense torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.size(1) != in_channels:
        raise ValueError(f"x must have shape (num_nodes, {in_channels}), got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"x is {x.dtype} but the layer's parameters are {dtype}; call .to({x.dtype}) on the module")


class _LayerInputs:
    """Input handling shared by GCNConv and GATConv (graph conversion once per
    ``edge_index``, feature validation once per tensor version, sparse features).

    Needs ``self._graphs`` (GraphCache), ``self._features`` (_FeatureCheck),
    ``self.in_channels`` and ``self.lin.weight``.
    """

    def _backward_will_run(self, x_grad: bool) -> bool:
        """Whether this call records a backward pass: autograd on and ``x`` or a
        parameter requires a gradient (the plans' ``training`` flag)."""
        return torch.is_grad_enabled() and (x_grad or any(p.requires_grad for p in self.parameters()))

    def sparse_features(self, x: torch.Tensor, num_nodes: int | None = None) -> "CSR | None":
        """Validate ``x`` (once per tensor version) and return its cached CSR if it is
        constant (no grad) and at most :data:`SPARSE_FEATURE_DENSITY` non-zero."""
        return self._features(x, x.size(0) if num_nodes is None else num_nodes, self.in_channels)

    def _inputs(self, x, edge_index, edge_weight=None):
        """``(graph, dense x or None, sparse x or None, dtype)``, validated before any work.

        ``x`` is a dense ``(n, in_channels)`` float tensor or a corgnn sparse matrix.
        """
        if isinstance(x, SparseFormat):
            graph = self._graphs(edge_index, edge_weight, x.shape[0])
            if x.shape != (graph.num_nodes, self.in_channels) or x.val is None or x.val.dim() != 1:
                raise ValueError(f"sparse x must be ({graph.num_nodes}, {self.in_channels}) with values, got {x!r}")
            check_finite("x", x.val)
            xs, dense, dtype, device = x, None, x.val.dtype, x.device
        else:
            graph = self._graphs(edge_index, edge_weight, x.size(0) if isinstance(x, torch.Tensor) and x.dim() == 2 else None)
            xs = self._features(x, graph.num_nodes, self.in_channels)
            dense, dtype, device = x, x.dtype, x.device
        if device != graph.device:
            raise ValueError(f"x is on {device} but edge_index is on {graph.device}")
        if self.lin.weight.dtype != dtype:
            raise TypeError(f"x is {dtype} but the layer's parameters are {self.lin.weight.dtype}; call .to({dtype}) on the module")
        return graph, dense, xs, dtype


class GCNConv(_LayerInputs, nn.Module):
    r"""Graph convolution ``X' = D^{-1/2}(A+I)D^{-1/2} X Θ + b`` with adaptive reordering
    and caching (paper §"Analysis of the GCN Computational Graph", Tables 1-2).

    A drop-in for ``torch_geometric.nn.GCNConv``: same parameters (``lin.weight``
    ``(out_channels, in_channels)``, Glorot init; ``bias`` zero init; the same
    ``state_dict`` keys), the same normalisation (PyG's ``gcn_norm``), the same
    outputs and gradients. Per call it plans the cheapest scheme from ``n, q, m, k``
    and whether ``x`` needs a gradient: transform-first or propagate-first forward,
    fused- or split-propagate backward, caching ``A'X`` when that saves an SpMM.

    Args:
        in_channels: m, input features per node.
        out_channels: k, output features per node.
        bias: learn an additive bias (default True).
        scheme: ``"auto"`` (default) or a scheme name to force, e.g.
            ``"transform-first+fused"``, ``"propagate-first+split+cache"`` (see
            :data:`corgnn.cost.GCN_SCHEMES`).
        format: sparse format of ``A'``: ``"csr"`` (default), ``"auto"`` (chosen by
            :func:`corgnn.cost.choose_format` from the I/O model) or
            ``"coo" | "csc" | "ell" | "hybrid"``.
        improved: self-loop weight 2 instead of 1 (PyG's ``improved``).
        add_self_loops: add ``I`` before normalising (PyG's default True).
        normalize: apply the symmetric normalisation (PyG's default True).
        cached: kept for PyG signature compatibility; the adjacency is always
            cached per graph, keyed as :class:`corgnn.graph.GraphCache` says (a
            new tensor or an in-place op rebuilds it; writes through
            ``edge_index.data[...]`` or NumPy are not seen).

    Shapes:
        - input: ``x (n, in_channels)`` float32/float64, ``edge_index (2, q)`` int64 or
          a :class:`corgnn.Graph`, optional ``edge_weight (q,)``
        - output: ``(n, out_channels)``

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index`` (float dtype,
        wrong shape, negative or out-of-range ids), ``x`` rows not matching the node
        count or columns not ``in_channels``, ``edge_weight`` of the wrong length,
        NaN/Inf in ``x`` or ``edge_weight``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bias: bool = True,
        *,
        scheme: str = "auto",
        format: str = "csr",
        improved: bool = False,
        add_self_loops: bool = True,
        normalize: bool = True,
        cached: bool = True,
    ):
        super().__init__()
        if in_channels <= 0 or out_channels <= 0:
            raise ValueError(f"in_channels and out_channels must be positive, got {in_channels}, {out_channels}")
        if scheme != "auto":
            parse_scheme(scheme)
        check_format_name(format, allow_auto=True)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.scheme, self.format = scheme, format
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._graphs = GraphCache()
        self._features = _FeatureCache()
        self.last_plan: GCNPlan | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        if self.bias is not None:
            zeros(self.bias)

    def adjacency(self, graph: Graph, dtype: torch.dtype):
        opts = dict(dtype=dtype, improved=self.improved, add_self_loops=self.add_self_loops, normalize=self.normalize)
        fmt = self.format
        if fmt == "auto":  # I/O-model choice, on the SpMM width of transform-first
            fmt = choose_format(graph.gcn_stats(**opts), min(self.in_channels, self.out_channels)).format
        return graph.gcn_adjacency(**opts, format=fmt)

    def sparse_features_allowed(self) -> bool:
        """Whether sparse-only input features fit this layer's scheme setting (they
        need transform-first+fused: ``A'X`` would be a sparse-sparse product)."""
        return self.scheme == "auto" or parse_scheme(self.scheme) == GCN_SCHEMES[0]

    def plan(self, graph: Graph, x, x_nnz: int | None = None) -> GCNPlan:
        """The scheme this layer would use for ``x`` on ``graph`` now, with costs."""
        A = self.adjacency(graph, x.dtype)
        dense = isinstance(x, torch.Tensor)
        x_grad = dense and x.requires_grad
        training = self._backward_will_run(x_grad)
        candidates = GCN_SCHEMES if dense else GCN_SCHEMES[:1]  # sparse-only X: transform-first+fused
        return plan_gcn(
            graph.num_nodes, A.nnz, self.in_channels, self.out_channels, input_grad=training and x_grad,
            training=training, scheme=self.scheme, candidates=candidates, x_nnz=x_nnz,
        )

    def forward(self, x, edge_index, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Args: ``x (n, in_channels)`` dense float tensor, or a corgnn sparse matrix
        (e.g. :class:`corgnn.sparse.CSR`) of input features (no gradient flows to it);
        ``edge_index (2, q)`` or a :class:`corgnn.Graph`; optional ``edge_weight (q,)``.

        Gradients as PyG's: also to ``edge_weight`` (or the Graph's weights) when it
        requires one, through the normalisation (eager mode), and second derivatives
        (``create_graph=True``) in every scheme."""
        if torch.compiler.is_compiling():
            return self._forward_compiled(x, edge_index, edge_weight)
        graph, dense, xs, dtype = self._inputs(x, edge_index, edge_weight)
        weight = self.lin.weight
        A = self.adjacency(graph, dtype)
        plan = self.plan(graph, dense if dense is not None else _SparseView(dtype), None if xs is None else xs.nnz)
        self.last_plan = plan
        return GCNFunction.apply(dense, weight, self.bias, A, plan.scheme, xs, self._edge_values(graph, A))

    def _edge_values(self, graph: Graph, A: SparseFormat) -> torch.Tensor | None:
        """``A``'s values as a differentiable function of ``graph.edge_weight`` when
        that needs a gradient (learnable edge weights, explainer masks), else None:
        the cached ``A.val`` is used as a constant, at no extra cost."""
        ew = graph.edge_weight
        if ew is None or not ew.requires_grad or not torch.is_grad_enabled():
            return None
        return gcn_values(A, graph.edge_index, ew, improved=self.improved, add_self_loops=self.add_self_loops, normalize=self.normalize)

    def _forward_compiled(self, x, edge_index, edge_weight):
        """The forward as ``torch.compile`` traces it (see "torch.compile" in the
        README): the adjacency comes from the ``corgnn::gcn_adjacency`` custom op
        (validated and cached at run time, in CSR), the plan from the static sizes
        (:func:`corgnn.cost.gcn.static_scheme_name`), and ``x`` is used dense; no
        Python branch depends on tensor data."""
        _check_compiled_x(x, self.in_channels, self.lin.weight.dtype)
        A = compiled_gcn_adjacency(
            edge_index, edge_weight, x.size(0), dtype=x.dtype,
            improved=self.improved, add_self_loops=self.add_self_loops, normalize=self.normalize,
        )
        training = self._backward_will_run(x.requires_grad)
        scheme = parse_scheme(static_scheme_name(self.in_channels, self.out_channels, training and x.requires_grad, training, self.scheme))
        return GCNFunction.apply(x, self.lin.weight, self.bias, A, scheme, None, None)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, scheme={self.scheme!r}, format={self.format!r}"


class GCN(nn.Module):
    """The paper's 2-layer GCN: ``GCNConv -> ReLU -> (dropout) -> GCNConv``.

    Args:
        in_channels, hidden_channels, out_channels: layer widths.
        dropout: dropout probability on the input and hidden features in training
            (Kipf & Welling use 0.5; default 0.0 = none, as in the paper's benchmarks).
        scheme, format: passed to both layers.

    Shapes: ``x (n, in_channels)``, ``edge_index (2, q)`` or Graph -> ``(n, out_channels)``.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.0, *, scheme: str = "auto", format: str = "csr"):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = dropout
        self.conv1 = GCNConv(in_channels, hidden_channels, scheme=scheme, format=format)
        self.conv2 = GCNConv(hidden_channels, out_channels, scheme=scheme, format=format)
        self._graphs = GraphCache()

    def reset_parameters(self) -> None:
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        xs = None
        if not torch.compiler.is_compiling():  # (compiled: each layer takes A' from the graph op)
            # one Graph (and one A') shared by both layers
            edge_index = self._graphs(edge_index, edge_weight, x.size(0) if isinstance(x, torch.Tensor) and x.dim() == 2 else None)
            edge_weight = None
            if self.conv1.sparse_features_allowed() and isinstance(x, torch.Tensor):
                xs = self.conv1.sparse_features(x, edge_index.num_nodes)
        if xs is not None:
            # NOTE: dropout of a zero is a zero, so dropping the sparse values is the
            # same distribution as dense dropout at ~1 % of the random numbers.
            x = xs.with_values(dropout(xs.val, self.dropout, self.training))
        else:
            x = dropout(x, self.dropout, self.training)
        x = torch.relu(self.conv1(x, edge_index, edge_weight))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index, edge_weight)

    def schemes(self) -> list[str]:
        """Scheme name each layer used on its last call."""
        return [c.last_plan.scheme.name if c.last_plan else "-" for c in (self.conv1, self.conv2)]
