"""Partitioned full-graph training over ``torch.distributed`` (``corgnn train --nproc N``).

Every rank loads the dataset, rank 0 partitions it (:func:`~.partition.partition_nodes`)
and broadcasts the split, and each rank keeps its rows of ``A'`` (normalised with
global degrees before the split), ``X``, labels and masks. Parameters are replicated
(broadcast from rank 0) and their gradients summed with ``all_reduce``; each rank's
loss is its summed cross-entropy over its training nodes divided by the *global*
number of training nodes, so the summed loss and gradients are those of
single-process full-graph training (exactly, up to float32 summation order).
Evaluation counts correct predictions per rank and sums them.

Launch: :func:`train_distributed` spawns ``nproc`` local processes (gloo on CPU,
NCCL for ``device="cuda"``, one GPU per rank); under ``torchrun``,
:func:`train_rank` joins the group its environment variables describe.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist

from ..datasets import load_planetoid
from ..train import TrainConfig, TrainResult, build_model, progress_bar
from .halo import HaloPlan
from .model import DistributedGAT, DistributedGCN
from .partition import build_partitions, edge_cut, partition_nodes

__all__ = ["train_step", "train_rank", "train_distributed", "init_from_env", "run_cli", "TIMEOUT_S"]

TIMEOUT_S = 300
"""Seconds a collective may wait before the process group gives up (a lost rank
raises instead of hanging)."""


def _backend(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_from_env(device: str = "cpu") -> None:
    """Join the process group described by ``torchrun``'s environment variables
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); gloo on CPU, NCCL
    on CUDA (each rank on GPU ``LOCAL_RANK``)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(_backend(device), timeout=timedelta(seconds=TIMEOUT_S))


def _sum(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _check(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` resolved, or a ValueError for what partitioned training does not run."""
    cfg = cfg.resolved()
    if cfg.model not in ("gcn", "gat"):
        raise ValueError(f"distributed training runs the gcn and gat models, got model={cfg.model!r}")
    if cfg.model == "gat" and cfg.scheme != "auto":
        raise ValueError(f"distributed GAT runs one scheme (autograd attention over the halo of XΘ); got scheme={cfg.scheme!r}")
    if cfg.format != "csr":
        raise ValueError(f"distributed training runs the CSR format, got format={cfg.format!r}")
    if cfg.batch_size is not None:
        raise ValueError("distributed training is full-graph; --batch-size cannot be combined with --nproc/--torchrun")
    return cfg


def train_step(dmodel, opt: torch.optim.Optimizer, x_own: torch.Tensor, y_own: torch.Tensor, mask: torch.Tensor, n_train: int) -> torch.Tensor:
    """One partitioned training step: forward on this rank's rows, cross-entropy over
    its training nodes summed and divided by the global count ``n_train``, backward
    (with the halo exchanges), one ``all_reduce`` of the flattened gradients,
    ``opt.step()``. Returns this rank's share of the loss (the ranks' shares sum to
    the full-graph loss)."""
    dmodel.train()
    opt.zero_grad()
    out = dmodel(x_own)
    loss = torch.nn.functional.cross_entropy(out[mask], y_own[mask], reduction="sum") / n_train
    loss.backward()
    params = [p for p in dmodel.model.parameters() if p.requires_grad]
    for p in params:  # (the same layout on every rank, even where no gradient reached)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.flatten() for p in params])
    dist.all_reduce(flat)  # replicated parameters: the global gradient on every rank
    torch.nn.utils.vector_to_parameters(flat, [p.grad for p in params])
    opt.step()
    return loss.detach()


def train_rank(cfg: TrainConfig, partition: str = "auto") -> TrainResult:
    """Train on this rank's partition of ``cfg.dataset`` in the current process group
    (initialised by the caller) and return the summary (the same on every rank).

    ``TrainResult.extra`` holds ``world_size``, ``losses`` (training loss of each
    epoch), ``comm_bytes_per_epoch`` (halo bytes sent per training step, forward and
    backward, all ranks; median over epochs), ``comm_bytes_setup`` (the cached
    first-layer halo, when propagate-first), ``edge_cut`` (directed edges between
    ranks), ``halo_rows`` (all ranks) and ``partition``.

    Raises:
        ValueError: an unsupported configuration (model, format, scheme).
    """
    cfg = _check(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(cfg.device)
    data = load_planetoid(cfg.dataset, cfg.root)
    x = data.x
    if cfg.normalize_features:
        x = x / x.sum(1, keepdim=True).clamp_min(1.0)
    torch.manual_seed(cfg.seed)
    num_classes = int(data.y.max()) + 1
    model = build_model(cfg, x.size(1), num_classes).to(device)
    for p in model.parameters():  # replicated: rank 0's initialisation everywhere
        dist.broadcast(p.data, 0)

    parts = partition_nodes(data.edge_index, data.num_nodes, world, partition) if rank == 0 else torch.empty(data.num_nodes, dtype=torch.long)
    parts = parts.to(device)
    dist.broadcast(parts, 0)
    parts = parts.cpu()
    from ..graph import Graph

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

    losses, times, comm = [], [], []
    best = (-1.0, 0, (0.0, 0.0, 0.0))
    it = range(1, cfg.epochs + 1)
    bar = None
    if cfg.progress and rank == 0:
        it = bar = progress_bar(it, desc=f"{cfg.model.upper()} {cfg.dataset} x{world}", unit="epoch")
    for epoch in it:
        t0 = time.perf_counter()
        loss = train_step(dmodel, opt, x_own, y_own, masks[0], n_train)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        sent = halo.reset()
        dmodel.eval()
        with torch.no_grad():
            pred = dmodel(x_own).argmax(-1)
        halo.reset()  # (evaluation traffic is not counted)
        correct = [float((pred[m] == y_own[m]).sum()) for m in masks]
        totals = _sum([float(loss.detach()), float(sent)] + correct + [float(m.sum()) for m in masks], device)
        losses.append(totals[0])
        comm.append(int(totals[1]))
        accs = tuple(c / max(t, 1.0) for c, t in zip(totals[2:5], totals[5:8]))
        if accs[1] >= best[0]:
            best = (accs[1], epoch, accs)
        if bar is not None:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{accs[1]:.3f}", best_test=f"{best[2][2]:.3f}", refresh=False)
    _, best_epoch, (tr, va, te) = best
    epoch_ms = _sum([statistics.median(times[1:] if len(times) > 1 else times)], device)[0] / world
    extra = {
        "world_size": world,
        "losses": losses,
        "comm_bytes_per_epoch": int(statistics.median(comm)),
        "comm_bytes_setup": int(_sum([float(setup_bytes)], device)[0]),
        "edge_cut": cut,
        "halo_rows": part.totals["n_halo"],
        "partition": partition,
    }
    return TrainResult(
        dataset=cfg.dataset, model=cfg.model, train_acc=tr, val_acc=va, test_acc=te, best_epoch=best_epoch,
        epoch_ms=epoch_ms, schemes=dmodel.schemes(), config=asdict(cfg), extra=extra,
    )


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


def train_distributed(cfg: TrainConfig, nproc: int, partition: str = "auto") -> TrainResult:
    """Spawn ``nproc`` local processes (``torch.multiprocessing.spawn``) that train
    ``cfg`` with :func:`train_rank` over gloo (NCCL on CUDA) on a free localhost port;
    return rank 0's summary. ``nproc=1`` runs the same code in one process.

    Raises:
        ValueError: ``nproc`` < 1, more CUDA ranks than GPUs, an unsupported
            configuration (:func:`train_rank`).
        FileNotFoundError: the dataset's files are not found.
        torch.multiprocessing.ProcessRaisedException: a rank failed (its traceback).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    from ..datasets import find_data_root

    _check(cfg)
    find_data_root(cfg.dataset, cfg.root)  # (a missing dataset fails here, not in every rank)
    if torch.device(cfg.device).type == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(f"nproc={nproc} ranks need as many GPUs, found {torch.cuda.device_count()}")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.spawn(_worker, args=(nproc, _free_port(), cfg, partition, out_path), nprocs=nproc, join=True)
        with open(out_path) as f:
            return TrainResult(**json.load(f))


def run_cli(cfg: TrainConfig, nproc: "int | None", torchrun: bool, partition: str = "auto") -> "TrainResult | None":
    """``corgnn train --nproc N`` (spawn) or ``--torchrun`` (join torchrun's group;
    returns the summary on rank 0 only, None elsewhere).

    Raises:
        ValueError: both or neither of ``nproc`` and ``torchrun``; ``nproc`` < 1.
    """
    if torchrun == (nproc is not None):
        raise ValueError("give either --nproc N or --torchrun")
    if not torchrun:
        return train_distributed(cfg, nproc, partition)
    init_from_env(cfg.device)
    try:
        res = train_rank(cfg if dist.get_rank() == 0 else TrainConfig(**{**asdict(cfg), "progress": False}), partition)
        return res if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()
