"""Mini-batch training step (``corgnn train --batch-size B``): a step per METIS
cluster (:class:`corgnn.distributed.minibatch.ClusterBatches`)."""

from __future__ import annotations

import torch

__all__ = ["minibatch_epoch"]


def minibatch_epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, batches, x: torch.Tensor, y: torch.Tensor,
                    train_mask: torch.Tensor) -> torch.Tensor:
    """One epoch over ``batches``: an optimizer step per batch holding training nodes.

    Args:
        batches: iterable of ``(nodes (b,), graph, x_b)`` (``ClusterBatches``).
        x: ``(n, m)`` features (only their device is used; batches carry their rows).
        y: ``(n,)`` int64 labels; train_mask: ``(n,)`` bool.

    Returns:
        The training loss averaged over the training nodes (0-dim, detached).
    """
    total, count = x.new_zeros(()), 0
    for nodes, g, xb in batches:
        nodes = nodes.to(x.device)
        mask = train_mask[nodes]
        if not bool(mask.any()):
            continue
        opt.zero_grad()
        out = model(xb, g)
        loss = torch.nn.functional.cross_entropy(out[mask], y[nodes][mask])
        loss.backward()
        opt.step()
        total, count = total + loss.detach() * int(mask.sum()), count + int(mask.sum())
    return total / max(count, 1)
