"""Row-partitioned forward passes of corgnn's 2-layer models.

Each rank holds a replica of the model (:class:`corgnn.nn.GCN` / :class:`corgnn.nn.GAT`,
same parameters on every rank) and computes the output rows of the nodes it owns;
the halo rows its local ``A'`` reads come from :func:`~.halo.halo_exchange`.
Dropout masks are drawn for the whole graph from a generator seeded identically on
every rank and indexed by global node id, so a node's mask is the same on every rank
that reads it and the same for any number of ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from ..cost.comm import NetworkModel, plan_partitioned_gcn
from ..functional.gcn import gcn_conv
from ..sparse.ops import spmm
from .halo import HaloPlan, halo_exchange
from .partition import RankPartition

__all__ = ["GlobalDropout", "DistributedGCN"]


class GlobalDropout:
    """Inverted dropout whose mask row of node ``i`` depends only on ``i``, the seed
    and the call count (not on the partition): ``(num_nodes, c)`` uniforms are drawn
    per call on every rank, and each rank keeps the rows it reads."""

    def __init__(self, p: float, num_nodes: int, seed: int):
        self.p, self.num_nodes = p, num_nodes
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, h: torch.Tensor, rows: torch.Tensor, training: bool) -> torch.Tensor:
        """``h (len(rows), c)`` with the global mask rows ``rows`` applied."""
        if not training or self.p == 0.0:
            return h
        keep = torch.rand((self.num_nodes, h.size(1)), generator=self.gen)[rows].to(h.device) >= self.p
        return h * keep * (1.0 / (1.0 - self.p))


class DistributedGCN(nn.Module):
    """:class:`corgnn.nn.GCN` on this rank's rows: ``forward(x_own) -> (n_own, out)``.

    Each layer's scheme comes from :func:`corgnn.cost.comm.plan_partitioned_gcn`
    (compute + halo bytes), the same on every rank. Transform-first computes
    ``T = X_own Θ`` and exchanges halo rows of ``T`` (k columns); propagate-first
    exchanges halo rows of ``X`` (m columns) and runs
    :class:`~corgnn.functional.gcn.GCNFunction` on ``[X_own | X_halo]``. The first
    layer's input is constant: its halo is exchanged once (on the first call) and
    cached.

    Args:
        model: the replicated :class:`corgnn.nn.GCN` (its parameters are used).
        part: this rank's :class:`~.partition.RankPartition` of the GCN ``A'``.
        halo: the :class:`~.halo.HaloPlan` of ``part``.
        seed: dropout seed (identical on every rank).
        scheme: ``"auto"`` or a scheme of :data:`corgnn.cost.comm.PARTITIONED_SCHEMES`.
        network: bandwidth of the cost model's communication term.
    """

    def __init__(self, model: nn.Module, part: RankPartition, halo: HaloPlan, seed: int = 0, *, scheme: str = "auto", network: NetworkModel = NetworkModel()):
        super().__init__()
        self.model, self.part, self.halo = model, part, halo
        self.A = part.A
        self.columns = part.columns
        self.drop = GlobalDropout(model.dropout, part.totals["n"], seed)
        t = part.totals
        convs = (model.conv1, model.conv2)
        self.plans = [
            plan_partitioned_gcn(
                t["n"], t["nnz"], c.in_channels, c.out_channels, input_grad=i > 0, world_size=part.world_size,
                halo_rows=t["n_halo"], input_cached=i == 0, scheme=scheme, network=network,
            )
            for i, c in enumerate(convs)
        ]
        self._x_cache = None  # (x_own, [x_own | x_halo]) of the constant first-layer input

    def schemes(self) -> list[str]:
        return [p.scheme.name for p in self.plans]

    def _input_full(self, x_own: torch.Tensor) -> torch.Tensor:
        if self._x_cache is None or self._x_cache[0] is not x_own:
            with torch.no_grad():
                self._x_cache = (x_own, halo_exchange(x_own, self.halo))
        return self._x_cache[1]

    def _layer(self, i: int, h_own: torch.Tensor) -> torch.Tensor:
        conv, plan = (self.model.conv1, self.model.conv2)[i], self.plans[i]
        weight, bias, n_own = conv.lin.weight, conv.bias, self.part.n_own
        constant = i == 0 and not h_own.requires_grad
        if plan.scheme.forward == "transform-first":
            h_own = self.drop(h_own, self.columns[:n_own], self.training)
            out = spmm(self.A, halo_exchange(torch.mm(h_own, weight.t()), self.halo))
            return out + bias if bias is not None else out
        if constant:
            full = self.drop(self._input_full(h_own), self.columns, self.training)
        else:
            full = halo_exchange(self.drop(h_own, self.columns[:n_own], self.training), self.halo)
        return gcn_conv(full, weight, bias, self.A, plan.scheme)

    def forward(self, x_own: torch.Tensor) -> torch.Tensor:
        """``x_own (n_own, in_channels)`` (this rank's rows) -> ``(n_own, out_channels)``.

        Raises:
            ValueError: ``x_own`` does not have this rank's ``n_own`` rows.
        """
        if x_own.dim() != 2 or x_own.size(0) != self.part.n_own:
            raise ValueError(f"x_own must have shape ({self.part.n_own}, in_channels), got {tuple(x_own.shape)}")
        return self._layer(1, torch.relu(self._layer(0, x_own)))
