"""GraphSAGE and GraphConv: an aggregation SpMM and a Linear, reordered like GCN.

Both layers compute ``X' = (A X) Θ_agg^T + b + X Θ_root^T`` with ``A`` the
aggregation matrix of PyG's message passing (:meth:`corgnn.Graph.aggr_adjacency`:
sum, or mean as an SpMM with ``1/deg`` values). The aggregated term is the GCN
product ``A X Θ + b`` for another ``A`` (paper §"Analysis of the GCN Computational
Graph"), so it runs :class:`~corgnn.functional.gcn.GCNFunction` under the scheme
:func:`~corgnn.cost.gcn.plan_gcn` picks (transform-first: aggregate ``k`` columns;
propagate-first: ``m`` columns; fused/split backward; ``A X`` cached for backward).
The root term is a dense Linear (no sparse product to reorder).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear

from ..cost.gcn import GCN_SCHEMES, GCNPlan, parse_scheme, plan_gcn
from ..functional.gcn import GCNFunction, composed_first, entry_values, feature_transform, row_tails, runs_composed
from ..graph import AGGREGATIONS, Graph, GraphCache, aggr_edge_weights
from ..sparse.formats import CSR
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import (
    CorgnnConv, FeatureCache, SparseView, UnsupportedOption, check_message_passing_kwargs, check_value_grad, parameter, sparse_values_weigh,
    submodule, weight_and_bias,
)

__all__ = ["SAGEConv", "GraphConv", "TARGET_ROWS_MAX_FRACTION"]

TARGET_ROWS_MAX_FRACTION = 0.5
"""The aggregated term runs on the rows of ``A`` that hold entries (the nodes with
incoming edges: :meth:`corgnn.sparse.CSR.nonempty_rows`) when they are at most this
fraction of the nodes; its other rows are the bias alone.

NOTE (issue 21, measured): a neighbour-sampled subgraph in NeighborLoader's layout
(512 seeds, fanouts 10, 10) of the OGB-Arxiv stand-in has 10,906 nodes of which
2,063 have incoming edges; a 128 -> 64 GEMM on those rows takes 0.18 ms against
1.13 ms on all, and propagate-first's GEMMs (forward, ``dΘ``, ``G Θ^T``) all run on
them. The price is one scatter of the ``(r, k)`` result into ``(n, k)`` and one
gather of its gradient."""


class _AggregateLinear(CorgnnConv):
    """``lin_agg(A x) + lin_root(x)`` with the planned GCN product for the first term.

    Subclasses set ``_agg`` / ``_root`` (names of the two Linears; ``_root`` may be
    absent) and ``_weighted`` (whether edge weights enter ``A``)."""

    _agg = "lin_l"
    _root = "lin_r"
    _weighted = False
    project = False  # (SAGEConv's option, an instance attribute there: a class default, not Module.__getattr__'s miss per call)
    SUPPORTS_EXPLAIN = True

    def _setup(self, in_channels, out_channels, aggr: str, scheme: str, format: str, kwargs: dict) -> None:
        name = type(self).__name__
        check_message_passing_kwargs(name, kwargs)
        if isinstance(in_channels, (tuple, list)):
            raise UnsupportedOption(f"{name}: bipartite in_channels {tuple(in_channels)} is not supported by corgnn; use torch_geometric.nn.{name}")
        if in_channels <= 0 or out_channels <= 0:
            raise ValueError(f"{name}: in_channels and out_channels must be positive, got {in_channels}, {out_channels}")
        if aggr not in AGGREGATIONS:
            raise UnsupportedOption(f"{name}: aggr={aggr!r} is not supported by corgnn (only {', '.join(AGGREGATIONS)}); use torch_geometric.nn.{name}")
        if scheme != "auto":
            parse_scheme(scheme)
        check_format_name(format, allow_auto=False)
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, aggr
        self.scheme, self.format = scheme, format
        self._graphs = GraphCache()
        self._features = FeatureCache()
        self.last_plan: GCNPlan | None = None

    def _dtype_param(self) -> torch.Tensor:
        return parameter(submodule(self, self._agg), "weight")

    def adjacency(self, graph: Graph, dtype: torch.dtype, columns: int | None = None):
        """The aggregation matrix ``A (n, n)`` of this layer on ``graph``, cached on it;
        with ``columns`` (the product's width) a graph not built yet may hand out its
        edge list (:meth:`corgnn.Graph.aggr_adjacency`)."""
        return graph.aggr_adjacency(self.aggr, dtype=dtype, weighted=self._weighs(graph), format=self.format, columns=columns)

    @staticmethod
    def _edge_list_columns(graph: Graph, src: torch.Tensor | None, per_call) -> int | None:
        """:meth:`adjacency`'s ``columns``: the width of ``src``, the features the
        product reads, where an edge list can serve (dense ``src``, no per-call values,
        :meth:`_per_call`) and the rows with entries are not few: a mini-batch of small
        graphs, whose every node has incoming edges. None (the built CSR) where at most
        :data:`TARGET_ROWS_MAX_FRACTION` of the rows can hold one (edges reach only
        nodes below :meth:`corgnn.Graph.target_bound`: NeighborLoader's layout numbers
        the targets first), for the products on those rows (:meth:`target_rows`).

        NOTE (issue 21, measured 2026-11-29 on the 2-core VM, a 3-layer SAGE / GraphConv
        with mean pooling on mini-batches of 32 small graphs, 64 channels, PyG's model,
        the code before and this one interleaved in one process, two runs): with the
        built CSR and ``GCNFunction`` per layer SAGE ran 0.89-1.02x PyG's speed in
        training and 0.78-0.81x in evaluation, GraphConv 0.94-1.00x and 0.72-0.92x;
        with the edge list and the composition (:func:`corgnn.functional.gcn.composes`)
        SAGE 1.09-1.12x and 1.17x faster than that, GraphConv 1.11-1.13x and 1.31x."""
        if src is None or per_call is not None or not graph.targets_beyond(TARGET_ROWS_MAX_FRACTION * graph.num_nodes):
            return None
        return src.size(1)

    def _weighs(self, graph: Graph) -> bool:
        """Whether the edge weights scale the messages: always for GraphConv; for
        SAGEConv when the graph is a weighted ``torch.sparse`` adjacency, as PyG."""
        return self._weighted or sparse_values_weigh(graph)

    def plan(self, graph: Graph, x, x_nnz: int | None = None) -> GCNPlan:
        """The scheme of the aggregated term ``A x Θ_agg + b`` for ``x`` (the aggregated
        features, after ``project``) on ``graph`` now, with every scheme's cost
        (``rows``: the rows it runs on, :meth:`target_rows`)."""
        A = self.adjacency(graph, x.dtype)
        return self._plan(graph, x, x_nnz, A, self.target_rows(A)[0])

    def _plan(self, graph: Graph, x, x_nnz: int | None, A, rows: torch.Tensor | None) -> GCNPlan:
        """:meth:`plan` for the matrix ``A`` and its :meth:`target_rows` ``rows``, as
        the forward has them already."""
        dense = isinstance(x, torch.Tensor)
        x_grad = dense and x.requires_grad
        training = self._backward_will_run(x_grad)
        return plan_gcn(
            graph.num_nodes, A.nnz, self.in_channels, self.out_channels, input_grad=training and x_grad,
            training=training, scheme=self.scheme, x_nnz=x_nnz, approximate=True,
            candidates=self._candidates(graph, A, dense, rows, training),
            rows=None if rows is None else rows.numel(),
        )

    def _candidates(self, graph: Graph, A, dense: bool, rows: torch.Tensor | None, training: bool) -> tuple:
        """The plan's schemes: sparse-only features take transform-first+fused; on
        all rows a tie goes to the composition where it composes
        (:func:`corgnn.functional.gcn.composed_first`); on the rows with entries
        ``GCNFunction`` runs every scheme."""
        if not dense:
            return GCN_SCHEMES[:1]
        if rows is not None:
            return GCN_SCHEMES
        return composed_first(GCN_SCHEMES, graph.num_nodes, self.in_channels, self.out_channels, row_tails(training, A))

    @staticmethod
    def target_rows(A) -> tuple[torch.Tensor | None, object]:
        """``(rows, A[rows])`` when at most :data:`TARGET_ROWS_MAX_FRACTION` of the
        rows of CSR ``A`` hold entries (and some do), else ``(None, A)``."""
        if type(A) is not CSR or not A.nnz:
            return None, A
        rows, A_rows = A.nonempty_rows()
        if rows.numel() > TARGET_ROWS_MAX_FRACTION * A.shape[0]:
            return None, A
        return rows, A_rows

    def _check_size(self, size) -> None:
        if size is not None:
            raise UnsupportedOption(f"{type(self).__name__}: size={size!r} (bipartite message passing) is not supported by corgnn")

    def _forward(self, x, edge_index, edge_weight=None) -> torch.Tensor:
        graph, dense, xs, dtype = self._inputs(x, edge_index, edge_weight)
        if self._weighs(graph):
            check_value_grad(graph)
        src, src_sparse = dense, xs
        proj = self._modules.get("lin") if self.project else None
        if proj is not None:  # PyG's project: relu(lin(x)) is what gets aggregated
            src, src_sparse = torch.relu(feature_transform(dense, proj.weight, xs) + proj.bias), None
        per_call = self._per_call(graph)
        A = self.adjacency(graph, dtype, self._edge_list_columns(graph, src, per_call))
        rows, A_rows = self.target_rows(A)
        plan = self._plan(graph, src if src is not None else SparseView(dtype), None if src_sparse is None else src_sparse.nnz, A, rows)
        self.__dict__["last_plan"] = plan  # (a plain attribute: no Module.__setattr__, ~1 us a call)
        weight, bias = weight_and_bias(submodule(self, self._agg))
        root = self._modules.get(self._root)
        values = self._edge_values(graph, A, per_call)
        if rows is None:
            if runs_composed(plan.scheme, src, weight, src_sparse, row_tails(plan.training, A)):  # (A x, then torch's own linear)
                out = nn.functional.linear(spmm(A, src, values=values), weight, bias)
            else:
                out = GCNFunction.apply(src, weight, bias, A, plan.scheme, src_sparse, values)
            if root is not None:
                out = feature_transform(dense, parameter(root, "weight"), xs, add=out)
            return out
        # the aggregated term on the rows with entries (A's entry order: the same values)
        agg = GCNFunction.apply(src, weight, None, A_rows, plan.scheme, src_sparse, values)
        if root is not None:
            out = feature_transform(dense, parameter(root, "weight"), xs).index_add_(0, rows, agg)
        else:
            out = agg.new_zeros(A.shape[0], agg.size(1)).index_add_(0, rows, agg)
        return out if bias is None else out.add_(bias)

    def _per_call(self, graph: Graph) -> tuple | None:
        """``(edge weights or None, explain mask or None)`` when ``A``'s values are made
        per call (:meth:`_edge_values`): the graph's edge weights need a gradient, or
        PyG's explain edge mask is set; else None (the cached ``A.val``)."""
        ew = graph.edge_weight if self._weighs(graph) else None
        mask = self.explain_mask(graph.edge_index, graph.num_nodes, loops=False)
        if mask is None and (ew is None or not ew.requires_grad or not torch.is_grad_enabled()):
            return None
        return ew, mask

    def _edge_values(self, graph: Graph, A, per_call: tuple | None) -> torch.Tensor | None:
        """``A``'s values as a differentiable function of the graph's edge weights,
        times PyG's explain edge mask (each message times its edge's mask, before the
        mean's division by the edge count, as PyG's ``explain_message``), for
        :meth:`_per_call`'s ``per_call``; None without: the cached ``A.val`` is a constant."""
        if per_call is None:
            return None
        ew, mask = per_call
        w = aggr_edge_weights(graph.edge_index, ew, graph.num_nodes, "sum" if self.aggr == "add" else self.aggr, A.val.dtype)
        return entry_values(A, graph.edge_index, w if mask is None else w * mask.to(w.dtype))

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr!r}, scheme={self.scheme!r}, format={self.format!r}"


class SAGEConv(_AggregateLinear):
    r"""GraphSAGE ``x'_i = W_l aggr_{j -> i} x_j + b + W_r x_i`` (Hamilton et al. 2017)
    with the aggregated term reordered and cached as GCN's (module docstring).

    A drop-in for ``torch_geometric.nn.SAGEConv`` (its signature, parameters
    ``lin_l`` (with bias), ``lin_r`` (no bias), ``lin`` with ``project``, init,
    ``state_dict`` keys, outputs and gradients). Mean aggregation is the SpMM with
    ``1/deg`` values (a node without in-edges aggregates 0, as PyG); edge weights of
    a graph are ignored, as PyG's SAGEConv ignores them, except the stored values of a
    ``torch.sparse`` adjacency, by which PyG multiplies the messages.

    Args (PyG's, in PyG's order):
        in_channels: m (an int; bipartite pairs raise :class:`UnsupportedOption`).
        out_channels: k.
        aggr: ``"mean"`` (default), ``"sum"`` or ``"add"``; others raise
            :class:`UnsupportedOption`.
        normalize: L2-normalise each output row (default False).
        root_weight: add ``W_r x_i`` (default True).
        project: aggregate ``relu(lin(x))`` instead of ``x`` (default False).
        bias: bias of ``lin_l`` (default True).
        **kwargs: PyG ``MessagePassing`` options, as :class:`corgnn.nn.GCNConv`.

    Keyword-only: ``scheme`` (``"auto"`` or a :data:`corgnn.cost.GCN_SCHEMES` name),
    ``format`` of ``A`` (``"csr"`` default).

    Shapes: ``x (n, in_channels)`` float (or a corgnn / torch.sparse matrix),
    ``edge_index (2, q)`` int64, a :class:`corgnn.Graph` or a sparse ``adj_t`` ->
    ``(n, out_channels)``.

    Raises (before any work): TypeError / ValueError naming the argument, as
    :class:`corgnn.nn.GCNConv`.
    """

    PYG_NAME = "SAGEConv"
    PYG_LINEARS, PYG_BIASLESS, PYG_AGGRS = ("lin", "lin_l", "lin_r"), ("lin_r",), AGGREGATIONS

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        w = layer.lin_l.weight
        return dict(
            in_channels=w.size(1), out_channels=w.size(0), aggr=layer.aggr, normalize=layer.normalize, root_weight=layer.root_weight,
            project=layer.project, bias=getattr(layer.lin_l, "bias", None) is not None,
        )

    def __init__(
        self, in_channels: int, out_channels: int, aggr: str = "mean", normalize: bool = False, root_weight: bool = True,
        project: bool = False, bias: bool = True, *, scheme: str = "auto", format: str = "csr", **kwargs,
    ):
        super().__init__()
        self._setup(in_channels, out_channels, aggr, scheme, format, kwargs)
        self.normalize, self.root_weight, self.project = bool(normalize), bool(root_weight), bool(project)
        if self.project:  # construction order as PyG's (same seeded initial values)
            self.lin = Linear(in_channels, in_channels, bias=True)
        self.lin_l = Linear(in_channels, out_channels, bias=bias)
        if self.root_weight:
            self.lin_r = Linear(in_channels, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def forward(self, x, edge_index, size=None) -> torch.Tensor:
        """``x (n, in_channels)``, ``edge_index (2, q)`` / Graph / sparse ``adj_t`` -> ``(n, out_channels)``."""
        self._check_size(size)
        out = self._forward(x, edge_index)
        return nn.functional.normalize(out, p=2.0, dim=-1) if self.normalize else out


class GraphConv(_AggregateLinear):
    r"""GraphConv ``x'_i = W_rel sum_{j -> i} e_ji x_j + b + W_root x_i`` (Morris et al.
    2019), the aggregated term reordered and cached as GCN's (module docstring).

    A drop-in for ``torch_geometric.nn.GraphConv`` (parameters ``lin_rel`` with bias,
    ``lin_root`` without, init, outputs and gradients, also w.r.t. ``edge_weight``).

    Args (PyG's): ``in_channels`` (int), ``out_channels``, ``aggr`` (``"add"``
    default, ``"sum"``, ``"mean"``; others raise :class:`UnsupportedOption`),
    ``bias``, ``**kwargs`` as :class:`corgnn.nn.GCNConv`; keyword-only ``scheme``,
    ``format`` as :class:`SAGEConv`.

    Shapes: ``x (n, in_channels)``, ``edge_index (2, q)`` (or Graph / sparse
    ``adj_t``), optional ``edge_weight (q,)`` -> ``(n, out_channels)``.

    Raises (before any work): TypeError / ValueError naming the argument.
    """

    _agg, _root, _weighted = "lin_rel", "lin_root", True

    PYG_NAME = "GraphConv"
    PYG_LINEARS, PYG_BIASLESS, PYG_AGGRS = ("lin_rel", "lin_root"), ("lin_root",), AGGREGATIONS

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        w = layer.lin_rel.weight
        return dict(in_channels=w.size(1), out_channels=w.size(0), aggr=layer.aggr, bias=getattr(layer.lin_rel, "bias", None) is not None)

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "add", bias: bool = True, *, scheme: str = "auto", format: str = "csr", **kwargs):
        super().__init__()
        self._setup(in_channels, out_channels, aggr, scheme, format, kwargs)
        self.lin_rel = Linear(in_channels, out_channels, bias=bias)
        self.lin_root = Linear(in_channels, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()

    def forward(self, x, edge_index, edge_weight: torch.Tensor | None = None, size=None) -> torch.Tensor:
        """``x (n, in_channels)``, ``edge_index (2, q)`` / Graph / sparse ``adj_t``,
        optional ``edge_weight (q,)`` -> ``(n, out_channels)``."""
        self._check_size(size)
        return self._forward(x, edge_index, edge_weight)
