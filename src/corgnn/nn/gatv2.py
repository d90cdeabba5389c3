"""GATv2 layer (fused attention with caching schemes), a 2-layer GATv2 model, and
conversion from PyG's ``GATv2Conv``."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import glorot, zeros

from .._validate import check_features
from ..cost.gat import GATPlan
from ..cost.gatv2 import parse_gatv2_cache, plan_gatv2
from ..functional.gatv2 import gatv2_conv
from ..graph import Graph, GraphCache, gat_edges
from ..sparse.formats import CSR, SparseFormat
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import (
    CorgnnConv, FeatureCache, UnsupportedOption, check_message_passing_kwargs, dropout, hidden_elu, message_passing_unsupported, not_parameters,
)
from .gat import GATConv, attention_result, check_attention_arguments, positive_int

__all__ = ["GATv2Conv", "GATv2"]



class GATv2Conv(CorgnnConv):
    r"""Multi-head GATv2 attention layer (Brody et al., "How Attentive are Graph
    Attention Networks?", ICLR 2022), fused and with caching schemes
    (:mod:`corgnn.cost.gatv2`, after the paper's Table 4 for GAT).

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\big(a^T \mathrm{LeakyReLU}(Θ_s x_i + Θ_t x_j)\big),
        \qquad x'_i = \big\Vert_{h} \sum_{j \in N(i) \cup \{i\}} \alpha^h_{ij} Θ_t x_j + b

    with ``Θ_t x_j = lin_l(x_j)`` (source side ``XL``) and ``Θ_s x_i = lin_r(x_i)``
    (target side ``XR``), as PyG. A drop-in for ``torch_geometric.nn.GATv2Conv``: the
    same parameters (``lin_l``/``lin_r`` ``(heads*out_channels, in)`` with biases when
    ``bias``, one module with ``share_weights``; ``att (1, heads, out_channels)``;
    ``res`` with ``residual``; ``bias``; Glorot / zero init; the same ``state_dict``
    keys), the same self-loop handling (existing loops removed, one added per node,
    duplicate edges kept), the same outputs, attention weights and gradients.

    Per destination row one kernel computes each edge's score, the softmax (online)
    and the weighted sum of the neighbours' ``XL`` rows, never storing PyG's
    ``(q, heads, out_channels)`` per-edge values; the backward is explicit
    (:class:`~corgnn.functional.gatv2.GATv2Function`), and each training call keeps
    what its caching scheme says (``last_cache``; None for the attention-weight path,
    see :meth:`forward`).

    Args (PyG's, in PyG's positional order with PyG's defaults):
        in_channels: m, input features per node, or ``(m_src, m_dst)`` (bipartite).
        out_channels: k, output features per head.
        heads: h, attention heads (default 1).
        concat: concatenate the heads' outputs to ``(n, h*k)`` (default) or average them.
        negative_slope: LeakyReLU slope inside the score (default 0.2).
        dropout: dropout probability of the attention coefficients in training
            (default 0); the mask is the GAT kernels' counter-based one, redrawn in
            backward from an 8-byte seed.
        add_self_loops: remove existing and add one self-loop per node (default True).
        edge_dim: must be None: edge features enter every edge's ``(h, k)``
            pre-activation, which the fused kernels do not take; ``optimize()`` leaves
            such layers to PyG (:class:`UnsupportedOption` here).
        fill_value: PyG's self-loop edge-feature fill (unused without ``edge_dim``).
        bias: learn the biases of ``lin_l``/``lin_r`` and the output bias (default True).
        share_weights: ``lin_r`` is ``lin_l`` (default False); with one input ``XR = XL``
            is computed and kept once.
        residual: add ``res(x)`` (``x_dst`` for bipartite inputs) to the output (default False).
        **kwargs: PyG's ``MessagePassing`` options where they change nothing
            (see :func:`corgnn.nn.base.check_message_passing_kwargs`).

    Keyword-only (corgnn's own):
        cache: ``"auto"`` (default: the fastest scheme within ``memory_budget``, i.e.
            "edge_weights" without a budget) or "none", "features", "edge_weights".
        format: sparse format of the attention pattern (``"csr"`` default, ``"auto"`` =
            csr, or ``"coo" | "csc" | "ell" | "hybrid"``; one feature matrix only).
        memory_budget: with ``cache="auto"``, the most bytes a call may keep for
            backward beyond its input and parameters.

    Shapes:
        - input: ``x (n, in_channels)`` float32/float64 (the Numba kernels; other
          dtypes run the torch reference), a corgnn sparse matrix or a ``torch.sparse``
          one (constant features at most :data:`~corgnn.nn.base.SPARSE_FEATURE_DENSITY`
          non-zero are used sparse, as GATConv does: SpMMs replace the transforms'
          GEMMs; no gradient flows to sparse features), or a pair ``(x_src (n_src, m_src), x_dst
          (n_dst, m_dst))``; ``edge_index (2, q)`` int64, a :class:`corgnn.Graph`, or a
          sparse adjacency (``torch.sparse`` COO/CSR, ``torch_sparse.SparseTensor``)
        - output: ``(n_dst, heads * out_channels)`` if ``concat`` else ``(n_dst, out_channels)``

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index``, ``x`` rows not
        matching the node count or columns not ``in_channels``, NaN/Inf in ``x``, a
        dtype or device mismatch, ``x_dst=None``, ``edge_attr`` given.
    """

    PYG_NAME = "GATv2Conv"
    PYG_LINEARS = ("lin_l", "lin_r", "res")

    @classmethod
    def pyg_params(cls, layer) -> dict:
        params = {}
        for name in cls.PYG_LINEARS:
            lin = getattr(layer, name, None)
            if lin is not None:
                params[f"{name}.weight"] = lin.weight
                params[f"{name}.bias"] = getattr(lin, "bias", None)
        params.update(att=layer.att, bias=layer.bias)
        return params

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        """Options of a PyG ``GATv2Conv`` this layer leaves to PyG: ``edge_dim`` (edge
        features add a per-edge ``(h, k)`` term the fused kernels do not take), a
        ``res`` with a bias, ``lin_l``/``lin_r`` biases not matching ``bias``, a
        ``share_weights`` layer whose ``lin_r`` is not ``lin_l``, non-Parameter
        weights and :func:`~corgnn.nn.base.message_passing_unsupported`."""
        unsupported = message_passing_unsupported(layer)
        if getattr(layer, "edge_dim", None) is not None or getattr(layer, "lin_edge", None) is not None:
            unsupported.append(f"edge_dim={getattr(layer, 'edge_dim', None)} (edge features)")
        if getattr(layer, "lin_l", None) is None or getattr(layer, "lin_r", None) is None:
            unsupported.append("no lin_l/lin_r")
            return unsupported
        if bool(getattr(layer, "share_weights", False)) != (layer.lin_r is layer.lin_l):
            unsupported.append("share_weights does not match lin_r is lin_l")
        has_bias = layer.bias is not None
        for name in ("lin_l", "lin_r"):
            if (getattr(layer, name).bias is not None) != has_bias:
                unsupported.append(f"{name}.bias {'missing' if has_bias else 'present'} with bias={has_bias}")
        if getattr(layer, "res", None) is not None and getattr(layer.res, "bias", None) is not None:
            unsupported.append("res.bias")
        return unsupported + not_parameters(cls.pyg_params(layer))

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        m_l, m_r = layer.lin_l.weight.size(1), layer.lin_r.weight.size(1)  # (PyG keeps in_channels=-1 for a lazy layer)
        in_channels = (m_l, m_r) if isinstance(layer.in_channels, (tuple, list)) else m_l
        return dict(
            in_channels=in_channels, out_channels=layer.out_channels, heads=layer.heads, concat=layer.concat,
            negative_slope=layer.negative_slope, dropout=layer.dropout, add_self_loops=layer.add_self_loops,
            bias=layer.bias is not None, share_weights=bool(layer.share_weights), residual=getattr(layer, "res", None) is not None,
        )

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        *,
        cache: str = "auto",
        format: str = "csr",
        memory_budget: int | None = None,
        **kwargs,
    ):
        super().__init__()
        check_message_passing_kwargs(type(self).__name__, kwargs, fixed=("node_dim",))
        if edge_dim is not None:
            raise UnsupportedOption(
                "GATv2Conv: edge_dim (edge features) is not supported by corgnn: they add a per-edge (q, heads, out_channels) "
                "term the fused kernels do not take; use torch_geometric.nn.GATv2Conv (optimize() leaves such layers to PyG)"
            )
        in_channels, m_l, m_r = check_attention_arguments(in_channels, out_channels, heads, dropout, memory_budget)
        if cache != "auto":
            cache = parse_gatv2_cache(cache)
        check_format_name(format, allow_auto=True)
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, concat
        self.negative_slope, self.dropout = float(negative_slope), float(dropout)
        self.add_self_loops, self.edge_dim, self.fill_value = bool(add_self_loops), None, fill_value
        self.share_weights, self.residual = bool(share_weights), bool(residual)
        self.cache, self.format, self.memory_budget = cache, format, memory_budget
        self.lin_l = Linear(m_l, heads * out_channels, bias=bias, weight_initializer="glorot")
        self.lin_r = self.lin_l if share_weights else Linear(m_r, heads * out_channels, bias=bias, weight_initializer="glorot")
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = None
        total_out = heads * out_channels if concat else out_channels
        if residual:
            self.res = Linear(m_r, total_out, bias=False, weight_initializer="glorot")
        else:
            self.register_parameter("res", None)
        self.bias = nn.Parameter(torch.empty(total_out)) if bias else None
        self._graphs = GraphCache()
        self._features = FeatureCache()
        self.last_plan: GATPlan | None = None
        self.last_cache: str | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()
        if self.res is not None:
            self.res.reset_parameters()
        glorot(self.att)
        zeros(self.bias)

    def _dtype_param(self) -> torch.Tensor:
        return self.lin_l.weight

    def adjacency(self, graph: Graph) -> SparseFormat:
        """The attention pattern of ``graph`` in this layer's format (cached on the Graph)."""
        fmt = "csr" if self.format == "auto" else self.format
        return graph.gat_adjacency(add_self_loops=self.add_self_loops, format=fmt)

    def plan(self, graph: Graph, x) -> GATPlan:
        """The caching scheme this layer would use for ``x`` on ``graph`` now, with costs
        (:func:`corgnn.cost.gatv2.plan_gatv2`; ``table()`` shows every scheme)."""
        A = self.adjacency(graph)
        training = self._backward_will_run(isinstance(x, torch.Tensor) and x.requires_grad)
        m = self.in_channels if isinstance(self.in_channels, int) else self.in_channels[0]
        return plan_gatv2(
            graph.num_nodes, A.nnz, self.heads, self.out_channels, m, cache=self.cache, memory_budget=self.memory_budget,
            training=training, value_bytes=self.lin_l.weight.element_size(), shared=self.share_weights,
        )

    def _call(self, x_l, x_r, A, want_alpha: bool, cache: str, xs: SparseFormat | None = None):
        """Run the layer's math: ``x_r=None`` means the target features are ``x_l``
        (``xs``: the one input as sparse features, ``x_l`` None)."""
        shared = self.share_weights and x_r is None
        return gatv2_conv(
            x_l, x_r, self.lin_l.weight, self.lin_l.bias, None if shared else self.lin_r.weight, None if shared else self.lin_r.bias,
            self.att, self.bias if self.res is None else None, A, self.heads, concat=self.concat, negative_slope=self.negative_slope,
            dropout=self.dropout, training=self.training, cache=cache, return_attention_weights=want_alpha, xs=xs,
        )

    def _finish(self, out, x_target, xs: SparseFormat | None = None):
        """PyG adds the residual, then the bias (the fused call added the bias already
        when there is no residual)."""
        if self.res is not None:
            out = out + (spmm(xs, self.res.weight.t()) if xs is not None else self.res(x_target))
            if self.bias is not None:
                out = out + self.bias
        return out

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        """PyG's ``GATv2Conv.forward``.

        Args:
            x: ``(n, in_channels)`` dense float tensor, a corgnn sparse matrix or a
                ``torch.sparse`` one, or PyG's bipartite pair ``(x_src (n_src, m_src), x_dst
                (n_dst, m_dst))``.
            edge_index: ``(2, q)`` int tensor (row 0 = source), a :class:`corgnn.Graph`
                (one node set), or a sparse adjacency in PyG's ``adj_t`` convention.
            edge_attr: must be None (edge features are left to PyG).
            return_attention_weights: if truthy, also return the attention coefficients
                as PyG does: ``(out, (edge_index, alpha))`` with the edges after self-loop
                handling in PyG's order and ``alpha (q', heads)`` (differentiable), or
                the sparse forms for a sparse adjacency.

        With autograd or dropout, attention weights come from
        :func:`~corgnn.functional.gatv2.gatv2_attention` (PyG's per-edge computation;
        ``last_cache`` None); every other call runs the fused kernels.
        """
        flow = getattr(self, "flow", "source_to_target")
        if flow != "source_to_target":
            raise UnsupportedOption(f"GATv2Conv: flow={flow!r} is not supported by corgnn (only 'source_to_target'); use torch_geometric.nn.GATv2Conv")
        if edge_attr is not None:
            raise ValueError("GATv2Conv: edge_attr needs edge_dim, which corgnn leaves to PyG (torch_geometric.nn.GATv2Conv); pass edge_attr=None")
        want_alpha = bool(return_attention_weights)
        if isinstance(x, (tuple, list)) or isinstance(self.in_channels, tuple):
            return self._forward_bipartite(x, edge_index, want_alpha)
        graph, dense, xs, _ = self._inputs(x, edge_index)
        n = graph.num_nodes
        plan = self.plan(graph, dense)
        if want_alpha:  # (attention weights map back to PyG's edge order from the CSR's)
            A = graph.gat_adjacency(add_self_loops=self.add_self_loops)
        else:
            A = self.adjacency(graph)
        out = self._call(None if xs is not None else dense, None, A, want_alpha, plan.scheme, xs)
        grad_path = want_alpha and (plan.training or (self.training and self.dropout > 0))
        self.last_plan, self.last_cache = (None, None) if grad_path else (plan, plan.scheme)
        if want_alpha:
            out, alpha = out
        out = self._finish(out, dense, xs)
        if want_alpha:
            ei, perm = graph.gat_edges(add_self_loops=self.add_self_loops)
            return out, attention_result(ei, perm, alpha, graph.sparse_input, (n, n))
        return out

    def _forward_bipartite(self, x, edge_index, want_alpha: bool):
        """Bipartite ``(x_src, x_dst)`` inputs, or bipartite ``in_channels`` with one
        feature matrix: the attention pattern ``(n_dst, n_src)`` built per call (PyG's
        loops: one per node both sides have), CSR; the same fused kernels."""
        m_l, m_r = self.in_channels if isinstance(self.in_channels, tuple) else (self.in_channels,) * 2
        pair = isinstance(x, (tuple, list))
        if pair:
            if len(x) != 2:
                raise ValueError(f"x must be a tensor or a pair (x_src, x_dst), got a {type(x).__name__} of {len(x)}")
            x_src, x_dst = x
            if x_dst is None:
                raise ValueError("GATv2Conv needs target features: x = (x_src, x_dst) with x_dst a tensor, got x_dst=None (as PyG)")
        else:
            x_src = x_dst = x
        like = self.lin_l.weight
        for name, t, m in (("x_src" if pair else "x", x_src, m_l), ("x_dst" if pair else "x", x_dst, m_r)):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                raise TypeError(f"{name} must be a dense torch.Tensor, got {getattr(t, 'layout', type(t).__name__)}")
            check_features(name, t, t.size(0) if t.dim() == 2 else -1, m)
            if t.dtype != like.dtype:
                raise TypeError(f"{name} is {t.dtype} but the layer's parameters are {like.dtype}; call .to({t.dtype}) on the module")
            if t.device != like.device:
                raise ValueError(f"{name} is on {t.device} but the layer's parameters are on {like.device}")
        n_src, n_dst = x_src.size(0), x_dst.size(0)
        raw, sparse_input, loops = GATConv.bipartite_edges(edge_index, n_src, n_dst, x_src.device)
        ei = gat_edges(raw, n_src, n_dst, min(n_src, n_dst) if self.add_self_loops else None, loops)
        perm = torch.argsort(ei[1] * max(n_src, 1) + ei[0], stable=True)  # CSR.from_coo's entry order
        A = CSR.from_coo(ei[1], ei[0], None, (n_dst, n_src))
        training = self._backward_will_run(x_src.requires_grad or x_dst.requires_grad)
        plan = plan_gatv2(
            n_dst, A.nnz, self.heads, self.out_channels, m_l, cache=self.cache, memory_budget=self.memory_budget,
            training=training, value_bytes=like.element_size(),
        )
        out = self._call(x_src, x_dst if pair else None, A, want_alpha, plan.scheme)
        grad_path = want_alpha and (training or (self.training and self.dropout > 0))
        self.last_plan, self.last_cache = (None, None) if grad_path else (plan, plan.scheme)
        if want_alpha:
            out, alpha = out
        out = self._finish(out, x_dst)
        if want_alpha:
            return out, attention_result(ei, perm, alpha, sparse_input, (n_dst, n_src))
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, "
            f"share_weights={self.share_weights}, dropout={self.dropout}, cache={self.cache!r}, format={self.format!r}"
        )


class GATv2(nn.Module):
    """A 2-layer GATv2 model, the GAT recipe (:class:`corgnn.nn.GAT`) with GATv2 layers:
    ``dropout -> GATv2Conv(heads, concat) -> ELU -> dropout -> GATv2Conv(out_heads, mean)``.

    Args:
        in_channels, hidden_channels, out_channels: widths (``hidden_channels`` per head).
        heads: heads of the first layer (default 8), concatenated.
        out_heads: heads of the output layer (default 1), averaged.
        dropout: dropout on the input and hidden features and on both layers'
            attention coefficients in training (default 0.0).
        share_weights: passed to both layers.
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
        share_weights: bool = False,
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
        kw = dict(dropout=dropout, share_weights=share_weights, cache=cache, format=format, memory_budget=memory_budget)
        self.conv1 = GATv2Conv(in_channels, hidden_channels, heads=heads, concat=True, **kw)
        self.conv2 = GATv2Conv(hidden_channels * heads, out_channels, heads=out_heads, concat=False, **kw)

    def reset_parameters(self) -> None:
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        xs = None
        if isinstance(x, torch.Tensor) and x.layout == torch.strided and not torch.compiler.is_compiling():
            xs = self.conv1.sparse_features(x)  # (validated once per tensor version; None unless sparse and constant)
        if xs is not None:
            # NOTE: dropout of a zero is a zero, so dropping the sparse values is the
            # same distribution as dense dropout (as corgnn.nn.GAT does).
            x = xs.with_values(dropout(xs.val, self.dropout, self.training))
        else:
            x = dropout(x, self.dropout, self.training)
        x = hidden_elu(self.conv1(x, edge_index))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index)

    def schemes(self) -> list[str]:
        """Caching scheme each layer used on its last call."""
        return [c.last_cache or "-" for c in (self.conv1, self.conv2)]
