"""``corgnn bench distributed``: halo bytes and epoch time of partitioned GCN training.

For each dataset (Table-5 stand-ins, real files where found), hidden width, number of
local processes (gloo) and exchange variant, it trains the 2-layer GCN for a few
epochs through :func:`corgnn.distributed.train.train_step` and records the halo bytes
sent per epoch (all ranks, forward + backward), the one-off bytes, the cost model's
prediction of them, and the median epoch time of the slowest rank. Variants:

* ``transform-first``: both layers exchange halo rows of ``XΘ`` (k columns);
* ``propagate-first+cached``: both layers propagate first; the first layer's
  constant input halo (m columns) is exchanged once and cached;
* ``propagate-first+uncached``: the same, re-exchanging that input halo each epoch;
* ``auto``: the plan's choice (compute + communication).

All processes share this machine's cores, so epoch times measure contention as much
as the exchange; the bytes are exact. Writes ``results.json``, ``summary.md`` and
``distributed.png`` to ``--out``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

__all__ = ["VARIANTS", "add_arguments", "run"]

VARIANTS = {
    "transform-first": dict(scheme="transform-first+fused", cache_input=True),
    "propagate-first+cached": dict(scheme="propagate-first+split+cache", cache_input=True),
    "propagate-first+uncached": dict(scheme="propagate-first+split+cache", cache_input=False),
    "auto": dict(scheme="auto", cache_input=True),
}


def _measure(dataset: str, hidden: int, variant: str, epochs: int, root) -> dict:
    """One cell on the current process group (every rank returns the same row)."""
    import torch.distributed as dist

    from ..datasets import load_dataset
    from ..distributed import DistributedGCN, HaloPlan, build_partitions, edge_cut, partition_nodes
    from ..distributed.train import train_step
    from ..graph import Graph
    from ..nn import GCN

    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_dataset(dataset, root)
    n, c = data.num_nodes, int(data.y.max()) + 1
    parts = partition_nodes(data.edge_index, n, world) if rank == 0 else torch.empty(n, dtype=torch.long)
    dist.broadcast(parts, 0)
    A = Graph(data.edge_index, num_nodes=n).gcn_adjacency()
    part = build_partitions(A, parts, [rank])[0]
    halo = HaloPlan(part)
    torch.manual_seed(0)
    model = GCN(data.x.size(1), hidden, c)
    dmodel = DistributedGCN(model, part, halo, **VARIANTS[variant])
    x_own, y_own = data.x[part.owned].float(), data.y[part.owned]
    mask = torch.ones(part.n_own, dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    times, sent = [], []
    for epoch in range(epochs + 2):  # 2 warm-up epochs (kernel compilation, the cached halo)
        dist.barrier()
        t0 = time.perf_counter()
        train_step(dmodel, opt, x_own, y_own, mask, n)
        times.append(time.perf_counter() - t0)
        sent.append(halo.reset())
    setup = sent[0] - sent[1]  # the first call also exchanged the cached input halo
    t = torch.tensor([statistics.median(times[2:]) * 1e3, float(statistics.median(sent[2:])), float(setup)], dtype=torch.float64)
    ms = t[:1].clone()
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    dist.all_reduce(t)
    predicted = sum(p.comm_bytes() for p in dmodel.plans)
    return dict(
        dataset=data.name, nodes=n, hidden=hidden, variant=variant, nproc=world, schemes=dmodel.schemes(),
        epoch_ms=float(ms), comm_bytes_per_epoch=int(t[1]), comm_bytes_setup=int(t[2]), predicted_bytes_per_epoch=int(predicted),
        edge_cut=edge_cut(data.edge_index, parts), halo_rows=part.totals["n_halo"],
    )


def _worker(rank: int, world: int, port: int, cells: list, epochs: int, root, out_path: str) -> None:
    import torch.distributed as dist

    from ..distributed.train import init_from_env

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    init_from_env("cpu")
    try:
        rows = [_measure(d, h, v, epochs, root) for d, h, v in cells]
        if rank == 0:
            Path(out_path).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def add_arguments(p) -> None:
    p.add_argument("--datasets", nargs="+", default=["Cora", "CiteSeer", "PubMed"], help="Table-5 names (default Cora CiteSeer PubMed)")
    p.add_argument("--hidden", nargs="+", type=int, default=[16, 256], help="hidden widths (default 16 256)")
    p.add_argument("--nproc", nargs="+", type=int, default=[1, 2], help="process counts (default 1 2)")
    p.add_argument("--epochs", type=int, default=10, help="timed epochs per cell after 2 warm-up (default 10)")
    p.add_argument("--root", default=None, help="data root (see corgnn train --help)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/distributed"), help="output directory")


def _plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    multi = [r for r in rows if r["nproc"] > 1]
    nmax = max((r["nproc"] for r in rows), default=1)
    keys = sorted({(r["dataset"], r["hidden"]) for r in multi}, key=lambda k: (k[0], k[1]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(VARIANTS)
    for j, v in enumerate(VARIANTS):
        by = {(r["dataset"], r["hidden"]): r for r in multi if r["variant"] == v and r["nproc"] == nmax}
        xs = [i + j * width for i in range(len(keys))]
        axes[0].bar(xs, [by[k]["comm_bytes_per_epoch"] / 1e6 if k in by else 0 for k in keys], width, label=v)
        axes[1].bar(xs, [by[k]["epoch_ms"] if k in by else 0 for k in keys], width, label=v)
    # * = synthetic stand-in; PubMed's real graph keeps a short "(real graph)" and a * for its synthetic features
    labels = [f"{d.replace(' (synthetic)', '*').replace(' (real graph, synthetic features)', ' (real graph)*')}\nh={h}" for d, h in keys]
    for ax, title in zip(axes, (f"halo MB sent per epoch ({nmax} ranks, all ranks)", f"epoch ms, slowest rank ({nmax} processes, 2 shared cores)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], labels)
        ax.set_title(title, fontsize=10)
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _summary(rows: list) -> str:
    head = "| dataset | hidden | variant | nproc | schemes | halo MB/epoch | predicted MB | once MB | edge cut | halo rows | epoch ms |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['hidden']} | {r['variant']} | {r['nproc']} | {', '.join(r['schemes'])} | "
            f"{r['comm_bytes_per_epoch'] / 1e6:.4g} | {r['predicted_bytes_per_epoch'] / 1e6:.4g} | {r['comm_bytes_setup'] / 1e6:.4g} | "
            f"{r['edge_cut']} | {r['halo_rows']} | {r['epoch_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run(args) -> int:
    import tempfile

    import torch.multiprocessing as mp

    from ..distributed.train import free_port

    if args.epochs < 1 or any(n < 1 for n in args.nproc):
        raise ValueError("--epochs and --nproc must be >= 1")
    cells = [(d, h, v) for d in args.datasets for h in args.hidden for v in VARIANTS]
    rows = []
    for nproc in args.nproc:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            mp.spawn(_worker, args=(nproc, free_port(), cells, args.epochs, args.root, out), nprocs=nproc, join=True)
            rows += json.loads(Path(out).read_text())
        print(f"nproc {nproc}: {len(cells)} cells done")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    (args.out / "summary.md").write_text(_summary(rows))
    _plot(rows, args.out / "distributed.png")
    print(_summary(rows))
    print(f"written to {args.out}/ (results.json, summary.md, distributed.png)")
    return 0
