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
from ..functional.gat import gat_attention
from ..functional.gcn import gcn_conv
from ..sparse.ops import spmm
from .halo import HaloPlan, halo_exchange
from .partition import RankPartition

__all__ = ["GlobalDropout", "DistributedGCN", "DistributedGAT"]


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
        keep = torch.rand((self.num_nodes, h.size(1)), generator=self.gen)[rows.cpu()].to(h.device) >= self.p
        return h * keep * (1.0 / (1.0 - self.p))


class _Partitioned(nn.Module):
    """A replicated 2-layer model run on one rank's rows: ``forward(x_own) ->
    (n_own, out)``; subclasses give each layer (:meth:`_layer`) and the activation."""

    activation = staticmethod(torch.relu)

    def __init__(self, model: nn.Module, part: RankPartition, halo: HaloPlan, seed: int = 0):
        super().__init__()
        self.model, self.part, self.halo = model, part, halo
        self.A = part.A
        self.columns = part.columns
        self.drop = GlobalDropout(model.dropout, part.totals["n"], seed)

    def _own_dropout(self, h_own: torch.Tensor) -> torch.Tensor:
        return self.drop(h_own, self.columns[: self.part.n_own], self.training)

    def forward(self, x_own: torch.Tensor) -> torch.Tensor:
        """``x_own (n_own, in_channels)`` (this rank's rows) -> ``(n_own, out_channels)``.

        Raises:
            ValueError: ``x_own`` does not have this rank's ``n_own`` rows.
        """
        if x_own.dim() != 2 or x_own.size(0) != self.part.n_own:
            raise ValueError(f"x_own must have shape ({self.part.n_own}, in_channels), got {tuple(x_own.shape)}")
        return self._layer(1, self.activation(self._layer(0, x_own)))


class DistributedGCN(_Partitioned):
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
        cache_input: keep the first layer's input halo across calls (False: exchange
            it on every propagate-first call; for measuring what the cache saves).
    """

    def __init__(self, model: nn.Module, part: RankPartition, halo: HaloPlan, seed: int = 0, *, scheme: str = "auto",
                 network: NetworkModel = NetworkModel(), cache_input: bool = True):
        super().__init__(model, part, halo, seed)
        self.cache_input = cache_input
        t = part.totals
        convs = (model.conv1, model.conv2)
        self.plans = [
            plan_partitioned_gcn(
                t["n"], t["nnz"], c.in_channels, c.out_channels, input_grad=i > 0, world_size=part.world_size,
                halo_rows=t["n_halo"], input_cached=i == 0 and cache_input, scheme=scheme, network=network,
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
        weight, bias = conv.lin.weight, conv.bias
        constant = i == 0 and self.cache_input and not h_own.requires_grad
        if plan.scheme.forward == "transform-first":
            h_own = self._own_dropout(h_own)
            out = spmm(self.A, halo_exchange(torch.mm(h_own, weight.t()), self.halo))
            return out + bias if bias is not None else out
        if constant:
            full = self.drop(self._input_full(h_own), self.columns, self.training)
        else:
            full = halo_exchange(self._own_dropout(h_own), self.halo)
        return gcn_conv(full, weight, bias, self.A, plan.scheme)


class DistributedGAT(_Partitioned):
    """:class:`corgnn.nn.GAT` on this rank's rows: ``forward(x_own) -> (n_own, out)``.

    Per layer: ``M_own = X_own Θ`` ``(n_own, h, k)``; the halo rows of ``M``
    (``h*k`` columns) are exchanged, from which each rank computes the halo's source
    attention terms ``<M_j, a_src>`` itself (``h`` fewer columns on the wire than
    sending them); the target terms are its own rows'. The attention over the local
    pattern (rows = owned targets, columns ``[owned | halo]`` sources) and its
    backward run through :func:`corgnn.functional.gat.gat_attention` (autograd over
    corgnn's ``edge_softmax`` / ``spmm``), not the fused caching schemes of
    :class:`~corgnn.functional.gat.GATFunction`. Attention dropout is drawn per
    local edge (each edge lives on its target's rank): the same distribution as
    single-process training, not the same draw.

    Args:
        model: the replicated :class:`corgnn.nn.GAT` (its parameters are used).
        part: this rank's :class:`~.partition.RankPartition` of the GAT pattern
            (:meth:`corgnn.Graph.gat_adjacency`).
        halo, seed: as :class:`DistributedGCN`.
    """

    activation = staticmethod(nn.functional.elu)

    def schemes(self) -> list[str]:
        return ["halo of XΘ (h*k columns)"] * 2

    def _layer(self, i: int, h_own: torch.Tensor) -> torch.Tensor:
        conv = (self.model.conv1, self.model.conv2)[i]
        M = torch.mm(self._own_dropout(h_own), conv.lin.weight.t())
        full = halo_exchange(M, self.halo).unflatten(1, (conv.heads, -1))
        out3, _ = gat_attention(
            full, M.unflatten(1, (conv.heads, -1)), conv.att_src, conv.att_dst, self.A,
            negative_slope=conv.negative_slope, dropout=conv.dropout, training=self.training,
        )
        out = out3.flatten(1) if conv.concat else out3.mean(1)
        return out + conv.bias if conv.bias is not None else out
