"""``corgnn train``: arguments and the command (single-process, mini-batch, or
partitioned with ``--nproc N`` / ``--torchrun``); see :mod:`corgnn.training`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, fields

from ..nn.models import MODELS
from .config import CHECKPOINT_EVERY, TrainConfig, check_writable
from .distributed import RankFailed, run_cli
from .single import train

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    """The ``corgnn train`` options on argparse parser ``p``."""
    p.add_argument("--dataset", default="Cora", help="Cora (default) or CiteSeer")
    p.add_argument("--model", default="gcn", choices=sorted(MODELS), help="gcn (default), gat, sage, gin, sgc, appnp or transformer")
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
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="save model, optimizer, epoch and RNG states to PATH (atomically, rank 0) every --checkpoint-every epochs and at the end")
    c.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, metavar="N",
                   help=f"epochs between checkpoints (default {CHECKPOINT_EVERY})")
    c.add_argument("--resume", action="store_true", help="continue from --checkpoint PATH (same settings; --epochs is the total)")
    g = p.add_argument_group("scaling out (README: Scaling out)")
    g.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="partitioned full-graph training in N spawned local processes (gloo; NCCL with --device cuda)")
    g.add_argument("--torchrun", action="store_true", help="join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR, ...)")
    g.add_argument("--partition", default="auto", choices=("auto", "metis", "range"), help="node split: METIS (auto, if pymetis is installed) or id ranges")
    g.add_argument("--port", type=int, default=None, help="with --nproc: rendezvous port on 127.0.0.1 (default: a free one)")
    g.add_argument("--oversubscribe", action="store_true", help="with --nproc: allow more CPU ranks than cores")


def run(args) -> int:
    """Run ``corgnn train`` with parsed ``args``; returns the exit code (1: a rank died)."""
    opts = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    cfg = TrainConfig(**opts, normalize_features=not args.no_normalize_features, progress=not args.no_progress)
    if args.json:
        check_writable(args.json, "--json")
    if getattr(args, "nproc", None) is not None or getattr(args, "torchrun", False):
        try:
            res = run_cli(cfg, args.nproc, args.torchrun, args.partition, port=args.port, oversubscribe=args.oversubscribe)
        except RankFailed as e:
            print(f"corgnn train: error: {e}", file=sys.stderr)
            return 1
        if res is None:  # a torchrun rank other than 0
            return 0
    else:
        if args.port is not None or args.oversubscribe:
            raise ValueError("--port and --oversubscribe go with --nproc")
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
