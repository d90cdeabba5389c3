"""Software prefetching in the Numba gather kernels (issue 12, lever 3).

Each gather kernel is compiled twice from one source (plain and prefetching); a call
picks by the gathered operand's size. Prefetches are hints: the prefetching
compilation must give bit-identical results. Test graphs are tiny, so the tests lower
the size threshold to force the prefetching compilation everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corgnn.graph import Graph
from corgnn.nn import GAT, GCN
from corgnn.sparse import sddmm, spmm, use_backend
from corgnn.sparse.backends import numba_gat_kernels as gat_kernels
from corgnn.sparse.backends import numba_gatv2_kernels as gatv2_kernels
from corgnn.sparse.backends import numba_kernels as kernels
from corgnn.sparse.backends import numba_transformer_kernels as transformer_kernels
from conftest import FORCED_TRITON_INTERPRETER, make_graph

pytestmark = pytest.mark.skipif(FORCED_TRITON_INTERPRETER, reason="Numba kernels only; the forced-Triton pass does not run them")

GATHER_KERNELS = [
    (mod.__name__.rsplit(".", 1)[1], name, obj)
    for mod in (kernels, gat_kernels, gatv2_kernels, transformer_kernels)
    for name, obj in vars(mod).items()
    if isinstance(obj, kernels._GatherKernel)
]


def test_every_row_and_entry_gather_kernel_has_a_prefetching_twin():
    names = {name for _, name, _ in GATHER_KERNELS}
    expected = {
        "spmm_rows", "spmm_rows_heads", "sddmm_rows", "sddmm_rows_heads", "spmm_coo", "spmm_coo_heads",
        "sddmm_coo", "sddmm_coo_heads", "gat_forward_rows", "gat_backward_rows", "gat_backward_cols",
    }
    assert expected <= names


@pytest.mark.parametrize("module,name,kernel", GATHER_KERNELS, ids=[n for _, n, _ in GATHER_KERNELS])
def test_call_picks_the_compilation_by_operand_size(monkeypatch, module, name, kernel):
    calls = []
    monkeypatch.setattr(kernel, "plain", lambda *a: calls.append("plain"))
    monkeypatch.setattr(kernel, "prefetching", lambda *a: calls.append("prefetching"))

    class Operand:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.dtype = np.dtype(np.float32)

    class Tier:  # (a tiered kernel's tier: its parallel compilation, then its serial one)
        def __init__(self):
            self.parallel = True

        def run(self, parallel, serial, args, tasks):
            assert tasks == args[3].shape[0] - 1
            (parallel if self.parallel else serial)(*args)

    args = [None] * max(4, kernel.operand + 1)
    args[3] = np.zeros(3, dtype=np.int64)  # (a tiered kernel's row chunks: 2 tasks)
    sizes = (kernels.PREFETCH_MIN_BYTES, kernels.PREFETCH_MIN_BYTES + 1)
    if kernel.serial is not None:
        monkeypatch.setattr(kernel, "serial", (lambda *a: calls.append("serial plain"), lambda *a: calls.append("serial prefetching")))
        tier = Tier()
        monkeypatch.setattr(kernel, "_tiers", {np.dtype(np.float32): tier})
        for parallel in (False, True):
            tier.parallel = parallel
            for nbytes in sizes:
                args[kernel.operand] = Operand(nbytes)
                kernel(*args)
        assert calls == ["serial plain", "serial prefetching", "plain", "prefetching"]
        return
    for nbytes in sizes:
        args[kernel.operand] = Operand(nbytes)
        kernel(*args)
    assert calls == ["plain", "prefetching"]


def _run(fn, prefetch: bool, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kernels, "PREFETCH_MIN_BYTES", -1 if prefetch else 2**62)
        with use_backend("numba"):
            return fn()


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "hybrid"])
@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prefetching_spmm_and_sddmm_are_bit_identical(monkeypatch, fmt, heads, dtype):
    ei, n = make_graph(n=300, q=2500)
    A = Graph(ei, num_nodes=n).gcn_adjacency(format=fmt)
    g = torch.Generator().manual_seed(0)
    shape = (n, 8) if heads is None else (n, heads, 8)
    B = torch.randn(shape, generator=g, dtype=dtype)
    C = torch.randn(shape, generator=g, dtype=dtype)
    val = A.val.to(dtype) if heads is None else torch.rand(A.nnz, heads, generator=g, dtype=dtype)

    def products():
        return (
            spmm(A, B, values=val), spmm(A, B, values=val, transpose=True),
            sddmm(A, B, C.t() if heads is None else C, values=val),
        )

    plain = _run(products, False, monkeypatch)
    fetched = _run(products, True, monkeypatch)
    for a, b in zip(plain, fetched):
        assert torch.equal(a, b)


@pytest.mark.parametrize("model", ["gcn", "gat-none", "gat-features", "gat-node_attention", "gat-edge_weights"])
def test_prefetching_layers_give_bit_identical_outputs_and_gradients(monkeypatch, model):
    ei, n = make_graph(n=300, q=2500)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 12, generator=g)

    def step():
        torch.manual_seed(0)
        if model == "gcn":
            net = GCN(12, 16, 4)
        else:
            net = GAT(12, 4, 4, heads=3, dropout=0.3, cache=model.split("-", 1)[1])
        net.train()
        xx = x.clone().requires_grad_(True)
        out = net(xx, ei)
        out.square().sum().backward()
        return [out.detach(), xx.grad] + [p.grad for p in net.parameters()]

    plain = _run(step, False, monkeypatch)
    fetched = _run(step, True, monkeypatch)
    assert len(plain) == len(fetched)
    for a, b in zip(plain, fetched):
        assert torch.equal(a, b)
