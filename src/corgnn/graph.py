"""``Graph``: a validated graph with its propagation matrices built once and cached."""

from __future__ import annotations

import torch

from ._validate import check_edge_index, check_edge_weight
from .sparse.formats import CSR, SparseFormat
from .sparse.registry import convert

__all__ = ["Graph", "GraphCache", "as_graph"]


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
        self.edge_index = edge_index.long()
        self.edge_weight = edge_weight
        self._cache: dict = {}

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
        are summed. ``normalize=False`` gives the raw weighted adjacency.
        Rows = targets, columns = sources, ``(n, n)``.

        Built once per option set and cached on the Graph; ``A'^T`` for the
        backward pass is the cached CSC dual of the same object.

        Returns:
            The matrix in ``format`` (``"csr"`` default; any of ``FORMAT_NAMES``).
        """
        key = ("gcn", dtype, improved, add_self_loops, normalize)
        csr = self._cache.get(key)
        if csr is None:
            ei, ew = self.edge_index, self.edge_weight
            if ew is not None:
                ew = ew.to(dtype)
            if normalize:
                from torch_geometric.nn.conv.gcn_conv import gcn_norm

                ei, ew = gcn_norm(ei, ew, self.num_nodes, improved, add_self_loops, "source_to_target", dtype)
            else:
                if add_self_loops:
                    from torch_geometric.utils import add_remaining_self_loops

                    ei, ew = add_remaining_self_loops(ei, ew, 2.0 if improved else 1.0, self.num_nodes)
                if ew is None:
                    ew = torch.ones(ei.size(1), dtype=dtype, device=ei.device)
            n = self.num_nodes
            csr = CSR.from_coo(ei[1], ei[0], ew.to(dtype), (n, n), coalesce=True)
            self._cache[key] = csr
        return self._format(key, csr, format)

    # ---------------------------------------------------------- GAT adjacency
    def gat_adjacency(self, *, add_self_loops: bool = True, format: str = "csr") -> SparseFormat:
        """Attention pattern of PyG's ``GATConv``: existing self-loops removed and one
        added per node (when ``add_self_loops``); duplicate edges kept as separate
        edges. Rows = targets, columns = sources, no values (the attention
        coefficients are supplied per call). Cached.
        """
        key = ("gat", add_self_loops)
        csr = self._cache.get(key)
        if csr is None:
            ei = self.edge_index
            if add_self_loops:
                keep = ei[0] != ei[1]
                loops = torch.arange(self.num_nodes, device=ei.device)
                ei = torch.cat([ei[:, keep], torch.stack([loops, loops])], dim=1)
            n = self.num_nodes
            csr = CSR.from_coo(ei[1], ei[0], None, (n, n), coalesce=False)
            self._cache[key] = csr
        return self._format(key, csr, format)

    def _format(self, key, csr: CSR, format: str) -> SparseFormat:
        if format == "csr":
            return csr
        fkey = key + (format,)
        out = self._cache.get(fkey)
        if out is None:
            out = self._cache[fkey] = convert(csr, format)
        return out


def as_graph(edge_index_or_graph, edge_weight=None, num_nodes: int | None = None) -> Graph:
    """Accept a :class:`Graph` or a PyG ``edge_index`` (+ optional weights)."""
    if isinstance(edge_index_or_graph, Graph):
        if edge_weight is not None:
            raise ValueError("edge_weight must be given when building the Graph, not with a Graph argument")
        if num_nodes is not None and num_nodes != edge_index_or_graph.num_nodes:
            raise ValueError(f"x has {num_nodes} rows but the Graph has {edge_index_or_graph.num_nodes} nodes")
        return edge_index_or_graph
    return Graph(edge_index_or_graph, edge_weight, num_nodes)


class GraphCache:
    """Maps the ``edge_index`` a module is called with to a :class:`Graph`, once.

    Like PyG's ``cached=True`` but safe: keyed on the ``edge_index`` /
    ``edge_weight`` tensors themselves (identity and in-place version counter) and
    the node count, so a training loop passing the same ``edge_index`` every epoch
    builds ``A'`` once, and a new or modified tensor builds a new Graph.
    """

    def __init__(self):
        self._key = None
        self._graph = None

    def __call__(self, edge_index_or_graph, edge_weight=None, num_nodes: int | None = None) -> Graph:
        if isinstance(edge_index_or_graph, Graph) or not isinstance(edge_index_or_graph, torch.Tensor):
            return as_graph(edge_index_or_graph, edge_weight, num_nodes)
        key = (
            edge_index_or_graph,
            edge_index_or_graph._version,
            edge_weight,
            None if edge_weight is None else edge_weight._version,
            num_nodes,
        )
        old = self._key
        if old is not None and all((a is b) if isinstance(a, torch.Tensor) or b is None else a == b for a, b in zip(old, key)):
            return self._graph
        self._graph = Graph(edge_index_or_graph, edge_weight, num_nodes)
        self._key = key
        return self._graph
