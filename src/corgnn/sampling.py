"""Neighbour sampling without pyg-lib or torch-sparse, for benchmarks and tests.

PyG's :class:`torch_geometric.loader.NeighborLoader` needs ``pyg-lib`` or
``torch-sparse`` to sample; where neither is installed, :func:`sample_neighbors`
(NumPy, vectorised per hop) builds the same mini-batch a ``NeighborLoader(data,
num_neighbors=fanouts, batch_size=len(seeds))`` yields for a homogeneous graph with
its defaults (sampling without replacement, ``subgraph_type="directional"``,
``disjoint=False``), in the layout PyG documents for it
(https://pytorch-geometric.readthedocs.io/en/latest/modules/loader.html#torch_geometric.loader.NeighborLoader
and the "Hierarchical Neighborhood Sampling" tutorial,
https://pytorch-geometric.readthedocs.io/en/latest/tutorial/neighbor_loader.html):

* nodes are numbered in the order they are sampled: the seeds first
  (``n_id[:batch_size]``), then the nodes new at hop 1, then those new at hop 2, ...;
  ``num_sampled_nodes[h]`` counts the nodes added at hop ``h`` (hop 0: the seeds);
* at hop ``h`` every node added at hop ``h - 1`` (its *target*) draws up to
  ``fanouts[h - 1]`` of its in-neighbours (sources of edges ``source -> target``)
  uniformly without replacement (all of them when it has fewer; ``-1``: all);
  each draw is one edge ``source -> target`` in local ids, kept even when the
  source was sampled before; edges are ordered by hop, then by target, and
  ``num_sampled_edges[h - 1]`` counts those of hop ``h``;
* ``e_id`` holds each sampled edge's column in the input ``edge_index``, ``n_id``
  each local node's global id, ``input_id`` the seeds' positions in the loader's
  input nodes, ``batch_size`` the number of seeds; every node-level attribute
  (``x``, ``y``, masks...) is sliced by ``n_id`` and every edge-level one
  (``edge_attr``...) by ``e_id``, lists of one item per node too.

So ``model(batch.x, batch.edge_index)[:batch.batch_size]`` and models that call
:func:`torch_geometric.utils.trim_to_layer` work on it as on a NeighborLoader batch.
The random draws differ from pyg-lib's (another generator): same distribution, not
the same samples. Not a replacement for pyg-lib in training pipelines (it is single
threaded and Python-driven); use it where pyg-lib is absent, to benchmark or test
models on sampled subgraphs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["NeighborSampler", "sample_neighbors"]


class NeighborSampler:
    """A graph prepared for :func:`sample_neighbors`: its in-edges grouped by target
    (CSC), built once and reused for every batch.

    Args:
        data: a homogeneous ``torch_geometric.data.Data`` with ``edge_index (2, q)``
            int64 (``source -> target``, any order, duplicates allowed) and any
            node-level (``x``, ``y``, masks) and edge-level attributes; its
            ``num_nodes`` is the node count.

    Raises:
        TypeError: ``data`` has no ``edge_index`` tensor.
        ValueError: ``edge_index`` not of shape ``(2, q)`` or holds ids outside
            ``[0, num_nodes)``.
    """

    def __init__(self, data):
        ei = getattr(data, "edge_index", None)
        if not isinstance(ei, torch.Tensor):
            raise TypeError(f"data must be a torch_geometric Data with an edge_index tensor, got {type(data).__name__}")
        if ei.dim() != 2 or ei.size(0) != 2 or ei.dtype in (torch.bool,) or ei.is_floating_point():
            raise ValueError(f"data.edge_index must be an integer tensor of shape (2, q), got {tuple(ei.shape)} {ei.dtype}")
        n = int(data.num_nodes)
        src, dst = ei.detach().cpu().numpy().astype(np.int64, copy=False)
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise ValueError(f"data.edge_index holds node ids outside [0, {n})")
        perm = np.argsort(dst, kind="stable")
        self.data = data
        self.num_nodes = n
        self.colptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=self.colptr[1:])
        self.row = src[perm]  # sources grouped by target
        self.perm = perm  # CSC position -> column of data.edge_index

    def sample(self, seeds, fanouts: Sequence[int], generator=None, *, input_id: torch.Tensor | None = None):
        """The sampled subgraph around ``seeds``; see :func:`sample_neighbors`."""
        seeds_np = _check_seeds(seeds, self.num_nodes)
        fanouts = _check_fanouts(fanouts)
        rng = generator if isinstance(generator, np.random.Generator) else np.random.default_rng(generator)
        b = seeds_np.size
        if input_id is None:
            input_id = torch.arange(b)
        elif not isinstance(input_id, torch.Tensor) or input_id.shape != (b,):
            raise ValueError(f"input_id must be a tensor of shape ({b},) (one per seed), got {getattr(input_id, 'shape', type(input_id).__name__)}")

        local = np.full(self.num_nodes, -1, dtype=np.int64)  # global id -> local id
        local[seeds_np] = np.arange(b)
        count = b
        nodes, rows, cols, edges = [seeds_np], [], [], []
        num_nodes, num_edges = [b], []
        frontier_start, frontier = 0, seeds_np
        for fanout in fanouts:
            src, tgt_local, eid = self._draw(frontier, frontier_start, fanout, rng)
            unseen = src[local[src] < 0]
            uniq, first = np.unique(unseen, return_index=True)
            new = uniq[np.argsort(first, kind="stable")]  # in order of first draw
            local[new] = np.arange(count, count + new.size)
            frontier_start, frontier = count, new
            count += new.size
            nodes.append(new)
            rows.append(local[src])
            cols.append(tgt_local)
            edges.append(eid)
            num_nodes.append(int(new.size))
            num_edges.append(int(src.size))
        return self._batch(nodes, rows, cols, edges, num_nodes, num_edges, input_id)

    def _draw(self, frontier: np.ndarray, start: int, fanout: int, rng: np.random.Generator):
        """One hop: up to ``fanout`` in-edges of each frontier node, without
        replacement; returns (sources, target local ids, edge columns) ordered by
        target (the frontier's order), then by CSC position."""
        lo, hi = self.colptr[frontier], self.colptr[frontier + 1]
        deg = hi - lo
        take = deg if fanout < 0 else np.minimum(deg, fanout)
        total = int(deg.sum())
        if total == 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty
        # every candidate in-edge of the frontier, grouped by target
        seg = np.repeat(np.arange(frontier.size), deg)
        pos = np.arange(total) - np.repeat(np.cumsum(deg) - deg, deg) + np.repeat(lo, deg)
        if fanout >= 0 and (deg > fanout).any():
            # uniform without replacement: the `take` smallest of i.i.d. random keys
            keys = rng.random(total)
            order = np.lexsort((keys, seg))
            rank = np.arange(total) - np.repeat(np.cumsum(deg) - deg, deg)
            keep = order[rank < np.repeat(take, deg)]
            keep.sort()  # back to CSC order within each target
            seg, pos = seg[keep], pos[keep]
        return self.row[pos], seg + start, self.perm[pos]

    def _batch(self, nodes, rows, cols, edges, num_nodes, num_edges, input_id):
        n_id = torch.from_numpy(np.concatenate(nodes))
        e_id = torch.from_numpy(np.concatenate(edges))
        edge_index = torch.stack([torch.from_numpy(np.concatenate(rows)), torch.from_numpy(np.concatenate(cols))])
        data = self.data
        out = copy.copy(data)
        for key, value in data.items():
            if key == "edge_index":
                out.edge_index = edge_index.to(value.device)
            elif key == "num_nodes":
                out.num_nodes = n_id.numel()
            elif data.is_node_attr(key):
                out[key] = _take(value, n_id, data.__cat_dim__(key, value))
            elif data.is_edge_attr(key):
                out[key] = _take(value, e_id, data.__cat_dim__(key, value))
        out.n_id = n_id
        out.e_id = e_id
        out.num_sampled_nodes = num_nodes
        out.num_sampled_edges = num_edges
        out.input_id = input_id
        out.batch_size = int(num_nodes[0])
        return out


def _take(value, index: torch.Tensor, dim: int):
    """``value`` at ``index`` along ``dim`` (tensors, arrays; lists and tuples along
    their only axis), as PyG's loaders slice node and edge attributes."""
    if isinstance(value, torch.Tensor):
        return value.index_select(dim, index.to(value.device))
    if isinstance(value, np.ndarray):
        return np.take(value, index.numpy(), axis=dim)
    return [value[i] for i in index.tolist()]


def sample_neighbors(graph, seeds, fanouts: Sequence[int], generator=None, *, input_id: torch.Tensor | None = None):
    """Sample the ``len(fanouts)``-hop neighbourhood of ``seeds`` as a NeighborLoader
    mini-batch (layout in the module docstring).

    Args:
        graph: a :class:`NeighborSampler` (reuse one for many batches) or a
            ``torch_geometric.data.Data`` (prepared on the fly, O(q log q)).
        seeds: ``(b,)`` int64 tensor (or sequence) of distinct node ids in
            ``[0, num_nodes)``.
        fanouts: neighbours drawn per node and hop, e.g. ``[10, 10]``; ``-1`` = all.
        generator: ``numpy.random.Generator``, an int seed, or None (fresh entropy).
        input_id: ``(b,)`` positions of the seeds in the loader's input nodes
            (default ``arange(b)``).

    Returns:
        ``torch_geometric.data.Data`` with the graph's node attributes sliced by
        ``n_id`` (``x (N, m)``...), ``edge_index (2, E)`` int64 in local ids
        (``source -> target``), its edge attributes sliced by ``e_id``, ``n_id
        (N,)`` and ``e_id (E,)`` int64 global ids, ``batch_size = b``,
        ``num_sampled_nodes`` (list of ``len(fanouts) + 1`` ints summing to ``N``),
        ``num_sampled_edges`` (list of ``len(fanouts)`` ints summing to ``E``) and
        ``input_id (b,)``.

    Raises:
        TypeError: ``graph`` is neither; ``seeds`` not integer.
        ValueError: ``seeds`` empty, not 1-D, repeated or out of range; ``fanouts``
            empty or holding a value below ``-1``; ``input_id`` of the wrong shape.
    """
    sampler = graph if isinstance(graph, NeighborSampler) else NeighborSampler(graph)
    return sampler.sample(seeds, fanouts, generator, input_id=input_id)


def _check_seeds(seeds, n: int) -> np.ndarray:
    t = seeds if isinstance(seeds, torch.Tensor) else torch.as_tensor(seeds)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"seeds must hold integer node ids, got dtype {t.dtype}")
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"seeds must be a non-empty 1-D tensor of node ids, got shape {tuple(t.shape)}")
    a = t.detach().cpu().numpy().astype(np.int64, copy=False)
    if a.min() < 0 or a.max() >= n:
        raise ValueError(f"seeds must lie in [0, {n}), got ids from {int(a.min())} to {int(a.max())}")
    if np.unique(a).size != a.size:
        raise ValueError("seeds must be distinct node ids (disjoint sampling is not supported)")
    return a


def _check_fanouts(fanouts) -> list[int]:
    try:
        f = [int(v) for v in fanouts]
    except (TypeError, ValueError):
        raise ValueError(f"fanouts must be a sequence of ints (one per hop), got {fanouts!r}") from None
    if not f or min(f) < -1:
        raise ValueError(f"fanouts must be a non-empty sequence of ints >= -1 (-1: all neighbours), got {fanouts!r}")
    return f
