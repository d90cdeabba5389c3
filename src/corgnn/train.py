"""``corgnn.train``: the public names of :mod:`corgnn.training` where they were
before it existed (``TrainConfig``, ``TrainResult``, ``train``, ``progress_bar``,
``add_arguments``, ``run``, ``MODEL_DEFAULTS``)."""

from .training.cli import add_arguments, run
from .training.config import MODEL_DEFAULTS, TrainConfig, TrainResult
from .training.loop import NON_TTY_PROGRESS_INTERVAL, progress_bar
from .training.single import train

__all__ = ["TrainConfig", "TrainResult", "train", "progress_bar", "add_arguments", "run", "MODEL_DEFAULTS", "NON_TTY_PROGRESS_INTERVAL"]
