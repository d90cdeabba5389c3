"""PyG's own unit tests for GCNConv / GATConv, ported to check corgnn against PyG.

Adapted from pyg-team/pytorch_geometric ``test/nn/conv/test_gcn_conv.py`` and
``test/nn/conv/test_gat_conv.py``. Where PyG's tests only check shapes or
self-consistency, these tests also compare every output (and, where noted,
attention weights and gradients) with the reference PyG layer holding the same
parameters.

Each test runs for two implementations:

* ``"corgnn"``: ``corgnn.nn.GCNConv`` / ``corgnn.nn.GATConv`` constructed directly
  with the same arguments, parameters loaded from the reference PyG layer's
  ``state_dict``;
* ``"optimize"``: a copy of the reference PyG layer converted by ``corgnn.optimize``
  (bare layer -> replacement, and a layer inside a wrapper module).
"""

from __future__ import annotations

import copy
import importlib.util
import warnings

import pytest
import torch
from torch.testing import assert_close

import corgnn
import corgnn.nn as cnn
import torch_geometric.nn as pnn
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor

IMPLS = ["corgnn", "optimize"]
HAS_TORCH_SPARSE = importlib.util.find_spec("torch_sparse") is not None
HAS_PYG_LIB = importlib.util.find_spec("pyg_lib") is not None
PYG_GAT_HAS_NORMALIZE = "normalize" in pnn.GATConv.__init__.__code__.co_varnames

needs_torch_sparse = pytest.mark.skipif(not HAS_TORCH_SPARSE, reason="torch_sparse is not installed (SparseTensor inputs)")
SKIP_JIT = "torch.jit.script of PyG's jittable layers is not ported (TorchScript is out of corgnn's scope)"
SKIP_REPR = "repr/str of the layer is cosmetic and not compared"
SKIP_GAT_NORMALIZE = (
    f"installed torch_geometric {__import__('torch_geometric').__version__} GATConv has no `normalize` "
    "argument (nor gat_norm), so PyG's GAT-normalization tests have no reference here"
)

TOL = dict(atol=1e-5, rtol=1e-5)


class _Wrap(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, *args, **kwargs):
        return self.conv(*args, **kwargs)


def make_pair(kind: str, impl: str, *args, seed: int = 12345, wrapped: bool = False, **kwargs):
    """``(reference PyG layer, layer under test)`` with identical parameters."""
    pyg_cls, cor_cls = {"gcn": (pnn.GCNConv, cnn.GCNConv), "gat": (pnn.GATConv, cnn.GATConv)}[kind]
    torch.manual_seed(seed)
    ref = pyg_cls(*args, **kwargs)
    if impl == "corgnn":
        layer = cor_cls(*args, **kwargs)
        missing, unexpected = layer.load_state_dict(ref.state_dict(), strict=True)
        assert not missing and not unexpected
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # optimize must not leave the layer unconverted
            if wrapped:
                layer = corgnn.optimize(_Wrap(copy.deepcopy(ref))).conv
            else:
                layer = corgnn.optimize(copy.deepcopy(ref))
    assert isinstance(layer, cor_cls), type(layer)
    for (n1, p1), (n2, p2) in zip(sorted(ref.state_dict().items()), sorted(layer.state_dict().items())):
        assert n1 == n2
        assert_close(p1, p2, atol=0, rtol=0)
    return ref, layer


def param_grads(module) -> dict:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def check_same_grads(ref, layer, out_ref, out, inputs_ref=(), inputs=()):
    """Backprop the same random cotangent through both and compare gradients of the
    parameters and of the given input tensors."""
    g = torch.randn_like(out_ref)
    ref.zero_grad(set_to_none=True)
    layer.zero_grad(set_to_none=True)
    tensors_ref = [t for t in inputs_ref if t is not None]
    tensors = [t for t in inputs if t is not None]
    gr = torch.autograd.grad(out_ref, list(ref.parameters()) + tensors_ref, g, allow_unused=True)
    gc = torch.autograd.grad(out, list(layer.parameters()) + tensors, g, allow_unused=True)
    names = [n for n, _ in ref.named_parameters()] + [f"input{i}" for i in range(len(tensors_ref))]
    for name, a, b in zip(names, gr, gc):
        if a is None:
            assert b is None or torch.count_nonzero(b) == 0, name
        else:
            assert b is not None, f"no gradient for {name}"
            assert_close(b, a, **TOL, msg=lambda m, name=name: f"grad of {name}: {m}")


# --------------------------------------------------------------------------- GCN


def _gcn_graph():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])
    value = torch.rand(edge_index.size(1))
    return x, edge_index, value


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv(impl):
    x, edge_index, value = _gcn_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    adj2 = to_torch_csc_tensor(edge_index, value, size=(4, 4))
    ref, conv = make_pair("gcn", impl, 16, 32)

    out1 = conv(x, edge_index)
    assert out1.size() == (4, 32)
    assert_close(out1, ref(x, edge_index), **TOL)
    assert_close(conv(x, adj1.t()), out1, **TOL)
    assert_close(conv(x, adj1.t()), ref(x, adj1.t()), **TOL)

    out2 = conv(x, edge_index, value)
    assert out2.size() == (4, 32)
    assert_close(out2, ref(x, edge_index, value), **TOL)
    assert_close(conv(x, adj2.t()), out2, **TOL)
    assert_close(conv(x, adj2.t()), ref(x, adj2.t()), **TOL)
    assert not torch.allclose(out1, out2)  # the weights matter

    # (not in PyG's test) same gradients for x and the parameters
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    check_same_grads(ref, conv, ref(xr, edge_index, value), conv(xc, edge_index, value), [xr], [xc])


@needs_torch_sparse
@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_sparse_tensor(impl):  # PyG's SparseTensor part of test_gcn_conv
    from torch_sparse import SparseTensor

    x, edge_index, value = _gcn_graph()
    ref, conv = make_pair("gcn", impl, 16, 32)
    adj3 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
    adj4 = SparseTensor.from_edge_index(edge_index, value, (4, 4))
    assert_close(conv(x, adj3.t()), ref(x, edge_index), **TOL)
    assert_close(conv(x, adj4.t()), ref(x, edge_index, value), **TOL)


@pytest.mark.skip(reason=SKIP_JIT)
def test_gcn_conv_jit():
    pass


@pytest.mark.skip(reason=SKIP_REPR)
def test_gcn_conv_repr():
    pass


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("set_after_init", [False, True])
def test_gcn_conv_cached(impl, set_after_init):
    # PyG sets ``conv.cached = True`` on a built layer; also test ``cached=True`` at init.
    x, edge_index, _ = _gcn_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    ref, conv = make_pair("gcn", impl, 16, 32, cached=not set_after_init)
    expected = ref(x, edge_index)
    out1 = conv(x, edge_index)
    assert_close(out1, expected, **TOL)
    if set_after_init:
        ref.cached = conv.cached = True
    # (PyG checks its private ``_cached_edge_index``; corgnn has its own cache)
    conv(x, edge_index)
    assert_close(conv(x, edge_index), out1, **TOL)
    assert_close(conv(x, adj1.t()), out1, **TOL)
    x2 = torch.randn(4, 16)
    assert_close(conv(x2, edge_index), ref(x2, edge_index), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_with_decomposed_layers(impl):
    x, edge_index, _ = _gcn_graph()
    ref, conv = make_pair("gcn", impl, 16, 32)
    out1 = ref(x, edge_index)
    # as PyG's test: a deep copy with ``decomposed_layers`` set afterwards
    decomposed = copy.deepcopy(conv)
    decomposed.decomposed_layers = 2
    assert_close(decomposed(x, edge_index), out1, **TOL)
    # and the constructor / optimize path with decomposed_layers=2
    ref2, conv2 = make_pair("gcn", impl, 16, 32, decomposed_layers=2)
    assert_close(conv2(x, edge_index), ref2(x, edge_index), **TOL)
    assert_close(conv2(x, edge_index), out1, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_with_sparse_input_feature(impl):
    x = torch.sparse_coo_tensor(
        indices=torch.tensor([[0, 0], [0, 1]]), values=torch.tensor([1.0, 1.0]), size=torch.Size([4, 16]),
    )
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])
    ref, conv = make_pair("gcn", impl, 16, 32)
    out = conv(x, edge_index)
    assert out.size() == (4, 32)
    assert_close(out, ref(x, edge_index), **TOL)
    assert_close(out, ref(x.to_dense(), edge_index), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_static_gcn_conv(impl):
    torch.manual_seed(1)
    x = torch.randn(3, 4, 16)  # a batch of 3 feature matrices on one static graph
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])
    ref, conv = make_pair("gcn", impl, 16, 32)
    out = conv(x, edge_index)
    assert out.size() == (3, 4, 32)
    assert_close(out, ref(x, edge_index), **TOL)
    # (not in PyG's test) gradients, and a per-element check, with edge weights
    ew = torch.rand(edge_index.size(1))
    a, c = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(a, edge_index, ew), conv(c, edge_index, ew)
    assert_close(out, out_ref, **TOL)
    check_same_grads(ref, conv, out_ref, out, [a], [c])
    with torch.no_grad():
        assert_close(conv(x, edge_index)[1], conv(x[1], edge_index), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_norm(impl):
    # PyG: flow="target_to_source" with flipped edges gives the same output.
    x, _, _ = _gcn_graph()
    edge_index = torch.tensor([[0, 0, 0], [1, 2, 3]])
    ref, conv = make_pair("gcn", impl, 16, 32, flow="source_to_target")
    out1 = conv(x, edge_index)
    assert_close(out1, ref(x, edge_index), **TOL)
    ref.flow = "target_to_source"
    expected = ref(x, edge_index.flip(0))
    assert_close(expected, out1, **TOL)  # PyG's own claim
    # corgnn honours target_to_source given at construction (and optimize converts such a PyG layer).
    ref2, conv2 = make_pair("gcn", impl, 16, 32, flow="target_to_source")
    assert conv2.flow == "target_to_source"
    assert_close(conv2(x, edge_index.flip(0)), expected, **TOL)
    assert_close(conv2(x, edge_index.flip(0)), ref2(x, edge_index.flip(0)), **TOL)
    # a sparse adjacency cannot carry that flow (PyG refuses it too): a clear error
    with pytest.raises(ValueError, match="flow"):
        conv2(x, to_torch_coo_tensor(edge_index))


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_norm_flow_set_after_init(impl):
    # PyG's test switches ``conv.flow`` on a built layer; corgnn must then either
    # compute target_to_source or refuse, not silently keep source_to_target.
    x, _, _ = _gcn_graph()
    edge_index = torch.tensor([[0, 0, 0], [1, 2, 3]])
    ref, conv = make_pair("gcn", impl, 16, 32)
    out1 = ref(x, edge_index)
    conv.flow = "target_to_source"
    out2 = conv(x, edge_index.flip(0))
    assert_close(out2, out1, **TOL)
    ref.flow = "target_to_source"
    assert_close(out2, ref(x, edge_index.flip(0)), **TOL)
    conv.flow = "source_to_target"
    assert_close(conv(x, edge_index), out1, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "requires_grad,layout",
    [
        (False, torch.sparse_coo),
        (True, torch.sparse_coo),
        (False, torch.sparse_csr),
        (True, torch.sparse_csr),
    ],
    ids=["coo-nograd", "coo-grad", "csr-nograd", "csr-grad"],
)
def test_gcn_norm_gradient(impl, requires_grad, layout):
    # PyG checks that gcn_norm of a sparse adjacency passes on ``requires_grad`` of
    # its values. Here: the layer's output and gradient w.r.t. the adjacency values
    # match PyG's (for the same edges given as edge_index + edge_weight, and for CSR
    # also PyG's layer on the sparse input itself).
    x, edge_index, _ = _gcn_graph()
    ref, conv = make_pair("gcn", impl, 16, 32)
    ew = torch.ones(edge_index.size(1), requires_grad=requires_grad)
    adj = to_torch_coo_tensor(edge_index, ew)  # used as adj_t: row = target
    if layout == torch.sparse_csr:
        adj = adj.to_sparse_csr()
    ew_ref = torch.ones(edge_index.size(1), requires_grad=requires_grad)
    expected = ref(x, edge_index.flip(0), ew_ref)
    out = conv(x, adj)
    assert_close(out, expected, **TOL)
    with torch.no_grad():  # (a copy: PyG's layer marks a COO adj coalesced in place, bumping its version)
        assert_close(out, ref(x, adj.detach().clone()), **TOL)
    if requires_grad:
        g = torch.randn_like(out)
        expected.backward(g)
        out.backward(g)
        assert ew.grad is not None, "no gradient reached the sparse adjacency's values"
        assert_close(ew.grad, ew_ref.grad, **TOL)
        if layout == torch.sparse_coo:
            # (PyG's layer fails in backward here: 'derivative for aten::_coalesced_ is not
            # implemented'.) Under no_grad, then with grad on the same adjacency: still a gradient.
            ew.grad = None
            adj2 = to_torch_coo_tensor(edge_index, ew)
            with torch.no_grad():
                conv(x, adj2)
            conv(x, adj2).backward(g)
            assert_close(ew.grad, ew_ref.grad, **TOL)
            # an uncoalesced COO tensor cannot give its values' gradient in stored order: a clear error
            ew3 = torch.ones(edge_index.size(1), requires_grad=True)
            raw = torch.sparse_coo_tensor(edge_index.flip(0), ew3, (x.size(0), x.size(0)))
            assert not raw.is_coalesced()
            with pytest.raises(ValueError, match="coalesce"):
                conv(x, raw)
        if layout == torch.sparse_csr:  # PyG's layer itself differentiates CSR values
            ew2 = torch.ones(edge_index.size(1), requires_grad=True)
            ref(x, to_torch_coo_tensor(edge_index, ew2).to_sparse_csr()).backward(g)
            assert_close(ew.grad, ew2.grad, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(improved=True),
        dict(add_self_loops=False),
        dict(normalize=False),
        dict(normalize=False, add_self_loops=False),
        dict(bias=False),
        dict(improved=True, bias=False),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_gcn_conv_variants(impl, kwargs):
    x, edge_index, value = _gcn_graph()
    edge_index = torch.cat([edge_index, torch.tensor([[1], [1]])], 1)  # one existing self-loop
    value = torch.cat([value, torch.tensor([0.5])])
    adj = to_torch_csc_tensor(edge_index, value, size=(4, 4))
    ref, conv = make_pair("gcn", impl, 16, 8, **kwargs)
    for ew in (None, value):
        out = conv(x, edge_index, ew)
        assert_close(out, ref(x, edge_index, ew), **TOL)
    assert_close(conv(x, adj.t()), ref(x, adj.t()), **TOL)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    wr, wc = value.clone().requires_grad_(), value.clone().requires_grad_()
    check_same_grads(ref, conv, ref(xr, edge_index, wr), conv(xc, edge_index, wc), [xr, wr], [xc, wc])


@pytest.mark.parametrize("impl", IMPLS)
def test_gcn_conv_optimize_wrapped(impl):
    x, edge_index, value = _gcn_graph()
    ref, conv = make_pair("gcn", impl, 16, 32, wrapped=True)
    assert_close(conv(x, edge_index, value), ref(x, edge_index, value), **TOL)


# --------------------------------------------------------------------------- GAT


def _gat_graph():
    torch.manual_seed(0)
    x1 = torch.randn(4, 8)
    x2 = torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    return x1, x2, edge_index


def _sparse_equal(a, b):
    assert a.size() == b.size()
    assert_close(a.to_dense(), b.to_dense(), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv(impl, residual):
    x1, _, edge_index = _gat_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    ref, conv = make_pair("gat", impl, 8, 32, heads=2, residual=residual)

    out = conv(x1, edge_index)
    assert out.size() == (4, 64)
    assert_close(out, ref(x1, edge_index), **TOL)
    assert_close(conv(x1, edge_index, size=(4, 4)), out, **TOL)
    assert_close(conv(x1, adj1.t()), out, **TOL)
    assert_close(conv(x1, adj1.t()), ref(x1, adj1.t()), **TOL)

    # (not in PyG's test) same gradients
    xr, xc = x1.clone().requires_grad_(), x1.clone().requires_grad_()
    check_same_grads(ref, conv, ref(xr, edge_index), conv(xc, edge_index), [xr], [xc])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_return_attention_weights(impl, residual):
    x1, _, edge_index = _gat_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))
    ref, conv = make_pair("gat", impl, 8, 32, heads=2, residual=residual)
    out = ref(x1, edge_index)

    result = conv(x1, edge_index, return_attention_weights=True)
    expected = ref(x1, edge_index, return_attention_weights=True)
    assert_close(result[0], out, **TOL)
    assert result[1][0].size() == (2, 7)
    assert result[1][1].size() == (7, 2)
    assert result[1][1].min() >= 0 and result[1][1].max() <= 1
    assert torch.equal(result[1][0], expected[1][0])
    assert_close(result[1][1], expected[1][1], **TOL)

    # torch.sparse adjacency: the attention weights come back as a sparse (4, 4, 2) tensor
    result = conv(x1, adj1.t(), return_attention_weights=True)
    expected = ref(x1, adj1.t(), return_attention_weights=True)
    assert_close(result[0], out, **TOL)
    assert result[1][0].size() == torch.Size([4, 4, 2])
    assert result[1][0]._nnz() == 7
    assert result[1][0].layout == expected[1][0].layout
    _sparse_equal(result[1][0], expected[1][0])

    # attention weights are differentiable, as in PyG
    xr, xc = x1.clone().requires_grad_(), x1.clone().requires_grad_()
    ar = ref(xr, edge_index, return_attention_weights=True)[1][1]
    ac = conv(xc, edge_index, return_attention_weights=True)[1][1]
    check_same_grads(ref, conv, ar, ac, [xr], [xc])


@needs_torch_sparse
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_sparse_tensor(impl, residual):  # PyG's SparseTensor parts of test_gat_conv
    from torch_sparse import SparseTensor

    x1, x2, edge_index = _gat_graph()
    ref, conv = make_pair("gat", impl, 8, 32, heads=2, residual=residual)
    adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
    assert_close(conv(x1, adj2.t()), ref(x1, edge_index), **TOL)
    result = conv(x1, adj2.t(), return_attention_weights=True)
    assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 7
    ref, conv = make_pair("gat", impl, (8, 16), 32, heads=2, residual=residual)
    adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
    assert_close(conv((x1, x2), adj2.t()), ref((x1, x2), edge_index), **TOL)
    assert_close(conv((x1, None), adj2.t()), ref((x1, None), edge_index, size=(4, 2)), **TOL)


@pytest.mark.skip(reason=SKIP_JIT)
def test_gat_conv_jit():
    pass


@pytest.mark.skip(reason=SKIP_REPR)
def test_gat_conv_repr():
    pass


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_bipartite(impl, residual):
    x1, x2, edge_index = _gat_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))
    ref, conv = make_pair("gat", impl, (8, 16), 32, heads=2, residual=residual)

    out1 = conv((x1, x2), edge_index)
    assert out1.size() == (2, 64)
    assert_close(out1, ref((x1, x2), edge_index), **TOL)
    assert_close(conv((x1, x2), edge_index, size=(4, 2)), out1, **TOL)
    assert_close(conv((x1, x2), adj1.t()), out1, **TOL)
    assert_close(conv((x1, x2), adj1.t()), ref((x1, x2), adj1.t()), **TOL)

    out2 = conv((x1, None), edge_index, size=(4, 2))
    assert out2.size() == (2, 64)
    assert_close(out2, ref((x1, None), edge_index, size=(4, 2)), **TOL)

    # (not in PyG's test) attention weights and gradients on the bipartite graph
    res = conv((x1, x2), edge_index, return_attention_weights=True)
    exp = ref((x1, x2), edge_index, return_attention_weights=True)
    assert torch.equal(res[1][0], exp[1][0])
    assert_close(res[1][1], exp[1][1], **TOL)
    a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    c, d = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    check_same_grads(ref, conv, ref((a, b), edge_index), conv((c, d), edge_index), [a, b], [c, d])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_bipartite_no_x_dst_sparse_adj(impl, residual):
    x1, _, edge_index = _gat_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))
    ref, conv = make_pair("gat", impl, (8, 16), 32, heads=2, residual=residual)
    expected = ref((x1, None), edge_index, size=(4, 2))
    assert_close(ref((x1, None), adj1.t()), expected, **TOL)  # PyG's own claim
    assert_close(conv((x1, None), adj1.t()), expected, **TOL)
    res = conv((x1, None), adj1.t(), return_attention_weights=True)
    exp = ref((x1, None), adj1.t(), return_attention_weights=True)
    assert_close(res[0], expected, **TOL)
    _sparse_equal(res[1][0], exp[1][0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_bipartite_no_x_dst_sparse_adj_with_size(impl, residual):
    # the same with size=(4, 2) given explicitly
    x1, _, edge_index = _gat_graph()
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))
    ref, conv = make_pair("gat", impl, (8, 16), 32, heads=2, residual=residual)
    expected = ref((x1, None), edge_index, size=(4, 2))
    assert_close(conv((x1, None), adj1.t(), size=(4, 2)), expected, **TOL)
    res = conv((x1, None), adj1.t(), size=(4, 2), return_attention_weights=True)
    exp = ref((x1, None), adj1.t(), size=(4, 2), return_attention_weights=True)
    assert_close(res[0], expected, **TOL)
    _sparse_equal(res[1][0], exp[1][0])


@pytest.mark.skipif(not PYG_GAT_HAS_NORMALIZE, reason=SKIP_GAT_NORMALIZE)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_conv_normalize(impl, residual):
    x1, _, edge_index = _gat_graph()
    ref, conv = make_pair("gat", impl, 8, 32, heads=2, residual=residual, normalize=True)
    assert_close(conv(x1, edge_index), ref(x1, edge_index), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "edge_dim,fill_value", [(1, 0.5), (1, "mean"), (4, 0.5), (4, "mean")],
)
def test_gat_conv_with_edge_attr(impl, edge_dim, fill_value):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
    edge_weight = torch.randn(edge_index.size(1))
    edge_attr = torch.randn(edge_index.size(1), 4)
    attr = edge_weight if edge_dim == 1 else edge_attr

    ref, conv = make_pair("gat", impl, 8, 32, heads=2, edge_dim=edge_dim, fill_value=fill_value)
    out = conv(x, edge_index, attr)
    assert out.size() == (4, 64)
    assert_close(out, ref(x, edge_index, attr), **TOL)
    res = conv(x, edge_index, attr, return_attention_weights=True)
    exp = ref(x, edge_index, attr, return_attention_weights=True)
    assert torch.equal(res[1][0], exp[1][0])
    assert_close(res[1][1], exp[1][1], **TOL)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ar, ac = attr.clone().requires_grad_(), attr.clone().requires_grad_()
    check_same_grads(ref, conv, ref(xr, edge_index, ar), conv(xc, edge_index, ac), [xr, ar], [xc, ac])


@needs_torch_sparse
@pytest.mark.parametrize("impl", IMPLS)
def test_gat_conv_with_edge_attr_sparse_tensor(impl):
    from torch_sparse import SparseTensor

    x = torch.randn(4, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
    edge_weight = torch.randn(edge_index.size(1))
    _, conv = make_pair("gat", impl, 8, 32, heads=2, edge_dim=1, fill_value=0.5)
    adj1 = SparseTensor.from_edge_index(edge_index, edge_weight, (4, 4))
    with pytest.raises((NotImplementedError, ValueError)):
        conv(x, adj1.t())


@pytest.mark.parametrize("impl", IMPLS)
def test_gat_conv_empty_edge_index(impl):
    x = torch.randn(0, 8)
    edge_index = torch.empty(2, 0, dtype=torch.long)
    ref, conv = make_pair("gat", impl, 8, 32, heads=2)
    out = conv(x, edge_index)
    assert out.size() == (0, 64)
    assert out.size() == ref(x, edge_index).size()


@pytest.mark.skipif(not PYG_GAT_HAS_NORMALIZE, reason=SKIP_GAT_NORMALIZE)
def test_gat_conv_csc_error():
    pass


@pytest.mark.skipif(not PYG_GAT_HAS_NORMALIZE, reason=SKIP_GAT_NORMALIZE)
def test_gat_norm_csc_error():
    pass


@pytest.mark.skipif(not PYG_GAT_HAS_NORMALIZE, reason=SKIP_GAT_NORMALIZE)
def test_gat_conv_bipartite_normalize_error():
    pass


@needs_torch_sparse
def test_remove_diag_sparse_tensor():
    # PyG's test of torch_sparse.remove_diag (used by GAT normalization); no corgnn code
    # is involved, kept for completeness of the port.
    import torch_sparse
    from torch_sparse import SparseTensor

    adj1 = SparseTensor.from_edge_index(torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]]), sparse_sizes=(4, 4))
    adj2 = SparseTensor.from_edge_index(torch.tensor([[1, 2, 3], [0, 1, 1]]), sparse_sizes=(4, 4))
    assert torch_sparse.remove_diag(adj1.t()) == adj2.t()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(heads=3, concat=False),
        dict(heads=2, add_self_loops=False),
        dict(heads=2, bias=False),
        dict(heads=1, negative_slope=0.5),
        dict(heads=2, concat=False, residual=True),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_gat_conv_variants(impl, kwargs):
    x1, _, _ = _gat_graph()
    edge_index = torch.tensor([[0, 1, 2, 3, 2, 1], [0, 0, 1, 1, 3, 2]])  # incl. a self-loop, node 3 <- 2
    adj = to_torch_csc_tensor(edge_index, size=(4, 4))
    ref, conv = make_pair("gat", impl, 8, 4, **kwargs)
    assert_close(conv(x1, edge_index), ref(x1, edge_index), **TOL)
    assert_close(conv(x1, adj.t()), ref(x1, adj.t()), **TOL)
    res = conv(x1, edge_index, return_attention_weights=True)
    exp = ref(x1, edge_index, return_attention_weights=True)
    assert torch.equal(res[1][0], exp[1][0])
    assert_close(res[1][1], exp[1][1], **TOL)
    xr, xc = x1.clone().requires_grad_(), x1.clone().requires_grad_()
    check_same_grads(ref, conv, ref(xr, edge_index), conv(xc, edge_index), [xr], [xc])


@pytest.mark.parametrize("impl", IMPLS)
def test_gat_conv_optimize_wrapped(impl):
    x1, _, edge_index = _gat_graph()
    ref, conv = make_pair("gat", impl, 8, 32, heads=2, wrapped=True)
    assert_close(conv(x1, edge_index), ref(x1, edge_index), **TOL)
