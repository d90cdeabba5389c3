"""GAT layer, the paper's 2-layer GAT model, and conversion from PyG's ``GATConv``."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros

from ..cost.gat import GATPlan, parse_cache, plan_gat, static_cache_name
from ..functional.gat import gat_conv
from ..graph import Graph, GraphCache, compiled_gat_adjacency
from ..sparse.registry import check_format_name
from .gcn import _check_compiled_x, _FeatureCache, _LayerInputs, dropout

__all__ = ["GATConv", "GAT"]


def _positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")


class GATConv(_LayerInputs, nn.Module):
    r"""Multi-head graph attention layer with the paper's caching schemes
    (paper §"Analysis of the GAT Computation", Table 4; appendix "GAT Forward Pass").

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(a_{dst}^T Θ x_i + a_{src}^T Θ x_j)\big),
        \qquad x'_i = \big\Vert_{h} \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} Θ_h x_j + b

    A drop-in for ``torch_geometric.nn.GATConv`` (homogeneous graphs, no edge
    features): the same parameters (``lin.weight (heads*out_channels, in_channels)``,
    ``att_src``/``att_dst (1, heads, out_channels)``, ``bias``; Glorot / zero init;
    the same ``state_dict`` keys), the same self-loop handling (existing loops
    removed, one added per node; duplicate edges kept), the same outputs and
    gradients. Each training call keeps for backward what its caching scheme says
    (:mod:`corgnn.cost.gat`); the scheme used is recorded in ``last_cache``.

    Args:
        in_channels: m, input features per node.
        out_channels: k, output features per head.
        heads: h, attention heads (default 1).
        concat: concatenate the heads' outputs to ``(n, h*k)`` (default) or average
            them to ``(n, k)``.
        negative_slope: LeakyReLU slope of the attention logits (default 0.2).
        dropout: dropout probability of the attention coefficients in training
            (default 0). The mask is redrawn in backward from an 8-byte seed.
        bias: learn an additive bias (default True).
        cache: ``"auto"`` (default: the fastest scheme within ``memory_budget``,
            i.e. "edge_weights" without a budget) or one of "none", "features",
            "node_attention", "edge_weights".
        format: sparse format of the attention pattern: ``"csr"`` (default;
            ``"auto"`` = csr) or ``"coo" | "csc" | "ell" | "hybrid"``.
        add_self_loops: remove existing and add one self-loop per node (PyG default).
        memory_budget: with ``cache="auto"``, the most bytes a call may keep for
            backward beyond its input and parameters (Table 4's extra memory).

    Shapes:
        - input: ``x (n, in_channels)`` float32/float64, ``edge_index (2, q)`` int64
          or a :class:`corgnn.Graph`
        - output: ``(n, heads * out_channels)`` if ``concat`` else ``(n, out_channels)``

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index`` (float dtype,
        wrong shape, negative or out-of-range ids), ``x`` rows not matching the node
        count or columns not ``in_channels``, NaN/Inf in ``x``, a dtype or device
        mismatch, ``edge_attr`` / ``return_attention_weights`` (not supported).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        cache: str = "auto",
        format: str = "csr",
        add_self_loops: bool = True,
        memory_budget: int | None = None,
    ):
        super().__init__()
        if isinstance(in_channels, (tuple, list)):
            raise ValueError(f"in_channels must be an int; bipartite (source, target) in_channels {tuple(in_channels)} are not supported")
        _positive_int("in_channels", in_channels)
        _positive_int("out_channels", out_channels)
        _positive_int("heads", heads)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if cache != "auto":
            cache = parse_cache(cache)
        check_format_name(format, allow_auto=True)
        if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget < 0):
            raise ValueError(f"memory_budget must be None or a non-negative int (bytes), got {memory_budget!r}")
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, concat
        self.negative_slope, self.dropout = float(negative_slope), float(dropout)
        self.cache, self.format, self.add_self_loops, self.memory_budget = cache, format, add_self_loops, memory_budget
        self.lin = Linear(in_channels, heads * out_channels, bias=False, weight_initializer="glorot")
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.bias = nn.Parameter(torch.empty(heads * out_channels if concat else out_channels)) if bias else None
        self._graphs = GraphCache()
        self._features = _FeatureCache()
        self.last_plan: GATPlan | None = None
        self.last_cache: str | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        if self.bias is not None:
            zeros(self.bias)

    def adjacency(self, graph: Graph):
        """The attention pattern of ``graph`` in this layer's format (cached on the Graph)."""
        fmt = "csr" if self.format == "auto" else self.format
        return graph.gat_adjacency(add_self_loops=self.add_self_loops, format=fmt)

    def plan(self, graph: Graph, x) -> GATPlan:
        """The caching scheme this layer would use for ``x`` on ``graph`` now, with costs."""
        A = self.adjacency(graph)
        x_grad = isinstance(x, torch.Tensor) and x.requires_grad
        training = self._backward_will_run(x_grad)
        value_bytes = self.lin.weight.element_size()
        return plan_gat(
            graph.num_nodes, A.nnz, self.heads, self.out_channels, self.in_channels,
            cache=self.cache, memory_budget=self.memory_budget, training=training, value_bytes=value_bytes,
        )

    def forward(self, x, edge_index, edge_attr=None, size=None, return_attention_weights=None) -> torch.Tensor:
        """Args: ``x (n, in_channels)`` dense float tensor, or a corgnn sparse matrix
        (e.g. :class:`corgnn.sparse.CSR`) of input features (no gradient flows to it);
        ``edge_index (2, q)`` or a :class:`corgnn.Graph`. ``edge_attr`` must be None
        and ``size`` None or ``(n, n)`` (PyG signature)."""
        if edge_attr is not None:
            raise ValueError("edge_attr is not supported by corgnn's GATConv (no edge_dim); use torch_geometric.nn.GATConv for edge features")
        if return_attention_weights is not None:
            raise ValueError("return_attention_weights is not supported by corgnn's GATConv; use torch_geometric.nn.GATConv to inspect attention")
        if torch.compiler.is_compiling():
            return self._forward_compiled(x, edge_index, size)
        graph, dense, xs, dtype = self._inputs(x, edge_index)
        if size is not None and tuple(size) != (graph.num_nodes, graph.num_nodes):
            raise ValueError(f"size must be None or ({graph.num_nodes}, {graph.num_nodes}); bipartite graphs are not supported, got {tuple(size)}")
        weight = self.lin.weight
        plan = self.plan(graph, dense)
        self.last_plan, self.last_cache = plan, plan.scheme
        return gat_conv(
            None if xs is not None else dense, weight, self.att_src, self.att_dst, self.bias, self.adjacency(graph), self.heads,
            concat=self.concat, negative_slope=self.negative_slope, dropout=self.dropout,
            training=self.training, cache=plan.scheme, xs=xs,
        )

    def _forward_compiled(self, x, edge_index, size):
        """The forward as ``torch.compile`` traces it: the attention pattern from the
        ``corgnn::gat_adjacency`` custom op (validated and cached at run time, CSR),
        the caching scheme from the static sizes (:func:`corgnn.cost.gat.static_cache_name`),
        ``x`` dense."""
        _check_compiled_x(x, self.in_channels, self.lin.weight.dtype)
        if size is not None and (size[0] != x.size(0) or size[1] != x.size(0)):
            raise ValueError(f"size must be None or (n, n) with n = x.size(0); bipartite graphs are not supported, got {tuple(size)}")
        A = compiled_gat_adjacency(edge_index, x.size(0), add_self_loops=self.add_self_loops)
        training = self._backward_will_run(x.requires_grad)
        cache = static_cache_name(self.heads, self.out_channels, self.in_channels, self.cache, self.memory_budget, training)
        return gat_conv(
            x, self.lin.weight, self.att_src, self.att_dst, self.bias, A, self.heads,
            concat=self.concat, negative_slope=self.negative_slope, dropout=self.dropout, training=self.training, cache=cache,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, "
            f"dropout={self.dropout}, cache={self.cache!r}, format={self.format!r}"
        )


class GAT(nn.Module):
    """The paper's 2-layer GAT (Velickovic et al.; paper §"Evaluation"):
    ``dropout -> GATConv(heads, concat) -> ELU -> dropout -> GATConv(out_heads, mean)``.

    Args:
        in_channels, hidden_channels, out_channels: widths (``hidden_channels`` per head).
        heads: heads of the first layer (default 8), concatenated.
        out_heads: heads of the output layer (default 1), averaged.
        dropout: dropout on the input and hidden features and on both layers'
            attention coefficients in training (GAT on Cora uses 0.6; default 0.0,
            as in the paper's benchmarks).
        cache, format, memory_budget: passed to both layers.

    Shapes: ``x (n, in_channels)``, ``edge_index (2, q)`` or Graph -> ``(n, out_channels)``.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        heads: int = 8,
        out_heads: int = 1,
        dropout: float = 0.0,
        *,
        cache: str = "auto",
        format: str = "csr",
        memory_budget: int | None = None,
    ):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        _positive_int("hidden_channels", hidden_channels)
        _positive_int("heads", heads)
        self.dropout = dropout
        kw = dict(dropout=dropout, cache=cache, format=format, memory_budget=memory_budget)
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads, concat=True, **kw)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=out_heads, concat=False, **kw)
        self._graphs = GraphCache()

    def reset_parameters(self) -> None:
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        xs, graph = None, edge_index
        if not torch.compiler.is_compiling():  # (compiled: each layer takes A from the graph op)
            # one Graph (and one attention pattern) shared by both layers
            graph = self._graphs(edge_index, None, x.size(0) if isinstance(x, torch.Tensor) and x.dim() == 2 else None)
            xs = self.conv1.sparse_features(x, graph.num_nodes) if isinstance(x, torch.Tensor) else None
        if xs is not None:
            # NOTE: dropout of a zero is a zero, so dropping the sparse values is the
            # same distribution as dense dropout at ~1 % of the random numbers.
            x = xs.with_values(dropout(xs.val, self.dropout, self.training))
        else:
            x = dropout(x, self.dropout, self.training)
        x = nn.functional.elu(self.conv1(x, graph))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)

    def schemes(self) -> list[str]:
        """Caching scheme each layer used on its last call."""
        return [c.last_cache or "-" for c in (self.conv1, self.conv2)]
