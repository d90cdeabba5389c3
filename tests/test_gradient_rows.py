"""Weight gradients on the live rows of the output gradient (issue 21): node
classification on a neighbour-sampled batch reads the seeds' outputs only, so the
gradient reaching the first layer is zero past the seeds and their in-neighbours
(samplers number nodes hop by hop). :func:`corgnn.functional.gcn.gradient_rows` finds
that tail; GCN's weight gradient and the root term of SAGE / GraphConv
(:class:`corgnn.functional.gcn.RowsLinear`) skip it. Exactness against PyG (float64),
gradcheck / gradgradcheck with a zero tail, and that the short path is taken."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import corgnn
import corgnn.functional.gcn as fgcn
from corgnn.cost import GCN_SCHEMES, parse_scheme
from corgnn.datasets import synthetic
from corgnn.functional import gcn_conv
from corgnn.sampling import sample_neighbors
from conftest import FAST_GRADCHECK, make_graph

F64 = torch.float64


def test_gradient_rows_finds_the_zero_tail():
    big = fgcn.ROWS_MIN_MACS
    G = torch.randn(10, 3)
    assert fgcn.gradient_rows(G, big) == 10  # live last row: no look back
    G[6:] = 0
    assert fgcn.gradient_rows(G, big) == 6
    assert fgcn.gradient_rows(G, big - 1) == 10  # too short a product to look
    G[2:6] = 0
    G[3, 1] = float("nan")  # a NaN row is live (the NaN must reach the weight gradient)
    assert fgcn.gradient_rows(G, big) == 4
    G[4, 2] = -0.0  # (negative zero is zero)
    assert fgcn.gradient_rows(G, big) == 4
    assert fgcn.gradient_rows(torch.zeros(5, 2), big) == 0
    assert fgcn.gradient_rows(torch.zeros(0, 2), big) == 0
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):  # tails of every length, against the blocks it reads back in
        n = int(torch.randint(1, 2500, (1,), generator=gen))
        h = int(torch.randint(0, n + 1, (1,), generator=gen))
        G = torch.zeros(n, 3)
        G[: max(h - 1, 0)] = torch.randn(max(h - 1, 0), 3, generator=gen) * (torch.rand(max(h - 1, 0), 1, generator=gen) < 0.2)
        if h:
            G[h - 1, h % 3] = (1e-30, -2.0, float("nan"), float("-inf"))[h % 4]
        assert fgcn.gradient_rows(G, big) == h, (n, h)


@pytest.fixture
def spy_rows(monkeypatch):
    """Every product looks for a zero tail; records what :func:`gradient_rows` found."""
    monkeypatch.setattr(fgcn, "ROWS_MIN_MACS", 0)
    found = []
    real = fgcn.gradient_rows

    def spy(G, macs):
        h = real(G, macs)
        found.append((h, G.size(0)))
        return h

    monkeypatch.setattr(fgcn, "gradient_rows", spy)
    return found


@pytest.mark.parametrize("scheme", [s.name for s in GCN_SCHEMES if not s.reuse])
@pytest.mark.parametrize("input_grad", [False, True])
def test_gcn_weight_gradient_on_live_rows_gradcheck(scheme, input_grad, spy_rows):
    """A loss on the first ``h`` rows only: the backward sees a zero tail."""
    ei, n = make_graph(n=14, q=40, seed=2)
    A = corgnn.Graph(ei, num_nodes=n).gcn_adjacency(dtype=F64, format="csr")
    s = parse_scheme(scheme)
    torch.manual_seed(0)
    x = torch.randn(n, 3, dtype=F64, requires_grad=input_grad)
    w, b = torch.randn(2, 3, dtype=F64, requires_grad=True), torch.randn(2, dtype=F64, requires_grad=True)
    f = lambda *t: gcn_conv(t[0] if input_grad else x, t[-2], t[-1], A, s)[:5]  # noqa: E731
    args = (x, w, b) if input_grad else (w, b)
    assert torch.autograd.gradcheck(f, args, fast_mode=FAST_GRADCHECK)
    assert any(h < rows for h, rows in spy_rows)
    assert torch.autograd.gradgradcheck(f, args, fast_mode=FAST_GRADCHECK)


@pytest.mark.parametrize("input_grad", [False, True])
def test_rows_linear_gradcheck_with_a_zero_tail(input_grad, spy_rows):
    torch.manual_seed(1)
    x = torch.randn(9, 4, dtype=F64, requires_grad=input_grad)
    w = torch.randn(3, 4, dtype=F64, requires_grad=True)
    f = lambda *t: fgcn.feature_transform(t[0] if input_grad else x, t[-1], None)[:4] * 2  # noqa: E731
    args = (x, w) if input_grad else (w,)
    assert torch.autograd.gradcheck(f, args, fast_mode=FAST_GRADCHECK)
    assert torch.autograd.gradgradcheck(f, args, fast_mode=FAST_GRADCHECK)
    assert any(h == 4 and rows == 9 for h, rows in spy_rows)


@pytest.mark.parametrize("layer", ["gcn", "sage", "graphconv"])
@pytest.mark.parametrize("scheme", ["auto", "propagate-first+split+cache", "transform-first+split", "transform-first+fused"])
def test_sampled_training_gradients_equal_pyg(layer, scheme, spy_rows):
    """Training as users train on sampled batches: cross-entropy on the seeds' rows.
    Every gradient equals PyG's (float64) and the first layer's weight gradients ran
    on the live rows only."""
    import torch_geometric.nn as pyg

    data = synthetic("Cora", seed=5, nodes=400, edges=3000, features=12)
    make = {"sage": pyg.SAGEConv, "graphconv": pyg.GraphConv, "gcn": pyg.GCNConv}[layer]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = make(12, 16), make(16, 5)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    ref = Net().double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    if scheme != "auto":
        for conv in (ours.conv1, ours.conv2):
            conv.scheme = scheme
    seeds = torch.tensor([3, 17, 250, 120, 8, 42, 77, 301])
    for seed in range(2):
        batch = sample_neighbors(data, seeds, [4, 4], np.random.default_rng(seed))
        x, y = batch.x.double(), torch.arange(seeds.numel()) % 5
        grads = []
        for model in (ref, ours):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x, batch.edge_index)[: seeds.numel()], y).backward()
            grads.append([p.grad for p in model.parameters()])
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert any(h < rows for h, rows in spy_rows)
