"""``corgnn bench clients``: PyG's own example scripts with one added ``optimize`` line.

PyG's ``examples/gcn.py``, ``examples/gat.py`` (Cora) and ``examples/mutag_gin.py``
(graph classification in mini-batches; default arguments) are reproduced here as a
new user runs them: the same model classes (written after the
scripts, not imported: they run at import time), the same dropout placement, the
``NormalizeFeatures`` transform, the same optimizer and parameter groups, and the
same epoch (``train()`` then ``test()``: one training step, one evaluation forward
under ``torch.no_grad()`` with the accuracies of the three masks).

* ``gcn.py``: ``F.dropout(x, 0.5) -> GCNConv(m, 16).relu() -> F.dropout(0.5) ->
  GCNConv(16, c)``, ``Adam([conv1 wd=5e-4, conv2 wd=0], lr=0.01)``, cross entropy.
* ``gat.py``: ``F.dropout(x, 0.6) -> elu(GATConv(m, 8, heads=8, dropout=0.6)) ->
  F.dropout(0.6) -> GATConv(64, c, heads=1, concat=False, dropout=0.6)``,
  ``Adam(lr=0.005, weight_decay=5e-4)``, cross entropy.
* ``mutag_gin.py``: 5 x ``GINConv(MLP([in, 32, 32]))`` (PyG's ``MLP``: Linear,
  BatchNorm, ReLU, Linear) + ReLU, ``global_add_pool``, ``MLP([32, 32, c],
  norm=None, dropout=0.5)``, ``Adam(lr=0.01)``; an epoch trains on a shuffled
  ``DataLoader(batch_size=128)`` of 90 % of the graphs and evaluates the training
  and test loaders (every batch a new ``Batch``, so a new ``edge_index`` per call:
  issue 21). MUTAG itself is not in the shared datasets: :func:`mutag_standin` is
  a seeded stand-in with MUTAG's shape (188 graphs of 10-28 nodes, ~1.1 undirected
  edges per node, 7 one-hot node features, 2 classes).

Variants, each its own model built from the same seed: ``pyg`` (the script as
published), ``optimize`` (one ``model = corgnn.optimize(model)`` line before the
optimizer) and ``optimize-no-rewrite`` (``optimize(model,
sparse_input_dropout=False)``). They run in the same process, alternating: each of
``--epochs`` timed epochs runs one epoch of every variant in turn, the order rotated
by one each epoch (after ``--warmup`` untimed epochs each), and the reported time per epoch is the median
over all timed epochs; ``speed-up = pyg / variant`` (> 1: faster with corgnn), of
the medians and of the fastest epochs.
Output: ``results.json`` and ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["add_arguments", "run", "SCRIPTS", "VARIANTS", "build_client", "measure"]

SCRIPTS = ("gcn", "gat", "mutag_gin")
VARIANTS = ("pyg", "optimize", "optimize-no-rewrite")


class ExampleGCN(torch.nn.Module):
    """The model class of PyG's ``examples/gcn.py`` (without ``--use_gdc``)."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int):
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, normalize=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, normalize=True)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


class ExampleGAT(torch.nn.Module):
    """The model class of PyG's ``examples/gat.py``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, heads: int):
        from torch_geometric.nn import GATConv

        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


class ExampleGIN(torch.nn.Module):
    """The model class of PyG's ``examples/mutag_gin.py``."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int):
        from torch_geometric.nn import MLP, GINConv

        super().__init__()
        self.convs = torch.nn.ModuleList()
        for _ in range(num_layers):
            self.convs.append(GINConv(nn=MLP([in_channels, hidden_channels, hidden_channels]), train_eps=False))
            in_channels = hidden_channels
        self.mlp = MLP([hidden_channels, hidden_channels, out_channels], norm=None, dropout=0.5)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_add_pool

        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.mlp(global_add_pool(x, batch))


def mutag_standin(seed: int = 0) -> tuple[list, list]:
    """``(train, test)`` lists of ``torch_geometric.data.Data``: 188 seeded graphs with
    MUTAG's shape (10-28 nodes, ``int(1.1 n)`` random node pairs symmetrised, node
    features one-hot over 7 atom types, label in {0, 1}; :func:`corgnn.bench.workloads.random_molecules`),
    split as ``mutag_gin.py`` splits its shuffled dataset (``dataset[:0.9]`` for
    training, the remaining 19 graphs for testing)."""
    from .workloads import random_molecules

    graphs = random_molecules(188, seed, min_nodes=10, max_nodes=29, degree=1.1, features=7)
    for d in graphs:  # (MUTAG's features are one-hot atom types)
        d.x = F.one_hot(d.x.argmax(1), 7).to(torch.float32)
    cut = int(0.9 * len(graphs))
    return graphs[:cut], graphs[cut:]


def load_data(script: str):
    """The data ``script`` reads: Cora (:func:`load_cora`) for ``gcn`` and ``gat``, the
    MUTAG stand-in (:func:`mutag_standin`) for ``mutag_gin``."""
    return mutag_standin() if script == "mutag_gin" else load_cora()


def load_cora():
    """Cora as the scripts see it: ``Planetoid(..., transform=NormalizeFeatures())[0]``
    (read in place from the shared dataset folder)."""
    import torch_geometric.transforms as T

    from ..datasets import load_planetoid

    return T.NormalizeFeatures()(load_planetoid("Cora"))


def build_client(script: str, variant: str, data, seed: int = 0):
    """``(model, optimizer, epoch)`` of ``script`` (one of :data:`SCRIPTS`) in ``variant``
    (one of :data:`VARIANTS`) on ``data`` (:func:`load_data`); ``epoch()`` runs the
    script's ``train()`` then ``test()`` and returns ``(loss, accuracies)``: ``[train,
    val, test]`` for the Cora scripts, ``[train, test]`` for ``mutag_gin``."""
    from ..interop import optimize

    if script not in SCRIPTS or variant not in VARIANTS:
        raise ValueError(f"script must be one of {SCRIPTS} and variant one of {VARIANTS}, got {script!r}, {variant!r}")
    torch.manual_seed(seed)
    if script == "mutag_gin":
        return _gin_client(variant, *data, seed)
    c = int(data.y.max()) + 1
    if script == "gcn":
        model = ExampleGCN(data.num_features, 16, c)
    else:
        model = ExampleGAT(data.num_features, 8, c, 8)
    if variant != "pyg":
        model = optimize(model, sparse_input_dropout=variant == "optimize")
    if script == "gcn":  # (only weight decay on the first convolution, as the script)
        optimizer = torch.optim.Adam([
            dict(params=model.conv1.parameters(), weight_decay=5e-4),
            dict(params=model.conv2.parameters(), weight_decay=0),
        ], lr=0.01)
        inputs = (data.x, data.edge_index, data.edge_attr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
        inputs = (data.x, data.edge_index)

    def epoch():
        model.train()
        optimizer.zero_grad()
        out = model(*inputs)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.eval()
            pred = model(*inputs).argmax(dim=-1)
            accs = [int((pred[m] == data.y[m]).sum()) / int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)]
        return float(loss.detach()), accs

    return model, optimizer, epoch


def _gin_client(variant: str, train_set: list, test_set: list, seed: int):
    """:func:`build_client` of ``mutag_gin.py``: its loaders, model, optimizer and epoch."""
    from torch_geometric.loader import DataLoader

    from ..interop import optimize

    model = ExampleGIN(train_set[0].num_features, 32, 2, 5)
    if variant != "pyg":
        model = optimize(model, sparse_input_dropout=variant == "optimize")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    shuffle = torch.Generator().manual_seed(seed)  # (each variant draws the same batches)
    train_loader = DataLoader(train_set, batch_size=128, shuffle=True, generator=shuffle)
    test_loaders = (DataLoader(train_set, batch_size=128), DataLoader(test_set, batch_size=128))

    def epoch():
        model.train()
        total = 0.0
        for batch in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch), batch.y)
            loss.backward()
            optimizer.step()
            total += loss.item() * batch.num_graphs
        accs = []
        with torch.no_grad():
            model.eval()
            for loader in test_loaders:
                correct = sum(int((model(b.x, b.edge_index, b.batch).argmax(-1) == b.y).sum()) for b in loader)
                accs.append(correct / len(loader.dataset))
        return total / len(train_set), accs

    return model, optimizer, epoch


def measure(script: str, data, *, epochs: int = 50, warmup: int = 3, variants=VARIANTS) -> dict:
    """Per-epoch times (ms) of every variant of ``script``, alternating in one process.

    Returns ``{variant: {"median_ms", "min_ms", "max_ms", "epochs", "final_loss",
    "accuracy", "speedup", "speedup_min"}}``: the speed-ups are ``pyg``'s median
    (fastest) epoch over the variant's (on a loaded machine the fastest epochs are
    the least disturbed)."""
    variants = tuple(variants)
    runs = {v: build_client(script, v, data) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    last: dict[str, tuple] = {}
    for v in variants:
        for _ in range(warmup):
            runs[v][2]()
    for e in range(epochs):  # (one epoch of each variant in turn: they share the machine's load)
        for v in variants[e % len(variants):] + variants[: e % len(variants)]:  # (rotated: none always follows the same one)
            t0 = time.perf_counter()
            last[v] = runs[v][2]()
            times[v].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for v in variants:
        med = statistics.median(times[v])
        out[v] = dict(median_ms=med, min_ms=min(times[v]), max_ms=max(times[v]), epochs=len(times[v]), final_loss=last[v][0], accuracy=last[v][1])
    for v in variants:
        out[v]["speedup"] = out["pyg"]["median_ms"] / out[v]["median_ms"] if "pyg" in out else None
        out[v]["speedup_min"] = out["pyg"]["min_ms"] / out[v]["min_ms"] if "pyg" in out else None
    return out


def add_arguments(p) -> None:
    p.add_argument("--scripts", nargs="+", choices=SCRIPTS, default=list(SCRIPTS), help="example scripts to run (default both)")
    p.add_argument("--epochs", type=int, default=50, help="timed epochs per variant (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed epochs per variant first (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch and Numba threads (default: as installed)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results/clients-<time>)")


def _summary(results: dict, info: dict, args) -> str:
    lines = [
        "# corgnn bench clients: PyG's examples/gcn.py and gat.py on Cora, mutag_gin.py on a MUTAG stand-in, CPU",
        "",
        f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), PyG {info['pyg']}. "
        f"Epoch = train() + test(); median of {args.epochs} epochs per variant, one epoch of each variant in turn (the order rotated every epoch), "
        f"after {args.warmup} warm-up epochs.",
        "",
        "| script | variant | ms / epoch (median) | min-max | speed-up vs PyG (medians) | (fastest epochs) | final train loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for script, res in results.items():
        for v, r in res.items():
            lines.append(f"| {script}.py | {v} | {r['median_ms']:.1f} | {r['min_ms']:.1f}-{r['max_ms']:.1f} | {r['speedup']:.2f}x | {r['speedup_min']:.2f}x | {r['final_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from .harness import machine_info

    if args.threads:
        import numba

        torch.set_num_threads(args.threads)
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    results = {s: measure(s, load_data(s), epochs=args.epochs, warmup=args.warmup) for s in args.scripts}
    info = machine_info("cpu")
    out = args.out or Path("benchmarks/results") / f"clients-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(machine=info, results=results), indent=1))
    summary = _summary(results, info, args)
    (out / "summary.md").write_text(summary)
    print(summary)
    print(f"written to {out}")
    return 0
