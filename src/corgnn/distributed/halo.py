"""The halo exchange: an autograd Function over ``torch.distributed.all_to_all_single``.

Forward: rank ``r`` sends the rows of its local ``H`` ``(n_own, c)`` that other ranks
list in their halo and receives its own halo rows ``(n_halo, c)``. Backward is the
mirror exchange: the gradients of the received halo rows go back to their owners,
which add them into the gradients of the rows they sent (a row sent to several
ranks sums their contributions). Bytes sent are counted on the :class:`HaloPlan`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .partition import RankPartition

__all__ = ["HaloPlan", "HaloExchange", "halo_exchange"]


class HaloPlan:
    """The exchange lists of one :class:`~.partition.RankPartition`, with a byte
    counter (``bytes_sent``: halo bytes this rank sent, forward and backward, since
    the last :meth:`reset`)."""

    def __init__(self, part: RankPartition, group=None):
        self.send_index = part.send_index
        self.send_counts = list(part.send_counts)
        self.recv_counts = list(part.recv_counts)
        self.n_own, self.n_halo = part.n_own, part.n_halo
        self.world_size = part.world_size
        self.group = group
        self.bytes_sent = 0

    def reset(self) -> int:
        """Return :attr:`bytes_sent` and set it to 0."""
        b, self.bytes_sent = self.bytes_sent, 0
        return b

    def exchange(self, send: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
        """``all_to_all_single`` of ``send`` (rows grouped by destination rank)."""
        recv = send.new_empty((sum(recv_counts),) + tuple(send.shape[1:]))
        if self.world_size > 1:
            self.bytes_sent += send.numel() * send.element_size()
            dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts, group=self.group)
        return recv


class HaloExchange(torch.autograd.Function):
    """``apply(h, plan) -> (n_halo, c)``: the halo rows of the row-partitioned ``H``.

    ``h``: this rank's rows ``(n_own, c)``, any floating dtype. A collective: every
    rank of the group must call it with the same ``c`` (the layer's plan decides
    ``c``, identically on every rank). Backward sends ``n_halo x c`` gradient values
    back and returns ``dL/dh`` ``(n_own, c)``.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, plan: HaloPlan):
        ctx.plan = plan
        return plan.exchange(h[plan.send_index], plan.send_counts, plan.recv_counts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        plan = ctx.plan
        g_sent = plan.exchange(grad, plan.recv_counts, plan.send_counts)
        gh = grad.new_zeros((plan.n_own,) + tuple(grad.shape[1:]))
        return gh.index_add_(0, plan.send_index, g_sent), None


def halo_exchange(h: torch.Tensor, plan: HaloPlan) -> torch.Tensor:
    """``[h | halo rows of h]`` ``(n_own + n_halo, c)``, the input of the local
    ``A'`` (columns ``[owned | halo]``); differentiable w.r.t. ``h``.

    Raises:
        ValueError: ``h`` does not have ``plan.n_own`` rows.
    """
    if h.dim() < 1 or h.size(0) != plan.n_own:
        raise ValueError(f"h must have {plan.n_own} rows (this rank's nodes), got shape {tuple(h.shape)}")
    return torch.cat([h, HaloExchange.apply(h, plan)])
