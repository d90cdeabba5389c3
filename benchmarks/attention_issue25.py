import time, copy, sys, statistics as st, torch, corgnn
from torch_geometric.nn import GATv2Conv, TransformerConv
from corgnn.datasets import load_dataset
torch.manual_seed(0)
def net(kind, m, c):
    L = (lambda i, o, h, cat: GATv2Conv(i, o, heads=h, concat=cat)) if kind == "gatv2" else (lambda i, o, h, cat: TransformerConv(i, o, heads=h, concat=cat))
    class N(torch.nn.Module):
        def __init__(s):
            super().__init__(); s.c1 = L(m, 8, 8, True); s.c2 = L(64, c, 1, False)
        def forward(s, x, ei): return s.c2(torch.relu(s.c1(x, ei)), ei)
    return N()
def saved_bytes(model, x, ei, y):
    tot = [0]
    def pack(t): tot[0] += t.numel() * t.element_size(); return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x, ei), y)
    loss.backward(); return tot[0]
def run(name, x, ei, y, c, reps=7):
    for kind in ("gatv2", "transformer"):
        pyg = net(kind, x.size(1), c); cor = corgnn.optimize(copy.deepcopy(pyg))
        opts = {k: torch.optim.Adam(m.parameters(), 0.01) for k, m in (("pyg", pyg), ("cor", cor))}
        def step(m, o):
            o.zero_grad(); torch.nn.functional.cross_entropy(m(x, ei), y).backward(); o.step()
        for k, m in (("pyg", pyg), ("cor", cor)):
            for _ in range(2): step(m, opts[k])
        ts = {"pyg": [], "cor": []}
        for _ in range(reps):
            for k, m in (("pyg", pyg), ("cor", cor)):
                t = time.perf_counter(); step(m, opts[k]); ts[k].append(time.perf_counter() - t)
        p, q = st.median(ts["pyg"]) * 1e3, st.median(ts["cor"]) * 1e3
        sp, sc = saved_bytes(pyg, x, ei, y), saved_bytes(cor, x, ei, y)
        print(f"{name:22s} {kind:12s} pyg {p:8.1f} ms  corgnn {q:8.1f} ms  speedup {p/q:5.2f}x  saved-for-backward {sc/2**20:7.1f} / {sp/2**20:7.1f} MiB = {sc/sp:.2f}x", flush=True)
n, q = 20000, 200000
ei = torch.randint(0, n, (2, q)); x = torch.randn(n, 128); y = torch.randint(0, 8, (n,))
run("synthetic 20k/200k", x, ei, y, 8)
for ds in ("Cora", "CiteSeer", "PubMed"):
    d = load_dataset(ds)
    run(f"{ds} (real graph)", d.x, d.edge_index, d.y, int(d.y.max()) + 1)
