"""Single-process training (full graph, or mini-batches with ``batch_size``)."""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from ..datasets import load_planetoid
from ..distributed.minibatch import ClusterBatches
from ..graph import Graph
from ..nn.models import build_model
from .checkpoint import load_checkpoint
from .config import TrainConfig, TrainResult, check_writable
from .loop import Trainer, fit
from .minibatch import minibatch_epoch

__all__ = ["train", "load_features", "model_for", "history_result", "median_ms"]


def load_features(cfg: TrainConfig):
    """The dataset of ``cfg`` with ``x`` row-normalised when ``cfg.normalize_features``:
    ``(data, x (n, m) float32)``, both on the CPU."""
    data = load_planetoid(cfg.dataset, cfg.root)
    x = data.x
    if cfg.normalize_features:
        x = x / x.sum(1, keepdim=True).clamp_min(1.0)
    return data, x


def model_for(cfg: TrainConfig, in_channels: int, out_channels: int) -> torch.nn.Module:
    """The registry's model ``cfg.model`` (:func:`corgnn.nn.models.build_model`) with ``cfg``'s options."""
    return build_model(cfg.model, in_channels, out_channels, hidden=cfg.hidden, dropout=cfg.dropout,
                       scheme=cfg.scheme, format=cfg.format, heads=cfg.heads)


def history_result(cfg: TrainConfig, dataset: str, h, epoch_ms: float, schemes: list, extra: dict) -> TrainResult:
    """The :class:`TrainResult` of a finished :func:`~.loop.fit` history ``h``."""
    tr, va, te = h.best_accs
    extra = {**extra, "losses": h.losses}
    if h.resumed_from is not None:
        extra["resumed_from_epoch"] = h.resumed_from
    return TrainResult(dataset=dataset, model=cfg.model, train_acc=tr, val_acc=va, test_acc=te, best_epoch=h.best_epoch,
                       epoch_ms=epoch_ms, schemes=schemes, config=asdict(cfg), extra=extra)


def median_ms(times: list) -> float:
    """Median epoch time without the first epoch (planning, caches), when there are more."""
    return statistics.median(times[1:] if len(times) > 1 else times)


class _SingleProcess(Trainer):
    def __init__(self, model, optimizer, device, x, y, graph, masks, batches):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.x, self.y, self.graph, self.masks, self.batches = x, y, graph, masks, batches
        self.schemes = []

    def step(self) -> torch.Tensor:
        self.model.train()
        if self.batches is None:
            self.optimizer.zero_grad()
            out = self.model(self.x, self.graph)
            loss = torch.nn.functional.cross_entropy(out[self.masks[0]], self.y[self.masks[0]])
            loss.backward()
            self.optimizer.step()
        else:
            loss = minibatch_epoch(self.model, self.optimizer, self.batches, self.x, self.y, self.masks[0])
        self.schemes = self.model.schemes() if hasattr(self.model, "schemes") else []  # the training call's choice
        return loss

    def evaluate(self, loss):
        value = loss.item()
        self.model.eval()
        with torch.no_grad():
            pred = self.model(self.x, self.graph).argmax(-1)
        return value, tuple(float((pred[m] == self.y[m]).float().mean()) for m in self.masks)


def train(cfg: TrainConfig) -> TrainResult:
    """Train and evaluate one model in this process (see :mod:`corgnn.training`).

    The progress bar (``cfg.progress``) goes to stderr (:func:`~.loop.progress_bar`).
    ``TrainResult.extra["losses"]`` holds each epoch's training loss.

    Raises:
        ValueError: a bad configuration (:meth:`TrainConfig.resolved`), an unwritable
            checkpoint path, a checkpoint of another run to resume.
        FileNotFoundError: the dataset, or the checkpoint to resume, is not found.
    """
    cfg = cfg.resolved()
    if cfg.checkpoint:
        check_writable(cfg.checkpoint, "--checkpoint")
    resume = load_checkpoint(cfg.checkpoint, cfg) if cfg.resume else None
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    data, x = load_features(cfg)
    x, y = x.to(device), data.y.to(device)
    graph = Graph(data.edge_index.to(device), num_nodes=data.num_nodes)
    model = model_for(cfg, x.size(1), int(data.y.max()) + 1).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    masks = [m.to(device) for m in (data.train_mask, data.val_mask, data.test_mask)]
    batches = None
    if cfg.batch_size is not None:
        batches = ClusterBatches(data.edge_index, data.num_nodes, cfg.batch_size, device=device, x=x)
    trainer = _SingleProcess(model, opt, device, x, y, graph, masks, batches)
    h = fit(trainer, cfg, desc=f"{cfg.model.upper()} {data.name}" if cfg.progress else None, resume=resume)
    return history_result(cfg, data.name, h, median_ms(h.times), trainer.schemes, {})
