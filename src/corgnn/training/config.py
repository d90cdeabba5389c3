"""Configuration and summary of ``corgnn train`` (:class:`TrainConfig`, :class:`TrainResult`).

Defaults per model come from the registry :data:`corgnn.nn.models.MODELS`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import torch

from ..nn.models import MODELS

__all__ = ["TrainConfig", "TrainResult", "MODEL_DEFAULTS", "check_device", "check_writable"]

MODEL_DEFAULTS = {name: spec.defaults() for name, spec in MODELS.items()}
"""Per-model training defaults (hidden, dropout, lr, weight_decay, epochs), from
:data:`corgnn.nn.models.MODELS`."""

CHECKPOINT_EVERY = 10
"""Default epochs between checkpoints (the last epoch is always saved)."""


def check_device(device: str) -> torch.device:
    """``device`` as a :class:`torch.device` this machine has.

    Raises:
        ValueError: not a device name torch knows (``"tpu"``), a CUDA device without
            CUDA, or a GPU index past the last GPU.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu or cuda[:index], got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available on this machine (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be cpu or cuda[:index], got {device!r}")
    return dev


def check_writable(path: str, what: str) -> None:
    """Raise a ValueError naming ``what`` (e.g. ``"--json"``) when a file cannot be
    written at ``path``: it is a directory, its directory is missing, or either is
    not writable. Nothing is created."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{what} {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{what} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{what} {path}: not writable")


@dataclass
class TrainConfig:
    """Settings of one ``corgnn train`` run; None fields take the model's defaults
    (:data:`MODEL_DEFAULTS`) in :meth:`resolved`.

    ``checkpoint``: file to save the training state to every ``checkpoint_every``
    epochs and at the end (rank 0 writes it, atomically); ``resume``: continue from
    it (model, optimizer, epoch, history, RNG states).
    """

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
    checkpoint: str | None = None
    checkpoint_every: int = CHECKPOINT_EVERY
    resume: bool = False

    def resolved(self) -> "TrainConfig":
        """A copy with the model's defaults filled in.

        Raises:
            ValueError: unknown model, ``batch_size`` < 1, non-positive ``epochs`` or
                ``hidden`` (SGC has none), ``checkpoint_every`` < 1, ``resume``
                without ``checkpoint``, a device this machine lacks (:func:`check_device`).
        """
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {sorted(MODELS)}, got {self.model!r}")
        out = TrainConfig(**asdict(self))
        for k, v in MODEL_DEFAULTS[self.model].items():
            if getattr(out, k) is None:
                setattr(out, k, v)
        if out.batch_size is not None and out.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {out.batch_size}")
        if out.epochs <= 0 or out.hidden <= 0 and out.model != "sgc":
            raise ValueError(f"epochs and hidden must be positive, got {out.epochs}, {out.hidden}")
        if out.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {out.checkpoint_every}")
        if out.resume and not out.checkpoint:
            raise ValueError("resume needs a checkpoint path (--checkpoint PATH)")
        check_device(out.device)
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
