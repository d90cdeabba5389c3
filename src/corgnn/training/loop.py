"""The one training loop of ``corgnn train``: single-process, mini-batch and
partitioned training all run :func:`fit` over a :class:`Trainer`.

Per epoch: one timed training step (:meth:`Trainer.step`; CUDA synchronised before
the clock stops), then :meth:`Trainer.evaluate` (the epoch's loss and the train /
validation / test accuracies, summed over ranks where partitioned). The reported
test accuracy is the one at the epoch with the best validation accuracy (ties: the
later epoch). With ``cfg.checkpoint`` the state is saved every
``cfg.checkpoint_every`` epochs and after the last (:mod:`.checkpoint`); with a
checkpoint to resume from, the loop restores it and continues after its epoch.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from .checkpoint import rng_state, save_checkpoint, set_rng_state

__all__ = ["Trainer", "History", "fit", "progress_bar", "NON_TTY_PROGRESS_INTERVAL"]

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


class Trainer:
    """What :func:`fit` drives. Subclasses set ``model`` (the module whose parameters
    are trained and checkpointed), ``optimizer`` and ``device``, and implement
    :meth:`step` and :meth:`evaluate`; partitioned trainers also set ``rank``,
    ``world_size`` and ``partitioned`` and override :meth:`gather`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    rank: int = 0
    world_size: int = 1
    partitioned: bool = False

    def step(self) -> torch.Tensor:
        """One epoch of training (forward, backward, optimizer steps); returns the loss (0-dim)."""
        raise NotImplementedError

    def evaluate(self, loss: torch.Tensor) -> tuple[float, tuple[float, float, float]]:
        """The epoch's training loss as a float (over all ranks) and the train,
        validation and test accuracies."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """This rank's own state to checkpoint beyond model, optimizer and RNGs (e.g. generators)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s result."""

    def gather(self, obj) -> "list | None":
        """Every rank's ``obj`` on rank 0 (None on the others)."""
        return [obj]


@dataclass
class History:
    """What the loop has done so far: the last finished ``epoch``, per-epoch
    ``losses`` and ``times`` (ms of the training step) and the best validation epoch
    with its accuracies."""

    epoch: int = 0
    losses: list = field(default_factory=list)
    times: list = field(default_factory=list)
    best_val: float = -1.0
    best_epoch: int = 0
    best_accs: tuple = (0.0, 0.0, 0.0)
    resumed_from: int | None = None


def _restore(trainer: Trainer, ck: dict) -> History:
    trainer.model.load_state_dict(ck["model"])
    trainer.optimizer.load_state_dict(ck["optimizer"])
    local = ck["ranks"][trainer.rank]
    set_rng_state(local["rng"], trainer.device)
    trainer.load_state_dict(local["trainer"])
    h = History(**{**ck["history"], "best_accs": tuple(ck["history"]["best_accs"])})
    h.resumed_from = h.epoch
    return h


def _save(trainer: Trainer, cfg, h: History, shared: dict) -> None:
    ranks = trainer.gather({"rng": rng_state(trainer.device), "trainer": trainer.state_dict()})
    if trainer.rank != 0:
        return
    save_checkpoint(cfg.checkpoint, {
        "format": "corgnn-train-checkpoint",
        "config": asdict(cfg),
        "world_size": trainer.world_size if trainer.partitioned else None,
        "epoch": h.epoch,
        "history": {**asdict(h), "resumed_from": None},
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "ranks": ranks,
        "shared": shared,
    })


def fit(trainer: Trainer, cfg, *, desc: str | None = None, resume: dict | None = None, shared: dict | None = None) -> History:
    """Train ``trainer`` for epochs ``1..cfg.epochs`` (from ``resume["epoch"] + 1`` when
    resuming a checkpoint of :func:`corgnn.training.checkpoint.load_checkpoint`).

    Args:
        cfg: the resolved :class:`~.config.TrainConfig` (epochs, checkpoint settings).
        desc: progress bar label on stderr (None: no bar).
        resume: a loaded checkpoint to continue from.
        shared: run-wide state saved with each checkpoint (e.g. the node split).

    Returns:
        The :class:`History` of all epochs (a resumed run's includes the checkpoint's).
    """
    h = History() if resume is None else _restore(trainer, resume)
    it = range(h.epoch + 1, cfg.epochs + 1)
    bar = None
    if desc is not None:
        it = bar = progress_bar(it, desc=desc, unit="epoch")
    for epoch in it:
        t0 = time.perf_counter()
        loss = trainer.step()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        h.times.append((time.perf_counter() - t0) * 1e3)
        value, accs = trainer.evaluate(loss)
        h.losses.append(value)
        if accs[1] >= h.best_val:
            h.best_val, h.best_epoch, h.best_accs = accs[1], epoch, accs
        h.epoch = epoch
        if bar is not None:
            bar.set_postfix(loss=f"{value:.3f}", val=f"{accs[1]:.3f}", best_test=f"{h.best_accs[2]:.3f}", refresh=False)
        if cfg.checkpoint and (epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs):
            _save(trainer, cfg, h, shared or {})
    return h
