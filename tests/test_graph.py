import pytest
import torch
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from corgnn import Graph
from conftest import make_graph


def dense_gcn_norm(ei, ew, n, **kw):
    ei2, w2 = gcn_norm(ei, ew, n, **kw)
    d = torch.zeros(n, n, dtype=w2.dtype)
    d.index_put_((ei2[1], ei2[0]), w2, accumulate=True)
    return d


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("improved", [False, True])
def test_gcn_adjacency_matches_pyg_gcn_norm(weighted, improved):
    ei, n = make_graph()
    ew = torch.rand(ei.size(1), dtype=torch.float64) if weighted else None
    A = Graph(ei, ew, n).gcn_adjacency(dtype=torch.float64, improved=improved)
    ref = dense_gcn_norm(ei, ew, n, improved=improved, dtype=torch.float64)
    torch.testing.assert_close(A.to_dense(), ref, rtol=0, atol=1e-14)
    # isolated nodes only have the self-loop
    assert A.to_dense()[n - 1, n - 1].item() == pytest.approx(1.0)


def test_transpose_dual_is_transpose():
    ei, n = make_graph()
    A = Graph(ei, num_nodes=n).gcn_adjacency(dtype=torch.float64)
    dense = A.to_dense()
    csc = A.to_csc()
    torch.testing.assert_close(csc.to_dense(), dense)
    torch.testing.assert_close(A.t().to_dense(), dense.t())
    # the CSR->CSC permutation reads CSR-ordered values in CSC order
    torch.testing.assert_close(A.val[csc.perm], csc.val)


def test_adjacency_built_once():
    ei, n = make_graph()
    g = Graph(ei, num_nodes=n)
    assert g.gcn_adjacency() is g.gcn_adjacency()
    assert g.gcn_adjacency(dtype=torch.float64) is not g.gcn_adjacency()


def test_gat_adjacency_pattern():
    ei, n = make_graph()
    A = Graph(ei, num_nodes=n).gat_adjacency()
    non_loops = int((ei[0] != ei[1]).sum())
    assert A.nnz == non_loops + n  # duplicates kept, one loop per node
    assert A.val is None
    row = A.row()
    assert int((row == A.col).sum()) == n


@pytest.mark.parametrize(
    "edge_index, kwargs, exc, match",
    [
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), {}, TypeError, "integer dtype"),
        (torch.tensor([0, 1, 2]), {}, ValueError, "shape"),
        (torch.tensor([[0, 1], [1, -1]]), {}, ValueError, "negative"),
        (torch.tensor([[0, 1], [1, 5]]), {"num_nodes": 3}, ValueError, "num_nodes=3"),
        ([[0, 1], [1, 0]], {}, TypeError, "torch.Tensor"),
    ],
)
def test_bad_edge_index(edge_index, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Graph(edge_index, **kwargs)


def test_bad_edge_weight():
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="edge_weight"):
        Graph(ei, torch.ones(3))
    with pytest.raises(TypeError, match="edge_weight"):
        Graph(ei, torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match="edge_weight contains 1 NaN"):
        Graph(ei, torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="edge_weight contains 1 NaN/Inf"):
        Graph(ei, torch.tensor([1.0, float("inf")]))


def test_empty_graph():
    g = Graph(torch.empty(2, 0, dtype=torch.long), num_nodes=4)
    A = g.gcn_adjacency()
    assert A.nnz == 4  # self-loops only
    torch.testing.assert_close(A.to_dense(), torch.eye(4))
