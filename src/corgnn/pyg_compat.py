"""Fixes to PyTorch Geometric objects that corgnn's layers take as inputs.

:func:`trace_safe_edge_index_repr` (run by ``import corgnn``) makes the ``repr`` of a
PyG ``EdgeIndex`` without real values (a fake or meta tensor, as ``torch.compile``
builds while tracing) read no values.

Why (issue 23 item 9): PyG's ``EdgeIndex.__repr__`` formats its index values
(``torch._tensor_str._tensor_str`` on the wrapped tensor, reading every entry). On the
fake ``EdgeIndex`` that AOTAutograd keeps for a compiled graph's input (its subclass
metadata), each read is an ``.item()`` under the compile's ``FakeTensorMode`` and
allocates an *unbacked* SymInt that no graph output binds: 12 per repr of a
``(2, 6)`` index. PyTorch reprs that metadata in its structured compile trace
(``dataclass_repr(fw_metadata)``, the ``aot_forward_graph_fw_metadata`` payload),
which is built whenever the ``torch.__trace`` logger has a handler: ``TORCH_TRACE``
runs, and pytest processes (pytest 9.2 attaches its log-capture handlers to all
non-propagating loggers). When Inductor then compiles the graph (an FX graph
cache miss: a cold cache, or a new key, e.g. another ``torch.get_num_threads()``),
its fake-tensor propagation finds those pending symbols and raises
``PendingUnbackedSymbolNotFound`` (48 symbols: 4 reprs). The same happens to PyG's
own layers; real ``EdgeIndex`` values are printed exactly as before.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["trace_safe_edge_index_repr"]

_MARK = "__corgnn_trace_safe__"


def _has_no_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no readable values: a fake tensor (``torch.compile`` tracing,
    also behind functional or subclass wrappers) or a meta tensor."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "meta" or is_fake(t)


def _value_free_repr(ei) -> str:
    """``EdgeIndex(..., size=(2, q), sparse_size=(n, m), nnz=q, sort_order=row)``:
    shape and metadata only, as torch prints a fake tensor."""
    parts = [f"..., size={tuple(ei.shape)}"]
    rows, cols = ei.sparse_size()
    if rows is not None or cols is not None:
        parts.append(f"sparse_size=({rows if rows is not None else '?'}, {cols if cols is not None else '?'})")
    parts.append(f"nnz={ei.shape[1]}")
    if ei.device.type != "cpu":
        parts.append(f"device='{ei.device}'")
    if ei.dtype != torch.int64:
        parts.append(f"dtype={ei.dtype}")
    if ei.sort_order is not None:
        parts.append(f"sort_order={ei.sort_order}")
    if ei.is_undirected:
        parts.append("is_undirected=True")
    return f"{type(ei).__name__}({', '.join(parts)})"


def trace_safe_edge_index_repr() -> bool:
    """Wrap PyG's ``EdgeIndex.__repr__`` so that an ``EdgeIndex`` without values (fake
    or meta) is printed from its shape and metadata, never read; every other
    ``EdgeIndex`` is printed by PyG's own ``__repr__``, unchanged. Idempotent.

    Returns: True when the wrapper is installed (now or before), False when this
    PyG has no ``EdgeIndex`` (nothing to fix).
    """
    try:
        from torch_geometric import EdgeIndex
    except ImportError:  # pragma: no cover - PyG before EdgeIndex (2.5)
        return False
    original = EdgeIndex.__repr__
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def __repr__(self, *args, **kwargs) -> str:
        if _has_no_values(self):
            return _value_free_repr(self)
        return original(self, *args, **kwargs)

    setattr(__repr__, _MARK, True)
    EdgeIndex.__repr__ = __repr__
    return True
