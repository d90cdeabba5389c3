"""GCN layer and the paper's 2-layer GCN model."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros

from .._cache import Uncopied, tensor_state
from .._validate import check_features
from ..cost.gcn import GCN_SCHEMES, GCNPlan, parse_scheme, plan_gcn, static_scheme_name
from ..cost.io import choose_format
from ..functional.gcn import GCNFunction, composed_first, gcn_values, row_tails, runs_composed
from ..graph import Graph, GraphCache, compiled_gcn_adjacency, is_sparse_adjacency
from ..sparse.formats import SparseFormat
from ..sparse.ops import spmm
from ..sparse.registry import check_format_name
from .base import (
    SPARSE_FEATURE_DENSITY, CorgnnConv, FeatureCache, SparseView, UnsupportedOption, check_compiled_x, check_flow,
    check_message_passing_kwargs, check_value_grad, dense_to_csr, dropout, message_passing_unsupported, not_parameters, num_rows,
    parameter, submodule,
)

__all__ = ["GCNConv", "GCN", "dropout", "UnsupportedOption", "check_message_passing_kwargs", "SPARSE_FEATURE_DENSITY", "dense_to_csr"]


class _FlipCache(Uncopied):
    """``edge_index.flip(0)`` for ``flow="target_to_source"``, kept per tensor version
    (like :class:`corgnn.graph.GraphCache`) so the Graph built from it is reused."""

    def __init__(self):
        self._key = None
        self._flipped = None

    def __call__(self, edge_index: torch.Tensor) -> torch.Tensor:
        key = tensor_state(edge_index)
        if self._key is not None and self._key[0]() is edge_index and self._key[1] == key:
            return self._flipped
        self._flipped = edge_index.flip(0)
        self._key = (weakref.ref(edge_index), key)
        return self._flipped


class _PropagationCache(Uncopied):
    """``A'X`` of a GCN layer's constant input features, kept across calls (issue 12,
    lever 1: with constant ``X`` the propagation is the same every epoch).

    Keyed like :class:`corgnn.graph.GraphCache`: the feature tensor itself (identity,
    held weakly, and :func:`corgnn.graph.tensor_state`: an in-place edit, new
    ``.data``, another dtype or device is another key, with the same limit for writes
    through ``x.data[...]`` or NumPy) and the adjacency object ``A'`` (a new graph or
    ``edge_weight``, another dtype, format or normalisation option is another
    ``A'``). A new key is only remembered; ``A'X`` is computed when the same key
    comes back, so features that are a new tensor every call (input dropout) never
    pay for it. Holds one ``(n, m)`` tensor (:attr:`nbytes`). Never pickled or
    deep-copied: a copy starts empty."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self._x = self._A = self._state = self.ax = None

    def seen(self, x: torch.Tensor, A: SparseFormat) -> bool:
        """Whether ``x`` (same object, same state) and ``A`` are the remembered key."""
        return self._x is not None and self._x() is x and self._A() is A and self._state == tensor_state(x)

    def remember(self, x: torch.Tensor, A: SparseFormat) -> None:
        """Make ``(x, A)`` the key, dropping the kept ``A'X`` of another key."""
        if not self.seen(x, A):
            self.clear()
            self._x, self._A, self._state = weakref.ref(x), weakref.ref(A), tensor_state(x)

    def get(self, x: torch.Tensor, A: SparseFormat) -> torch.Tensor:
        """The kept ``A'X`` of the remembered key, computed (one SpMM on m columns) on first use."""
        if self.ax is None:
            with torch.no_grad():
                self.ax = spmm(A, x)
        return self.ax

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept ``A'X`` (0 when none)."""
        return 0 if self.ax is None else self.ax.numel() * self.ax.element_size()


class GCNConv(CorgnnConv):
    r"""Graph convolution ``X' = D^{-1/2}(A+I)D^{-1/2} X Θ + b`` with adaptive reordering
    and caching (paper §"Analysis of the GCN Computational Graph", Tables 1-2).

    A drop-in for ``torch_geometric.nn.GCNConv``: same parameters (``lin.weight``
    ``(out_channels, in_channels)``, Glorot init; ``bias`` zero init; the same
    ``state_dict`` keys), the same normalisation (PyG's ``gcn_norm``), the same
    outputs and gradients. Per call it plans the cheapest scheme from ``n, q, m, k``
    and whether ``x`` needs a gradient: transform-first or propagate-first forward,
    fused- or split-propagate backward, caching ``A'X`` when that saves an SpMM.

    Args (PyG's, in PyG's positional order with PyG's defaults):
        in_channels: m, input features per node.
        out_channels: k, output features per node.
        improved: self-loop weight 2 instead of 1 (default False).
        cached: accepted for PyG compatibility (default False); the adjacency is
            always cached per graph, keyed as :class:`corgnn.graph.GraphCache` says
            (a new tensor or an in-place op gets the graph of its contents; writes through
            ``edge_index.data[...]`` or NumPy are not seen).
        add_self_loops: add the remaining self-loops before normalising; ``None``
            (default) = ``normalize``, as in PyG. ``True`` with ``normalize=False``
            (which PyG refuses) adds unnormalised loops.
        normalize: apply the symmetric normalisation (default True); without it
            ``A`` is the raw (weighted) adjacency.
        bias: learn an additive bias (default True).
        **kwargs: PyG's ``MessagePassing`` options, accepted where they are what
            corgnn computes anyway (``aggr="add"/"sum"``, ``node_dim``,
            ``decomposed_layers``), and ``flow`` (``"target_to_source"`` flips
            ``edge_index``, as PyG, also when set on a built layer; with a Graph or a
            sparse adjacency it raises :class:`UnsupportedOption`); any other value raises
            :class:`UnsupportedOption` naming it (see
            :func:`check_message_passing_kwargs`).

    Keyword-only (corgnn's own):
        scheme: ``"auto"`` (default) or a scheme name to force, e.g.
            ``"transform-first+fused"``, ``"propagate-first+split+cache"`` (see
            :data:`corgnn.cost.GCN_SCHEMES`).
        cache_propagation: ``"auto"`` (default), True or False: keep ``A'X`` across
            calls when ``x`` is a constant (issue 12, lever 1): the same dense tensor, unmodified,
            needing no gradient, on the same graph (e.g. a first layer reading the
            dataset's features with no input dropout). From the second such call the
            plan (``"auto"`` only) may pick ``propagate-first+split+cache+reuse``,
            which runs no SpMM forward or backward; it does when its cost model
            says so and (``"auto"``) no peak memory is added (see the README). Memory: one ``(n, in_channels)`` tensor of ``x``'s dtype held
            by the layer (:meth:`propagation_cache_nbytes`; PubMed float32: 39 MB).
            ``"auto"`` keeps it only where that raises no step's peak memory (it
            replaces the ``A'X`` propagate-first holds anyway, when k >= m/2;
            ``plan_gcn(reuse_extra_memory=False)``); True also where it costs
            memory but saves time (e.g. OGB-Arxiv at k = 16: 87 MB more); False never.
            Invalidated by an in-place edit of ``x``, a new ``x``, graph or
            ``edge_weight``, another dtype or device (see ``_PropagationCache``).
            Input dropout makes ``x`` a new tensor every call: never cached. Setting
            the attribute to False frees the kept tensor at the next call.
        format: sparse format of ``A'``: ``"csr"`` (default), ``"auto"`` (chosen by
            :func:`corgnn.cost.choose_format` from the I/O model) or
            ``"coo" | "csc" | "ell" | "hybrid"``.

    Shapes:
        - input: ``x (n, in_channels)`` (or PyG's static-graph batch
          ``(*batch, n, in_channels)`` -> ``(*batch, n, out_channels)``) float32/float64/bfloat16/float16 (half
          precision accumulates in float32 inside the kernels), a corgnn sparse
          matrix or a ``torch.sparse`` COO/CSR tensor; ``edge_index (2, q)`` int64 or
          a :class:`corgnn.Graph`, optional ``edge_weight (q,)``
        - output: ``(n, out_channels)``, ``x``'s dtype

    Raises (from ``forward``, before any work):
        TypeError / ValueError naming the argument: bad ``edge_index`` (float dtype,
        wrong shape, negative or out-of-range ids), ``x`` rows not matching the node
        count or columns not ``in_channels``, ``edge_weight`` of the wrong length,
        NaN/Inf in ``x`` or ``edge_weight``.
    """

    SUPPORTS_EXPLAIN = True
    PYG_NAME = "GCNConv"

    @classmethod
    def pyg_params(cls, layer) -> dict:
        return {"lin.weight": layer.lin.weight, "bias": layer.bias}

    @classmethod
    def pyg_unsupported(cls, layer) -> list[str]:
        """Options of a PyG ``GCNConv`` this layer does not support: those of
        :func:`~corgnn.nn.base.message_passing_unsupported` (both flows are), a ``lin.bias``."""
        unsupported = message_passing_unsupported(layer, ("source_to_target", "target_to_source")) + not_parameters(cls.pyg_params(layer))
        if getattr(layer.lin, "bias", None) is not None:
            unsupported.append("lin.bias")
        return unsupported

    @classmethod
    def pyg_arguments(cls, layer) -> dict:
        weight = layer.lin.weight  # (out, in); PyG keeps in_channels=-1 for a lazy layer
        return dict(
            in_channels=weight.size(1), out_channels=weight.size(0), bias=layer.bias is not None, improved=layer.improved,
            add_self_loops=layer.add_self_loops, normalize=layer.normalize, flow=layer.flow,
        )

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
        *,
        scheme: str = "auto",
        format: str = "csr",
        cache_propagation: bool | str = "auto",
        **kwargs,
    ):
        super().__init__()
        flow = kwargs.pop("flow", "source_to_target")
        check_message_passing_kwargs(type(self).__name__, kwargs)
        check_flow(type(self).__name__, flow)
        if in_channels <= 0 or out_channels <= 0:
            raise ValueError(f"in_channels and out_channels must be positive, got {in_channels}, {out_channels}")
        if scheme != "auto":
            parse_scheme(scheme)
        check_format_name(format, allow_auto=True)
        if add_self_loops is None:  # PyG: self-loops by default exactly when normalising
            add_self_loops = normalize
        self.in_channels, self.out_channels = in_channels, out_channels
        self.scheme, self.format = scheme, format
        self.improved, self.add_self_loops, self.normalize = bool(improved), bool(add_self_loops), bool(normalize)
        self.cached = bool(cached)
        self.flow = flow
        self._flipped = _FlipCache()
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._graphs = GraphCache()
        self._features = FeatureCache()
        if cache_propagation not in ("auto", True, False):
            raise ValueError(f"cache_propagation must be 'auto', True or False, got {cache_propagation!r}")
        self.cache_propagation = cache_propagation
        self._propagation = _PropagationCache()
        self.last_plan: GCNPlan | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        if self.bias is not None:
            zeros(self.bias)

    def adjacency(self, graph: Graph, dtype: torch.dtype):
        """``A'`` of ``graph`` in this layer's format; when its values are a
        differentiable function of ``graph.edge_weight`` (:meth:`_edge_values`
        supplies them), only its pattern counts and it is the unweighted graph's
        (:meth:`corgnn.Graph.gcn_pattern`, built once however often the weights change)."""
        opts = dict(dtype=dtype, improved=self.improved, add_self_loops=self.add_self_loops, normalize=self.normalize)
        fmt = self.format
        if fmt == "auto":  # I/O-model choice, on the SpMM width of transform-first
            fmt = choose_format(graph.unweighted().gcn_stats(**opts), min(self.in_channels, self.out_channels)).format
        if self._custom_values(graph) and graph.loops == "remaining":
            return graph.gcn_pattern(dtype=dtype, add_self_loops=self.add_self_loops, format=fmt)[0]
        return graph.gcn_adjacency(**opts, format=fmt)

    def sparse_features_allowed(self) -> bool:
        """Whether sparse-only input features fit this layer's scheme setting (they
        need transform-first+fused: ``A'X`` would be a sparse-sparse product)."""
        return self.scheme == "auto" or parse_scheme(self.scheme) == GCN_SCHEMES[0]

    def plan(self, graph: Graph, x, x_nnz: int | None = None) -> GCNPlan:
        """The scheme this layer would use for ``x`` on ``graph`` now, with costs."""
        return self._plan(graph, self.adjacency(graph, x.dtype), x, x_nnz)

    def _plan(self, graph: Graph, A, x, x_nnz: int | None) -> GCNPlan:
        """:meth:`plan` for ``graph``'s matrix ``A`` (:meth:`adjacency`), which the
        forward has at hand."""
        dense = isinstance(x, torch.Tensor)
        x_grad = dense and x.requires_grad
        training = self._backward_will_run(x_grad)
        # (sparse-only X: transform-first+fused; dense: a tie to the composition where it composes)
        candidates = composed_first(GCN_SCHEMES, graph.num_nodes, self.in_channels, self.out_channels, row_tails(training, A)) if dense else GCN_SCHEMES[:1]
        return plan_gcn(
            graph.num_nodes, A.nnz, self.in_channels, self.out_channels, input_grad=training and x_grad,
            training=training, scheme=self.scheme, candidates=candidates, x_nnz=x_nnz,
            reuse=self._constant_input(x, graph) and self._propagation.seen(x, A),
            reuse_extra_memory=getattr(self, "cache_propagation", "auto") is True, approximate=True,
        )

    def _constant_input(self, x, graph: Graph) -> bool:
        """Whether ``A'X`` of ``x`` may be kept across calls: ``cache_propagation`` on,
        ``x`` a dense tensor needing no gradient, the adjacency values constant."""
        return (
            getattr(self, "cache_propagation", "auto") is not False and isinstance(x, torch.Tensor) and not x.requires_grad
            and not self._custom_values(graph)
        )

    def propagation_cache_nbytes(self) -> int:
        """Bytes of the ``A'X`` this layer keeps across calls (``cache_propagation``); 0 when none."""
        return self._propagation.nbytes

    def forward(self, x, edge_index, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Args: ``x (n, in_channels)`` dense float tensor, or a corgnn sparse matrix
        (e.g. :class:`corgnn.sparse.CSR`) of input features (no gradient flows to it);
        ``edge_index (2, q)`` or a :class:`corgnn.Graph`; optional ``edge_weight (q,)``.
        ``edge_index`` may also be a sparse adjacency in PyG's ``adj_t`` convention
        (row = target): a ``torch.sparse`` COO/CSR tensor or a
        ``torch_sparse.SparseTensor``, its values the edge weights (``edge_weight``
        must then be None) and its self-loops handled as PyG's ``gcn_norm`` does for
        that form (:data:`corgnn.graph.LOOP_MODES`).

        Gradients as PyG's: also to ``edge_weight`` (or the Graph's weights) when it
        requires one, through the normalisation (eager mode), and second derivatives
        (``create_graph=True``) in every scheme."""
        edge_index = self._flow_edges(edge_index)
        if torch.compiler.is_compiling():
            return self._forward_compiled(x, edge_index, edge_weight)
        if isinstance(x, torch.Tensor) and x.layout == torch.strided and x.dim() > 2:
            return self._forward_batched(x, edge_index, edge_weight)
        graph, dense, xs, dtype = self._inputs(x, edge_index, edge_weight)
        check_value_grad(graph)
        weight, bias = parameter(submodule(self, "lin"), "weight"), parameter(self, "bias")
        A = self.adjacency(graph, dtype)
        plan = self._plan(graph, A, dense if dense is not None else SparseView(dtype), None if xs is None else xs.nnz)
        self.__dict__["last_plan"] = plan  # (a plain attribute: no Module.__setattr__, ~1 us a call)
        if plan.scheme.reuse:
            return GCNFunction.apply(self._propagation.get(dense, A), weight, bias, A, plan.scheme, None, None)
        if self._constant_input(dense, graph):
            self._propagation.remember(dense, A)
        else:
            self._propagation.clear()
        if runs_composed(plan.scheme, dense, weight, xs, row_tails(plan.training, A)):  # (A'X, then torch's own linear)
            return torch.nn.functional.linear(spmm(A, dense, values=self._edge_values(graph, A)), weight, bias)
        return GCNFunction.apply(dense, weight, bias, A, plan.scheme, xs, self._edge_values(graph, A))

    def _flow_edges(self, edge_index):
        """``edge_index`` as ``source_to_target`` sees it: flipped (``edge_index.flip(0)``,
        cached per tensor version) for ``flow="target_to_source"``, which PyG honours
        also when set on a built layer; a Graph or sparse adjacency cannot be flipped
        here and is refused (PyG refuses a sparse adjacency with that flow too)."""
        flow = getattr(self, "flow", "source_to_target")
        if flow == "source_to_target":
            return edge_index
        check_flow(type(self).__name__, flow)
        if not isinstance(edge_index, torch.Tensor) or edge_index.layout != torch.strided or is_sparse_adjacency(edge_index):
            what = type(edge_index).__name__ if not isinstance(edge_index, torch.Tensor) else f"sparse {edge_index.layout} adjacency"
            raise UnsupportedOption(
                f"{type(self).__name__}: flow='target_to_source' needs edge_index as a (2, q) tensor, got a {what}; "
                "pass the transposed graph with flow='source_to_target' instead"
            )
        if torch.compiler.is_compiling():
            return edge_index.flip(0)
        return self._flipped(edge_index)

    def _forward_batched(self, x: torch.Tensor, edge_index, edge_weight) -> torch.Tensor:
        """PyG's static-graph form: ``x (*batch, n, in_channels)`` with one graph
        (``node_dim=-2``) -> ``(*batch, n, out_channels)``. The batch is folded into the
        channels for one propagation: ``[X_1..X_B] (n, B*m)`` times the block-diagonal
        ``diag(Θ, .., Θ)``, so every scheme, and every gradient, is the 2-D layer's."""
        batch, n, m = x.shape[:-2], x.size(-2), self.in_channels
        if x.size(-1) != m:
            raise ValueError(f"x must have shape (*batch, num_nodes, {m}), got {tuple(x.shape)}")
        B = 1
        for b in batch:
            B *= int(b)
        k = self.out_channels
        if B == 0:
            return x.new_zeros(*batch, n, k) + (0 if self.bias is None else self.bias)
        x2 = x.reshape(B, n, m).permute(1, 0, 2).reshape(n, B * m)
        graph = self._graphs(edge_index, edge_weight, n)
        check_value_grad(graph)
        check_features("x", x2, graph.num_nodes, B * m)  # (x2 is a new tensor every call: nothing to cache)
        if x.device != graph.device:
            raise ValueError(f"x is on {x.device} but edge_index is on {graph.device}")
        if self.lin.weight.dtype != x.dtype:
            raise TypeError(f"x is {x.dtype} but the layer's parameters are {self.lin.weight.dtype}; call .to({x.dtype}) on the module")
        weight = torch.block_diag(*([self.lin.weight] * B))  # (B*k, B*m)
        bias = None if self.bias is None else self.bias.repeat(B)
        A = self.adjacency(graph, x.dtype)
        training = self._backward_will_run(x.requires_grad)
        plan = plan_gcn(
            graph.num_nodes, A.nnz, B * m, B * k, input_grad=training and x.requires_grad,
            training=training, scheme=self.scheme, candidates=GCN_SCHEMES, approximate=True,
        )
        self.last_plan = plan
        out = GCNFunction.apply(x2, weight, bias, A, plan.scheme, None, self._edge_values(graph, A))
        return out.reshape(n, B, k).permute(1, 0, 2).reshape(*batch, n, k)

    def _custom_values(self, graph: Graph) -> bool:
        """Whether ``A'``'s values are computed per call (:meth:`_edge_values`): the
        edge weights need a gradient (learnable weights, an explainer's mask passed
        as ``edge_weight``), or PyG's explain machinery set an edge mask on the layer."""
        ew = graph.edge_weight
        return self._explain is True or (ew is not None and ew.requires_grad and torch.is_grad_enabled())

    def _edge_values(self, graph: Graph, A: SparseFormat) -> torch.Tensor | None:
        """``A``'s values as a differentiable function of ``graph.edge_weight`` and of
        PyG's explain edge mask (:meth:`explain_mask`: each edge's normalised weight
        times its mask, self-loops times 1, as PyG's ``explain_message``) when
        :meth:`_custom_values`, else None: the cached ``A.val`` is used as a
        constant, at no extra cost."""
        if not self._custom_values(graph):
            return None
        mask = self.explain_mask(graph.edge_index, graph.num_nodes, loops=self.add_self_loops)
        if mask is not None and graph.loops != "remaining":
            raise UnsupportedOption(f"{type(self).__name__}: explaining a call with a sparse adjacency is not supported; pass edge_index")
        positions = graph.gcn_pattern(dtype=A.val.dtype, add_self_loops=self.add_self_loops, format=A.name)[1] if graph.loops == "remaining" else None
        return gcn_values(
            A, graph.edge_index, graph.edge_weight, improved=self.improved, add_self_loops=self.add_self_loops, normalize=self.normalize, loops=graph.loops,
            positions=positions, edge_mask=mask,
        )

    def _forward_compiled(self, x, edge_index, edge_weight):
        """The forward as ``torch.compile`` traces it (see "torch.compile" in the
        README): the adjacency comes from the ``corgnn::gcn_adjacency`` custom op
        (validated and cached at run time, in CSR), the plan from the static sizes
        (:func:`corgnn.cost.gcn.static_scheme_name`), and ``x`` is used dense; no
        Python branch depends on tensor data."""
        check_compiled_x(x, self.in_channels, self.lin.weight.dtype)
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
            if isinstance(x, torch.Tensor) and x.layout != torch.strided:  # torch.sparse features
                x = self.conv1._torch_sparse_features(x)
            # one Graph (and one A') shared by both layers
            edge_index = self._graphs(edge_index, edge_weight, num_rows(x))
            edge_weight = None
            if isinstance(x, SparseFormat):
                xs = x
            elif self.conv1.sparse_features_allowed() and isinstance(x, torch.Tensor):
                xs = self.conv1.sparse_features(x, edge_index.num_nodes)
        if xs is not None and self.training and self.dropout:
            # NOTE: dropout of a zero is a zero, so dropping the sparse values is the
            # same distribution as dense dropout at ~1 % of the random numbers.
            x = xs.with_values(dropout(xs.val, self.dropout, self.training))
        else:  # (no input dropout: conv1 gets the constant x, so it can keep A'X)
            x = dropout(x, self.dropout, self.training)
        x = torch.relu(self.conv1(x, edge_index, edge_weight))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index, edge_weight)

    def schemes(self) -> list[str]:
        """Scheme name each layer used on its last call."""
        return [c.last_plan.scheme.name if c.last_plan else "-" for c in (self.conv1, self.conv2)]
