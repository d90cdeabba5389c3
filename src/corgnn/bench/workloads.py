"""PyG models and inputs of the ``changing-graphs`` experiment, written as a PyG user
writes them (plain ``torch_geometric.nn`` layers, no corgnn).

This file imports only torch and PyG at module level, so that
:func:`first_call_script` can run it in a fresh interpreter **by path** (``runpy``)
without importing the corgnn package: the ``pyg`` variant of the first-call case
then loads no corgnn code at all, as a plain PyG script would not.

* :func:`random_molecules` - seeded small random graphs (15-35 nodes), as in the
  issue 21 reproduction;
* :class:`PoolGCN` (3 x ``GCNConv`` + ``global_mean_pool``) and :class:`PoolGIN`
  (5 x ``GINConv`` with a 2-layer MLP + ``global_add_pool``): graph classification
  of mini-batches (``Batch.from_data_list``);
* :class:`NodeGCN` / :class:`NodeSAGE`: 2-layer node classifiers (sampled
  subgraphs, full-graph inference, the explanation loop);
* :func:`first_call` - import, build, ``optimize`` (corgnn variant) and one
  forward + backward, timed inside one fresh process.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

__all__ = ["random_molecules", "PoolConvs", "PoolGCN", "PoolSAGE", "PoolGIN", "TransformOnly", "without_aggregation", "NodeGCN", "NodeSAGE", "first_call", "first_call_script", "MOLECULE_FEATURES"]

MOLECULE_FEATURES = 16
"""Node feature width of :func:`random_molecules`."""


def random_molecules(count: int, seed: int = 0, *, min_nodes: int = 15, max_nodes: int = 35, degree: float = 2.2, features: int = MOLECULE_FEATURES):
    """``count`` seeded random graphs of ``min_nodes`` to ``max_nodes - 1`` nodes.

    Each graph has ``int(degree * n)`` uniformly random node pairs, symmetrised (so
    about ``2 * degree`` directed edges per node, self-loops and repeats possible, as
    in the issue 21 script), standard normal features ``x (n, features)`` and a
    binary label ``y (1,)``.

    Returns:
        list of ``torch_geometric.data.Data``.

    Raises:
        ValueError: ``count < 1`` or ``not 1 <= min_nodes < max_nodes``.
    """
    from torch_geometric.data import Data

    if count < 1 or not 1 <= min_nodes < max_nodes:
        raise ValueError(f"need count >= 1 and 1 <= min_nodes < max_nodes, got count={count}, min_nodes={min_nodes}, max_nodes={max_nodes}")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in torch.randint(min_nodes, max_nodes, (count,), generator=gen).tolist():
        ei = torch.randint(0, n, (2, int(degree * n)), generator=gen)
        ei = torch.cat([ei, ei.flip(0)], 1)
        out.append(Data(x=torch.randn(n, features, generator=gen), edge_index=ei, y=torch.randint(0, 2, (1,), generator=gen)))
    return out


class PoolConvs(torch.nn.Module):
    """``layers`` x (PyG's ``conv`` layer (a class name of ``torch_geometric.nn``,
    ``conv(d, hidden)``) + ReLU), ``global_mean_pool``, ``Linear``; forward ``(x (N, m),
    edge_index (2, E), batch (N,)) -> (graphs, out)``."""

    conv = "GCNConv"

    def __init__(self, in_channels: int, hidden: int, out: int, layers: int = 3):
        import torch_geometric.nn as pyg

        super().__init__()
        make = getattr(pyg, self.conv)
        self.convs = torch.nn.ModuleList([make(in_channels if i == 0 else hidden, hidden) for i in range(layers)])
        self.lin = torch.nn.Linear(hidden, out)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_mean_pool

        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.lin(global_mean_pool(x, batch))


class PoolGCN(PoolConvs):
    """:class:`PoolConvs` of ``GCNConv``."""


class PoolSAGE(PoolConvs):
    """:class:`PoolConvs` of ``SAGEConv`` (mean aggregation)."""

    conv = "SAGEConv"


class PoolGIN(torch.nn.Module):
    """``layers`` x (``GINConv(MLP(d, hidden, hidden))`` + ReLU), ``global_add_pool``,
    ``Linear``; forward as :class:`PoolGCN`."""

    def __init__(self, in_channels: int, hidden: int, out: int, layers: int = 5):
        from torch_geometric.nn import GINConv

        super().__init__()

        def mlp(d):
            return torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden))

        self.convs = torch.nn.ModuleList([GINConv(mlp(in_channels if i == 0 else hidden)) for i in range(layers)])
        self.lin = torch.nn.Linear(hidden, out)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_add_pool

        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.lin(global_add_pool(x, batch))


class TransformOnly(torch.nn.Module):
    """A message-passing layer's feature transform without its aggregation:
    ``nn(x)`` of a ``GINConv``, ``lin(x) + bias`` of a ``GCNConv`` (same parameter
    objects; a ``SAGEConv``'s two Linears on ``x``); forward ``(x (n, in), edge_index
    ignored) -> (n, out)``. What a layer would cost if message passing were free: the
    bound of ``corgnn bench changing-graphs`` (:func:`without_aggregation`)."""

    def __init__(self, conv: torch.nn.Module):
        super().__init__()
        self.conv = conv

    def forward(self, x, edge_index=None):
        conv = self.conv
        if isinstance(getattr(conv, "nn", None), torch.nn.Module):
            return conv.nn(x)
        if hasattr(conv, "lin_l"):  # SAGEConv: lin_l(x) in place of lin_l(mean of the neighbours)
            out = conv.lin_l(x)
            return out if not conv.root_weight else out + conv.lin_r(x)
        out = conv.lin(x)
        return out if conv.bias is None else out + conv.bias


def without_aggregation(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of a :class:`PoolConvs` / :class:`PoolGIN` whose layers are
    :class:`TransformOnly`: the model's time without message passing (its MLPs,
    activations, pooling, loss and optimizer step only), so ``PyG / this`` bounds the
    speed-up any aggregation kernel can give it.

    Raises:
        TypeError: ``model`` has no ``convs`` list.
    """
    import copy

    if not isinstance(getattr(model, "convs", None), torch.nn.ModuleList):
        raise TypeError(f"model must have a convs ModuleList (PoolConvs, PoolGIN), got {type(model).__name__}")
    out = copy.deepcopy(model)
    out.convs = torch.nn.ModuleList(TransformOnly(c) for c in out.convs)
    return out


class NodeGCN(torch.nn.Module):
    """``GCNConv(m, hidden)`` + ReLU + ``GCNConv(hidden, out)``; forward ``(x (n, m),
    edge_index (2, q), edge_weight (q,) or None) -> (n, out)``."""

    def __init__(self, in_channels: int, hidden: int, out: int):
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out)

    def forward(self, x, edge_index, edge_weight=None):
        x = self.conv1(x, edge_index, edge_weight).relu()
        return self.conv2(x, edge_index, edge_weight)


class NodeSAGE(torch.nn.Module):
    """``SAGEConv(m, hidden)`` + ReLU + ``SAGEConv(hidden, out)`` (mean aggregation);
    forward ``(x (n, m), edge_index (2, q)) -> (n, out)``."""

    def __init__(self, in_channels: int, hidden: int, out: int):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden)
        self.conv2 = SAGEConv(hidden, out)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def first_call(variant: str, graphs: int, hidden: int = 64, seed: int = 0, threads: int | None = None) -> dict:
    """Import, build, optimize and run one training step, timed in this process.

    Meant for a fresh interpreter (:func:`first_call_script`): ``import_ms`` times
    ``import torch_geometric`` (and ``import corgnn`` for ``variant="corgnn"``; torch
    is already loaded by this module); ``first_ms`` times building a
    :class:`PoolGCN`, ``corgnn.optimize`` (corgnn variant) and one forward +
    cross-entropy + backward on one batch of ``graphs`` :func:`random_molecules`
    (the batch is collated before the clock starts).

    Returns:
        ``{"variant", "import_ms", "first_ms", "nodes", "edges", "corgnn_loaded"}``
        (the last: whether any corgnn module was imported in this process).

    Raises:
        ValueError: ``variant`` not ``"pyg"`` or ``"corgnn"``.
    """
    if variant not in ("pyg", "corgnn"):
        raise ValueError(f"variant must be 'pyg' or 'corgnn', got {variant!r}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    import torch_geometric  # noqa: F401

    if variant == "corgnn":
        import corgnn
    import_ms = (time.perf_counter() - t0) * 1e3
    from torch_geometric.data import Batch

    b = Batch.from_data_list(random_molecules(graphs, seed))
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = PoolGCN(MOLECULE_FEATURES, hidden, 2)
    if variant == "corgnn":
        model = corgnn.optimize(model)
    F.cross_entropy(model(b.x, b.edge_index, b.batch), b.y).backward()
    first_ms = (time.perf_counter() - t0) * 1e3
    loaded = any(name == "corgnn" or name.startswith("corgnn.") for name in sys.modules)
    return dict(variant=variant, import_ms=import_ms, first_ms=first_ms, nodes=int(b.num_nodes), edges=int(b.edge_index.size(1)), corgnn_loaded=loaded)


def first_call_script(variant: str, graphs: int, hidden: int = 64, seed: int = 0, threads: int | None = None) -> list[str]:
    """argv of a fresh interpreter (``sys.executable``) that runs this file by path
    and prints :func:`first_call`'s result as one JSON line."""
    code = (
        "import runpy, sys, json; "
        f"ns = runpy.run_path({__file__!r}); "
        f"print(json.dumps(ns['first_call']({variant!r}, {int(graphs)}, {int(hidden)}, {int(seed)}, {threads!r})))"
    )
    return [sys.executable, "-c", code]

