"""Partitioned full-graph training over ``torch.distributed`` (see README "Scaling out").

``partition_nodes`` / ``build_partitions``: the row split and each rank's local
``A'`` with its halo lists; ``halo_exchange``: the differentiable halo exchange;
``DistributedGCN`` / ``DistributedGAT``: the 2-layer models on one rank's rows;
``train_step``: one partitioned training step; ``init_from_env``: join torchrun's
process group. The training loop (``train_distributed`` / ``train_rank``, spawned
or under ``torchrun``) is :mod:`corgnn.training.distributed`.
"""

from .halo import HaloExchange, HaloPlan, halo_exchange
from .model import DistributedGAT, DistributedGCN, GlobalDropout
from .partition import PARTITION_METHODS, RankPartition, build_partitions, edge_cut, partition_nodes
from .train import init_from_env, train_step

__all__ = [
    "PARTITION_METHODS", "RankPartition", "build_partitions", "edge_cut", "partition_nodes",
    "HaloExchange", "HaloPlan", "halo_exchange", "DistributedGCN", "DistributedGAT", "GlobalDropout",
    "init_from_env", "train_step",
]
