"""The ceiling of ``mutag_gin.py`` (issue 21): how fast PyG's script could get if
corgnn's GIN aggregation cost nothing but its kernel.

Runs, interleaved in one process (epochs rotated, medians over ``EPOCHS``), the
``corgnn bench clients`` MUTAG stand-in with four models of the same seed:

* ``pyg``: the script as published;
* ``optimize``: with ``corgnn.optimize(model)``;
* ``bare scatter``: PyG's model with every ``GINConv`` aggregation replaced by corgnn's
  Numba scatter kernel (``spmm_coo_scatter``) inside a minimal ``autograd.Function``,
  with the batch's index arrays kept per ``edge_index``: no validation, no plan, no
  cache lookups, what corgnn's layer would cost with no Python of its own (and no
  safety: do not use this outside a measurement);
* ``no aggregation``: PyG's model with every GIN layer's ``nn`` applied to ``x`` alone
  (:class:`corgnn.bench.workloads.TransformOnly`).

Usage: ``CORGNN_TIER_UP_S=0 python benchmarks/mutag_ceiling.py [EPOCHS]`` (default 60).
Prints each variant's median ms per epoch and its speed-up over ``pyg``.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from corgnn.bench import clients
from corgnn.bench.workloads import TransformOnly
from corgnn.sparse.backends.numba_kernels import spmm_coo_scatter

_NO_VALUES = np.empty(0, np.float32)


def _scatter(row: np.ndarray, col: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape)
    spmm_coo_scatter(row, col, _NO_VALUES, x.detach().contiguous().numpy(), out.numpy(), 2)
    return out


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, row, col):
        ctx.rc = (row, col)
        return _scatter(row, col, x)

    @staticmethod
    def backward(ctx, grad):
        row, col = ctx.rc
        return _scatter(col, row, grad), None, None


class BareGIN(torch.nn.Module):
    """``nn((A + I) x)`` of a PyG ``GINConv`` (eps = 0) by the bare scatter."""

    _arrays: dict = {}

    def __init__(self, conv):
        super().__init__()
        self.nn = conv.nn

    def forward(self, x, edge_index):
        hit = self._arrays.get(id(edge_index))
        if hit is None or hit[0] is not edge_index:
            loops = torch.arange(x.size(0))
            hit = (edge_index, torch.cat([edge_index[1], loops]).numpy(), torch.cat([edge_index[0], loops]).numpy())
            self._arrays.clear()
            self._arrays[id(edge_index)] = hit
        row, col = hit[1], hit[2]
        h = _Scatter.apply(x, row, col) if x.requires_grad and torch.is_grad_enabled() else _scatter(row, col, x)
        return self.nn(h)


def main(epochs: int = 60) -> dict:
    data = clients.load_data("mutag_gin")
    runs = {v: clients.build_client("mutag_gin", v, data)[2] for v in ("pyg", "optimize")}
    for name, wrap in (("bare scatter", BareGIN), ("no aggregation", TransformOnly)):
        model, _, epoch = clients.build_client("mutag_gin", "pyg", data)
        model.convs = torch.nn.ModuleList(wrap(c) for c in model.convs)
        runs[name] = epoch
    for epoch in runs.values():
        for _ in range(3):
            epoch()
    names = list(runs)
    times = {v: [] for v in names}
    for e in range(epochs):
        for v in names[e % len(names):] + names[: e % len(names)]:
            t0 = time.perf_counter()
            runs[v]()
            times[v].append((time.perf_counter() - t0) * 1e3)
    med = {v: statistics.median(t) for v, t in times.items()}
    for v in names:
        print(f"{v:15s} {med[v]:6.1f} ms / epoch  {med['pyg'] / med[v]:.2f}x")
    return med


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
