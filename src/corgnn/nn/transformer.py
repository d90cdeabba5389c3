"""Graph transformer layer (PyG's ``TransformerConv``; Shi et al. 2021, "Masked Label
Prediction: Unified Message Passing Model for Semi-Supervised Classification", UniMP)
with fused, cached attention, a 2-layer model, and conversion from PyG."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear

from .._validate import check_edge_index, check_features, check_finite
from ..cost.transformer import TransformerPlan, parse_transformer_cache, plan_transformer
from ..functional.transformer import dot_attention, project_heads, transformer_conv
from ..graph import GraphCache, is_sparse_adjacency
from ..sparse.formats import CSR, SparseFormat
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import CorgnnConv, FeatureCache, UnsupportedOption, check_message_passing_kwargs, message_passing_unsupported, not_parameters
from .gat import GAT, check_attention_arguments, positive_int

__all__ = ["TransformerConv", "Transformer"]



class TransformerConv(CorgnnConv):
    r"""Graph transformer operator (Shi et al. 2021, UniMP), a drop-in for
    ``torch_geometric.nn.TransformerConv`` with fused attention kernels and caching
    schemes (:mod:`corgnn.cost.transformer`).

    .. math::
        \alpha_{ij} = \mathrm{softmax}_j\Big(\frac{(W_q x_i + b_q)^T (W_k x_j + b_k)}{\sqrt{c}}\Big),
        \qquad x'_i = W_s x_i + b_s + \big\Vert_h \sum_{j \in N(i)} \alpha^h_{ij} (W_v x_j + b_v)

    (heads concatenated, or averaged with ``concat=False``); with ``beta``,
    ``x'_i = \beta_i r_i + (1 - \beta_i) m_i``, ``\beta_i = \sigma(w_\beta^T [m_i, r_i, m_i - r_i])``
    for the aggregate ``m_i`` and the root term ``r_i = W_s x_i + b_s``.

    The same parameters as PyG (``lin_query``, ``lin_key``, ``lin_value``, ``lin_skip``:
    ``Linear``s with biases when ``bias``; ``lin_beta (1, 3 h c)`` or ``(1, 3 c)`` without
    a bias when ``beta``; PyG's initialisation and ``state_dict`` keys), the same edges
    (no self-loops added, duplicates kept), outputs, attention weights and gradients.
    The attention (scores, row softmax, dropout, aggregation) runs as one fused
    autograd Function (:class:`~corgnn.functional.transformer.TransformerFunction`):
    one row walk per destination (the row's softmax fused), an explicit backward, never the
    ``(q, h, c)`` per-edge messages PyG materialises; each training call keeps for
    backward what its caching scheme says (``last_plan``, ``last_cache``). The root
    and ``beta`` terms are dense torch ops.

    Args (PyG's, in PyG's order with PyG's defaults):
        in_channels: m, input features per node, or ``(m_src, m_dst)`` (bipartite:
            keys and values from the source features, queries and the root term
            from the target features).
        out_channels: c, output features per head.
        heads: h, attention heads (default 1).
        concat: concatenate the heads to ``(n, h*c)`` (default) or average them to ``(n, c)``.
        beta: gate the root term with ``lin_beta`` (default False; only with ``root_weight``).
        dropout: dropout probability of the attention coefficients in training
            (default 0). The mask is a counter-based hash of each entry and an 8-byte
            seed (:mod:`corgnn.sparse.rng`), redrawn in backward.
        edge_dim: edge feature width (default None: none); ``lin_edge (h*c, edge_dim)``
            (no bias, as PyG) maps ``edge_attr`` to a term added to every key and value
            (computed in the kernels from ``edge_attr``, never as ``(q, h, c)``).
        bias: biases on ``lin_query``/``lin_key``/``lin_value``/``lin_skip`` (default True).
        root_weight: add the root term ``lin_skip(x_i)`` (default True).
        **kwargs: PyG's ``MessagePassing`` options where they change nothing
            (see :func:`corgnn.nn.base.check_message_passing_kwargs`).

    Keyword-only (corgnn's own):
        cache: ``"auto"`` (default: the fastest scheme within ``memory_budget``) or
            one of "none", "features", "row_stats", "edge_weights".
        format: sparse format of the attention pattern, ``"csr"`` (default; ``"auto"``
            = csr) or ``"coo" | "csc" | "ell" | "hybrid"``.
        memory_budget: with ``cache="auto"``, the most bytes a call may keep for
            backward beyond its input and parameters.

    Shapes:
        - input: ``x (n, in_channels)`` float32/float64 (a corgnn sparse matrix or
          ``torch.sparse`` tensor of constant features too), or a pair
          ``(x_src (n_src, m_src), x_dst (n_dst, m_dst))``; ``edge_index (2, q)`` int64, a
          :class:`corgnn.Graph`, or (one node set) a sparse adjacency in PyG's ``adj_t``
          convention
        - output: ``(n_dst, heads * out_channels)`` if ``concat`` else ``(n_dst, out_channels)``

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index`` (float dtype,
        wrong shape, negative or out-of-range ids), ``x`` rows or columns not
        matching, NaN/Inf in ``x`` or ``edge_attr``, a dtype or device mismatch,
        ``edge_attr`` given without ``edge_dim``, missing or misshapen with it,
        ``x_dst`` None in a pair; :class:`UnsupportedOption` for ``edge_attr`` or
        ``return_attention_weights`` with a sparse adjacency.
    """

    PYG_NAME = "TransformerConv"
    PYG_LINEARS = ("lin_key", "lin_query", "lin_value", "lin_skip", "lin_beta", "lin_edge")

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        """Options of a PyG ``TransformerConv`` this layer does not support: a bias on
        ``lin_beta`` or ``lin_edge``, ``edge_dim`` without ``lin_edge``, those of
        :func:`~corgnn.nn.base.message_passing_unsupported`, a non-Parameter weight.
        Bipartite ``in_channels``, ``beta``, ``root_weight=False``, ``bias=False``,
        ``concat=False``, edge features and attention dropout are converted."""
        unsupported = message_passing_unsupported(layer)
        if getattr(layer, "edge_dim", None) is not None and getattr(layer, "lin_edge", None) is None:
            unsupported.append(f"edge_dim={layer.edge_dim} without lin_edge")
        if any(getattr(layer, name, None) is None for name in ("lin_key", "lin_query", "lin_value", "lin_skip")):
            unsupported.append("a missing lin_key/lin_query/lin_value/lin_skip")
            return unsupported
        biases = {getattr(layer, name).bias is not None for name in ("lin_key", "lin_query", "lin_value", "lin_skip")}
        if len(biases) > 1:
            unsupported.append("biases on some of lin_key/lin_query/lin_value/lin_skip only")
        for name in ("lin_beta", "lin_edge"):
            if getattr(layer, name, None) is not None and getattr(layer, name).bias is not None:
                unsupported.append(f"{name}.bias")
        return unsupported + not_parameters(cls.pyg_params(layer))

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        m_src, m_dst = layer.lin_key.weight.size(1), layer.lin_query.weight.size(1)  # (PyG keeps -1 for a lazy layer)
        bipartite = isinstance(layer.in_channels, (tuple, list)) or m_src != m_dst
        return dict(
            in_channels=(m_src, m_dst) if bipartite else m_src, out_channels=layer.out_channels, heads=layer.heads,
            concat=layer.concat, beta=bool(layer.beta), dropout=layer.dropout,
            edge_dim=None if getattr(layer, "lin_edge", None) is None else layer.lin_edge.weight.size(1),
            bias=layer.lin_key.bias is not None, root_weight=layer.root_weight,
        )

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: int | None = None,
        bias: bool = True,
        root_weight: bool = True,
        *,
        cache: str = "auto",
        format: str = "csr",
        memory_budget: int | None = None,
        **kwargs,
    ):
        super().__init__()
        check_message_passing_kwargs(type(self).__name__, kwargs, fixed=("node_dim",))
        in_channels, m_src, m_dst = check_attention_arguments(in_channels, out_channels, heads, dropout, memory_budget, edge_dim)
        if cache != "auto":
            cache = parse_transformer_cache(cache)
        check_format_name(format, allow_auto=True)
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, bool(concat)
        self.beta, self.root_weight, self.dropout, self.edge_dim = bool(beta and root_weight), bool(root_weight), float(dropout), edge_dim
        self.cache, self.format, self.memory_budget = cache, format, memory_budget
        hc = heads * out_channels
        self.lin_key = Linear(m_src, hc, bias=bias)
        self.lin_query = Linear(m_dst, hc, bias=bias)
        self.lin_value = Linear(m_src, hc, bias=bias)
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, hc, bias=False)
        else:
            self.register_parameter("lin_edge", None)
        total_out = hc if concat else out_channels
        self.lin_skip = Linear(m_dst, total_out, bias=bias)  # (built without root_weight too, as PyG)
        if self.beta:
            self.lin_beta = Linear(3 * total_out, 1, bias=False)
        else:
            self.register_parameter("lin_beta", None)
        self._graphs = GraphCache()
        self._features = FeatureCache()
        self.last_plan: TransformerPlan | None = None
        self.last_cache: str | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip, self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    def _dtype_param(self) -> torch.Tensor:
        return self.lin_query.weight

    def adjacency(self, graph) -> SparseFormat:
        """The attention pattern of ``graph`` (its edges as given: no self-loops added,
        duplicates kept; rows = targets) in this layer's format, cached on the Graph."""
        return graph.gat_adjacency(add_self_loops=False, format="csr" if self.format == "auto" else self.format)

    def plan(self, n: int, q: int, m: int, training: bool, dtype_bytes: int) -> TransformerPlan:
        """The caching scheme of a call on ``n`` target nodes, ``q`` edges and ``m`` input
        features (:func:`corgnn.cost.transformer.plan_transformer`)."""
        return plan_transformer(
            n, q, self.heads, self.out_channels, m, cache=self.cache, memory_budget=self.memory_budget,
            training=training, value_bytes=dtype_bytes, edge_dim=self.edge_dim or 0,
        )

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        """PyG's ``TransformerConv.forward``.

        Args:
            x: ``(n, in_channels)`` dense float tensor (or constant sparse features: a
                corgnn sparse matrix, a ``torch.sparse`` tensor), or the bipartite pair
                ``(x_src (n_src, m_src), x_dst (n_dst, m_dst))`` (dense).
            edge_index: ``(2, q)`` int tensor (row 0 = source, row 1 = target), a
                :class:`corgnn.Graph`, or (one node set) a sparse adjacency in PyG's
                ``adj_t`` convention (``torch.sparse`` or ``torch_sparse.SparseTensor``).
            edge_attr: ``(q, edge_dim)`` edge features in ``edge_index``'s order, needed
                with ``edge_dim`` (``edge_index`` input only); must be None without.
            return_attention_weights: as PyG, a bool (True or False) also returns
                ``(edge_index, alpha (q, heads))``, the attention before dropout in
                ``edge_index``'s order, differentiable (``edge_index`` input only).

        The attention runs fused (:func:`~corgnn.functional.transformer.transformer_conv`,
        scheme in ``last_cache``) unless attention weights are returned, which run
        :func:`~corgnn.functional.transformer.dot_attention` (corgnn's differentiable
        sparse ops; ``last_plan``/``last_cache`` None).
        """
        flow = getattr(self, "flow", "source_to_target")
        if flow != "source_to_target":  # (set on the built layer: never silently ignored)
            raise UnsupportedOption(f"TransformerConv: flow={flow!r} is not supported by corgnn (only 'source_to_target'); use torch_geometric.nn.TransformerConv")
        use_edge = self.lin_edge is not None
        if edge_attr is not None and not use_edge:
            raise ValueError("edge_attr: this TransformerConv has no edge features (edge_dim=None; PyG would add edge_attr to the values); pass edge_attr=None or build the layer with edge_dim")
        if use_edge and edge_attr is None:
            raise ValueError(f"edge_attr: the layer has edge_dim={self.edge_dim}; pass edge_attr of shape (q, {self.edge_dim})")
        want_alpha = isinstance(return_attention_weights, bool)  # PyG: True or False both return them
        H, C = self.heads, self.out_channels
        xs = None
        if isinstance(x, (tuple, list)):
            x_src, x_dst, A, ei, perm = self._bipartite_inputs(x, edge_index)
            x_root = x_dst
            if use_edge:
                q_edges = ei.size(1)
        else:
            graph, x_src, xs, _ = self._inputs(x, edge_index)
            x_dst = None
            x_root = x_src
            if want_alpha or use_edge:
                if graph.sparse_input is not None:
                    what = "edge_attr" if use_edge else "return_attention_weights"
                    raise UnsupportedOption(f"TransformerConv: {what} with a sparse adjacency is not supported by corgnn; pass edge_index")
                A = graph.gat_adjacency(add_self_loops=False)  # (CSR: edge i's features go to entry perm^-1[i])
                ei, perm = graph.gat_edges(add_self_loops=False)
                q_edges = graph.num_edges
            else:
                A = self.adjacency(graph)
            if xs is not None:
                x_src = x_root = None
        wq, bq, wk, bk, wv, bv = (p for lin in (self.lin_query, self.lin_key, self.lin_value) for p in (lin.weight, lin.bias))
        attr = we = None
        if use_edge:
            attr = self._edge_features(edge_attr, q_edges)[perm]  # (A's entry order)
            we = self.lin_edge.weight
        if want_alpha:
            # (projections through torch autograd, attention through corgnn's differentiable ops)
            Q = project_heads(x_src if x_dst is None else x_dst, wq, bq, H, xs if x_dst is None else None)
            K = project_heads(x_src, wk, bk, H, xs)
            V = project_heads(x_src, wv, bv, H, xs)
            E = None if attr is None else self.lin_edge(attr).unflatten(1, (H, C))
            out3, alpha = dot_attention(Q, K, V, A, dropout=self.dropout, training=self.training, E=E)
            out = out3.flatten(1) if self.concat else out3.mean(1)
            self.last_plan = self.last_cache = None
        else:
            training = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (x_src, x_dst, wq, bq, wk, bk, wv, bv, attr, we)
            )
            m = wk.size(1)
            plan = self.plan(A.shape[0], A.nnz, m, training, wq.element_size())
            self.last_plan, self.last_cache = plan, plan.scheme
            # (one node set: the root term is one more block of the Q, K, V product)
            fuse_root = self.root_weight and x_dst is None
            out = transformer_conv(
                x_src, x_dst, wq, bq, wk, bk, wv, bv, A, H, concat=self.concat,
                dropout=self.dropout, training=self.training, cache=plan.scheme, xs=xs, edge_attr=attr, edge_weight=we,
                root_weight=self.lin_skip.weight if fuse_root else None, root_bias=self.lin_skip.bias if fuse_root else None,
            )
            if fuse_root:
                out, x_r = out
        if self.root_weight:
            if want_alpha or x_dst is not None:
                x_r = spmm(xs, self.lin_skip.weight.t(), bias=self.lin_skip.bias) if x_root is None else self.lin_skip(x_root)
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        if want_alpha:
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=perm.device)
            return out, (ei, alpha[inv])
        return out

    def _edge_features(self, edge_attr, q: int) -> torch.Tensor:
        """``edge_attr`` validated: a floating ``(q, edge_dim)`` tensor of the layer's dtype
        and device, finite."""
        like = self.lin_edge.weight
        if not isinstance(edge_attr, torch.Tensor) or not edge_attr.is_floating_point():
            raise TypeError(f"edge_attr must be a floating tensor of shape ({q}, {self.edge_dim}), got {getattr(edge_attr, 'dtype', type(edge_attr).__name__)}")
        if edge_attr.dim() != 2 or tuple(edge_attr.shape) != (q, self.edge_dim):
            raise ValueError(f"edge_attr must have shape ({q}, {self.edge_dim}) (one row per edge), got {tuple(edge_attr.shape)}")
        if edge_attr.dtype != like.dtype or edge_attr.device != like.device:
            raise TypeError(f"edge_attr is {edge_attr.dtype} on {edge_attr.device} but the layer's parameters are {like.dtype} on {like.device}")
        check_finite("edge_attr", edge_attr)
        return edge_attr

    def _bipartite_inputs(self, x, edge_index):
        """``(x_src, x_dst, A (n_dst, n_src) CSR, edge_index, perm)`` of a bipartite
        call, validated (``perm``: the CSR position of each edge's entry)."""
        if len(x) != 2:
            raise ValueError(f"x must be a tensor or a pair (x_src, x_dst), got a {type(x).__name__} of {len(x)}")
        x_src, x_dst = x
        if x_dst is None:
            raise ValueError("x_dst is None: TransformerConv needs target features for its queries (and root term); pass (x_src, x_dst)")
        m_src, m_dst = self.lin_key.weight.size(1), self.lin_query.weight.size(1)
        like = self.lin_query.weight
        for name, t, m in (("x_src", x_src, m_src), ("x_dst", x_dst, m_dst)):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                raise TypeError(f"{name} must be a dense torch.Tensor (bipartite inputs), got {getattr(t, 'layout', type(t).__name__)}")
            check_features(name, t, t.size(0) if t.dim() == 2 else -1, m)
            if t.dtype != like.dtype:
                raise TypeError(f"{name} is {t.dtype} but the layer's parameters are {like.dtype}; call .to({t.dtype}) on the module")
            if t.device != like.device:
                raise ValueError(f"{name} is on {t.device} but the layer's parameters are on {like.device}")
        if is_sparse_adjacency(edge_index) or not isinstance(edge_index, torch.Tensor):
            raise TypeError("bipartite (x_src, x_dst) inputs need edge_index as a (2, q) int tensor (not a Graph or sparse adjacency)")
        check_edge_index(edge_index, None)
        n_src, n_dst = x_src.size(0), x_dst.size(0)
        ei = edge_index.long()
        if ei.device != x_src.device:
            raise ValueError(f"x is on {x_src.device} but edge_index is on {ei.device}")
        if ei.size(1):
            if int(ei[0].max()) >= n_src:
                raise ValueError(f"edge_index holds source id {int(ei[0].max())} but x_src has {n_src} rows; ids must be in [0, n_src)")
            if int(ei[1].max()) >= n_dst:
                raise ValueError(f"edge_index holds target id {int(ei[1].max())} but x_dst has {n_dst} rows; ids must be in [0, n_dst)")
        perm = torch.argsort(ei[1] * max(n_src, 1) + ei[0], stable=True)  # CSR.from_coo's entry order
        A = CSR.from_coo(ei[1], ei[0], None, (n_dst, n_src))
        return x_src, x_dst, A, edge_index, perm

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, beta={self.beta}, "
            f"dropout={self.dropout}, cache={self.cache!r}, format={self.format!r}"
        )


class Transformer(GAT):
    """2-layer graph transformer on GAT's recipe (the paper's GAT model with
    :class:`TransformerConv` layers): ``dropout -> TransformerConv(heads, concat) ->
    ELU -> dropout -> TransformerConv(out_heads, mean)``; the forward, the shared
    Graph and the sparse-feature hand-off are :class:`~corgnn.nn.gat.GAT`'s.

    Args:
        in_channels, hidden_channels, out_channels: widths (``hidden_channels`` per head).
        heads: heads of the first layer (default 8), concatenated.
        out_heads: heads of the output layer (default 1), averaged.
        dropout: dropout on the input and hidden features and on both layers'
            attention coefficients in training (default 0.0).
        root_weight, beta: passed to both layers.
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
        root_weight: bool = True,
        beta: bool = False,
        cache: str = "auto",
        format: str = "csr",
        memory_budget: int | None = None,
    ):
        nn.Module.__init__(self)  # (GAT's layers are not built: these replace them)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        positive_int("hidden_channels", hidden_channels)
        positive_int("heads", heads)
        self.dropout = dropout
        kw = dict(dropout=dropout, root_weight=root_weight, beta=beta, cache=cache, format=format, memory_budget=memory_budget)
        self.conv1 = TransformerConv(in_channels, hidden_channels, heads=heads, concat=True, **kw)
        self.conv2 = TransformerConv(hidden_channels * heads, out_channels, heads=out_heads, concat=False, **kw)
        self._graphs = GraphCache()
