"""``Graph``: a validated graph with its propagation matrices built once and cached."""

from __future__ import annotations

import math

import torch

from ._cache import ContentCache, SharedCache, Uncopied, tensor_state
from ._validate import check_edge_index, check_edge_weight, validate_compressed
from .cost.setup import BuildPlan, build_s, free_columns, scatter_rent_s
from .sparse import build
from .sparse.formats import COO, CSR, SparseFormat, values_version
from .sparse.registry import convert

__all__ = [
    "Graph", "GraphCache", "as_graph", "gcn_edge_weights", "tensor_state",
    "is_sparse_adjacency", "sparse_adjacency_entries", "gat_edges", "sparse_attention_result",
    "aggr_edge_weights", "AGGREGATIONS", "shared_graph", "GRAPHS",
]

LOOP_MODES = ("remaining", "add", "set")
"""How self-loops join a graph, by the form PyG was given it in (:attr:`Graph.loops`):
``"remaining"`` for an ``edge_index`` (GCN: ``add_remaining_self_loops``, an existing
loop keeps its weight; GAT: existing loops removed, one per node appended, duplicate
edges kept), ``"add"`` for a ``torch.sparse`` ``adj_t`` (GCN: ``A + fill I``, so an
existing loop's weight grows by the fill value; GAT: loops replaced and the pattern
coalesced, duplicate entries merged into one edge) and ``"set"`` for a
``torch_sparse.SparseTensor`` (GCN: ``fill_diag``, the diagonal replaced by the fill
value; GAT: ``set_diag``, loops replaced, the pattern kept sorted)."""


def is_sparse_adjacency(adj) -> bool:
    """Whether ``adj`` is a sparse adjacency matrix as PyG's layers accept one in
    place of ``edge_index``: a ``torch.sparse`` tensor (any sparse layout) or a
    ``torch_sparse.SparseTensor``."""
    if isinstance(adj, torch.Tensor):
        return adj.layout != torch.strided
    return _is_torch_sparse_sparsetensor(adj)


def _is_torch_sparse_sparsetensor(adj) -> bool:
    t = type(adj)
    return t.__name__ == "SparseTensor" and t.__module__.split(".")[0] == "torch_sparse"


def sparse_adjacency_entries(adj) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int]]:
    """``(kind, row, col, value, (rows, cols))`` of a sparse adjacency in PyG's
    ``adj_t`` convention (row = target, column = source), its entries in the order
    PyG reads them: a COO tensor's stored order (coalesced or not, as PyG's
    ``to_edge_index`` takes it), a CSR tensor's row-major order, a SparseTensor's
    ``coo()``. ``kind`` is ``"torch"`` or ``"SparseTensor"``; ``value`` is None when
    a SparseTensor has none.

    Raises:
        TypeError: ``adj`` is no sparse adjacency.
        ValueError: not 2-D, values with dense dimensions, or a layout PyG's layers
            do not take (CSC, BSR, BSC: convert with ``.to_sparse_csr()``).
    """
    if _is_torch_sparse_sparsetensor(adj):
        row, col, value = adj.coo()
        return "SparseTensor", row.long(), col.long(), value, (int(adj.size(0)), int(adj.size(1)))
    if not isinstance(adj, torch.Tensor) or adj.layout == torch.strided:
        raise TypeError(f"expected a torch.sparse tensor or a torch_sparse.SparseTensor, got {type(adj).__name__}")
    if adj.dim() != 2 or adj.dense_dim() != 0:
        raise ValueError(
            f"a sparse adjacency must be a 2-D (num_nodes, num_nodes) matrix with one value per entry, "
            f"got shape {tuple(adj.shape)} ({adj.layout})"
        )
    shape = (int(adj.size(0)), int(adj.size(1)))
    if adj.layout == torch.sparse_coo:
        row, col = adj._indices()
        value = adj._values()  # (stored order; not differentiable)
        if adj.requires_grad and torch.is_grad_enabled() and adj.is_coalesced():
            value = adj.values()  # the same entries, differentiable w.r.t. the adjacency
        # (uncoalesced: no gradient in stored order; Graph.from_sparse flags it, GCNConv refuses)
        return "torch", row.long(), col.long(), value, shape
    if adj.layout == torch.sparse_csr:
        crow = adj.crow_indices().long()
        # (torch does not check a CSR tensor's invariants unless asked: its row pointer is read here)
        validate_compressed(crow, adj.col_indices(), shape, "sparse adjacency (torch.sparse_csr)", "crow_indices", "col_indices", check=True)
        row = torch.repeat_interleave(torch.arange(shape[0], device=crow.device), crow[1:] - crow[:-1])
        return "torch", row, adj.col_indices().long(), adj.values(), shape
    raise ValueError(
        f"sparse adjacency layout {adj.layout} is not supported (nor by PyG's GCNConv/GATConv); "
        "pass a COO or CSR tensor (.to_sparse_csr()) with row = target, column = source (PyG's adj_t)"
    )


def _sparse_state(adj) -> tuple:
    """:func:`tensor_state` of a sparse adjacency: its version counter (shared with
    its index and value arrays, so in-place ops on them change it) and the state of
    each array."""
    if _is_torch_sparse_sparsetensor(adj):
        st = adj.storage
        parts = [getattr(st, name, None) for name in ("_row", "_rowptr", "_col", "_value")]
        return tuple(tensor_state(t) for t in parts if isinstance(t, torch.Tensor))
    if adj.layout == torch.sparse_coo:
        parts = (adj._indices(), adj._values())
    elif adj.layout == torch.sparse_csr:
        parts = (adj.crow_indices(), adj.col_indices(), adj.values())
    else:
        return (values_version(adj), tuple(adj.shape), adj.layout)
    return (values_version(adj), tuple(adj.shape), adj.layout) + tuple(tensor_state(t) for t in parts)



def _with_loops(edge_index: torch.Tensor, weight: torch.Tensor | None, fill: float, num_nodes: int, replace: bool):
    """``edge_index`` (and ``weight``) with one loop per node ``< num_nodes`` appended
    (weight ``fill``); existing loops removed first when ``replace``."""
    if replace:
        keep = edge_index[0] != edge_index[1]
        edge_index = edge_index[:, keep]
        weight = None if weight is None else weight[keep]
    loops = torch.arange(num_nodes, device=edge_index.device)
    edge_index = torch.cat([edge_index, torch.stack([loops, loops])], dim=1)
    if weight is not None:
        weight = torch.cat([weight, weight.new_full((num_nodes,), fill)])
    return edge_index, weight


def gcn_edge_weights(
    edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int, *,
    improved: bool = False, add_self_loops: bool = True, normalize: bool = True, dtype: torch.dtype = torch.float32,
    loops: str = "remaining",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, weight)`` of the GCN propagation matrix, one weight per edge
    (remaining self-loops appended, duplicates not yet summed), exactly as PyG's
    ``GCNConv`` computes them (``gcn_norm``; ``normalize=False``: the raw weights with
    the self-loops). Built from torch ops, so differentiable w.r.t. ``edge_weight``
    (twice, as PyG's): :func:`corgnn.functional.gcn.gcn_values` uses that;
    :meth:`Graph.gcn_adjacency` passes detached weights (its result is cached).
    ``loops`` (one of :data:`LOOP_MODES`) is how PyG adds the self-loops for the
    form the graph came in: ``"add"`` (a ``torch.sparse`` adjacency) appends a loop
    for every node, summed with an existing one; ``"set"`` (a SparseTensor) replaces
    existing loops."""
    ew = None if edge_weight is None else edge_weight.to(dtype)
    if add_self_loops and loops != "remaining":
        if ew is None:
            ew = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
        edge_index, ew = _with_loops(edge_index, ew, 2.0 if improved else 1.0, num_nodes, replace=loops == "set")
        add_self_loops = False
    if normalize:
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        return gcn_norm(edge_index, ew, num_nodes, improved, add_self_loops, "source_to_target", dtype)
    if add_self_loops:
        from torch_geometric.utils import add_remaining_self_loops

        edge_index, ew = add_remaining_self_loops(edge_index, ew, 2.0 if improved else 1.0, num_nodes)
    if ew is None:
        ew = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    return edge_index, ew


AGGREGATIONS = ("sum", "add", "mean")
"""The aggregations :meth:`Graph.aggr_adjacency` expresses as one SpMM ("add" = "sum")."""


def aggr_edge_weights(edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int, aggr: str, dtype: torch.dtype) -> torch.Tensor:
    """Per-edge weight ``(q,)`` in :meth:`Graph.aggr_adjacency` (before duplicates are
    summed): ``edge_weight`` (1 when None), over the target's in-degree for "mean"
    (PyG's scatter-mean divides by the edge count, clamped to 1). Torch ops, so
    differentiable w.r.t. ``edge_weight``.

    Raises:
        ValueError: ``aggr`` not one of :data:`AGGREGATIONS`.
    """
    if aggr not in AGGREGATIONS:
        raise ValueError(f"aggr must be one of {AGGREGATIONS}, got {aggr!r}")
    q = edge_index.size(1)
    w = torch.ones(q, dtype=dtype, device=edge_index.device) if edge_weight is None else edge_weight.to(dtype)
    if aggr == "mean":
        deg = torch.bincount(edge_index[1], minlength=num_nodes).clamp_min(1).to(dtype)
        w = w / deg[edge_index[1]]
    return w


class Graph:
    """A directed graph in PyG's convention, validated once, with cached adjacencies.

    Messages flow source -> target: ``edge_index[0]`` are sources, ``edge_index[1]``
    targets, so the propagation matrix has rows = targets and columns = sources.

    Args:
        edge_index: ``(2, q)`` int64 tensor (row 0 = source, row 1 = target).
        edge_weight: optional ``(q,)`` floating weights (GCN only; GAT ignores them,
            as PyG's GATConv without ``edge_dim`` does).
        num_nodes: node count; default ``edge_index.max() + 1``.

    Raises:
        TypeError: non-tensor or non-integer ``edge_index``; non-floating ``edge_weight``.
        ValueError: wrong shapes, negative or out-of-range node ids, ``edge_weight``
            of the wrong length, NaN/Inf weights.

    Example:
        >>> g = Graph(edge_index, num_nodes=x.size(0))
        >>> A = g.gcn_adjacency()          # CSR of D^-1/2 (A + I) D^-1/2, cached
    """

    def __init__(self, edge_index: torch.Tensor, edge_weight: torch.Tensor | None = None, num_nodes: int | None = None):
        self.num_nodes = check_edge_index(edge_index, num_nodes)
        check_edge_weight(edge_weight, edge_index.size(1))
        if edge_weight is not None and edge_weight.device != edge_index.device:
            raise ValueError(f"edge_weight is on {edge_weight.device} but edge_index is on {edge_index.device}")
        # NOTE: a detached alias, not the caller's tensor object: the shared graph
        # cache is keyed weakly on that object, so a Graph must not keep it alive. The
        # alias shares the version counter: an in-place edit of the caller's tensor
        # after construction is refused when a matrix is built (_edges), never read.
        self.edge_index = edge_index.long().detach()
        self._edges_state = tensor_state(self.edge_index)
        self.edge_weight = edge_weight
        self.loops = "remaining"  # how PyG adds self-loops to this graph (LOOP_MODES)
        self.sparse_input = None  # (kind, layout) when built from a sparse adjacency
        self._cache: dict = {}
        self._handouts: dict = {}  # aggr_adjacency's arguments -> (its final matrix, the widest product it serves)
        self._unweighted: "Graph | None" = None
        self.last_setup = None  # the latest corgnn.cost.setup.BuildPlan (rent or buy) of an edge list

    def _edges(self) -> torch.Tensor:
        """``edge_index`` for building a matrix, after checking it was not edited in
        place since this Graph validated it (raises ValueError naming it if so)."""
        if tensor_state(self.edge_index) != self._edges_state:
            raise ValueError(
                "edge_index was modified in place after the corgnn.Graph was built from it; "
                "build a new Graph (or pass a new tensor) after editing a graph"
            )
        return self.edge_index

    def target_bound(self) -> int:
        """``1 +`` the largest target id of the edges (0 without edges): no row of an
        aggregation matrix past it holds an entry. A neighbour-sampled subgraph in
        NeighborLoader's layout (targets numbered first, the last hop's nodes after
        them) has a bound well below its node count; a mini-batch of small graphs, its
        node count. One reduction over the targets, cached."""
        bound = self._cache.get("target-bound")
        if bound is None:
            targets = self._edges()[1]
            bound = self._cache["target-bound"] = int(targets.max()) + 1 if targets.numel() else 0
        return bound

    def targets_beyond(self, limit: float) -> bool:
        """Whether an edge targets a node id ``>= limit`` (:meth:`target_bound` ``> limit``).

        NOTE (issue 21): the last edge's target is read first: in a mini-batch of
        small graphs (PyG's ``Batch``) the last edge ends in the last graph, near the
        node count, which answers the question (~1 us) without the reduction over
        every target (~13 us inside a training loop on 32 small graphs, per batch);
        a NeighborLoader subgraph's edges end in its first nodes, so it reduces."""
        low = self._cache.get("last-target")  # (1 + the last edge's target: a lower bound of target_bound)
        if low is None:
            targets = self._edges()[1]
            low = self._cache["last-target"] = int(targets[-1]) + 1 if targets.numel() else 0
        return low > limit or self.target_bound() > limit

    def unweighted(self) -> "Graph":
        """The same edges without weights (``self`` when there are none), built once:
        the sparsity patterns and entry positions of the matrices depend on the edges
        alone, so a graph whose weights change every call (a learnable edge mask)
        builds them once through this."""
        if self.edge_weight is None:
            return self
        if self._unweighted is None:
            self._unweighted = self._sharing_edges(None)
        return self._unweighted

    def _sharing_edges(self, edge_weight) -> "Graph":
        """A Graph of these (validated) edges with ``edge_weight`` and empty caches."""
        g = Graph.__new__(Graph)
        g.__dict__.update(self.__dict__)
        g.edge_weight, g._cache, g._handouts, g._unweighted, g.last_setup = edge_weight, {}, {}, None, None
        return g

    def with_edge_weight(self, edge_weight: torch.Tensor | None) -> "Graph":
        """A Graph of these edges with ``edge_weight (q,)`` (validated; None: the
        unweighted graph), sharing this graph's unweighted patterns (:meth:`unweighted`)."""
        if edge_weight is None:
            return self.unweighted()
        check_edge_weight(edge_weight, self.num_edges)
        if edge_weight.device != self.device:
            raise ValueError(f"edge_weight is on {edge_weight.device} but edge_index is on {self.device}")
        g = self._sharing_edges(edge_weight)
        g._unweighted = self.unweighted()
        return g

    @classmethod
    def from_sparse(cls, adj, num_nodes: int | None = None) -> "Graph":
        """The graph of a sparse adjacency as PyG's ``GCNConv``/``GATConv`` take it
        in place of ``edge_index``: a ``torch.sparse`` COO or CSR tensor or a
        ``torch_sparse.SparseTensor``, in PyG's ``adj_t`` convention (``adj_t[i, j]``
        is the edge from source ``j`` to target ``i``; the transposed adjacency).
        Its values are the edge weights (GCN; GAT ignores them). Self-loops follow
        PyG's handling of that form (:data:`LOOP_MODES`), and the GAT attention
        edges keep PyG's entry order (see :meth:`gat_edges`).

        Raises:
            TypeError / ValueError: not a sparse adjacency, not square, a layout PyG
                does not take, ``num_nodes`` (``x``'s rows) not its size.
        """
        kind, row, col, value, shape = sparse_adjacency_entries(adj)
        if shape[0] != shape[1]:
            raise ValueError(f"a sparse adjacency must be square (num_nodes, num_nodes), got {shape}")
        if num_nodes is not None and num_nodes != shape[0]:
            raise ValueError(f"x has {num_nodes} rows but the sparse adjacency is {shape[0]} x {shape[1]}")
        if value is not None and not value.is_floating_point():
            value = value.to(torch.get_default_dtype())
        g = cls(torch.stack([col, row]), value, shape[0])
        # the adjacency's values need a gradient that ``value`` cannot carry (an
        # uncoalesced COO tensor): a layer using the values must refuse it
        g.value_grad_lost = (
            bool(getattr(adj, "requires_grad", False)) and torch.is_grad_enabled() and (value is None or not value.requires_grad)
        )
        g.loops = "add" if kind == "torch" else "set"
        g.sparse_input = (kind, getattr(adj, "layout", None))
        return g

    # ------------------------------------------------------------------ basics
    @property
    def num_edges(self) -> int:
        return self.edge_index.size(1)

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def to(self, device) -> "Graph":
        """This graph on ``device`` (a new Graph with empty caches; ``self`` if already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        ew = None if self.edge_weight is None else self.edge_weight.to(device)
        return Graph(self.edge_index.to(device), ew, self.num_nodes)

    def __repr__(self) -> str:
        return f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, device={self.device})"

    def max_in_degree(self) -> int:
        """Largest number of incoming edges of a node (before self-loops)."""
        if not self.num_edges:
            return 0
        return int(torch.bincount(self.edge_index[1], minlength=self.num_nodes).max())

    def _built(self, edge_weight, dtype, *, loops: int, fill: float = 1.0, norm: int = build.NORM_NONE, values: bool = True) -> tuple[CSR, torch.Tensor]:
        """``(A, entry)``: a propagation matrix of this graph on CPU in one counting-sort
        pass (:func:`corgnn.sparse.build.adjacency_csr`) and each edge's entry in it.

        Rows hold their entries in edge order, duplicates as separate entries: the
        products need neither sorted rows nor coalescing, which cost most of a build.
        While autograd is on (a backward, which walks ``A^T``, is likely) the walk of
        ``A^T`` comes from the same kernel call and is installed on ``A``
        (:meth:`~corgnn.sparse.formats.SparseFormat.set_row_plan`); otherwise it is
        built when first needed.
        """
        n = self.num_nodes
        transposed = torch.is_grad_enabled()
        out = build.adjacency_csr(
            self._edges(), edge_weight, n, dtype=dtype, loops=loops, fill=fill, norm=norm, coalesce=False, sort=False, transposed=transposed, check=False,
        )
        csr = CSR(out[0], out[1], out[2] if values else None, (n, n), check=False)
        if transposed:
            csr.set_row_plan(True, *out[4:], check=False)
        return csr, out[3]

    # ---------------------------------------------------------- GCN adjacency
    def gcn_adjacency(
        self,
        *,
        dtype: torch.dtype = torch.float32,
        improved: bool = False,
        add_self_loops: bool = True,
        normalize: bool = True,
        format: str = "csr",
    ) -> SparseFormat:
        """GCN propagation matrix ``A' = D^-1/2 (A + I) D^-1/2`` (paper eq. GCN forward).

        Exactly the semantics of ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` as
        used by PyG's ``GCNConv`` (it is called to compute the weights): remaining
        self-loops are added with fill value 1 (2 if ``improved``; existing loops
        keep their weight), degrees are taken on the target side, duplicate edges
        are summed (on CPU as separate entries, which every product sums: the same
        matrix; each row's entries in edge order, see :meth:`_built`).
        ``normalize=False`` gives the raw weighted adjacency.
        Rows = targets, columns = sources, ``(n, n)``.

        Built once per option set and cached on the Graph; ``A'^T`` for the
        backward pass is the cached CSC dual of the same object.

        Returns:
            The matrix in ``format`` (``"csr"`` default; any of ``FORMAT_NAMES``).
        """
        key = ("gcn", dtype, improved, add_self_loops, normalize)
        csr = self._cache.get(key)
        if csr is None:
            ew = None if self.edge_weight is None else self.edge_weight.detach()  # a constant: cached
            n = self.num_nodes
            if self.loops == "remaining" and build.supported(self.device, dtype):
                # NOTE: one counting-sort pass (sparse/build.py) computes what gcn_norm +
                # a coalescing sort compute: same matrix, O(q) instead of O(q log q).
                csr, entry = self._built(
                    ew, dtype, loops=build.LOOPS_REMAINING if add_self_loops else build.LOOPS_KEEP,
                    fill=2.0 if improved else 1.0, norm=build.NORM_SYMMETRIC if normalize else build.NORM_NONE,
                )
                self._cache.setdefault(("gcn-entry", add_self_loops), entry)
            else:
                ei, ew = gcn_edge_weights(
                    self._edges(), ew, n, improved=improved, add_self_loops=add_self_loops, normalize=normalize, dtype=dtype, loops=self.loops,
                )
                csr = CSR.from_coo(ei[1], ei[0], ew.to(dtype), (n, n), coalesce=True)
            self._cache[key] = csr
        return self._format(key, csr, format)

    def _positions(self, entry: torch.Tensor, add_self_loops: bool) -> torch.Tensor:
        """Entry of the GCN matrix of each edge of :func:`gcn_edge_weights`' output
        (the edges without self-loops, then one loop per node, when ``add_self_loops``;
        else every edge), from :func:`corgnn.sparse.build.adjacency_csr`'s ``entry``."""
        q = self.num_edges
        if not add_self_loops:
            return entry
        ei = self.edge_index
        return torch.cat([entry[:q][ei[0] != ei[1]], entry[q:]])

    def gcn_pattern(self, *, dtype: torch.dtype = torch.float32, add_self_loops: bool = True, format: str = "csr") -> tuple[SparseFormat, torch.Tensor | None]:
        """``(A, positions)``: a GCN matrix with this graph's sparsity pattern (that of
        the unweighted graph, :meth:`unweighted`, built once however often the weights
        change) and, on the fast path, for each edge of :func:`gcn_edge_weights`'
        output the position of its entry in ``A``'s CSR order (None otherwise: then
        :func:`corgnn.functional.gcn.gcn_values` searches them). For layers whose
        values are a differentiable function of the weights (they replace ``A``'s)."""
        base = self.unweighted()
        A = base.gcn_adjacency(dtype=dtype, add_self_loops=add_self_loops, format=format)
        entry = base._cache.get(("gcn-entry", add_self_loops))
        if entry is None or format != "csr":
            return A, None
        pos = base._cache.get(("gcn-positions", add_self_loops))
        if pos is None:
            pos = base._cache[("gcn-positions", add_self_loops)] = base._positions(entry, add_self_loops)
        return A, pos

    def gcn_stats(self, **opts):
        """:class:`corgnn.cost.MatrixStats` of :meth:`gcn_adjacency` with these
        options (sizes and row-length statistics the format plan needs), computed
        once and cached on the Graph."""
        from .cost.io import MatrixStats

        key = ("gcn-stats",) + tuple(sorted(opts.items()))
        st = self._cache.get(key)
        if st is None:
            st = self._cache[key] = MatrixStats.of(self.gcn_adjacency(**opts))
        return st

    # -------------------------------------------------- aggregation adjacency
    def aggr_adjacency(
        self, aggr: str = "sum", *, dtype: torch.dtype = torch.float32, weighted: bool = True, diagonal: bool = False, format: str = "csr",
        diagonal_value: float = 0.0, columns: int | None = None,
    ) -> SparseFormat:
        """Matrix ``A`` of PyG's message passing without self-loops or normalisation:
        ``(A X)_i`` is the ``aggr`` ("sum"/"add" or "mean") over the edges ``j -> i`` of
        ``w_ji x_j`` (``w`` = the edge weights when ``weighted``, else 1), as PyG's
        ``GraphConv``, ``SAGEConv`` and ``GINConv`` aggregate: the entry of an edge is
        its weight, divided by the target's in-degree (edges counted with
        duplicates, at least 1) for "mean" (:func:`aggr_edge_weights`); duplicate
        edges are summed (on CPU as separate entries, see :meth:`gcn_adjacency`).
        Rows = targets, columns = sources, ``(n, n)``. Built once
        per option set and cached like :meth:`gcn_adjacency`. ``diagonal``: the
        pattern also holds every diagonal entry (value 0 where the graph has no
        self-loop), so GIN's ``A + (1 + eps) I`` is the same pattern with new values;
        ``diagonal_value`` (a float, with ``diagonal``) is added to every diagonal
        entry: ``A + c I`` for a constant ``c = 1 + eps``, cached per ``c`` and shared
        by every layer with that ``c`` (on CPU built in the same one pass as the
        pattern, ``c`` summed into existing self-loops; elsewhere the pattern's values
        plus ``c`` on its diagonal).

        ``columns`` (the width of the product the caller runs next; None: always the
        built matrix): a CSR not built yet on CPU is first rented, not bought: the
        graph hands out its **edge list** (an unsorted COO of the edges in their
        order, rows = targets, then one diagonal entry per node with ``diagonal``;
        views of ``edge_index`` without it), until the time the built matrix would have saved
        reaches its build's (:mod:`corgnn.cost.setup`, counted per matrix:
        ``last_setup`` holds the latest state); from then on the CSR.

        Raises:
            ValueError: ``aggr`` not "sum", "add" or "mean".
        """
        # NOTE (issue 21): every layer of a model asks for its matrix on every call; a
        # handed-out matrix that no later call can change (a built one, an edge list
        # whose rent is nothing) is kept under the call's arguments, one dict read
        # for the next layers on the same mini-batch instead of the keys and rent below.
        # Each entry also holds the widest product it serves (a built matrix: any; an
        # edge list: up to cost.setup.free_columns), so a first layer on the input
        # features and the next on the hidden width (16 -> 64 columns) share it.
        memo = (aggr, dtype, weighted, diagonal, format, diagonal_value, columns is None, torch.is_grad_enabled(), torch.get_num_threads())
        hit = self._handouts.get(memo)
        if hit is not None and (columns is None or columns <= hit[1]):
            return hit[0]
        A, width = self._aggr_adjacency(aggr, dtype, weighted, diagonal, format, diagonal_value, columns)
        if width is not None:
            self._handouts[memo] = (A, width)
        return A

    def _aggr_adjacency(self, aggr: str, dtype, weighted: bool, diagonal: bool, format: str, diagonal_value: float, columns: int | None) -> tuple[SparseFormat, float | None]:
        """``(matrix, width)``: :meth:`aggr_adjacency`'s matrix, and the widest product
        for which another call with the same arguments gets the same one (``inf``: a
        built matrix; None: an edge list still paying rent)."""
        aggr = "sum" if aggr == "add" else aggr
        key = ("aggr", aggr, dtype, bool(weighted and self.edge_weight is not None), bool(diagonal))
        ew = self.edge_weight.detach() if key[-2] else None  # a constant: cached
        n = self.num_nodes
        c = float(diagonal_value) if diagonal else 0.0
        if columns is not None and format == "csr":
            edges = self._rented(key + ("diagonal-value", c) if c != 0.0 else key, columns, lambda: self._edge_list(aggr, dtype, ew, diagonal, c))
            if edges is not None:
                return edges

        def built(loops: int):
            return self._built(ew, dtype, loops=loops, fill=c, norm=build.NORM_MEAN if aggr == "mean" else build.NORM_NONE)

        if c != 0.0:
            vkey = key + ("diagonal-value", c)
            csr = self._cache.get(vkey)
            if csr is None:
                if build.supported(self.device, dtype):  # A + cI in the one pass (c summed into existing loops)
                    csr = self._cache[vkey] = built(build.LOOPS_DIAGONAL)[0]
                else:
                    base = self.aggr_adjacency(aggr, dtype=dtype, weighted=weighted, diagonal=True)
                    with torch.no_grad():
                        val = torch.add(base.val, self.diagonal_mask(aggr, dtype=dtype, weighted=weighted), alpha=c)
                    csr = self._cache[vkey] = base.with_values(val)
            return self._format(vkey, csr, format), math.inf
        csr = self._cache.get(key)
        if csr is None:
            if build.supported(self.device, dtype):
                csr, entry = built(build.LOOPS_DIAGONAL if diagonal else build.LOOPS_KEEP)
                self._cache[key] = csr
                if diagonal:  # (the entry of each node's diagonal: known from the build)
                    self._cache[key + ("diagonal",)] = torch.zeros(csr.nnz, dtype=dtype).index_fill_(0, entry[self.num_edges:], 1.0)
            else:
                ei, w = self._edges(), aggr_edge_weights(self.edge_index, ew, n, aggr, dtype)
                if diagonal:
                    ei, w = _with_loops(ei, w, 0.0, n, replace=False)
                csr = self._cache[key] = CSR.from_coo(ei[1], ei[0], w, (n, n), coalesce=True)
        return self._format(key, csr, format), math.inf

    def diagonal_mask(self, aggr: str = "sum", *, dtype: torch.dtype = torch.float32, weighted: bool = True, matrix: SparseFormat | None = None) -> torch.Tensor:
        """``(nnz,)`` of ``dtype``: 1 at the diagonal entries of
        :meth:`aggr_adjacency` ``(aggr, diagonal=True)`` (CSR entry order), 0 elsewhere,
        cached (GIN's ``A + (1 + eps) I`` is that matrix's values plus ``1 + eps``
        times this). ``matrix``: the matrix of those options this graph handed out,
        the CSR or the edge list (whose mask marks the appended diagonal entries, not
        the edges that are self-loops: those keep their own value)."""
        key = ("aggr", "sum" if aggr == "add" else aggr, dtype, bool(weighted and self.edge_weight is not None), True, "diagonal")
        rented = self._cache.get(("edges",) + key[:-1])
        if matrix is not None and rented is not None and rented[0] is matrix:
            if rented[1] is None:  # (made at the first use: a constant eps needs none)
                q, n = self.num_edges, self.num_nodes
                rented[1] = torch.cat([torch.zeros(q, dtype=dtype, device=self.device), torch.ones(n, dtype=dtype, device=self.device)])
            return rented[1]
        A = self.aggr_adjacency(aggr, dtype=dtype, weighted=weighted, diagonal=True)
        mask = self._cache.get(key)
        if mask is None:
            coo = A.to_coo()
            mask = self._cache[key] = (coo.row == coo.col).to(dtype)
        return mask

    def _rented(self, key, columns: int, make) -> tuple[SparseFormat, float | None] | None:
        """``(edge list, width)`` of matrix ``key`` (``make() -> A``, kept) while
        renting it pays, else None (build ``key``): each product adds its rent
        (:func:`corgnn.cost.setup.scatter_rent_s`, two products while autograd is on:
        the backward multiplies by ``A^T``) until the rent paid reaches the build's
        price (:func:`~corgnn.cost.setup.build_s`); ``last_setup`` records the state.
        ``width``: with no rent to count, the widest product that counts none either
        (:func:`~corgnn.cost.setup.free_columns`: the same call, or one as narrow, would
        get the edge list again), else None."""
        if key in self._cache or self.device.type != "cpu":
            return None
        ekey = ("edges",) + key
        rented = self._cache.get(ekey)
        if rented is None:
            A = make()
            rented = self._cache[ekey] = [A, None, 0.0, build_s(A.nnz)]  # (matrix, diagonal mask once asked for, rent paid, price)
            self.last_setup = BuildPlan(False, 0.0, rented[3])
        rent = scatter_rent_s(rented[0].nnz, columns, torch.get_num_threads(), 2 if torch.is_grad_enabled() else 1)
        if rent:  # (zero where the scatter is the faster: nothing to count, the common case of small graphs)
            rented[2] += rent
            self.last_setup = BuildPlan(rented[2] >= rented[3], rented[2], rented[3])
            if self.last_setup.build:
                del self._cache[ekey]
                self._handouts.clear()  # (an edge list handed out as final is built now: the matrix from now on)
                return None
        return rented[0], None if rent else free_columns(rented[0].nnz, torch.get_num_threads())

    def _edge_list(self, aggr: str, dtype: torch.dtype, ew: torch.Tensor | None, diagonal: bool, c: float):
        """:meth:`aggr_adjacency`'s matrix as an unsorted COO of the edges in their order
        (rows = targets: views of ``edge_index``), with ``diagonal`` one entry ``(i, i)``
        per node after them, valued ``c``; values None for an all-ones matrix. (Its
        diagonal mask, 1 at the appended entries, is made when first asked for:
        :meth:`diagonal_mask`.)"""
        ei, n, q = self._edges(), self.num_nodes, self.num_edges
        if aggr == "mean" and build.supported(ei.device, dtype):  # (the weights in one pass; ew is a constant here)
            w = build.mean_weights(ei[1], ew, n, dtype=dtype, check=False)
        else:
            w = None if aggr == "sum" and ew is None else aggr_edge_weights(ei, ew, n, aggr, dtype)
        row, col = ei[1], ei[0]
        if diagonal:
            loops = torch.arange(n, device=ei.device)
            row, col = torch.cat([row, loops]), torch.cat([col, loops])
            if w is not None or c != 1.0:
                w = torch.cat([torch.ones(q, dtype=dtype, device=ei.device) if w is None else w, torch.full((n,), c, dtype=dtype, device=ei.device)])
        return COO(row, col, w, (n, n), check=False)

    # ---------------------------------------------------------- GAT adjacency
    def gat_adjacency(self, *, add_self_loops: bool = True, format: str = "csr") -> SparseFormat:
        """Attention pattern of PyG's ``GATConv``: existing self-loops removed and one
        added per node (when ``add_self_loops``); duplicate edges kept as separate
        edges (merged for a ``torch.sparse`` input, as PyG coalesces it). Rows =
        targets, columns = sources, no values (the attention coefficients are
        supplied per call). Cached.
        """
        key = ("gat", add_self_loops)
        csr = self._cache.get(key)
        if csr is None:
            n = self.num_nodes
            if self.loops == "remaining" and build.supported(self.device, None):
                csr, entry = self._built(None, torch.float32, loops=build.LOOPS_REPLACE if add_self_loops else build.LOOPS_KEEP, values=False)
                self._cache[("gat-entry", add_self_loops)] = entry
            else:
                ei, _ = self.gat_edges(add_self_loops=add_self_loops)
                csr = CSR.from_coo(ei[1], ei[0], None, (n, n), coalesce=False)
            self._cache[key] = csr
        return self._format(key, csr, format)

    def gat_edges(self, *, add_self_loops: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index (2, q'), perm (q',))``: the edges of PyG's ``GATConv`` after its
        self-loop handling, in PyG's order (the ``edge_index`` it returns with
        ``return_attention_weights=True``; edge features follow it), and for each
        entry of the CSR :meth:`gat_adjacency` the position of its edge there
        (``alpha_csr = alpha_pyg[perm]``; ``perm.argsort()`` maps back). Cached.
        """
        key = ("gat-edges", add_self_loops)
        out = self._cache.get(key)
        if out is None:
            n = self.num_nodes
            ei = gat_edges(self._edges(), n, n, n if add_self_loops else None, self.loops)
            if self.loops == "remaining" and build.supported(self.device, None):
                self.gat_adjacency(add_self_loops=add_self_loops)  # (records each edge's entry)
            entry = self._cache.get(("gat-entry", add_self_loops))
            if entry is None:
                perm = torch.argsort(ei[1] * max(n, 1) + ei[0], stable=True)  # CSR.from_coo's order
            else:  # the CSR position of each of PyG's edges (kept edges in order, then the loops), inverted
                q = self.num_edges
                at = torch.cat([entry[:q][self.edge_index[0] != self.edge_index[1]], entry[q:]]) if add_self_loops else entry
                perm = torch.empty_like(at)
                perm[at] = torch.arange(at.numel())
            out = self._cache[key] = (ei, perm)
        return out

    def _format(self, key, csr: CSR, format: str) -> SparseFormat:
        if format == "csr":
            return csr
        fkey = key + (format,)
        out = self._cache.get(fkey)
        if out is None:
            out = self._cache[fkey] = convert(csr, format)
        return out


def gat_edges(edge_index: torch.Tensor, n_src: int, n_dst: int, num_loops: int | None, loops: str = "remaining") -> torch.Tensor:
    """The edges PyG's ``GATConv`` attends over, in its order: ``edge_index`` (row 0 =
    source ``< n_src``, row 1 = target ``< n_dst``) with its self-loops removed and one
    loop per node ``< num_loops`` appended (``None``: unchanged). For a sparse
    adjacency (``loops`` ``"add"``/``"set"``, see :data:`LOOP_MODES`) PyG rebuilds the
    matrix with the loops, sorted by (target, source), a ``torch.sparse`` one with
    duplicate entries merged."""
    if num_loops is None:
        return edge_index
    keep = edge_index[0] != edge_index[1]
    idx = torch.arange(num_loops, device=edge_index.device)
    ei = torch.cat([edge_index[:, keep], torch.stack([idx, idx])], dim=1)
    if loops != "remaining":
        m = max(n_src, 1)
        key = ei[1] * m + ei[0]
        key = torch.unique(key) if loops == "add" else torch.sort(key).values
        ei = torch.stack([key % m, key // m])
    return ei


def sparse_attention_result(sparse_input: tuple, edge_index: torch.Tensor, alpha: torch.Tensor, shape: tuple[int, int]):
    """The second item PyG's ``GATConv`` returns with ``return_attention_weights=True``
    for a sparse adjacency (``sparse_input`` = :attr:`Graph.sparse_input`):
    ``(adj, alpha)`` with ``adj`` a ``torch.sparse`` tensor of the input's layout
    holding ``alpha`` at the attention edges ``edge_index`` (PyG's order; shape
    ``shape + (heads,)``), or for a SparseTensor input the SparseTensor alone."""
    kind, layout = sparse_input
    row, col = edge_index[1], edge_index[0]
    if kind == "SparseTensor":
        from torch_sparse import SparseTensor

        return SparseTensor(row=row, col=col, value=alpha, sparse_sizes=shape, is_sorted=True, trust_data=True)
    size = tuple(shape) + tuple(alpha.shape[1:])
    if layout == torch.sparse_csr:
        from .sparse.formats import ptr_from_sorted

        return torch.sparse_csr_tensor(ptr_from_sorted(row, shape[0]), col, alpha, size), alpha
    return torch.sparse_coo_tensor(torch.stack([row, col]), alpha, size).coalesce(), alpha


def as_graph(edge_index_or_graph, edge_weight=None, num_nodes: int | None = None) -> Graph:
    """Accept a :class:`Graph`, a PyG ``edge_index`` (+ optional weights) or a sparse
    adjacency (``torch.sparse`` / ``torch_sparse.SparseTensor``, PyG's ``adj_t``)."""
    if isinstance(edge_index_or_graph, Graph):
        if edge_weight is not None:
            raise ValueError("edge_weight must be given when building the Graph, not with a Graph argument")
        if num_nodes is not None and num_nodes != edge_index_or_graph.num_nodes:
            raise ValueError(f"x has {num_nodes} rows but the Graph has {edge_index_or_graph.num_nodes} nodes")
        return edge_index_or_graph
    if is_sparse_adjacency(edge_index_or_graph):
        _no_weight_with_sparse(edge_weight)
        return Graph.from_sparse(edge_index_or_graph, num_nodes)
    return Graph(edge_index_or_graph, edge_weight, num_nodes)


def _no_weight_with_sparse(edge_weight) -> None:
    if edge_weight is not None:
        raise ValueError(
            "edge_weight must be None with a sparse adjacency: its values are the edge weights "
            "(PyG ignores edge_weight there); put the weights into the sparse matrix"
        )


class GraphCache(Uncopied):
    """Maps the ``edge_index`` a module is called with to a :class:`Graph`, once.

    Like PyG's ``cached=True`` but safer: keyed on the ``edge_index`` /
    ``edge_weight`` tensors themselves (identity and :func:`tensor_state`: in-place
    version counter, data address, shape) and the node count, so a training loop
    passing the same ``edge_index`` every epoch builds ``A'`` once, and a new
    tensor, one modified by an in-place torch op, or one whose ``.data`` was rebound
    gets the Graph of its contents: one seen recently as another tensor (up to
    :data:`CONTENT_MAX_EDGES` edges, :func:`graph_by_content`), else a new one. PyG's
    ``cached=True`` reuses its first graph for any input.

    Limit (by design): writes that bypass autograd's version counter,
    ``edge_index.data[0, 5] = 7`` or through ``edge_index.numpy()`` (or a DLPack
    view), are not seen: the cached Graph goes stale, as PyG's cache would. After
    such an edit pass a new tensor (``edge_index.clone()``) or a new
    :class:`Graph`. NOTE: a content check on every call would catch them, but costs
    O(q) per call plus a copy of ``edge_index``: 9.6 us per call on Cora (q =
    10556), about 1 % of a GCN training step (0.82 ms) and 6 % of a no-grad GCNConv
    call (0.16 ms), 2 cores, and a second ``edge_index`` in memory; the torch.compile
    path pays it (see :func:`graph_by_content`) because it cannot see tensor
    identity. Eager calls pay it only for a tensor they have not seen.

    The graphs of ``edge_index`` tensors are shared across layers and models
    (:func:`shared_graph`); a sparse adjacency is kept per instance. Cached state is
    never pickled or deep-copied: a copy starts empty.
    """

    def __init__(self):
        self._key = None
        self._graph = None

    def __call__(self, edge_index_or_graph, edge_weight=None, num_nodes: int | None = None) -> Graph:
        if type(edge_index_or_graph) is torch.Tensor and edge_index_or_graph.layout == torch.strided:  # (the common case first)
            return shared_graph(edge_index_or_graph, edge_weight, num_nodes)
        if is_sparse_adjacency(edge_index_or_graph):
            # keyed on the sparse matrix object and the state of its arrays
            adj = edge_index_or_graph
            _no_weight_with_sparse(edge_weight)
            # (a COO tensor's values are differentiable only when grad is on: part of the key)
            key = ("sparse", _sparse_state(adj), num_nodes, bool(getattr(adj, "requires_grad", False)) and torch.is_grad_enabled())
            old = self._key
            if old is not None and old[0] is adj and old[1:] == key:
                return self._graph
            self._graph = Graph.from_sparse(adj, num_nodes)
            self._key = (adj,) + key
            return self._graph
        if isinstance(edge_index_or_graph, Graph) or not isinstance(edge_index_or_graph, torch.Tensor):
            return as_graph(edge_index_or_graph, edge_weight, num_nodes)
        return shared_graph(edge_index_or_graph, edge_weight, num_nodes)


GRAPHS = SharedCache(capacity=32)
"""The process-wide store of :func:`shared_graph`: the Graph of each ``edge_index``
(and ``edge_weight``) tensor seen recently, dropped when the tensor is freed, or
beyond the 32 most recently used (:func:`corgnn.clear_caches` drops them all)."""


def shared_graph(edge_index: torch.Tensor, edge_weight: torch.Tensor | None = None, num_nodes: int | None = None) -> Graph:
    """The :class:`Graph` of ``edge_index (2, q)`` (+ ``edge_weight (q,)``), built once
    and shared by every layer and model that sees the same tensors: an L-layer model
    builds one Graph (and one ``A'``) per batch, not L.

    Keyed as :class:`GraphCache` says (tensor identity and state, the node count); a
    graph with weights shares the patterns of the unweighted graph of the same
    ``edge_index`` (:meth:`Graph.unweighted`), so weights that change every call (an
    explainer's edge mask) do not rebuild them.

    Raises: as :class:`Graph` (validation runs once per new key).
    """
    extra = (num_nodes,)
    g = GRAPHS.get((edge_index, edge_weight), extra)
    if g is not None:
        return g
    if edge_weight is None:
        return GRAPHS.put((edge_index, None), _edges_graph(edge_index, num_nodes), extra)
    base = GRAPHS.get((edge_index, None), extra)
    if base is None:
        base = GRAPHS.put((edge_index, None), _edges_graph(edge_index, num_nodes), extra)
    return GRAPHS.put((edge_index, edge_weight), base.with_edge_weight(edge_weight), extra)


CONTENT_MAX_EDGES = 1 << 16
"""A new ``edge_index`` tensor of at most this many edges is first looked up by its
contents (:func:`graph_by_content`), so a graph that comes back as a new tensor
reuses the Graph and matrices built for it.

NOTE (issue 21, measured on PyG's ``examples/mutag_gin.py``, 2-core VM): its
evaluation loaders collate the same graphs into new tensors every epoch, three
batches of five an epoch, and the build of each new batch's graph (~100-150 us in
the loop) was what made corgnn's evaluation forward slower than PyG's (0.94 vs
0.79 ms); a lookup costs a scan of :data:`CONTENT_GRAPHS` (equal sizes only, then
``torch.equal``) and a miss one copy of ``edge_index``. The bound keeps the graphs
held after their tensors are gone small (at most ``capacity`` graphs of 64 k edges)."""


def _edges_graph(edge_index: torch.Tensor, num_nodes: int | None) -> Graph:
    """The unweighted :class:`Graph` of a new ``edge_index`` tensor: by its contents
    (:func:`graph_by_content`) up to :data:`CONTENT_MAX_EDGES` edges while such
    lookups can pay (:meth:`corgnn._cache.ContentCache.probes`), else a new one."""
    if edge_index.dim() == 2 and edge_index.size(1) <= CONTENT_MAX_EDGES and CONTENT_GRAPHS.probes():
        return graph_by_content(edge_index, None, num_nodes)
    return Graph(edge_index, None, num_nodes)


# ----------------------------------------------------------------- torch.compile path
# NOTE (design): under torch.compile a layer cannot build or look up its Graph in
# Python (tensor identity, version counters, .item() validation and data-dependent
# sizes would each break the graph). Instead the adjacency is produced by the custom
# ops below: opaque to the compiler (their fake implementations give an unbacked
# entry count), they run at call time, validate edge_index exactly like Graph, and
# keep the built Graphs in a small cache keyed on the *contents* of edge_index /
# edge_weight (a copy is compared, so edits through .data or NumPy views are seen),
# so a training loop pays one O(q) comparison per call instead of a rebuild. The
# arrays are returned as fresh copies (O(q) bytes per call): a compiled graph may
# reuse its ops' output buffers, which must never be the cached ones.
# The entry count of A' is data-dependent (remaining self-loops, coalesced
# duplicates), and an op whose output size depends on data is a graph break unless
# the user enables dynamo's capture_dynamic_output_shape_ops. So the per-entry
# arrays are padded to the bound q + n (q edges plus at most one self-loop per
# node), a size known from the input shapes: the row pointers end at the true entry
# count, every kernel walks rows through them, and the padding is never read.

CONTENT_GRAPHS = ContentCache(capacity=8)
"""Graphs by the contents of their ``edge_index`` / ``edge_weight`` and node count
argument (:func:`graph_by_content`): the custom ops of the compiled path, and new
eager tensors of up to :data:`CONTENT_MAX_EDGES` edges."""


def graph_by_content(edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int | None) -> Graph:
    """The cached :class:`Graph` whose ``edge_index``/``edge_weight`` equal these
    tensors' contents (and ``num_nodes`` argument), else a new one, validated and
    cached in :data:`CONTENT_GRAPHS` (the most recently used few). A new one is
    built on private copies of the tensors, which are also its keys: no edit of the
    caller's tensors, even through ``.data`` or NumPy, reaches a cached Graph. As
    every key of :func:`tensor_state`, one found under ``torch.inference_mode`` was
    built under it (its matrices are inference tensors, refused outside)."""
    extra = (num_nodes, torch.is_inference_mode_enabled())
    g = CONTENT_GRAPHS.get((edge_index, edge_weight), extra)
    if g is not None:
        return g
    ei = edge_index.detach().clone() if isinstance(edge_index, torch.Tensor) else edge_index
    ew = None if edge_weight is None else edge_weight.detach().clone()
    return CONTENT_GRAPHS.put((ei, ew), Graph(ei, ew, num_nodes), extra)


@torch.library.custom_op("corgnn::gcn_adjacency", mutates_args=())
def _gcn_adjacency_op(
    edge_index: torch.Tensor, edge_weight: torch.Tensor | None, num_nodes: int,
    improved: bool, add_self_loops: bool, normalize: bool, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = graph_by_content(edge_index, edge_weight, num_nodes)
    csr = g.gcn_adjacency(dtype=dtype, improved=improved, add_self_loops=add_self_loops, normalize=normalize)
    csc = csr.to_csc()
    bound = edge_index.size(1) + num_nodes
    return csr.rowptr.clone(), _padded(csr.col, bound), _padded(csr.val, bound), csc.colptr.clone(), _padded(csc.row, bound), _padded(csc.perm, bound)


@_gcn_adjacency_op.register_fake
def _(edge_index, edge_weight, num_nodes, improved, add_self_loops, normalize, dtype):
    q = edge_index.shape[1] + num_nodes
    ptr = edge_index.new_empty(num_nodes + 1, dtype=torch.long)
    idx = edge_index.new_empty(q, dtype=torch.long)
    return ptr, idx, edge_index.new_empty(q, dtype=dtype), ptr.clone(), idx.clone(), idx.clone()


@torch.library.custom_op("corgnn::gat_adjacency", mutates_args=())
def _gat_adjacency_op(edge_index: torch.Tensor, num_nodes: int, add_self_loops: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    csr = graph_by_content(edge_index, None, num_nodes).gat_adjacency(add_self_loops=add_self_loops)
    csc = csr.to_csc()
    bound = edge_index.size(1) + num_nodes
    return csr.rowptr.clone(), _padded(csr.col, bound), csc.colptr.clone(), _padded(csc.row, bound), _padded(csc.perm, bound)


@_gat_adjacency_op.register_fake
def _(edge_index, num_nodes, add_self_loops):
    q = edge_index.shape[1] + num_nodes
    ptr = edge_index.new_empty(num_nodes + 1, dtype=torch.long)
    idx = edge_index.new_empty(q, dtype=torch.long)
    return ptr, idx, ptr.clone(), idx.clone(), idx.clone()


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    """A copy of ``t`` padded with zeros to ``size`` entries."""
    out = t.new_zeros(size)
    out[: t.numel()] = t
    return out


def _csr_with_dual(rowptr, col, val, colptr, row, perm, n: int) -> CSR:
    """A CSR whose row plans (``A`` and ``A^T``) are the given arrays, no lazy work
    left. Its per-entry arrays may carry padding past ``rowptr[-1]`` (never read)."""
    A = CSR(rowptr, col, val, (n, n), check=False)
    A.set_row_plan(False, rowptr, col, None, check=False)
    A.set_row_plan(True, colptr, row, perm, check=False)
    return A


def compiled_gcn_adjacency(edge_index_or_graph, edge_weight, num_nodes: int, *, dtype, improved: bool, add_self_loops: bool, normalize: bool) -> CSR:
    """:meth:`Graph.gcn_adjacency` (CSR) for code traced by ``torch.compile``."""
    ei, ew, n = _unpack(edge_index_or_graph, edge_weight, num_nodes)
    arrays = torch.ops.corgnn.gcn_adjacency(ei, ew, n, improved, add_self_loops, normalize, dtype)
    return _csr_with_dual(*arrays, n)


def compiled_gat_adjacency(edge_index_or_graph, num_nodes: int, *, add_self_loops: bool) -> CSR:
    """:meth:`Graph.gat_adjacency` (CSR pattern) for code traced by ``torch.compile``."""
    ei, _, n = _unpack(edge_index_or_graph, None, num_nodes)
    rowptr, col, colptr, row, perm = torch.ops.corgnn.gat_adjacency(ei, n, add_self_loops)
    return _csr_with_dual(rowptr, col, None, colptr, row, perm, n)


def _unpack(edge_index_or_graph, edge_weight, num_nodes):
    if isinstance(edge_index_or_graph, Graph):
        g = edge_index_or_graph
        if edge_weight is not None:
            raise ValueError("edge_weight must be given when building the Graph, not with a Graph argument")
        if g.loops != "remaining":  # (the compiled ops rebuild the graph from its edge list)
            raise ValueError("under torch.compile, a Graph built from a sparse adjacency is not supported; pass edge_index or run eagerly")
        return g.edge_index, g.edge_weight, g.num_nodes
    if is_sparse_adjacency(edge_index_or_graph):
        raise ValueError("under torch.compile, edge_index must be a (2, q) integer tensor or a corgnn.Graph; a sparse adjacency is not supported there")
    if not isinstance(edge_index_or_graph, torch.Tensor) or edge_index_or_graph.dim() != 2 or edge_index_or_graph.size(0) != 2:
        raise ValueError("edge_index must be a (2, q) integer tensor")
    return edge_index_or_graph, edge_weight, num_nodes
