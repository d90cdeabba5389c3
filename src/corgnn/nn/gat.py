"""GAT layer, the paper's 2-layer GAT model, and conversion from PyG's ``GATConv``."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros

from ..cost.gat import GATPlan, parse_cache, plan_gat, static_cache_name
from .._validate import check_edge_index, check_features, check_finite
from ..functional.gat import head_transform, gat_attention, gat_conv
from ..graph import (
    Graph, GraphCache, compiled_gat_adjacency, gat_edges, is_sparse_adjacency, sparse_adjacency_entries, sparse_attention_result,
)
from ..sparse.formats import CSR, SparseFormat
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import (
    CorgnnConv, FeatureCache, UnsupportedOption, check_compiled_x, check_message_passing_kwargs, dropout, hidden_elu, message_passing_unsupported,
    not_parameters, num_rows,
)

__all__ = ["GATConv", "GAT", "attention_result", "positive_int", "check_attention_arguments"]


def positive_int(name: str, v) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``v`` is a positive int (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")


def check_attention_arguments(in_channels, out_channels, heads, dropout, memory_budget, edge_dim=None):
    """Validate the constructor arguments the attention layers share (GAT, GATv2,
    TransformerConv) and return ``(in_channels, m_src, m_dst)``: ``in_channels`` an int
    or a ``(source, target)`` pair (then a tuple), the source and target widths.

    Raises:
        ValueError: naming the argument: not a positive int (``in_channels``,
            ``out_channels``, ``heads``, ``edge_dim``), a pair of other than two,
            ``dropout`` outside ``[0, 1)``, ``memory_budget`` not None or a
            non-negative int of bytes.
    """
    if isinstance(in_channels, (tuple, list)):
        if len(in_channels) != 2:
            raise ValueError(f"in_channels must be an int or a (source, target) pair, got {tuple(in_channels)}")
        in_channels = tuple(in_channels)
        positive_int("in_channels[0]", in_channels[0])
        positive_int("in_channels[1]", in_channels[1])
        m_src, m_dst = in_channels
    else:
        positive_int("in_channels", in_channels)
        m_src = m_dst = in_channels
    if edge_dim is not None:
        positive_int("edge_dim", edge_dim)
    positive_int("out_channels", out_channels)
    positive_int("heads", heads)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 0):
        raise ValueError(f"memory_budget must be None or a non-negative int (bytes), got {memory_budget!r}")
    return in_channels, m_src, m_dst


def _pair(x) -> bool:
    """Whether features ``x`` are PyG's bipartite ``(x_src, x_dst)`` pair."""
    return isinstance(x, (tuple, list))


class GATConv(CorgnnConv):
    r"""Multi-head graph attention layer with the paper's caching schemes
    (paper §"Analysis of the GAT Computation", Table 4; appendix "GAT Forward Pass").

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(a_{dst}^T Θ x_i + a_{src}^T Θ x_j)\big),
        \qquad x'_i = \big\Vert_{h} \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} Θ_h x_j + b

    A drop-in for ``torch_geometric.nn.GATConv``: the same parameters
    (``lin.weight (heads*out_channels, in_channels)`` or ``lin_src``/``lin_dst`` for
    bipartite ``in_channels``, ``att_src``/``att_dst (1, heads, out_channels)``,
    ``lin_edge``/``att_edge`` with ``edge_dim``, ``res`` with ``residual``, ``bias``;
    Glorot / zero init; the same ``state_dict`` keys), the same self-loop handling
    (existing loops removed, one added per node; duplicate edges kept; a sparse
    adjacency as PyG treats it), the same outputs, attention weights and
    gradients. The plain case runs the fused kernels: each training call keeps
    for backward what its caching scheme says (:mod:`corgnn.cost.gat`); the scheme
    used is recorded in ``last_cache`` (None for the other cases, see :meth:`forward`).

    Args (PyG's, in PyG's positional order with PyG's defaults):
        in_channels: m, input features per node, or ``(m_src, m_dst)``: separate
            source and target transforms ``lin_src``/``lin_dst`` (bipartite).
        out_channels: k, output features per head.
        heads: h, attention heads (default 1).
        concat: concatenate the heads' outputs to ``(n, h*k)`` (default) or average
            them to ``(n, k)``.
        negative_slope: LeakyReLU slope of the attention logits (default 0.2).
        dropout: dropout probability of the attention coefficients in training
            (default 0). The mask is redrawn in backward from an 8-byte seed.
        add_self_loops: remove existing and add one self-loop per node (default True).
        edge_dim: edge feature width (default None: no edge features); adds
            ``<lin_edge(edge_attr_e), att_edge>`` to each edge's attention logit.
        fill_value: edge features of the added self-loops (default ``"mean"`` of
            the node's incoming edges; a float/Tensor, or ``"add"``, ``"max"``, ...),
            as PyG's ``add_self_loops``.
        bias: learn an additive bias (default True).
        residual: add ``res(x)`` (``x_dst`` for bipartite inputs) to the output (default False).
        **kwargs: PyG's ``MessagePassing`` options where they change nothing
            (see :func:`corgnn.nn.gcn.check_message_passing_kwargs`).

    Keyword-only (corgnn's own):
        cache: ``"auto"`` (default: the fastest scheme within ``memory_budget``,
            i.e. "edge_weights" without a budget) or one of "none", "features",
            "node_attention", "edge_weights".
        format: sparse format of the attention pattern: ``"csr"`` (default;
            ``"auto"`` = csr) or ``"coo" | "csc" | "ell" | "hybrid"``.
        memory_budget: with ``cache="auto"``, the most bytes a call may keep for
            backward beyond its input and parameters (Table 4's extra memory).

    Shapes:
        - input: ``x (n, in_channels)`` float32/float64/bfloat16/float16 (half
          precision accumulates in float32 inside the kernels), a corgnn sparse
          matrix or a ``torch.sparse`` COO/CSR tensor, or a pair ``(x_src, x_dst)``;
          ``edge_index (2, q)`` int64, a :class:`corgnn.Graph`, or a sparse adjacency
          (``torch.sparse`` COO/CSR or ``torch_sparse.SparseTensor``, PyG's ``adj_t``)
        - output: ``(n, heads * out_channels)`` if ``concat`` else ``(n, out_channels)``, ``x``'s dtype

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index`` (float dtype,
        wrong shape, negative or out-of-range ids), ``x`` rows not matching the node
        count or columns not ``in_channels``, NaN/Inf in ``x``, a dtype or device
        mismatch, ``edge_attr`` of the wrong shape.
    """

    PYG_NAME = "GATConv"
    PYG_LINEARS = ("lin", "lin_src", "lin_dst", "lin_edge", "res")  # (all bias-free in PyG)

    @classmethod
    def pyg_params(cls, layer) -> dict:
        params = {f"{name}.weight": getattr(layer, name).weight for name in cls.PYG_LINEARS if getattr(layer, name, None) is not None}
        params.update(att_src=layer.att_src, att_dst=layer.att_dst, att_edge=getattr(layer, "att_edge", None), bias=layer.bias)
        return params

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        """Options of a PyG ``GATConv`` this layer does not support: a bias on one of its
        ``Linear`` transforms, those of :func:`~corgnn.nn.base.message_passing_unsupported`.
        Bipartite ``in_channels`` (``lin_src``/``lin_dst``), edge features (``edge_dim``,
        ``fill_value``) and ``residual=True`` are converted."""
        unsupported = message_passing_unsupported(layer)
        if getattr(layer, "lin", None) is None and (getattr(layer, "lin_src", None) is None or getattr(layer, "lin_dst", None) is None):
            unsupported.append("no lin nor lin_src/lin_dst")
            return unsupported
        if getattr(layer, "edge_dim", None) is not None and (getattr(layer, "lin_edge", None) is None or getattr(layer, "att_edge", None) is None):
            unsupported.append(f"edge_dim={layer.edge_dim} without lin_edge/att_edge")
        if getattr(layer, "residual", False) and getattr(layer, "res", None) is None:
            unsupported.append("residual=True without res")
        unsupported += not_parameters(cls.pyg_params(layer))
        for name in cls.PYG_LINEARS:
            lin = getattr(layer, name, None)
            if lin is not None and getattr(lin, "bias", None) is not None:
                unsupported.append(f"{name}.bias")
        return unsupported

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        if layer.lin is not None:
            in_channels = layer.lin.weight.size(1)  # (PyG keeps in_channels=-1 for a lazy layer)
        else:
            in_channels = (layer.lin_src.weight.size(1), layer.lin_dst.weight.size(1))
        lin_edge = getattr(layer, "lin_edge", None)
        return dict(
            in_channels=in_channels, out_channels=layer.out_channels, heads=layer.heads, concat=layer.concat,
            negative_slope=layer.negative_slope, dropout=layer.dropout, add_self_loops=layer.add_self_loops,
            edge_dim=None if lin_edge is None else lin_edge.weight.size(1), fill_value=getattr(layer, "fill_value", "mean"),
            bias=layer.bias is not None, residual=getattr(layer, "res", None) is not None,
        )

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        residual: bool = False,
        *,
        cache: str = "auto",
        format: str = "csr",
        memory_budget: int | None = None,
        **kwargs,
    ):
        super().__init__()
        check_message_passing_kwargs(type(self).__name__, kwargs, fixed=("node_dim",))
        bipartite = isinstance(in_channels, (tuple, list))
        in_channels, _, _ = check_attention_arguments(in_channels, out_channels, heads, dropout, memory_budget, edge_dim)
        if cache != "auto":
            cache = parse_cache(cache)
        check_format_name(format, allow_auto=True)
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, concat
        self.negative_slope, self.dropout = float(negative_slope), float(dropout)
        self.cache, self.format, self.add_self_loops, self.memory_budget = cache, format, bool(add_self_loops), memory_budget
        self.edge_dim, self.fill_value, self.residual = edge_dim, fill_value, bool(residual)
        # as PyG: one shared transform ``lin``, or ``lin_src``/``lin_dst`` for bipartite in_channels
        self.lin = self.lin_src = self.lin_dst = None
        if bipartite:
            self.lin_src = Linear(in_channels[0], heads * out_channels, bias=False, weight_initializer="glorot")
            self.lin_dst = Linear(in_channels[1], heads * out_channels, bias=False, weight_initializer="glorot")
        else:
            self.lin = Linear(in_channels, heads * out_channels, bias=False, weight_initializer="glorot")
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, heads * out_channels, bias=False, weight_initializer="glorot")
            self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total_out = heads * out_channels if concat else out_channels
        if residual:
            self.res = Linear(in_channels[1] if bipartite else in_channels, total_out, bias=False, weight_initializer="glorot")
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.empty(total_out)) if bias else None
        self._graphs = GraphCache()
        self._features = FeatureCache()
        self.last_plan: GATPlan | None = None
        self.last_cache: str | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                lin.reset_parameters()
        glorot(self.att_src)
        glorot(self.att_dst)
        glorot(self.att_edge)
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

    def forward(self, x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
        """PyG's ``GATConv.forward``.

        Args:
            x: ``(n, in_channels)`` dense float tensor, a corgnn sparse matrix (e.g.
                :class:`corgnn.sparse.CSR`) or a ``torch.sparse`` matrix of input
                features (no gradient flows to a sparse one); or PyG's bipartite pair
                ``(x_src (n_src, m_src), x_dst (n_dst, m_dst) or None)`` (dense).
            edge_index: ``(2, q)`` int tensor (row 0 = source, row 1 = target), a
                :class:`corgnn.Graph`, or a sparse adjacency in PyG's ``adj_t``
                convention (row = target): a ``torch.sparse`` COO/CSR tensor or a
                ``torch_sparse.SparseTensor``, self-loops handled as PyG does for it.
            edge_attr: ``(q, edge_dim)`` (or ``(q,)``) edge features, used with
                ``edge_dim`` (self-loops get ``fill_value``); ignored without, as PyG does.
            size: ``(n_src, n_dst)`` or None.
            return_attention_weights: if true, also return the attention
                coefficients as PyG does: ``(out, (edge_index, alpha))`` with the edges
                after self-loop handling in PyG's order and ``alpha (q', heads)``
                (differentiable); for a ``torch.sparse`` adjacency ``(out, (adj, alpha))``
                with ``adj`` holding ``alpha``, for a SparseTensor ``(out, adj)``.

        The plain case (one feature matrix, shared ``lin``, no edge features, no
        attention weights to return with autograd) runs the fused
        :class:`~corgnn.functional.gat.GATFunction` with its caching schemes; the others
        run :func:`~corgnn.functional.gat.gat_attention` (corgnn's differentiable
        sparse ops, ``last_plan``/``last_cache`` None).
        """
        flow = getattr(self, "flow", "source_to_target")
        if flow != "source_to_target":  # (set on the built layer: never silently ignored)
            raise UnsupportedOption(f"GATConv: flow={flow!r} is not supported by corgnn (only 'source_to_target'); use torch_geometric.nn.GATConv")
        want_alpha = bool(return_attention_weights)  # PyG: any truthy value
        use_edge = edge_attr is not None and self.lin_edge is not None  # PyG ignores edge_attr without edge_dim
        if torch.compiler.is_compiling():
            if want_alpha or use_edge or _pair(x) or self.lin is None or self.res is not None:
                raise ValueError(
                    "under torch.compile GATConv runs its fused form only: no return_attention_weights, "
                    "edge features, bipartite inputs or residual; run those eagerly"
                )
            return self._forward_compiled(x, edge_index, size)
        if _pair(x) or self.lin is None:
            return self._forward_general(x, edge_index, edge_attr if use_edge else None, size, want_alpha)
        graph, dense, xs, dtype = self._inputs(x, edge_index)
        n = graph.num_nodes
        if size is not None and tuple(size) != (n, n):
            raise ValueError(f"size must be None or ({n}, {n}) for one feature matrix (pass (x_src, x_dst) for a bipartite graph), got {tuple(size)}")
        weight = self.lin.weight
        bias = self.bias if self.res is None else None  # (PyG adds the residual before the bias)
        if use_edge:
            if graph.sparse_input is not None:
                raise ValueError("edge_attr with a sparse adjacency is not supported (nor by PyG with self-loops); pass edge_index")
            A = graph.gat_adjacency(add_self_loops=self.add_self_loops)
            ei, perm = graph.gat_edges(add_self_loops=self.add_self_loops)
            alpha_edge = self._edge_logits(graph.edge_index, edge_attr, n if self.add_self_loops else None, weight)[perm]
            M = head_transform(None if xs is not None else dense, weight, self.heads, xs)
            out3, alpha = gat_attention(
                M, M, self.att_src, self.att_dst, A, negative_slope=self.negative_slope,
                dropout=self.dropout, training=self.training, alpha_edge=alpha_edge,
            )
            out = out3.flatten(1) if self.concat else out3.mean(1)
            if bias is not None:
                out = out + bias
            self.last_plan = self.last_cache = None
        else:
            plan = self.plan(graph, dense)
            self.last_plan, self.last_cache = plan, plan.scheme
            # (attention weights map back to PyG's edge order from the CSR's)
            A = graph.gat_adjacency(add_self_loops=self.add_self_loops) if want_alpha else self.adjacency(graph)
            out = gat_conv(
                None if xs is not None else dense, weight, self.att_src, self.att_dst, bias, A, self.heads,
                concat=self.concat, negative_slope=self.negative_slope, dropout=self.dropout,
                training=self.training, cache=plan.scheme, xs=xs, return_attention_weights=want_alpha,
            )
            if want_alpha:
                out, alpha = out
        if self.res is not None:
            out = out + (spmm(xs, self.res.weight.t()) if xs is not None else self.res(dense))
            if self.bias is not None:
                out = out + self.bias
        if want_alpha:
            ei, perm = graph.gat_edges(add_self_loops=self.add_self_loops)
            return out, attention_result(ei, perm, alpha, graph.sparse_input, (n, n))
        return out

    def _edge_logits(self, edge_index: torch.Tensor, edge_attr, num_loops: int | None, like: torch.Tensor) -> torch.Tensor:
        """PyG's edge term of the attention logits, ``<W_e edge_attr_e, a_edge>`` per
        head ``(q', heads)``, for the edges in PyG's order: ``edge_index``'s with its
        self-loops removed and ``num_loops`` loops appended whose features PyG's
        ``add_self_loops`` fills per ``fill_value`` (``None``: no loop handling)."""
        from torch_geometric.utils import add_self_loops, remove_self_loops

        q = edge_index.size(1)
        if not isinstance(edge_attr, torch.Tensor) or not edge_attr.is_floating_point():
            raise TypeError(f"edge_attr must be a floating tensor of shape ({q}, {self.edge_dim}), got {getattr(edge_attr, 'dtype', type(edge_attr).__name__)}")
        shape_ok = edge_attr.dim() == 2 and edge_attr.size(1) == self.edge_dim or edge_attr.dim() == 1 and self.edge_dim == 1
        if not shape_ok or edge_attr.size(0) != q:
            raise ValueError(f"edge_attr must have shape ({q}, {self.edge_dim}) (one row per edge), got {tuple(edge_attr.shape)}")
        if edge_attr.dtype != like.dtype or edge_attr.device != like.device:
            raise TypeError(f"edge_attr is {edge_attr.dtype} on {edge_attr.device} but the layer's parameters are {like.dtype} on {like.device}")
        check_finite("edge_attr", edge_attr)
        if num_loops is not None:
            ei, edge_attr = remove_self_loops(edge_index, edge_attr)
            _, edge_attr = add_self_loops(ei, edge_attr, fill_value=self.fill_value, num_nodes=num_loops)
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        e = self.lin_edge(edge_attr).unflatten(1, (self.heads, self.out_channels))
        return (e * self.att_edge).sum(dim=-1)

    def _forward_general(self, x, edge_index, edge_attr, size, want_alpha: bool):
        """Bipartite ``(x_src, x_dst)`` inputs and layers with ``lin_src``/``lin_dst``
        (bipartite ``in_channels``), through :func:`~corgnn.functional.gat.gat_attention`,
        step for step PyG's computation."""
        H, C = self.heads, self.out_channels
        pair = _pair(x)
        if pair:
            if len(x) != 2:
                raise ValueError(f"x must be a tensor or a pair (x_src, x_dst), got a {type(x).__name__} of {len(x)}")
            x_src, x_dst = x
        else:
            x_src = x_dst = x
        lin_src, lin_dst = (self.lin, self.lin) if self.lin is not None else (self.lin_src, self.lin_dst)
        m_src, m_dst = lin_src.weight.size(1), lin_dst.weight.size(1)
        like = lin_src.weight
        for name, t, m in (("x_src" if pair else "x", x_src, m_src), ("x_dst", x_dst if pair else None, m_dst)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                raise TypeError(f"{name} must be a dense torch.Tensor here (bipartite inputs / in_channels), got {getattr(t, 'layout', type(t).__name__)}")
            check_features(name, t, t.size(0) if t.dim() == 2 else -1, m)
            if t.dtype != like.dtype:
                raise TypeError(f"{name} is {t.dtype} but the layer's parameters are {like.dtype}; call .to({t.dtype}) on the module")
            if t.device != like.device:
                raise ValueError(f"{name} is on {t.device} but the layer's parameters are on {like.device}")
        if not pair and x_src.size(1) != m_dst:
            raise ValueError(f"x has {x_src.size(1)} columns but the layer's in_channels are {self.in_channels} (source, target)")
        n_src = x_src.size(0)
        if not pair:  # one graph, separate source and target transforms
            graph = self._graphs(edge_index, None, n_src)
            if graph.device != x_src.device:
                raise ValueError(f"x is on {x_src.device} but edge_index is on {graph.device}")
            n_dst = n_src
            if size is not None and tuple(size) != (n_src, n_src):
                raise ValueError(f"size must be None or ({n_src}, {n_src}) for one feature matrix, got {tuple(size)}")
            num_loops = n_src if self.add_self_loops else None
            raw, sparse_input = graph.edge_index, graph.sparse_input
            A = graph.gat_adjacency(add_self_loops=self.add_self_loops)
            ei, perm = graph.gat_edges(add_self_loops=self.add_self_loops)
        else:
            bad = size is not None and (len(size) != 2 or size[0] is not None and size[0] != n_src)
            if not bad and size is not None and x_dst is not None:
                bad = size[1] is not None and size[1] != x_dst.size(0)
            if bad:
                raise ValueError(f"size {tuple(size)} does not match x_src ({n_src} rows) and x_dst")
            sparse_adj = is_sparse_adjacency(edge_index)
            if x_dst is not None:
                n_dst = x_dst.size(0)
            elif size is not None and size[1] is not None:
                n_dst = size[1]
            elif sparse_adj:  # PyG: the target count is the adjacency's rows (adj_t (n_dst, n_src))
                n_dst = int(edge_index.size(0))
            else:
                n_dst = n_src
            if self.add_self_loops:  # PyG: loops for the nodes both sides have
                if size is not None:
                    num_loops = min(n_src if size[0] is None else size[0], n_dst if size[1] is None else size[1])
                else:
                    num_loops = n_src if x_dst is None and not sparse_adj else min(n_src, n_dst)
            else:
                num_loops = None
            raw, sparse_input, loops = self.bipartite_edges(edge_index, n_src, n_dst, x_src.device)
            ei = gat_edges(raw, n_src, n_dst, num_loops, loops)
            perm = torch.argsort(ei[1] * max(n_src, 1) + ei[0], stable=True)  # CSR.from_coo's entry order
            A = CSR.from_coo(ei[1], ei[0], None, (n_dst, n_src))
        alpha_edge = None
        if edge_attr is not None:
            if sparse_input is not None:
                raise ValueError("edge_attr with a sparse adjacency is not supported (nor by PyG with self-loops); pass edge_index")
            alpha_edge = self._edge_logits(raw, edge_attr, num_loops, like)[perm]
        M_src = lin_src(x_src).unflatten(1, (H, C))
        M_dst = None if x_dst is None else lin_dst(x_dst).unflatten(1, (H, C))
        out3, alpha = gat_attention(
            M_src, M_dst, self.att_src, self.att_dst, A, negative_slope=self.negative_slope,
            dropout=self.dropout, training=self.training, alpha_edge=alpha_edge,
        )
        out = out3.flatten(1) if self.concat else out3.mean(1)
        if self.res is not None and x_dst is not None:
            out = out + self.res(x_dst)
        if self.bias is not None:
            out = out + self.bias
        self.last_plan = self.last_cache = None
        if want_alpha:
            return out, attention_result(ei, perm, alpha, sparse_input, (n_dst, n_src))
        return out

    @staticmethod
    def bipartite_edges(edge_index, n_src: int, n_dst: int, device):
        """``(edge_index (2, q) int64, sparse_input, loop mode)`` of a bipartite graph
        given as ``edge_index`` or a sparse ``adj_t (n_dst, n_src)``, validated."""
        if isinstance(edge_index, Graph):
            raise ValueError("a corgnn.Graph is one node set; pass edge_index (2, q) for bipartite (x_src, x_dst) inputs")
        if is_sparse_adjacency(edge_index):
            kind, row, col, _, shape = sparse_adjacency_entries(edge_index)
            if shape != (n_dst, n_src):
                raise ValueError(f"the sparse adjacency (adj_t) must be (n_dst, n_src) = ({n_dst}, {n_src}), got {shape}")
            ei, sparse_input, loops = torch.stack([col, row]), (kind, getattr(edge_index, "layout", None)), ("add" if kind == "torch" else "set")
        else:
            check_edge_index(edge_index, None)
            ei, sparse_input, loops = edge_index.long(), None, "remaining"
            if ei.size(1):
                if int(ei[0].max()) >= n_src:
                    raise ValueError(f"edge_index holds source id {int(ei[0].max())} but x_src has {n_src} rows; ids must be in [0, n_src)")
                if int(ei[1].max()) >= n_dst:
                    raise ValueError(f"edge_index holds target id {int(ei[1].max())} but there are {n_dst} target nodes; ids must be in [0, n_dst)")
        if ei.device != device:
            raise ValueError(f"x is on {device} but edge_index is on {ei.device}")
        return ei, sparse_input, loops

    def _forward_compiled(self, x, edge_index, size):
        """The forward as ``torch.compile`` traces it: the attention pattern from the
        ``corgnn::gat_adjacency`` custom op (validated and cached at run time, CSR),
        the caching scheme from the static sizes (:func:`corgnn.cost.gat.static_cache_name`),
        ``x`` dense."""
        check_compiled_x(x, self.in_channels, self.lin.weight.dtype)
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


def attention_result(edge_index: torch.Tensor, perm: torch.Tensor, alpha: torch.Tensor, sparse_input, shape: tuple[int, int]):
    """What PyG's ``GATConv`` returns beside ``out`` with ``return_attention_weights``:
    ``(edge_index, alpha)`` in PyG's edge order (``alpha`` comes in the CSR's entry
    order; ``perm`` maps CSR entries to edges), or its sparse forms
    (:func:`corgnn.graph.sparse_attention_result`)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    alpha = alpha[inv]
    if sparse_input is not None:
        return sparse_attention_result(sparse_input, edge_index, alpha, shape)
    return edge_index, alpha


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
        positive_int("hidden_channels", hidden_channels)
        positive_int("heads", heads)
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
            if isinstance(x, torch.Tensor) and x.layout != torch.strided:  # torch.sparse features
                x = self.conv1._torch_sparse_features(x)
            # one Graph (and one attention pattern) shared by both layers
            graph = self._graphs(edge_index, None, num_rows(x))
            xs = self.conv1.sparse_features(x, graph.num_nodes) if isinstance(x, torch.Tensor) else x if isinstance(x, SparseFormat) else None
        if xs is not None:
            # NOTE: dropout of a zero is a zero, so dropping the sparse values is the
            # same distribution as dense dropout at ~1 % of the random numbers.
            x = xs.with_values(dropout(xs.val, self.dropout, self.training))
        else:
            x = dropout(x, self.dropout, self.training)
        x = hidden_elu(self.conv1(x, graph))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)

    def schemes(self) -> list[str]:
        """Caching scheme each layer used on its last call."""
        return [c.last_cache or "-" for c in (self.conv1, self.conv2)]
