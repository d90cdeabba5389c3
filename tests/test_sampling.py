"""corgnn.sampling: NeighborLoader's batch layout without pyg-lib (invariants, and
PyG models with and without trim_to_layer on it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import trim_to_layer

from corgnn.datasets import synthetic
from corgnn.sampling import NeighborSampler, sample_neighbors


@pytest.fixture(scope="module")
def data():
    d = synthetic("Cora", seed=3, nodes=300, edges=2400, features=8)
    d.edge_attr = torch.arange(d.edge_index.size(1), dtype=torch.float32)[:, None]
    return d


def _hop_of_edges(batch):
    return np.repeat(np.arange(len(batch.num_sampled_edges)), batch.num_sampled_edges)


@pytest.mark.parametrize("fanouts", [[5, 3], [2, 2, 2], [-1, 4]])
def test_layout_matches_neighbor_loader(data, fanouts):
    seeds = torch.tensor([7, 3, 250, 120, 0, 42])
    batch = sample_neighbors(data, seeds, fanouts, np.random.default_rng(0))
    b, N, E = seeds.numel(), batch.num_nodes, batch.edge_index.size(1)
    # seeds first, then new nodes hop by hop; counts add up
    assert batch.batch_size == b and torch.equal(batch.n_id[:b], seeds)
    assert torch.equal(batch.input_id, torch.arange(b))
    assert len(batch.num_sampled_nodes) == len(fanouts) + 1 and len(batch.num_sampled_edges) == len(fanouts)
    assert sum(batch.num_sampled_nodes) == N == batch.n_id.numel() == batch.n_id.unique().numel()
    assert sum(batch.num_sampled_edges) == E == batch.e_id.numel()
    # every edge is a real edge source -> target, attributes sliced by n_id / e_id
    src, dst = batch.edge_index
    assert torch.equal(torch.stack([batch.n_id[src], batch.n_id[dst]]), data.edge_index[:, batch.e_id])
    assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    assert batch.e_id.unique().numel() == E  # without replacement
    # hop h's targets are the nodes added at hop h-1; its new nodes appear first as its sources
    bounds = np.cumsum([0] + batch.num_sampled_nodes)
    hop = _hop_of_edges(batch)
    for h, fanout in enumerate(fanouts):
        tgt = dst.numpy()[hop == h]
        assert ((tgt >= bounds[h]) & (tgt < bounds[h + 1])).all()
        assert (np.diff(tgt) >= 0).all()  # grouped by target
        assert set(src.numpy()[hop == h]) >= set(range(bounds[h + 1], bounds[h + 2]))
        assert src.numpy()[hop < h].max(initial=-1) < bounds[h + 1]
        # fanout bound: min(fanout, in-degree) per target
        indeg = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
        counts = np.bincount(tgt - bounds[h], minlength=bounds[h + 1] - bounds[h])
        want = indeg[batch.n_id[bounds[h] : bounds[h + 1]]].numpy()
        want = want if fanout < 0 else np.minimum(want, fanout)
        assert (counts == want).all()


def test_seeded_and_reusable(data):
    sampler = NeighborSampler(data)
    a = sampler.sample([1, 2, 3], [4, 4], 11)
    b = sample_neighbors(data, torch.tensor([1, 2, 3]), [4, 4], generator=11)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.n_id, b.n_id)
    c = sampler.sample([1, 2, 3], [4, 4], 12)
    assert not (torch.equal(a.e_id, c.e_id))


def test_all_neighbours_give_full_graph_outputs_and_trim_to_layer_agrees(data):
    """fanouts -1: every node within reach has all its in-edges, so a 2-layer SAGE's
    seed outputs equal the full graph's; trimming per layer changes nothing for them."""
    torch.manual_seed(0)

    class Sage(torch.nn.Module):
        def __init__(self, trim):
            super().__init__()
            self.convs = torch.nn.ModuleList([SAGEConv(8, 16), SAGEConv(16, 4)])
            self.trim = trim

        def forward(self, x, edge_index, nodes=None, edges=None):
            for i, conv in enumerate(self.convs):
                if self.trim:
                    x, edge_index, _ = trim_to_layer(i, nodes, edges, x, edge_index)
                x = conv(x, edge_index)
                if i == 0:
                    x = x.relu()
            return x

    plain, trimmed = Sage(False), Sage(True)
    trimmed.load_state_dict(plain.state_dict())
    seeds = torch.tensor([5, 17, 200, 64])
    batch = sample_neighbors(data, seeds, [-1, -1], 0)
    full = plain(data.x, data.edge_index)[seeds]
    b = batch.batch_size
    torch.testing.assert_close(plain(batch.x, batch.edge_index)[:b], full)
    torch.testing.assert_close(trimmed(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)[:b], full)
    sampled = sample_neighbors(data, seeds, [3, 2], 0)
    out = trimmed(sampled.x, sampled.edge_index, sampled.num_sampled_nodes, sampled.num_sampled_edges)
    torch.testing.assert_close(out[:b], plain(sampled.x, sampled.edge_index)[:b])


def test_isolated_seeds_and_bad_input(data):
    g = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 0]]), ids=["a", "b", "c", "d"])
    batch = sample_neighbors(g, [2, 3], [5])
    assert batch.ids == ["c", "d"]  # per-node lists are sliced too
    assert sample_neighbors(g, [1], [5]).ids == ["b", "a"]
    assert batch.num_sampled_nodes == [2, 0] and batch.num_sampled_edges == [0] and batch.edge_index.shape == (2, 0)
    with pytest.raises(ValueError, match="seeds must lie"):
        sample_neighbors(data, [0, 10_000], [2])
    with pytest.raises(ValueError, match="distinct"):
        sample_neighbors(data, [1, 1], [2])
    with pytest.raises(TypeError, match="seeds"):
        sample_neighbors(data, torch.tensor([1.0]), [2])
    with pytest.raises(ValueError, match="fanouts"):
        sample_neighbors(data, [1], [])
    with pytest.raises(ValueError, match="fanouts"):
        sample_neighbors(data, [1], [-2])
    with pytest.raises(ValueError, match="input_id"):
        sample_neighbors(data, [1, 2], [2], input_id=torch.arange(3))
    with pytest.raises(TypeError, match="edge_index"):
        NeighborSampler(object())
    with pytest.raises(ValueError, match="outside"):
        NeighborSampler(Data(edge_index=torch.tensor([[0], [9]]), num_nodes=3))


@pytest.mark.parametrize("layer", ["sage", "graphconv", "gcn"])
@pytest.mark.parametrize("trim", [False, True])
def test_optimized_models_on_sampled_batches_match_pyg(data, layer, trim):
    """An optimize()d 2-layer model on NeighborLoader-layout batches (with and without
    trim_to_layer): outputs and every gradient as PyG's, float64. SAGE and GraphConv
    run their aggregated term on the rows with incoming edges (most of a batch is its
    last hop, which has none): the plans say so."""
    import copy

    import torch_geometric.nn as pyg

    import corgnn

    make = {"sage": lambda i, o: pyg.SAGEConv(i, o), "graphconv": lambda i, o: pyg.GraphConv(i, o), "gcn": lambda i, o: pyg.GCNConv(i, o)}[layer]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([make(8, 16), make(16, 4)])

        def forward(self, x, edge_index, nodes=None, edges=None):
            for i, conv in enumerate(self.convs):
                if trim:
                    x, edge_index, _ = trim_to_layer(i, nodes, edges, x, edge_index)
                x = conv(x, edge_index)
                if i == 0:
                    x = x.relu()
            return x

    torch.manual_seed(0)
    ref = Net().double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    assert all(type(c).__module__.startswith("corgnn") for c in ours.convs)
    for seed in range(3):
        batch = sample_neighbors(data, torch.tensor([7, 3, 250, 120, 0, 42]), [2, 5], np.random.default_rng(seed))
        x = batch.x.double().requires_grad_()
        args = (batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
        o1, o2 = ref(x, *args), ours(x, *args)
        torch.testing.assert_close(o2, o1, rtol=1e-10, atol=1e-10)
        g = torch.randn_like(o1)
        g1 = torch.autograd.grad(o1, [x, *ref.parameters()], g)
        g2 = torch.autograd.grad(o2, [x, *ours.parameters()], g)
        for a, b in zip(g2, g1):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        if layer != "gcn":  # (GCN's self-loops give every row an entry)
            plan = ours.convs[0].last_plan
            assert plan.rows == batch.edge_index[1].unique().numel() < 0.5 * plan.n
