"""Row partitioning of a graph over ranks, and each rank's local view of it.

Rank ``r`` owns a set of nodes (its rows of ``A'``, ``X``, labels and masks). To
compute its rows of ``A' H`` it also needs the rows of ``H`` of its *halo*: the
sources of its owned targets' edges that other ranks own. :class:`RankPartition`
holds rank ``r``'s rows of the propagation matrix as a local CSR over the columns
``[owned | halo]`` and the index lists of the halo exchange, built once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sparse.formats import CSR

__all__ = ["partition_nodes", "RankPartition", "build_partitions", "edge_cut", "PARTITION_METHODS"]

PARTITION_METHODS = ("auto", "metis", "range")
"""``"metis"``: METIS k-way (``pymetis``) on the symmetrised graph, fewest cut edges;
``"range"``: contiguous node-id ranges of (almost) equal size; ``"auto"``: METIS when
``pymetis`` is installed, else ranges."""


def _metis(edge_index: torch.Tensor, num_nodes: int, nparts: int) -> torch.Tensor:
    import pymetis

    src, dst = edge_index
    keep = src != dst  # METIS takes no self-loops; both directions, no duplicates
    pairs = torch.cat([torch.stack([src[keep], dst[keep]]), torch.stack([dst[keep], src[keep]])], 1)
    pairs = torch.unique(pairs[0] * num_nodes + pairs[1])
    row, col = pairs // num_nodes, pairs % num_nodes
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    opts = pymetis.Options(seed=0)  # deterministic: every rank computes the same split
    _, membership = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj.tolist(), col.tolist()), options=opts)
    return torch.tensor(membership, dtype=torch.long)


def partition_nodes(edge_index: torch.Tensor, num_nodes: int, nparts: int, method: str = "auto") -> torch.Tensor:
    """The rank owning each node: ``(num_nodes,)`` int64 in ``[0, nparts)``.

    Args:
        edge_index: ``(2, q)`` int64 (PyG's source/target convention; direction is
            ignored for the split).
        num_nodes: node count; nparts: number of ranks (>= 1).
        method: one of :data:`PARTITION_METHODS`.

    Raises:
        ValueError: ``nparts`` < 1 or above ``num_nodes``, an unknown ``method``.
        ImportError: ``method="metis"`` without ``pymetis``.
    """
    if method not in PARTITION_METHODS:
        raise ValueError(f"method must be one of {PARTITION_METHODS}, got {method!r}")
    if not 1 <= nparts <= max(num_nodes, 1):
        raise ValueError(f"nparts must be in [1, num_nodes={num_nodes}], got {nparts}")
    if nparts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    if method == "auto":
        try:
            import pymetis  # noqa: F401

            method = "metis"
        except ImportError:
            method = "range"
    if method == "metis":
        parts = _metis(edge_index.cpu(), num_nodes, nparts)
        if torch.bincount(parts, minlength=nparts).min() > 0:
            return parts
        # (METIS may leave a part empty on tiny graphs; ranges never do)
    return torch.arange(num_nodes) * nparts // num_nodes


def edge_cut(edge_index: torch.Tensor, parts: torch.Tensor) -> int:
    """Number of edges (columns of ``edge_index``, each direction counted) whose
    endpoints lie on different ranks."""
    return int((parts[edge_index[0]] != parts[edge_index[1]]).sum())


@dataclass
class RankPartition:
    """Rank ``rank``'s share of a row-partitioned graph.

    Attributes:
        rank, world_size: this rank and the number of ranks.
        owned: ``(n_own,)`` global ids of the owned nodes (sorted); local row ``i`` is
            node ``owned[i]``.
        halo: ``(n_halo,)`` global ids of the halo nodes, grouped by owning rank
            (rank order, sorted ids within); local column ``n_own + j`` is ``halo[j]``.
        A: the local propagation matrix, a CSR ``(n_own, n_own + n_halo)``: rows of
            the global ``A'`` for the owned nodes, columns ``[owned | halo]``.
        send_index: ``(n_send,)`` local row ids to send, grouped by destination rank
            (rank order), each group in the order that rank lists them in its halo.
        send_counts, recv_counts: rows sent to / received from each rank
            (``len == world_size``, ``recv_counts`` sums to ``n_halo``).
        totals: ``{"n", "nnz", "n_halo"}`` summed over all ranks (the halo rows
            received = the rows sent); identical on every rank, so that every rank
            makes the same plan.
    """

    rank: int
    world_size: int
    owned: torch.Tensor
    halo: torch.Tensor
    A: CSR
    send_index: torch.Tensor
    send_counts: list
    recv_counts: list
    totals: dict

    @property
    def n_own(self) -> int:
        return self.owned.numel()

    @property
    def n_halo(self) -> int:
        return self.halo.numel()

    def to(self, device) -> "RankPartition":
        """This partition with its tensors on ``device``."""
        d = torch.device(device)
        A = CSR(self.A.rowptr.to(d), self.A.col.to(d), None if self.A.val is None else self.A.val.to(d), self.A.shape, check=False)
        return RankPartition(self.rank, self.world_size, self.owned.to(d), self.halo.to(d), A, self.send_index.to(d),
                             self.send_counts, self.recv_counts, self.totals)

    @property
    def columns(self) -> torch.Tensor:
        """``(n_own + n_halo,)`` global ids of the local columns, ``[owned | halo]``."""
        return torch.cat([self.owned, self.halo])


def build_partitions(A: CSR, parts: torch.Tensor, ranks: "list[int] | None" = None) -> list[RankPartition]:
    """Split the global propagation matrix ``A'`` ``(n, n)`` (rows = targets) by rows.

    The normalisation stays global (``A'`` is built before it is split), so the
    local products are exactly the rows of the single-process ones.

    Args:
        A: the global CSR (e.g. :meth:`corgnn.Graph.gcn_adjacency`, or the GAT
            adjacency; its values, when any, are kept).
        parts: ``(n,)`` owning rank of each node (:func:`partition_nodes`).
        ranks: which ranks to build (default all); the index lists and totals are
            global either way.

    Returns:
        One :class:`RankPartition` per requested rank.
    """
    n = A.shape[0]
    world = int(parts.max()) + 1 if n else 1
    row, col = A.row(), A.col
    # NOTE: each (rank needing j, j) pair once, ordered by (needer, owner of j, j):
    # the needer's halo order and, filtered by owner, the owner's send order.
    cross = parts[row] != parts[col]
    need = torch.unique(parts[row[cross]] * n + col[cross])
    needer, node = need // n, need % n
    owner = parts[node]
    order = torch.argsort((needer * world + owner) * n + node)
    needer, node, owner = needer[order], node[order], owner[order]
    counts = torch.bincount(needer * world + owner, minlength=world * world).view(world, world)  # [needer, owner]
    totals = {
        "n": n, "nnz": A.nnz, "n_halo": int(node.numel()),
    }
    local_of = torch.empty(n, dtype=torch.long)
    out = []
    for r in range(world) if ranks is None else ranks:
        owned = torch.nonzero(parts == r).flatten()
        halo = node[needer == r]
        local_of[owned] = torch.arange(owned.numel())
        local_of[halo] = owned.numel() + torch.arange(halo.numel())
        keep = parts[row] == r
        sub = CSR.from_coo(local_of[row[keep]], local_of[col[keep]], None if A.val is None else A.val[keep], (owned.numel(), owned.numel() + halo.numel()))
        # rows r sends: grouped by the needing rank, each in that rank's halo order
        send_index = torch.searchsorted(owned, node[owner == r])
        out.append(RankPartition(
            r, world, owned, halo, sub, send_index,
            counts[:, r].tolist(), counts[r].tolist(), totals,
        ))
    return out
