"""Partitioned full-graph training over ``torch.distributed`` (``corgnn train --nproc N``).

Every rank loads the dataset, rank 0 partitions it
(:func:`corgnn.distributed.partition_nodes`) and broadcasts the split, and each rank
keeps its rows of ``A'`` (normalised with global degrees before the split), ``X``,
labels and masks. Parameters are replicated (broadcast from rank 0) and their
gradients summed with ``all_reduce``; each rank's loss is its summed cross-entropy
over its training nodes divided by the *global* number of training nodes, so the
summed loss and gradients are those of single-process full-graph training (exactly,
up to float32 summation order). Evaluation counts correct predictions per rank and
sums them. The epochs run in the one loop, :func:`corgnn.training.loop.fit`.

Launch: :func:`train_distributed` spawns ``nproc`` local processes (gloo on CPU,
NCCL for ``device="cuda"``, one GPU per rank); under ``torchrun``,
:func:`train_rank` joins the group its environment variables describe.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
from dataclasses import asdict

import torch
import torch.distributed as dist

from ..datasets import find_data_root
from ..distributed import DistributedGAT, DistributedGCN, HaloPlan, build_partitions, edge_cut, partition_nodes
from ..distributed.train import all_reduce_sum, check_port_free, free_port, init_from_env, train_step
from ..graph import Graph
from ..nn.models import MODELS
from .checkpoint import load_checkpoint
from .config import TrainConfig, TrainResult, check_writable
from .loop import Trainer, fit
from .single import history_result, load_features, median_ms, model_for

__all__ = ["check_distributed", "train_rank", "train_distributed", "run_cli", "RankFailed"]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class RankFailed(RuntimeError):
    """A spawned rank died or raised; the message names the rank and the checkpoint
    to resume from (one line)."""


def check_distributed(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` resolved, or a ValueError for what partitioned training does not run."""
    cfg = cfg.resolved()
    if not MODELS[cfg.model].distributed:
        supported = " and ".join(n for n, s in MODELS.items() if s.distributed)
        raise ValueError(f"distributed training runs the {supported} models, got model={cfg.model!r}")
    if cfg.model == "gat" and cfg.scheme != "auto":
        raise ValueError(f"distributed GAT runs one scheme (autograd attention over the halo of XΘ); got scheme={cfg.scheme!r}")
    if cfg.format != "csr":
        raise ValueError(f"distributed training runs the CSR format, got format={cfg.format!r}")
    if cfg.batch_size is not None:
        raise ValueError("distributed training is full-graph; --batch-size cannot be combined with --nproc/--torchrun")
    return cfg


class _Partitioned(Trainer):
    partitioned = True

    def __init__(self, dmodel, optimizer, device, x_own, y_own, masks, n_train, halo):
        self.dmodel, self.model, self.optimizer, self.device = dmodel, dmodel.model, optimizer, device
        self.x_own, self.y_own, self.masks, self.n_train, self.halo = x_own, y_own, masks, n_train, halo
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.comm = []

    def step(self) -> torch.Tensor:
        return train_step(self.dmodel, self.optimizer, self.x_own, self.y_own, self.masks[0], self.n_train)

    def evaluate(self, loss):
        sent = self.halo.reset()
        self.dmodel.eval()
        with torch.no_grad():
            pred = self.dmodel(self.x_own).argmax(-1)
        self.halo.reset()  # (evaluation traffic is not counted)
        correct = [float((pred[m] == self.y_own[m]).sum()) for m in self.masks]
        totals = all_reduce_sum([float(loss.detach()), float(sent)] + correct + [float(m.sum()) for m in self.masks], self.device)
        self.comm.append(int(totals[1]))
        return totals[0], tuple(c / max(t, 1.0) for c, t in zip(totals[2:5], totals[5:8]))

    def state_dict(self) -> dict:
        return {"dropout_generator": self.dmodel.drop.gen.get_state(), "comm": list(self.comm)}

    def load_state_dict(self, state: dict) -> None:
        self.dmodel.drop.gen.set_state(state["dropout_generator"])
        self.comm = list(state["comm"])

    def gather(self, obj):
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out


def train_rank(cfg: TrainConfig, partition: str = "auto") -> TrainResult:
    """Train ``cfg`` (GCN or GAT, full graph) as one rank in the current process group
    (initialised by the caller) and return the summary (the same on every rank).

    ``TrainResult.extra`` holds ``world_size``, ``losses`` (training loss of each
    epoch), ``comm_bytes_per_epoch`` (halo bytes sent per training step, forward and
    backward, all ranks; median over epochs), ``comm_bytes_setup`` (the cached
    first-layer halo, when propagate-first), ``edge_cut`` (directed edges between
    ranks), ``halo_rows`` (all ranks) and ``partition``. With ``cfg.resume`` every
    rank reads ``cfg.checkpoint`` (the node split is the checkpoint's).

    Raises:
        ValueError: an unsupported configuration (model, format, scheme), a
            checkpoint of another run.
    """
    cfg = check_distributed(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    resume = load_checkpoint(cfg.checkpoint, cfg, world, partition) if cfg.resume else None
    device = torch.device(cfg.device)
    data, x = load_features(cfg)
    torch.manual_seed(cfg.seed)
    num_classes = int(data.y.max()) + 1
    model = model_for(cfg, x.size(1), num_classes).to(device)
    for p in model.parameters():  # replicated: rank 0's initialisation everywhere
        dist.broadcast(p.data, 0)

    if resume is not None:
        parts = resume["shared"]["parts"]
    else:
        parts = partition_nodes(data.edge_index, data.num_nodes, world, partition) if rank == 0 else torch.empty(data.num_nodes, dtype=torch.long)
        parts = parts.to(device)
        dist.broadcast(parts, 0)
        parts = parts.cpu()
    graph = Graph(data.edge_index, num_nodes=data.num_nodes)
    A = graph.gcn_adjacency(dtype=x.dtype) if cfg.model == "gcn" else graph.gat_adjacency()
    part = build_partitions(A, parts, [rank])[0].to(device)
    halo = HaloPlan(part)
    cut = edge_cut(data.edge_index, parts)
    own = part.owned
    x_own, y_own = x[own].to(device), data.y[own].to(device)
    masks = [m[own].to(device) for m in (data.train_mask, data.val_mask, data.test_mask)]
    n_train = int(data.train_mask.sum())
    del x, data  # this rank keeps its rows only

    if cfg.model == "gcn":
        dmodel = DistributedGCN(model, part, halo, cfg.seed, scheme=cfg.scheme)
    else:
        dmodel = DistributedGAT(model, part, halo, cfg.seed)
    if getattr(dmodel, "plans", None) and dmodel.plans[0].scheme.forward == "propagate-first":
        with torch.no_grad():
            dmodel._input_full(x_own)  # the constant first-layer halo, exchanged once
    setup_bytes = halo.reset()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    trainer = _Partitioned(dmodel, opt, device, x_own, y_own, masks, n_train, halo)
    desc = f"{cfg.model.upper()} {cfg.dataset} x{world}" if cfg.progress and rank == 0 else None
    h = fit(trainer, cfg, desc=desc, resume=resume, shared={"parts": parts, "partition": partition})
    epoch_ms = all_reduce_sum([median_ms(h.times)], device)[0] / world
    extra = {
        "world_size": world,
        "comm_bytes_per_epoch": int(statistics.median(trainer.comm)) if trainer.comm else 0,
        "comm_bytes_setup": int(all_reduce_sum([float(setup_bytes)], device)[0]),
        "edge_cut": cut,
        "halo_rows": part.totals["n_halo"],
        "partition": partition,
    }
    return history_result(cfg, cfg.dataset, h, epoch_ms, dmodel.schemes(), extra)


def _worker(rank: int, world: int, port: int, cfg: TrainConfig, partition: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    threads = max(1, (os.cpu_count() or 1) // world)  # the ranks share this machine's cores
    torch.set_num_threads(threads)
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    init_from_env(cfg.device)
    try:
        res = train_rank(cfg, partition)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(asdict(res), f)
    finally:
        dist.destroy_process_group()


def _checkpoint_note(cfg: TrainConfig) -> str:
    if not cfg.checkpoint:
        return "no --checkpoint to resume from"
    if not os.path.isfile(cfg.checkpoint):
        return f"no checkpoint written yet at {cfg.checkpoint}"
    try:
        epoch = torch.load(cfg.checkpoint, map_location="cpu", weights_only=False)["epoch"]
    except Exception:  # (a checkpoint being replaced, or not one)
        return f"checkpoint at {cfg.checkpoint}"
    return f"resume from checkpoint {cfg.checkpoint} (epoch {epoch}) with --resume"


def _rank_failure(e, cfg: TrainConfig) -> RankFailed:
    """One line naming the failed rank, what happened and the checkpoint."""
    import torch.multiprocessing as mp

    if isinstance(e, mp.ProcessExitedException):
        what = f"was killed by {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
    else:
        lines = [ln.strip() for ln in e.msg.splitlines() if ln.strip()]
        what = f"failed: {lines[-1] if lines else type(e).__name__}"
    return RankFailed(f"rank {e.error_index} {what}; {_checkpoint_note(cfg)}")


def train_distributed(cfg: TrainConfig, nproc: int, partition: str = "auto", *, port: int | None = None,
                      oversubscribe: bool = False) -> TrainResult:
    """Spawn ``nproc`` local processes (``torch.multiprocessing.spawn``) that train
    ``cfg`` with :func:`train_rank` over gloo (NCCL on CUDA) and return rank 0's
    summary. ``nproc=1`` runs the same code in one process.

    Args:
        port: the rendezvous port on 127.0.0.1 (default: a free one).
        oversubscribe: allow more CPU ranks than ``os.cpu_count()``.

    Raises:
        ValueError: ``nproc`` < 1, more CPU ranks than cores (without
            ``oversubscribe``), more CUDA ranks than GPUs, a taken ``port``, an
            unsupported configuration (:func:`train_rank`), an unwritable
            checkpoint path or a checkpoint of another run.
        FileNotFoundError: the dataset's files, or the checkpoint to resume, are not found.
        RankFailed: a rank died or raised (the message names it and the checkpoint).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    cfg = check_distributed(cfg)
    cores = os.cpu_count() or 1
    if torch.device(cfg.device).type == "cpu" and nproc > cores and not oversubscribe:
        raise ValueError(f"--nproc {nproc} CPU ranks on a machine with {cores} cores; give --oversubscribe to run them anyway")
    if torch.device(cfg.device).type == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(f"nproc={nproc} ranks need as many GPUs, found {torch.cuda.device_count()}")
    if port is not None:
        check_port_free(port)
    find_data_root(cfg.dataset, cfg.root)  # (a missing dataset fails here, not in every rank)
    if cfg.checkpoint:
        check_writable(cfg.checkpoint, "--checkpoint")
    if cfg.resume:
        load_checkpoint(cfg.checkpoint, cfg, nproc, partition)
    if port is None:
        port = free_port()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        spawn_log = logging.getLogger("torch.multiprocessing.spawn")
        level = spawn_log.level
        spawn_log.setLevel(logging.ERROR)  # (its "Terminating process ..." lines would precede our one-line error)
        try:
            mp.spawn(_worker, args=(nproc, port, cfg, partition, out_path), nprocs=nproc, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            raise _rank_failure(e, cfg) from None
        finally:
            spawn_log.setLevel(level)
        with open(out_path) as f:
            return TrainResult(**json.load(f))


def _check_torchrun_port() -> None:
    """Under a plain environment (not torchrun's agent store), rank 0 hosts the
    rendezvous: a taken ``MASTER_PORT`` on a local ``MASTER_ADDR`` fails here, at once."""
    if os.environ.get("RANK") != "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr in LOCAL_HOSTS and port is not None and port.isdigit():
        check_port_free(int(port), "127.0.0.1" if addr == "localhost" else addr)


def run_cli(cfg: TrainConfig, nproc: "int | None", torchrun: bool, partition: str = "auto", *, port: int | None = None,
            oversubscribe: bool = False) -> "TrainResult | None":
    """``corgnn train --nproc N`` (spawn) or ``--torchrun`` (join torchrun's group;
    returns the summary on rank 0 only, None elsewhere).

    Raises:
        ValueError: both or neither of ``nproc`` and ``torchrun``; ``--port`` with
            ``--torchrun``; and :func:`train_distributed`'s errors.
    """
    if torchrun == (nproc is not None):
        raise ValueError("give either --nproc N or --torchrun")
    if not torchrun:
        return train_distributed(cfg, nproc, partition, port=port, oversubscribe=oversubscribe)
    if port is not None:
        raise ValueError("--port is for --nproc; under torchrun the rendezvous is MASTER_PORT")
    check_distributed(cfg)
    if cfg.checkpoint and os.environ.get("RANK") == "0":  # (rank 0 writes it)
        check_writable(cfg.checkpoint, "--checkpoint")
    _check_torchrun_port()
    init_from_env(cfg.device)
    try:
        res = train_rank(cfg if dist.get_rank() == 0 else TrainConfig(**{**asdict(cfg), "progress": False}), partition)
        return res if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()
