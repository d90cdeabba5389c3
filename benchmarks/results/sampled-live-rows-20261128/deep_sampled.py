import sys, time, copy, statistics, torch, numpy as np, torch.nn.functional as F
import corgnn, corgnn.functional.gcn as g
from corgnn.datasets import load_dataset
from corgnn.sampling import NeighborSampler
from torch_geometric.nn import GCNConv, SAGEConv
if sys.argv[2] == "off": g.ROWS_MIN_MACS = 1 << 62
Conv = GCNConv if sys.argv[1] == "gcn" else SAGEConv
data = load_dataset("OGB-Arxiv", root="/work/shared/datasets")
s = NeighborSampler(data); rng = np.random.default_rng(0)
batches = []
for _ in range(10):
    seeds = torch.from_numpy(rng.choice(data.num_nodes, 512, replace=False))
    b = s.sample(seeds, [15, 10, 5], rng); batches.append((b.x, b.edge_index, b.y, b.batch_size))
class Net(torch.nn.Module):
    def __init__(self, m, h, c):
        super().__init__()
        self.convs = torch.nn.ModuleList([Conv(m, h), Conv(h, h), Conv(h, c)])
    def forward(self, x, ei):
        for i, conv in enumerate(self.convs):
            x = conv(x, ei)
            if i < 2: x = x.relu()
        return x
torch.manual_seed(0)
pyg = Net(data.num_features, 256, int(data.y.max()) + 1); cg = corgnn.optimize(copy.deepcopy(pyg))
opts = {id(m): torch.optim.Adam(m.parameters(), lr=0.01) for m in (pyg, cg)}
def step(m, inp):
    x, ei, y, bs = inp; o = opts[id(m)]; o.zero_grad(); F.cross_entropy(m(x, ei)[:bs], y[:bs]).backward(); o.step()
for m in (pyg, cg): step(m, batches[0])
res = {0: [], 1: []}
for r in range(3):
    for i, m in enumerate((pyg, cg)):
        t = time.perf_counter()
        for inp in batches: step(m, inp)
        res[i].append((time.perf_counter() - t) / len(batches) * 1e3)
p, c = statistics.median(res[0]), statistics.median(res[1])
print(f"{sys.argv[1]} rows {sys.argv[2]}: n~{batches[0][0].size(0)} pyg {p:.1f} ms corgnn {c:.1f} ms speed-up {p/c:.2f}")
