"""Checkpoints of ``corgnn train --checkpoint PATH [--checkpoint-every N] [--resume]``.

A checkpoint holds the model's and optimizer's state, the last finished epoch, the
loop's history (losses, epoch times, best validation epoch) and every rank's random
state (torch CPU and CUDA, numpy, python ``random`` and the trainer's own
generators, e.g. the partitioned dropout's), so a resumed run continues the killed
run's loss curve exactly. Rank 0 writes it: to a temporary file in the same
directory, then ``os.replace`` (a crash mid-write leaves the previous checkpoint).
"""

from __future__ import annotations

import os
import random
import tempfile

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint", "COMPATIBLE_FIELDS"]

COMPATIBLE_FIELDS = ("dataset", "model", "hidden", "heads", "dropout", "lr", "weight_decay", "seed", "scheme",
                     "format", "normalize_features", "batch_size")
"""TrainConfig fields a resumed run must share with the checkpoint's run."""


def rng_state(device: torch.device) -> dict:
    """This process's random state: torch (CPU, and ``device``'s when CUDA), numpy, python."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(path: str, state: dict) -> None:
    """Write ``state`` (``torch.save``) to ``path`` atomically: a temporary file in the
    same directory, then ``os.replace``."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_checkpoint(path: str, cfg, world_size: int | None = None, partition: str | None = None) -> dict:
    """The checkpoint at ``path``, checked against the run that resumes it:
    single-process (``world_size`` None) or partitioned over ``world_size`` ranks
    split by ``partition``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a corgnn checkpoint, or written by a run with other settings
            (:data:`COMPATIBLE_FIELDS`), another number of ranks or node split, or
            at ``cfg.epochs`` or past it.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # (unpickling errors of all kinds)
        raise ValueError(f"--resume: {path} is not a checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ck, dict) or ck.get("format") != "corgnn-train-checkpoint":
        raise ValueError(f"--resume: {path} is not a corgnn train checkpoint")
    diff = [f"{k}={ck['config'].get(k)!r} (now {getattr(cfg, k)!r})" for k in COMPATIBLE_FIELDS if ck["config"].get(k) != getattr(cfg, k)]
    if diff:
        raise ValueError(f"--resume: {path} was written with other settings: {', '.join(diff)}")
    def runs(w):
        return "single-process training" if w is None else f"{w} rank(s)"

    if ck["world_size"] != world_size:
        raise ValueError(f"--resume: {path} was written by {runs(ck['world_size'])}, this run is {runs(world_size)}")
    if world_size is not None and ck["shared"].get("partition") != partition:
        raise ValueError(f"--resume: {path} was written with --partition {ck['shared'].get('partition')}, not {partition}")
    if ck["epoch"] >= cfg.epochs:
        raise ValueError(f"--resume: {path} is at epoch {ck['epoch']}, nothing left to train with --epochs {cfg.epochs}")
    return ck
