"""Cold start: the first training step of a fresh process with an empty Numba cache.

For a 2-layer GCN and a 3-layer GIN (64 channels, add pool) on one batch of 32 small
random graphs (25 nodes, 60 edges each), in fresh processes: model built,
``corgnn.optimize()``, then the first forward/backward timed (imports excluded), then
the median of the next 20 steps on fresh ``edge_index`` tensors. Modes, each run with
``NUMBA_CACHE_DIR`` pointing to a new empty folder:

* ``cold``: the compile in the first step (the default: the CSR SpMM's and the
  feature conversions' serial first tiers, ``numba_warmup.Tier``);
* ``cold-parallel``: the same with ``CORGNN_TIER_UP_S=0`` (the parallel kernels at
  once, as before the tiers);
* ``warmed``: after ``corgnn warm`` filled that folder;
* ``background``: ``CORGNN_NUMBA_WARMUP=background`` (its step times are those of the
  torch path while the background compile runs);
* ``pyg``: PyG's model, for reference.

Run from the checkout: ``python benchmarks/cold_start.py [--repeats 2]`` (~1.5 min).
Results (2-core VM): ``benchmarks/results/cold-start-*``, README ("First use on a machine").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

STEP = r"""
import sys, time, statistics
import torch, torch.nn as nn
from torch_geometric.nn import GCNConv, GINConv, global_add_pool
import corgnn
kind, use = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
graphs, size = 32, 25
ei = torch.cat([torch.randint(0, size, (2, 60)) + i * size for i in range(graphs)], 1)
x, batch = torch.randn(graphs * size, 64), torch.arange(graphs).repeat_interleave(size)
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        if kind == "gcn":
            self.convs = nn.ModuleList([GCNConv(64, 64) for _ in range(2)])
        else:
            self.convs = nn.ModuleList([GINConv(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))) for _ in range(3)])
        self.out = nn.Linear(64, 2)
    def forward(self, x, ei, batch):
        for conv in self.convs:
            x = conv(x, ei).relu()
        return self.out(global_add_pool(x, batch))
model = Model()
if use == "corgnn":
    model = corgnn.optimize(model)
t = time.perf_counter()
model(x, ei, batch).sum().backward()
first = time.perf_counter() - t
steps = []
for _ in range(20):
    t = time.perf_counter()
    model(x, ei.clone(), batch).sum().backward()
    steps.append(time.perf_counter() - t)
print(f"{first * 1000:.0f} {statistics.median(steps) * 1000:.2f}")
"""


def run(kind: str, mode: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        env.pop("CORGNN_NUMBA_WARMUP", None)
        env.pop("CORGNN_TIER_UP_S", None)
        if mode == "cold-parallel":
            env["CORGNN_TIER_UP_S"] = "0"
        if mode == "warmed":
            subprocess.run([sys.executable, "-m", "corgnn.cli", "warm"], env=env, check=True, capture_output=True)
        if mode == "background":
            env["CORGNN_NUMBA_WARMUP"] = "background"
        out = subprocess.run([sys.executable, "-c", STEP, kind, "pyg" if mode == "pyg" else "corgnn"], env=env, check=True, capture_output=True, text=True)
        first, later = out.stdout.split()
        if mode == "background":  # (the warm-up goes on after the process: let it finish before the folder goes)
            subprocess.run([sys.executable, "-c", "import time, glob, sys; d = sys.argv[1]; t = time.time()\n"
                            "while glob.glob(d + '/*.lock') and time.time() - t < 120: time.sleep(0.5)", cache], check=True)
        return float(first), float(later)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    print("| model | mode | first step ms | next 20 steps, median ms |")
    print("|---|---|---|---|")
    for kind in ("gcn", "gin"):
        for mode in ("pyg", "cold", "cold-parallel", "warmed", "background"):
            for _ in range(args.repeats):
                first, later = run(kind, mode)
                print(f"| {kind} | {mode} | {first:.0f} | {later:.2f} |", flush=True)


if __name__ == "__main__":
    main()
