"""Communication term of a row-partitioned GCN layer (``corgnn.distributed``).

With ``A'`` split by rows over ``P`` ranks, a layer's SpMM on rank ``r`` reads the
rows of its operand for the *halo* nodes it does not own (``H`` halo rows over all
ranks). The association order decides what crosses the network (the paper's
``k`` vs ``m`` choice, now in bytes on the wire):

* transform-first exchanges halo rows of ``XΘ`` (``k`` columns) forward and their
  gradients (``k`` columns) backward, needed for ``dL/dΘ``;
* propagate-first exchanges halo rows of ``X`` (``m`` columns) forward, none when the
  input is constant and its halo was exchanged once and cached (a first layer), and
  their gradients (``m`` columns) backward only when ``dL/dX`` is needed.

Estimated time of a scheme = compute time (:func:`corgnn.cost.gcn.plan_gcn` on one
rank's share, ``n/P`` rows, ``q/P`` entries) + bytes one rank sends (``/P`` of the
total) / :attr:`NetworkModel.bandwidth`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gcn import GCN_SCHEMES, GCNPlan, GCNScheme, MachineModel, parse_scheme, plan_gcn

__all__ = ["NetworkModel", "PARTITIONED_SCHEMES", "halo_values", "PartitionedGCNPlan", "plan_partitioned_gcn"]

PARTITIONED_SCHEMES: tuple[GCNScheme, ...] = tuple(s for s in GCN_SCHEMES if s.name != "transform-first+split")
"""Schemes a partitioned layer runs: transform-first+split would read ``A'X`` in
backward, i.e. exchange ``X`` (m columns) as well as ``XΘ``, never cheaper than
either pure order."""


@dataclass(frozen=True)
class NetworkModel:
    """``bandwidth``: bytes/s one rank sends (default 1.25e9 = 10 Gbit/s Ethernet);
    ``value_bytes``: bytes per exchanged value (4, float32)."""

    bandwidth: float = 1.25e9
    value_bytes: int = 4


def halo_values(s: GCNScheme, halo_rows: int, m: int, k: int, input_grad: bool, input_cached: bool, training: bool = True) -> tuple[int, int]:
    """``(forward, backward)`` values sent by all ranks in one layer call under ``s``."""
    if s.forward == "transform-first":
        return halo_rows * k, halo_rows * k if training else 0
    return 0 if input_cached else halo_rows * m, halo_rows * m if training and input_grad else 0


@dataclass(frozen=True)
class PartitionedGCNPlan:
    """The choice for one row-partitioned layer call.

    ``compute``: the single-rank :class:`~corgnn.cost.gcn.GCNPlan` (its costs on one
    rank's share); ``comm``: ``{scheme name: (forward, backward) values sent, all
    ranks}``; ``total_s``: ``{scheme name: compute + communication seconds}``.
    """

    scheme: GCNScheme
    compute: GCNPlan
    comm: dict
    total_s: dict
    world_size: int
    halo_rows: int
    network: NetworkModel
    reason: str

    def comm_bytes(self, scheme: "GCNScheme | None" = None) -> int:
        """Halo bytes sent (all ranks, forward + backward) under ``scheme`` (default the chosen one)."""
        return sum(self.comm[(scheme or self.scheme).name]) * self.network.value_bytes

    def table(self) -> str:
        """The compute table, then each scheme's halo traffic and total estimate."""
        lines = [
            self.compute.table(),
            f"Halo exchange over {self.world_size} ranks ({self.halo_rows} halo rows in all, "
            f"network {self.network.bandwidth / 1e9:.3g} GB/s per rank):",
        ]
        w = max(len(c.scheme.name) for c in self.compute.costs)
        lines.append(f"  {'scheme'.ljust(w)}  {'halo MB fwd;bwd'.ljust(19)}  {'comm ms'.ljust(9)}  total est. ms")
        for c in self.compute.costs:
            f, b = self.comm[c.scheme.name]
            vb = self.network.value_bytes
            comm_ms = (f + b) * vb / self.world_size / self.network.bandwidth * 1e3
            mb = f"{f * vb / 1e6:.4g};{b * vb / 1e6:.4g}"
            lines.append(f"  {c.scheme.name.ljust(w)}  {mb.ljust(19)}  {f'{comm_ms:.4g}'.ljust(9)}  {self.total_s[c.scheme.name] * 1e3:.4g}")
        lines.append(f"  -> {self.scheme.name}: {self.reason}")
        return "\n".join(lines)


def plan_partitioned_gcn(
    n: int, q: int, m: int, k: int, input_grad: bool, *, world_size: int, halo_rows: int, input_cached: bool = False,
    training: bool = True, scheme: "str | GCNScheme" = "auto", machine: MachineModel = MachineModel(),
    network: NetworkModel = NetworkModel(), x_nnz: int | None = None,
) -> PartitionedGCNPlan:
    """Choose the scheme of a GCN layer whose ``A'`` is split by rows over ranks.

    Args:
        n, q: nodes and stored entries of the global ``A'``; m, k: input and output
            features; input_grad: whether ``dL/dX`` is needed.
        world_size: ranks ``P`` (>= 1); halo_rows: halo rows over all ranks
            (:attr:`corgnn.distributed.RankPartition.totals`).
        input_cached: the input is constant and its halo is exchanged once (so a
            propagate-first forward sends nothing per call).
        training, scheme, machine, x_nnz: as :func:`corgnn.cost.gcn.plan_gcn`.
        network: the link's bandwidth.

    Returns:
        :class:`PartitionedGCNPlan`; the same on every rank (global sizes only).

    Raises:
        ValueError: negative sizes, ``world_size`` < 1, an unknown scheme.
    """
    if world_size < 1 or halo_rows < 0:
        raise ValueError(f"world_size must be >= 1 and halo_rows >= 0, got {world_size}, {halo_rows}")
    share = lambda v: -(-v // world_size)  # noqa: E731  (one rank's share, rounded up)
    compute = plan_gcn(share(n), share(q), m, k, input_grad, training=training, machine=machine,
                       candidates=PARTITIONED_SCHEMES, x_nnz=None if x_nnz is None else share(x_nnz))
    comm, total = {}, {}
    for c in compute.costs:
        comm[c.scheme.name] = halo_values(c.scheme, halo_rows, m, k, input_grad, input_cached, training)
        total[c.scheme.name] = c.time_s + sum(comm[c.scheme.name]) * network.value_bytes / world_size / network.bandwidth
    if scheme != "auto":
        chosen, reason = parse_scheme(scheme), "forced by the caller"
        if chosen not in PARTITIONED_SCHEMES:
            raise ValueError(f"scheme {chosen.name!r} is not run partitioned; one of {[s.name for s in PARTITIONED_SCHEMES]}")
    else:
        best = min(compute.costs, key=lambda c: (round(total[c.scheme.name], 12), c.transient_forward + c.transient_backward))
        chosen = best.scheme
        f, b = comm[chosen.name]
        reason = f"least compute + communication ({total[chosen.name] * 1e3:.3g} ms est.; halo {f + b} values per call)"
    return PartitionedGCNPlan(chosen, compute, comm, total, world_size, halo_rows, network, reason)

