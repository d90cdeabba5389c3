"""Process-group plumbing and the partitioned training step.

The training loop itself (``corgnn train --nproc N`` / ``--torchrun``) lives in
:mod:`corgnn.training.distributed`; this module holds what it and the benchmarks
share below it: joining a process group (:func:`init_from_env`), a free or checked
rendezvous port (:func:`free_port`, :func:`check_port_free`), a summed
``all_reduce`` of floats (:func:`all_reduce_sum`) and one partitioned training
step (:func:`train_step`).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["train_step", "init_from_env", "free_port", "check_port_free", "all_reduce_sum", "backend", "TIMEOUT_S"]

TIMEOUT_S = 300
"""Seconds a collective may wait before the process group gives up (a lost rank
raises instead of hanging)."""


def backend(device: str) -> str:
    """``"nccl"`` for a CUDA device, else ``"gloo"``."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]




def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise a ValueError naming ``port`` when it is outside 1..65535 or a TCP
    server cannot bind it on ``host`` (another process listens there)."""
    if not 0 < port < 65536:
        raise ValueError(f"rendezvous port must be in 1..65535, got {port}")
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(f"rendezvous port {port} on {host} is taken ({e.strerror}); give another or leave it out to pick a free one") from None


def init_from_env(device: str = "cpu") -> None:
    """Join the process group described by ``torchrun``'s environment variables
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); gloo on CPU, NCCL
    on CUDA (each rank on GPU ``LOCAL_RANK``)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend(device), timeout=timedelta(seconds=TIMEOUT_S))


def all_reduce_sum(values: list[float], device) -> list[float]:
    """``values`` summed over the ranks (float64 on ``device``)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


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

