"""``corgnn train``: train the paper's 2-layer models (and SAGE, GIN, SGC, APPNP) on a
real Planetoid split, in one process, on mini-batches or partitioned over ranks.

Defaults follow Kipf & Welling for GCN (hidden 16, dropout 0.5, Adam lr 0.01, weight
decay 5e-4, 200 epochs) and Velickovic et al. for GAT (8 heads x 8 hidden, dropout 0.6
on inputs and attention, Adam lr 0.005, weight decay 5e-4, 200 epochs, 1 output
head); the registry :data:`corgnn.nn.models.MODELS` holds them. Features are
row-normalised. The reported test accuracy is the one at the epoch with the best
validation accuracy (ties: the later epoch), the usual model selection on the
public split.

Modules: :mod:`.config` (:class:`TrainConfig`, :class:`TrainResult`), :mod:`.loop`
(the one loop, :func:`~.loop.fit`), :mod:`.single` (:func:`train`),
:mod:`.minibatch`, :mod:`.distributed` (:func:`train_distributed`,
:func:`train_rank`), :mod:`.checkpoint`, :mod:`.cli` (the command).
"""

from .config import MODEL_DEFAULTS, TrainConfig, TrainResult
from .distributed import RankFailed, train_distributed, train_rank
from .loop import NON_TTY_PROGRESS_INTERVAL, fit, progress_bar
from .single import train

__all__ = ["TrainConfig", "TrainResult", "MODEL_DEFAULTS", "train", "train_distributed", "train_rank", "RankFailed",
           "fit", "progress_bar", "NON_TTY_PROGRESS_INTERVAL"]
