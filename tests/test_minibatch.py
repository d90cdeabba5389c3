"""Mini-batch training: METIS-cluster batches (no compiled extension), ``corgnn train
--batch-size``, and corgnn layers inside PyG's NeighborLoader (needs pyg-lib)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import corgnn
from corgnn.distributed.minibatch import ClusterBatches
from corgnn.sparse.formats import CSR


def _graph(n=80, q=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, q), generator=g), n


@pytest.mark.parametrize("method", ["range", "auto"])
def test_cluster_batches_cover_nodes_with_induced_subgraphs(method):
    ei, n = _graph()
    x = torch.zeros(n, 50)
    x[torch.arange(n), torch.arange(n) % 50] = 1.0  # 2 % non-zeros: kept as a CSR
    b = ClusterBatches(ei, n, 25, method=method, x=x)
    assert len(b) == 4
    seen = []
    for nodes, g, xb in b:
        seen += nodes.tolist()
        inside = torch.isin(ei[0], nodes) & torch.isin(ei[1], nodes)
        local = torch.full((n,), -1, dtype=torch.long)
        local[nodes] = torch.arange(nodes.numel())
        expect = sorted(map(tuple, local[ei[:, inside]].t().tolist()))
        assert g.num_nodes == nodes.numel() and sorted(map(tuple, g.edge_index.t().tolist())) == expect
        assert isinstance(xb, CSR) and torch.equal(xb.to_dense(), x[nodes])
    assert sorted(seen) == list(range(n))
    again = {id(g): xb for _, g, xb in b}  # graphs and features are built once
    assert all(again[id(g)] is xb for _, g, xb in b)
    dense = ClusterBatches(ei, n, 25, method=method, x=torch.randn(n, 3))
    assert all(isinstance(xb, torch.Tensor) for _, _, xb in dense)


def test_cluster_batches_bad_input():
    ei, n = _graph()
    with pytest.raises(ValueError, match="batch_size"):
        ClusterBatches(ei, n, 0)
    with pytest.raises(ValueError, match="x must have shape"):
        ClusterBatches(ei, n, 10, x=torch.randn(n + 1, 3))
    from corgnn.train import TrainConfig

    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0).resolved()


def test_train_batch_size():
    """One batch holding every node is full-graph training (same losses); smaller
    batches train (the loss falls)."""
    from corgnn.train import TrainConfig, train

    cfg = dict(dataset="Cora", dropout=0.0, epochs=4, progress=False)
    try:
        full = train(TrainConfig(**cfg))
    except FileNotFoundError as e:
        pytest.skip(f"Cora not found: {e}")
    one = train(TrainConfig(**cfg, batch_size=10_000))
    torch.testing.assert_close(torch.tensor(one.extra["losses"]), torch.tensor(full.extra["losses"]), rtol=1e-5, atol=1e-6)
    small = train(TrainConfig(**cfg, batch_size=700))
    losses = small.extra["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0] and 0.0 <= small.test_acc <= 1.0


@pytest.mark.skipif(
    importlib.util.find_spec("pyg_lib") is None and importlib.util.find_spec("torch_sparse") is None,
    reason="NeighborLoader needs pyg-lib or torch-sparse (no wheels on the package index here)",
)
def test_layers_inside_neighbor_loader():
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn import GCNConv

    ei, n = _graph(n=200, q=1200)
    data = Data(x=torch.randn(n, 8), edge_index=ei)
    ours, ref = corgnn.nn.GCNConv(8, 4), GCNConv(8, 4)
    ref.load_state_dict(ours.state_dict())
    batches = 0
    for batch in NeighborLoader(data, num_neighbors=[5, 5], batch_size=32):
        x = batch.x.clone().requires_grad_()
        out = ours(x, batch.edge_index)
        x_ref = batch.x.clone().requires_grad_()
        out_ref = ref(x_ref, batch.edge_index)
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(out)
        torch.testing.assert_close(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(out_ref, x_ref, g)[0], rtol=1e-5, atol=1e-5)
        batches += 1
    assert batches == -(-n // 32)
