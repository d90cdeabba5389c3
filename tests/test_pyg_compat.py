"""corgnn.pyg_compat: a PyG ``EdgeIndex`` without values (fake, meta) is printed from
its shape and metadata, reading no value; real ones exactly as PyG prints them."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch_geometric import EdgeIndex

import corgnn  # noqa: F401  (installs the repr)
from corgnn.pyg_compat import trace_safe_edge_index_repr


def _edge_index(order="row", **kw):
    return EdgeIndex(torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]), sparse_size=(4, 4), **kw).sort_by(order)[0]


def test_a_fake_edge_index_is_printed_without_reading_its_values():
    """Under a compile's fake mode each value PyG's repr read was an ``.item()``: a
    fresh unbacked SymInt that no graph output binds (issue 23 item 9)."""
    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env) as mode:
        fake = mode.from_tensor(_edge_index("col"))
        text = repr(fake)
        assert not shape_env.pending_fresh_unbacked_symbols
        assert text == "EdgeIndex(..., size=(2, 6), sparse_size=(4, 4), nnz=6, sort_order=col)"
        # PyG's own repr on the same fake tensor allocates one symbol per value
        EdgeIndex.__repr__.__wrapped__(fake)
        assert len(shape_env.pending_fresh_unbacked_symbols) == 12


@pytest.mark.parametrize("kw", [{}, {"is_undirected": True}])
def test_a_real_edge_index_is_printed_as_pyg_prints_it(kw):
    ei = _edge_index(**kw)
    assert repr(ei) == EdgeIndex.__repr__.__wrapped__(ei)
    assert "[[0, 0, 0, 1, 2, 3]," in repr(ei)


def test_a_meta_edge_index_is_printed_from_its_metadata():
    ei = EdgeIndex(torch.empty(2, 5, dtype=torch.int32, device="meta"), sparse_size=(3, None), is_undirected=False)
    assert repr(ei) == "EdgeIndex(..., size=(2, 5), sparse_size=(3, ?), nnz=5, device='meta', dtype=torch.int32)"


def test_installing_twice_wraps_once():
    wrapped = EdgeIndex.__repr__
    assert trace_safe_edge_index_repr() is True
    assert EdgeIndex.__repr__ is wrapped
    assert not hasattr(EdgeIndex.__repr__.__wrapped__, "__wrapped__")
