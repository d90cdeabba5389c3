"""torch.compile: corgnn models, single layers and optimize()d PyG models compile
with fullgraph=True and dynamic shapes, report 0 graph breaks, and give eager's
outputs and gradients; the backend choice stays a run-time decision."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo as dynamo

import corgnn
from conftest import make_graph

M_IN = 12


class PygGCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(M_IN, 8), GCNConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class PygGAT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GATConv

        self.conv1, self.conv2 = GATConv(M_IN, 4, heads=2), GATConv(8, 3, heads=1, concat=False)

    def forward(self, x, edge_index):
        return self.conv2(torch.nn.functional.elu(self.conv1(x, edge_index)), edge_index)


MODELS = {
    "GCN": lambda: corgnn.nn.GCN(M_IN, 8, 3, dropout=0.5),
    "GAT": lambda: corgnn.nn.GAT(M_IN, 4, 3, heads=2, dropout=0.0),
    "GCNConv": lambda: corgnn.nn.GCNConv(M_IN, 5),
    "GATConv": lambda: corgnn.nn.GATConv(M_IN, 3, heads=2),
    "optimized-pyg-GCN": lambda: corgnn.optimize(PygGCN()),
    "optimized-pyg-GAT": lambda: corgnn.optimize(PygGAT()),
}


def _grads(model, x, ei):
    model.zero_grad()
    out = model(x, ei)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


@pytest.mark.parametrize("name", list(MODELS))
def test_compile_fullgraph_dynamic_matches_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    model.eval() if name == "GCN" else model.train()  # (GCN: dropout off, so runs compare)
    ei, n = make_graph()
    x = torch.randn(n, M_IN, requires_grad=True)
    explained = dynamo.explain(model)(x, ei)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for n2, q2, seed in ((n, None, None), (57, 230, 3)):  # a second graph size, no recompile needed
        if seed is not None:
            ei, n = make_graph(n=n2, q=q2, seed=seed)
            x = torch.randn(n, M_IN, requires_grad=True)
        got = _grads(compiled, x, ei)
        x.grad = None
        want = _grads(model, x, ei)
        x.grad = None
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
        for a, b in zip(got[1], want[1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with corgnn.sparse.use_backend("torch"):  # dispatch happens when the ops run
        torch.testing.assert_close(compiled(x, ei), model(x, ei), rtol=1e-4, atol=1e-5)


def test_compile_validates_edge_index_at_run_time():
    model = torch.compile(corgnn.nn.GCNConv(M_IN, 4), fullgraph=True)
    ei, n = make_graph()
    model(torch.randn(n, M_IN), ei)
    with pytest.raises(Exception, match="edge_index holds node id"):
        model(torch.randn(n, M_IN), ei.clamp(max=n - 1) + torch.tensor([[0], [n]]))


def test_compile_in_fresh_process_before_any_eager_call():
    code = textwrap.dedent(
        f"""
        import sys, torch, corgnn
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        from conftest import make_graph
        ei, n = make_graph()
        x = torch.randn(n, {M_IN})
        for m in (corgnn.nn.GCN({M_IN}, 8, 3), corgnn.nn.GAT({M_IN}, 4, 3, heads=2)):
            y = torch.compile(m)(x, ei)
            y.sum().backward()
            torch.testing.assert_close(y, m(x, ei), rtol=1e-4, atol=1e-5)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@contextlib.contextmanager
def _structured_trace_and_a_real_inductor_compile():
    """The process state that used to break a compile taking a PyG ``EdgeIndex`` (issue
    23 item 9): torch's structured compile trace on (a handler on the ``torch.__trace``
    logger, as ``TORCH_TRACE``, tlparse and pytest's log capture install) and Inductor
    really compiling (its caches off: as on a cold cache, or after a change to the
    cache key such as ``corgnn bench --threads 1`` leaving torch on one thread)."""
    from torch._inductor import config as inductor_config

    log, handler = logging.getLogger("torch.__trace"), logging.NullHandler()
    log.addHandler(handler)
    try:
        with inductor_config.patch(force_disable_caches=True):
            yield
    finally:
        log.removeHandler(handler)


@pytest.mark.parametrize("layer", ["corgnn", "pyg"])
def test_compile_fullgraph_of_an_unnormalized_gcn_on_a_sorted_edge_index(layer):
    """Issue 23 item 9: ``GCNConv(normalize=False, add_self_loops=False)`` on a sorted
    PyG ``EdgeIndex`` under ``torch.compile(fullgraph=True)`` (PyG's own test case), in
    this process, in the state that made it fail with Inductor's
    ``PendingUnbackedSymbolNotFound`` (48 unbacked symbols): the structured trace reprs
    the fake ``EdgeIndex``, and PyG's repr read its values (one unbacked SymInt each).
    ``import corgnn`` makes that repr value-free (:mod:`corgnn.pyg_compat`); PyG's own
    layer compiles in that state too."""
    from torch_geometric import EdgeIndex
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    for order in ("row", "col"):
        ei = EdgeIndex(torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]), sparse_size=(4, 4)).sort_by(order)[0]
        conv = GCNConv(16, 32, normalize=False, add_self_loops=False)
        model = corgnn.optimize(conv) if layer == "corgnn" else conv
        expected = model(x, ei)
        dynamo.reset()
        with _structured_trace_and_a_real_inductor_compile():
            got = torch.compile(model, fullgraph=True)(x, ei)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["GCN", "GCNConv", "optimized-pyg-GCN"])
def test_compile_with_the_live_rows_backward(name, monkeypatch):
    """The backward's search for the gradient's zero tail (corgnn.functional.gcn.
    gradient_rows, data-dependent) stands aside while torch.compile traces: a loss on
    the first rows compiles with fullgraph=True and gives eager's gradients (eager
    taking the live-rows path)."""
    import corgnn.functional.gcn as fgcn

    monkeypatch.setattr(fgcn, "ROWS_MIN_MACS", 0)
    torch.manual_seed(0)
    model = MODELS[name]()
    model.eval() if name == "GCN" else model.train()
    ei, n = make_graph()
    x = torch.randn(n, M_IN, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    grads = []
    for m in (compiled, model):
        model.zero_grad()
        x.grad = None
        m(x, ei)[:7].square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()] + [x.grad.clone()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
