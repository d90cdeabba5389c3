"""PyG interop: ``optimize(model)`` swaps PyG layers for corgnn's equivalents.

Every PyG converter lives here: one function per PyG layer class, listed in
:func:`_converters`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ["optimize"]


def _message_passing_unsupported(layer) -> list[str]:
    """Options of PyG's ``MessagePassing`` base that no corgnn layer honours."""
    unsupported = []
    if getattr(layer, "flow", "source_to_target") != "source_to_target":
        unsupported.append(f"flow={layer.flow!r}")
    if getattr(layer, "aggr", "add") not in ("add", "sum"):
        unsupported.append(f"aggr={layer.aggr!r}")
    return unsupported


def _declined(layer, unsupported: list[str]) -> bool:
    """Warn and return True when ``layer`` uses options corgnn does not support."""
    if unsupported:
        warnings.warn(f"corgnn.optimize: left {type(layer).__name__} unchanged (unsupported: {', '.join(unsupported)})", stacklevel=4)
    return bool(unsupported)


def _adopt(new: nn.Module, layer, like: torch.Tensor, params: dict) -> nn.Module:
    """``new`` on ``like``'s device and dtype, in ``layer``'s training mode, with
    each ``new.<name>`` set to a copy of ``params[name]`` (None entries skipped)."""
    with torch.no_grad():
        new = new.to(device=like.device, dtype=like.dtype)
        for name, value in params.items():
            if value is not None:
                new.get_parameter(name).copy_(value)
    new.train(layer.training)
    return new


def _convert_gcn(layer) -> nn.Module | None:
    """corgnn GCNConv with the PyG layer's parameters, or None (with a warning) if
    the layer uses an option corgnn does not support."""
    from .nn.gcn import GCNConv

    unsupported = _message_passing_unsupported(layer)
    if getattr(layer.lin, "bias", None) is not None:
        unsupported.append("lin.bias")
    if _declined(layer, unsupported):
        return None
    new = GCNConv(
        layer.in_channels,
        layer.out_channels,
        bias=layer.bias is not None,
        improved=layer.improved,
        add_self_loops=layer.add_self_loops,
        normalize=layer.normalize,
    )
    return _adopt(new, layer, layer.lin.weight, {"lin.weight": layer.lin.weight, "bias": layer.bias})


def _convert_gat(layer) -> nn.Module | None:
    """corgnn :class:`GATConv` with the PyG ``GATConv`` layer's parameters copied, or
    ``None`` (with a warning) when the layer uses an option corgnn does not support:
    edge features (``edge_dim``), ``residual=True``, bipartite ``in_channels``
    (separate ``lin_src``/``lin_dst``), lazy ``in_channels=-1`` not yet
    initialised, ``flow="target_to_source"``, an aggregation other than ``"add"``.
    ``fill_value`` is accepted: PyG uses it only for edge features of self-loops.

    The new layer takes the old one's training mode, dtype and device.
    """
    unsupported = _message_passing_unsupported(layer)
    if getattr(layer, "edge_dim", None) is not None or getattr(layer, "lin_edge", None) is not None:
        unsupported.append(f"edge_dim={layer.edge_dim}")
    if getattr(layer, "res", None) is not None or getattr(layer, "residual", False):
        unsupported.append("residual=True")
    lin = getattr(layer, "lin", None)
    if lin is None:
        unsupported.append("bipartite in_channels (lin_src/lin_dst)")
    elif isinstance(lin.weight, nn.parameter.UninitializedParameter):
        unsupported.append("lazy in_channels=-1 (run one forward first)")
    elif lin.bias is not None:
        unsupported.append("lin.bias")
    if _declined(layer, unsupported):
        return None
    from .nn.gat import GATConv

    new = GATConv(
        lin.weight.size(1), layer.out_channels, heads=layer.heads, concat=layer.concat,
        negative_slope=layer.negative_slope, dropout=layer.dropout, bias=layer.bias is not None,
        add_self_loops=layer.add_self_loops,
    )
    params = {"lin.weight": lin.weight, "att_src": layer.att_src, "att_dst": layer.att_dst, "bias": layer.bias}
    return _adopt(new, layer, lin.weight, params)


def _converters():
    from torch_geometric.nn import GCNConv as PygGCNConv

    from torch_geometric.nn import GATConv as PygGATConv

    return [(PygGCNConv, _convert_gcn), (PygGATConv, _convert_gat)]


def optimize(module: nn.Module) -> nn.Module:
    """Replace every PyG ``GCNConv`` (and ``GATConv``) inside ``module`` by corgnn's.

    The replacements carry the same parameters (copied; the new layers own new
    ``Parameter`` objects, so build the optimizer *after* calling ``optimize``) and
    give the same outputs and gradients. A layer using an option corgnn does not
    support (e.g. ``flow="target_to_source"``) is left untouched with a warning,
    never silently changed. A bare PyG layer passed in returns its replacement.

    Args:
        module: any ``torch.nn.Module``.

    Returns:
        ``module`` itself, modified in place (or the replacement of a bare layer).

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    table = _converters()

    def convert(m):
        for cls, fn in table:
            if type(m) is cls:
                return fn(m)
        return None

    top = convert(module)
    if top is not None:
        return top
    for name, child in list(module.named_children()):
        new = convert(child)
        if new is not None:
            setattr(module, name, new)
        elif not any(type(child) is cls for cls, _ in table):
            optimize(child)
    return module
