"""``corgnn train``: train the paper's 2-layer models on a real Planetoid split.

Defaults follow Kipf & Welling for GCN (hidden 16, dropout 0.5, Adam lr 0.01, weight
decay 5e-4, 200 epochs) and Velickovic et al. for GAT (8 heads x 8 hidden, dropout 0.6
on inputs and attention, Adam lr 0.005, weight decay 5e-4, 200 epochs, 1 output
head); features are row-normalised. The reported test accuracy is
the one at the epoch with the best validation accuracy (ties: the later epoch),
the usual model selection on the public split.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import torch

from .datasets import load_planetoid

__all__ = ["TrainConfig", "TrainResult", "train", "progress_bar", "add_arguments", "run", "MODEL_DEFAULTS"]

# per-model defaults (GCN: Kipf & Welling 2017; GAT: Velickovic et al. 2018)
MODEL_DEFAULTS = {
    "gcn": dict(hidden=16, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200),
    "gat": dict(hidden=8, dropout=0.6, lr=0.005, weight_decay=5e-4, epochs=200),
    # issue 14 (corgnn.nn.models): GraphSAGE-mean, GIN, SGC (K=2, cached), APPNP (K=10, alpha=0.1)
    "sage": dict(hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200),
    "gin": dict(hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200),
    "sgc": dict(hidden=0, dropout=0.0, lr=0.2, weight_decay=2e-4, epochs=100),
    "appnp": dict(hidden=64, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200),
}


@dataclass
class TrainConfig:
    dataset: str = "Cora"
    model: str = "gcn"
    root: str | None = None
    hidden: int | None = None
    heads: int = 8
    dropout: float | None = None
    lr: float | None = None
    weight_decay: float | None = None
    epochs: int | None = None
    seed: int = 0
    scheme: str = "auto"
    format: str = "csr"
    device: str = "cpu"
    normalize_features: bool = True
    progress: bool = True
    batch_size: int | None = None  # mini-batches of METIS clusters of about this many nodes (None: full graph)

    def resolved(self) -> "TrainConfig":
        if self.model not in MODEL_DEFAULTS:
            raise ValueError(f"model must be one of {sorted(MODEL_DEFAULTS)}, got {self.model!r}")
        d = MODEL_DEFAULTS[self.model]
        out = TrainConfig(**asdict(self))
        for k, v in d.items():
            if getattr(out, k) is None:
                setattr(out, k, v)
        if out.batch_size is not None and out.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {out.batch_size}")
        if out.epochs <= 0 or out.hidden <= 0 and out.model != "sgc":
            raise ValueError(f"epochs and hidden must be positive, got {out.epochs}, {out.hidden}")
        return out


@dataclass
class TrainResult:
    dataset: str
    model: str
    train_acc: float
    val_acc: float
    test_acc: float
    best_epoch: int
    epoch_ms: float  # median wall-clock ms of one training epoch (forward + backward + step)
    schemes: list
    config: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def build_model(cfg: TrainConfig, in_channels: int, out_channels: int) -> torch.nn.Module:
    """The model named by ``cfg.model`` for the given widths."""
    if cfg.model == "gcn":
        from .nn import GCN

        return GCN(in_channels, cfg.hidden, out_channels, dropout=cfg.dropout, scheme=cfg.scheme, format=cfg.format)
    if cfg.model == "gat":
        from .nn import GAT

        return GAT(in_channels, cfg.hidden, out_channels, heads=cfg.heads, dropout=cfg.dropout, format=cfg.format, cache=cfg.scheme)
    from . import nn as cnn

    if cfg.model == "sgc":
        return cnn.models.SGC(in_channels, out_channels, scheme=cfg.scheme)
    if cfg.model == "appnp":
        return cnn.models.APPNPNet(in_channels, cfg.hidden, out_channels, dropout=cfg.dropout)
    if cfg.model in ("sage", "gin"):
        return getattr(cnn.models, cfg.model.upper())(in_channels, cfg.hidden, out_channels, dropout=cfg.dropout, scheme=cfg.scheme)
    raise ValueError(f"unknown model {cfg.model!r}")


def _accuracy(logits, y, mask) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).float().mean())


NON_TTY_PROGRESS_INTERVAL = 30.0
"""Seconds between progress lines when the progress stream is not a terminal (a log
file, CI): there each update is a new line, so a bar refreshed every epoch would
write one line per epoch; this keeps the start, one line per 30 s, and the end."""


def progress_bar(iterable, *, desc: str, unit: str, file=None):
    """tqdm bar over ``iterable`` on ``file`` (default ``sys.stderr``): the usual
    live bar on a terminal, at most one line per :data:`NON_TTY_PROGRESS_INTERVAL`
    seconds otherwise. Update its postfix with ``refresh=False`` (a refresh would
    write a line)."""
    from tqdm.auto import tqdm

    file = sys.stderr if file is None else file
    isatty = getattr(file, "isatty", None)
    tty = bool(isatty()) if callable(isatty) else False
    return tqdm(iterable, desc=desc, unit=unit, file=file, mininterval=0.1 if tty else NON_TTY_PROGRESS_INTERVAL)


def _minibatch_epoch(model, opt, batches, x, y, train_mask) -> torch.Tensor:
    """One epoch over ``batches`` (:class:`corgnn.distributed.minibatch.ClusterBatches`):
    a step per batch holding training nodes; returns the training loss averaged over
    the training nodes."""
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


def train(cfg: TrainConfig) -> TrainResult:
    """Train and evaluate; see module docstring for the protocol. The progress bar
    (``cfg.progress``) goes to stderr, see :func:`progress_bar`."""
    cfg = cfg.resolved()
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    data = load_planetoid(cfg.dataset, cfg.root)
    x = data.x
    if cfg.normalize_features:
        x = x / x.sum(1, keepdim=True).clamp_min(1.0)
    x, y = x.to(device), data.y.to(device)
    from .graph import Graph

    graph = Graph(data.edge_index.to(device), num_nodes=data.num_nodes)
    model = build_model(cfg, x.size(1), int(data.y.max()) + 1).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    masks = [m.to(device) for m in (data.train_mask, data.val_mask, data.test_mask)]

    batches = None
    if cfg.batch_size is not None:
        from .distributed.minibatch import ClusterBatches

        batches = ClusterBatches(data.edge_index, data.num_nodes, cfg.batch_size, device=device, x=x)
    best = (-1.0, 0, (0.0, 0.0, 0.0))
    times, losses = [], []
    it = range(1, cfg.epochs + 1)
    bar = None
    if cfg.progress:
        it = bar = progress_bar(it, desc=f"{cfg.model.upper()} {data.name}", unit="epoch")
    for epoch in it:
        t0 = time.perf_counter()
        model.train()
        if batches is None:
            opt.zero_grad()
            out = model(x, graph)
            loss = torch.nn.functional.cross_entropy(out[masks[0]], y[masks[0]])
            loss.backward()
            opt.step()
        else:
            loss = _minibatch_epoch(model, opt, batches, x, y, masks[0])
        schemes = model.schemes() if hasattr(model, "schemes") else []  # the training call's choice
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            logits = model(x, graph)
        accs = tuple(_accuracy(logits, y, m) for m in masks)
        if accs[1] >= best[0]:
            best = (accs[1], epoch, accs)
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{accs[1]:.3f}", best_test=f"{best[2][2]:.3f}", refresh=False)
    _, best_epoch, (tr, va, te) = best
    return TrainResult(
        dataset=data.name,
        model=cfg.model,
        train_acc=tr,
        val_acc=va,
        test_acc=te,
        best_epoch=best_epoch,
        epoch_ms=statistics.median(times[1:] if len(times) > 1 else times),
        schemes=schemes,
        config=asdict(cfg),
        extra={"losses": losses},
    )


def add_arguments(p) -> None:
    p.add_argument("--dataset", default="Cora", help="Cora (default) or CiteSeer")
    p.add_argument("--model", default="gcn", choices=sorted(MODEL_DEFAULTS), help="gcn (default), gat, sage, gin, sgc or appnp")
    p.add_argument("--root", default=None, help="data root holding <Name>/raw/ (default: $CORGNN_DATA, then ../shared/datasets, ...)")
    p.add_argument("--hidden", type=int, default=None, help="hidden channels (GCN 16, GAT 8 per head)")
    p.add_argument("--heads", type=int, default=8, help="GAT attention heads in the first layer (default 8)")
    p.add_argument("--dropout", type=float, default=None, help="dropout (GCN 0.5, GAT 0.6)")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate (GCN 0.01, GAT 0.005)")
    p.add_argument("--weight-decay", type=float, default=None, help="weight decay (5e-4)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheme", default="auto", help="GCN scheme or GAT caching scheme to force (default auto)")
    p.add_argument("--format", default="csr", help="sparse format: csr (default), coo, csc, ell, hybrid")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--no-normalize-features", action="store_true", help="do not row-normalise the input features")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--json", default=None, metavar="FILE", help="write the summary as JSON")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="mini-batch training on METIS clusters of about B nodes (no compiled extension needed; default: full graph)")
    g = p.add_argument_group("scaling out (README: Scaling out)")
    g.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="partitioned full-graph training in N spawned local processes (gloo; NCCL with --device cuda)")
    g.add_argument("--torchrun", action="store_true", help="join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR, ...)")
    g.add_argument("--partition", default="auto", choices=("auto", "metis", "range"), help="node split: METIS (auto, if pymetis is installed) or id ranges")


def run(args) -> int:
    opts = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    cfg = TrainConfig(**opts, normalize_features=not args.no_normalize_features, progress=not args.no_progress)
    if getattr(args, "nproc", None) is not None or getattr(args, "torchrun", False):
        from .distributed.train import run_cli

        res = run_cli(cfg, args.nproc, args.torchrun, args.partition)
        if res is None:  # a torchrun rank other than 0
            return 0
    else:
        res = train(cfg)
    print(
        f"{res.model.upper()} on {res.dataset}: train {res.train_acc:.4f}  val {res.val_acc:.4f}  "
        f"test {res.test_acc:.4f} (best val at epoch {res.best_epoch})\n"
        f"median epoch: {res.epoch_ms:.2f} ms   schemes: {', '.join(map(str, res.schemes))}"
    )
    if "world_size" in res.extra:
        e = res.extra
        print(f"ranks: {e['world_size']}   edge cut: {e['edge_cut']}   halo rows: {e['halo_rows']}   "
              f"halo bytes per epoch: {e['comm_bytes_per_epoch']} (+{e['comm_bytes_setup']} once)   "
              f"final loss: {e['losses'][-1]:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(res), f, indent=2)
        print(f"summary written to {args.json}")
    return 0
