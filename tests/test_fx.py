"""optimize()'s input-dropout rewrite (corgnn.fx), the feature-conversion plan and
the fused dense-to-CSR conversion."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv as PygGATConv
from torch_geometric.nn import GCNConv as PygGCNConv

import corgnn
from corgnn.cost import plan_feature_conversion
from corgnn.fx import InputDropout, rewrite_input_dropout
from corgnn.nn.base import FeatureCache, dense_to_csr

from conftest import make_graph


def sparse_x(n=40, m=60, density=0.03, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, m, generator=g, dtype=dtype) + 0.5
    return x * (torch.rand(n, m, generator=g, dtype=dtype) < density)


class ExampleGCN(torch.nn.Module):
    """PyG examples/gcn.py's model shape (input dropout, conv, relu, dropout, conv)."""

    def __init__(self, m, h, c, p=0.5):
        super().__init__()
        self.p = p
        self.conv1, self.conv2 = PygGCNConv(m, h), PygGCNConv(h, c)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=self.p, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index, edge_weight)


class ExampleGAT(torch.nn.Module):
    def __init__(self, m, c):
        super().__init__()
        self.drop = torch.nn.Dropout(0.6)
        self.conv1 = PygGATConv(m, 4, heads=2)
        self.conv2 = PygGATConv(8, c, heads=1, concat=False)

    def forward(self, x, edge_index):
        x = F.elu(self.conv1(self.drop(x), edge_index))
        return self.conv2(F.dropout(x, 0.6, self.training), edge_index)


class Untraceable(ExampleGCN):
    def forward(self, x, edge_index, edge_weight=None):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def pair(cls, *args):
    torch.manual_seed(0)
    ref = cls(*args).double()
    ours = corgnn.optimize(copy.deepcopy(ref))
    return ref, ours


@pytest.mark.parametrize("cls", [ExampleGCN, ExampleGAT])
def test_rewrite_keeps_module_and_eval_output(cls):
    ei, n = make_graph()
    x = sparse_x(n)
    ref, ours = pair(cls, 60, 8, 3) if cls is ExampleGCN else pair(cls, 60, 3)
    assert type(ours) is cls and "forward" in vars(ours)
    assert list(ours.state_dict()) == list(ref.state_dict())
    (site,) = ours._corgnn_input_dropout.values()
    assert site.sparse_out and site.p == (0.5 if cls is ExampleGCN else 0.6)
    ref.eval(), ours.eval()
    torch.testing.assert_close(ours(x, ei), ref(x, ei))
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert clone.forward.module is clone
        torch.testing.assert_close(clone(x, ei), ref(x, ei))
        clone.train()
        assert clone(x, ei).shape == (n, 3)


def test_rewrite_opt_out_and_untraceable():
    ref, _ = pair(ExampleGCN, 60, 8, 3)
    off = corgnn.optimize(copy.deepcopy(ref), sparse_input_dropout=False)
    assert "forward" not in vars(off) and not hasattr(off, "_corgnn_input_dropout")
    torch.manual_seed(0)
    bad = Untraceable(60, 8, 3)
    with pytest.warns(UserWarning, match="cannot trace Untraceable"):
        corgnn.optimize(bad)
    assert "forward" not in vars(bad)
    with pytest.raises(TypeError, match="module must be"):
        rewrite_input_dropout("not a module")


def test_rewrite_leaves_other_dropouts():
    """A dropout on a computed value, in place, or with p=0 is not rewritten; a
    dropout whose result also feeds a non-corgnn op returns dense values."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = PygGCNConv(60, 4)

        def forward(self, x, edge_index):
            y = F.dropout(x * 2, 0.5, self.training)  # not an input
            z = F.dropout(x, 0.0, self.training)  # inactive
            w = F.dropout(x, 0.5, self.training)  # also feeds a sum
            return self.conv(w, edge_index) + y.sum() + z.sum() + w.sum()

    m = corgnn.optimize(M())
    (site,) = m._corgnn_input_dropout.values()
    assert not site.sparse_out


def test_input_dropout_distribution():
    """Same distribution as F.dropout: zeros stay zero, kept values scaled by
    1/(1-p), each non-zero kept with probability 1-p, mean x over many draws."""
    x = sparse_x(30, 40, density=0.05, dtype=torch.float32)
    p, draws = 0.6, 4000
    site = InputDropout(p, sparse_out=False)
    torch.manual_seed(1)
    out = torch.stack([site(x) for _ in range(draws)])
    nz = x != 0
    assert (out[:, ~nz] == 0).all()
    kept = out[:, nz] != 0
    torch.testing.assert_close(out[:, nz][kept], (x[nz] / (1 - p)).expand(draws, -1)[kept])
    assert abs(kept.double().mean().item() - (1 - p)) < 0.01
    se = (x[nz] * ((p / (1 - p)) ** 0.5) / draws**0.5).max()
    assert (out.mean(0) - x).abs().max() < 5 * se
    sparse = InputDropout(p, sparse_out=True)(x)  # the CSR the first corgnn layer takes
    assert sparse.nnz == int(nz.sum())
    ratio = sparse.to_dense()[nz] / x[nz]
    assert ((ratio == 0) | ((ratio - 1 / (1 - p)).abs() < 1e-5)).all()
    with pytest.raises(ValueError, match="p must be in"):
        InputDropout(1.0, True)
    dense = torch.rand(8, 5) + 0.1  # not mostly zeros: torch's own dropout
    assert (InputDropout(0.5, True)(dense) == 0).any()


def test_rewrite_gradients_match_pyg_for_the_same_masks():
    """With the same dropped input and hidden mask (same seed, the site draws first),
    the rewritten model gives PyG's output and every parameter gradient."""
    ei, n = make_graph()
    x = sparse_x(n)
    ref, ours = pair(ExampleGCN, 60, 8, 3)
    (site,) = ours._corgnn_input_dropout.values()
    ours.train()
    torch.manual_seed(5)
    out = ours(x, ei)
    torch.manual_seed(5)
    xd = site(x).to_dense()  # same draws over the non-zeros, then the same hidden mask
    h = F.dropout(ref.conv1(xd, ei).relu(), 0.5, True)
    expect = ref.conv2(h, ei)
    torch.testing.assert_close(out, expect)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, list(ours.parameters()), g)
    want = torch.autograd.grad(expect, list(ref.parameters()), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_dense_to_csr_matches_torch(dtype):
    x = sparse_x(50, 33, density=0.1, dtype=torch.float64).to(dtype)
    x[7] = 0  # an empty row
    x[3, 5] = -2.0  # a negative value
    ref = x.to_sparse_csr()
    csr = dense_to_csr(x)
    assert torch.equal(csr.rowptr, ref.crow_indices()) and torch.equal(csr.col, ref.col_indices())
    assert torch.equal(csr.val, ref.values()) and csr.val.dtype == dtype
    empty = dense_to_csr(torch.zeros(4, 3, dtype=dtype))
    assert empty.nnz == 0 and empty.rowptr.tolist() == [0] * 5


def test_feature_conversion_plan():
    # Cora's first GCN layer: reused features always pay; so does one use here
    reused = plan_feature_conversion(2708, 1433, 49216, 16, training=True)
    once = plan_feature_conversion(2708, 1433, 49216, 16, training=True, uses=1)
    assert reused.convert and once.convert and once.conversion_s > 0
    # a width-1 inference layer: one use saves less than the two reads cost
    thin = plan_feature_conversion(2708, 1433, 49216, 1, training=False, uses=1)
    assert not thin.convert and thin.dense_s - thin.sparse_s < thin.conversion_s
    assert plan_feature_conversion(2708, 1433, 49216, 1, training=False).convert  # reused: amortised
    assert "conversion" in once.line()
    for bad in (dict(nnz=-1), dict(nnz=10**9), dict(uses=0)):
        kw = {**dict(n=10, m=10, nnz=5, k=4, training=True), **bad}
        with pytest.raises(ValueError):
            plan_feature_conversion(**kw)


def test_feature_cache_skips_once_seen_tensors_when_conversion_loses():
    x = sparse_x(40, 60, dtype=torch.float32)
    cache = FeatureCache()
    assert cache(x, 40, 60, 1, False) is not None  # first tensor: counted as reused
    assert cache(x, 40, 60, 1, False) is not None  # (a second call: reused indeed)
    fresh = [x.clone() for _ in range(3)]
    assert cache(fresh[0], 40, 60, 1, False) is not None  # the previous one was reused
    kept = cache(x, 40, 60, 1, False)  # x alternates with new tensors: kept, not converted again
    assert cache(fresh[1], 40, 60, 1, False) is None  # previous new one seen once, width 1: stays dense
    assert cache.last_conversion is not None and not cache.last_conversion.convert
    assert cache(x, 40, 60, 1, False) is kept
    assert cache(fresh[2], 40, 60, 64, True) is not None  # a wide training layer: worth it
    with pytest.raises(ValueError, match="NaN"):
        cache(torch.full((40, 60), float("nan")), 40, 60, 1, False)
