"""Mini-batches of METIS clusters (Cluster-GCN style), with no compiled extension.

PyG's ``NeighborLoader`` and ``ClusterData`` need ``pyg-lib`` or ``torch-sparse``;
:class:`ClusterBatches` splits the nodes with :func:`~.partition.partition_nodes`
(METIS through ``pymetis``, or id ranges) into clusters of about ``batch_size``
nodes and yields each cluster's induced subgraph (``torch_geometric.utils.subgraph``)
in a random order per epoch.

The clusters are fixed, so each one's :class:`corgnn.Graph` is built once and kept:
from the second epoch on a batch costs no graph construction or normalisation (the
Graph caches ``A'``; its CSC dual is built lazily, on the first backward), only
the layers' planning (:attr:`ClusterBatches.stats` measures both).
"""

from __future__ import annotations

import time

import torch

from .partition import partition_nodes

__all__ = ["ClusterBatches"]


class ClusterBatches:
    """Iterable of ``(nodes, graph, x_b)`` batches: ``nodes (b,)`` global ids (index
    labels and masks with them), ``graph`` the induced subgraph as a
    :class:`corgnn.Graph` on ``b`` nodes (edges between clusters are dropped) and
    ``x_b`` the cluster's rows of ``x`` (None without ``x``), kept across epochs: a
    corgnn CSR when at most :data:`corgnn.nn.base.SPARSE_FEATURE_DENSITY` of them are
    non-zero (as the layers would convert them, once instead of every batch).

    Args:
        edge_index: ``(2, q)`` int64 (PyG convention); num_nodes: node count.
        batch_size: about this many nodes per batch (``ceil(n / batch_size)`` clusters).
        method: :data:`~.partition.PARTITION_METHODS` (default METIS when available).
        shuffle: visit the clusters in a random order (torch's generator) per epoch.
        device: where the batch graphs live (the node ids stay on the CPU).
        x: optional ``(num_nodes, m)`` constant node features to slice per cluster.

    Raises:
        ValueError: ``batch_size`` < 1 (and :func:`partition_nodes`' errors).

    Attributes:
        stats: seconds spent building batch graphs (``"build_s"``, the first epoch
            only) and the count of batches served (``"batches"``).
    """

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, batch_size: int, *, method: str = "auto", shuffle: bool = True, device="cpu", x: torch.Tensor | None = None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        edge_index = edge_index.cpu()
        self.edge_index, self.num_nodes, self.shuffle, self.device = edge_index, num_nodes, shuffle, torch.device(device)
        nparts = max(1, -(-num_nodes // batch_size))
        parts = partition_nodes(edge_index, num_nodes, nparts, method)
        order = torch.argsort(parts, stable=True)
        self.clusters = list(torch.split(order, torch.bincount(parts, minlength=nparts).tolist()))
        if x is not None and (x.dim() != 2 or x.size(0) != num_nodes):
            raise ValueError(f"x must have shape ({num_nodes}, m), got {tuple(x.shape)}")
        self.x = x
        self._graphs: dict[int, object] = {}
        self._features: dict[int, object] = {}
        self.stats = {"build_s": 0.0, "batches": 0}

    def __len__(self) -> int:
        return len(self.clusters)

    def graph(self, i: int):
        """The :class:`corgnn.Graph` of cluster ``i`` (built on first use, then kept)."""
        g = self._graphs.get(i)
        if g is None:
            from torch_geometric.utils import subgraph

            from ..graph import Graph

            t0 = time.perf_counter()
            nodes = self.clusters[i]
            ei, _ = subgraph(nodes, self.edge_index, relabel_nodes=True, num_nodes=self.num_nodes)
            g = self._graphs[i] = Graph(ei.to(self.device), num_nodes=nodes.numel())
            self.stats["build_s"] += time.perf_counter() - t0
        return g

    def features(self, i: int):
        """Cluster ``i``'s rows of ``x`` (None without ``x``), built on first use, then kept."""
        if self.x is None:
            return None
        xb = self._features.get(i)
        if xb is None:
            from ..nn.base import SPARSE_FEATURE_DENSITY, dense_to_csr, row_pointer

            xb = self.x[self.clusters[i].to(self.x.device)]
            ptr = row_pointer(xb)
            xb = self._features[i] = dense_to_csr(xb, ptr) if int(ptr[-1]) <= SPARSE_FEATURE_DENSITY * xb.numel() else xb
        return xb

    def __iter__(self):
        order = torch.randperm(len(self.clusters)) if self.shuffle else torch.arange(len(self.clusters))
        for i in order.tolist():
            self.stats["batches"] += 1
            yield self.clusters[i], self.graph(i), self.features(i)
