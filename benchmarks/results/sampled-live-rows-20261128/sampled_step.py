import torch, numpy as np, time, sys, copy, statistics
import torch.nn.functional as F
import corgnn
from corgnn.datasets import load_dataset
from corgnn.sampling import NeighborSampler
from corgnn.bench.experiments.changing_graphs import FANOUTS
from corgnn.bench.workloads import NodeGCN, NodeSAGE
ds = sys.argv[1] if len(sys.argv) > 1 else "PubMed"
kind = sys.argv[2] if len(sys.argv) > 2 else "gcn"
data = load_dataset(ds, root="/work/shared/datasets")
s = NeighborSampler(data)
rng = np.random.default_rng(0)
batches = []
for _ in range(20):
    seeds = torch.from_numpy(rng.choice(data.num_nodes, 512, replace=False))
    b = s.sample(seeds, FANOUTS, rng)
    batches.append((b.x, b.edge_index, b.y, b.batch_size))
torch.manual_seed(0)
M = NodeGCN if kind == "gcn" else NodeSAGE
pyg = M(data.num_features, 64, int(data.y.max()) + 1)
cg = corgnn.optimize(copy.deepcopy(pyg))
opts = {n: torch.optim.Adam(m.parameters(), lr=0.01) for n, m in (("pyg", pyg), ("corgnn", cg))}
def step(m, o, inp):
    x, ei, y, bs = inp
    o.zero_grad(); F.cross_entropy(m(x, ei)[:bs], y[:bs]).backward(); o.step()
for n, m in (("pyg", pyg), ("corgnn", cg)):
    for inp in batches[:3]: step(m, opts[n], inp)
res = {"pyg": [], "corgnn": []}
for r in range(5):
    for n, m in (("pyg", pyg), ("corgnn", cg)):
        t = time.perf_counter()
        for inp in batches: step(m, opts[n], inp)
        res[n].append((time.perf_counter() - t) / len(batches) * 1e3)
p, c = statistics.median(res["pyg"]), statistics.median(res["corgnn"])
print(f"{ds} {kind}: pyg {p:.2f} ms corgnn {c:.2f} ms speed-up {p / c:.2f}")
for name, mod in cg.named_modules():
    lp = mod.__dict__.get("last_plan")
    if lp is not None: print(" ", name, lp)
