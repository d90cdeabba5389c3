"""GPU probe: per training step of a 2-layer GCN and GAT on Cora, PyG's layers and
their ``corgnn.optimize()``d copy: ms per step (Adam), host syncs
(``torch.cuda.set_sync_debug_mode``), kernel launches (``torch.profiler``) and
corgnn's Python hotspots (cProfile). Run from the checkout root with the datasets
under ``data/`` (or ``$CORGNN_DATA``): ``python benchmarks/gpu_probe.py`` (about 30 s on an H100; on CPU
it runs too, without sync and launch counts).

Results of 2026-11-27: ``benchmarks/results/gpu-h100-20261127/README.md``.
"""

import copy
import cProfile
import io
import os
import pstats
import time
import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv

import corgnn
from corgnn.datasets import load_planetoid

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


class PygGCN(torch.nn.Module):
    def __init__(self, m, h, c):
        super().__init__()
        self.c1, self.c2 = GCNConv(m, h), GCNConv(h, c)

    def forward(self, x, ei):
        return self.c2(F.relu(self.c1(x, ei)), ei)


class PygGAT(torch.nn.Module):
    def __init__(self, m, h, c):
        super().__init__()
        self.c1, self.c2 = GATConv(m, h, heads=8), GATConv(8 * h, c)

    def forward(self, x, ei):
        return self.c2(F.elu(self.c1(x, ei)), ei)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def main():
    d = load_planetoid("Cora", root=os.environ.get("CORGNN_DATA", "data"))
    x, ei, y = d.x.to(DEV), d.edge_index.to(DEV), d.y.to(DEV)

    def step(model, opt):
        opt.zero_grad()
        F.cross_entropy(model(x, ei), y).backward()
        opt.step()

    for name, cls, h in (("GCN", PygGCN, 16), ("GAT", PygGAT, 8)):
        torch.manual_seed(0)
        ref = cls(x.size(1), h, 7).to(DEV)
        for tag, model in (("pyg", ref), ("corgnn", corgnn.optimize(copy.deepcopy(ref)))):
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            for _ in range(5):
                step(model, opt)
            sync()
            t = time.perf_counter()
            for _ in range(50):
                step(model, opt)
            sync()
            ms = (time.perf_counter() - t) / 50 * 1e3
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                if CUDA:
                    torch.cuda.set_sync_debug_mode("warn")
                step(model, opt)
                if CUDA:
                    torch.cuda.set_sync_debug_mode(0)
            syncs = [a for a in w if "synchroniz" in str(a.message)]
            print(f"== {name} {tag}: {ms:.3f} ms/step; {len(syncs)} host syncs")
            for (f, line), c in Counter((a.filename.split("/src/")[-1], a.lineno) for a in syncs).most_common(12):
                print(f"   sync x{c} at {f}:{line}")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
                step(model, opt)
                sync()
            ka = prof.key_averages()
            print(f"   launches {sum(e.count for e in ka if e.key in LAUNCHES)}; "
                  f"sync/memcpy {({e.key: e.count for e in ka if 'ynchronize' in e.key or 'Memcpy' in e.key})}")
            if tag == "corgnn":
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(30):
                    step(model, opt)
                sync()
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
                print(s.getvalue()[-4500:])


if __name__ == "__main__":
    main()
