"""PyG interop: ``optimize(model)`` swaps PyG layers for corgnn's equivalents."""

from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ["optimize"]


def _convert_gcn(layer) -> nn.Module | None:
    """corgnn GCNConv with the PyG layer's parameters, or None (with a warning) if
    the layer uses an option corgnn does not support."""
    from .nn.gcn import GCNConv

    unsupported = []
    if getattr(layer, "flow", "source_to_target") != "source_to_target":
        unsupported.append(f"flow={layer.flow!r}")
    if getattr(layer, "aggr", "add") not in ("add", "sum"):
        unsupported.append(f"aggr={layer.aggr!r}")
    if getattr(layer.lin, "bias", None) is not None:
        unsupported.append("lin.bias")
    if unsupported:
        warnings.warn(f"corgnn.optimize: left {type(layer).__name__} unchanged (unsupported: {', '.join(unsupported)})", stacklevel=3)
        return None
    new = GCNConv(
        layer.in_channels,
        layer.out_channels,
        bias=layer.bias is not None,
        improved=layer.improved,
        add_self_loops=layer.add_self_loops,
        normalize=layer.normalize,
    )
    with torch.no_grad():
        new = new.to(device=layer.lin.weight.device, dtype=layer.lin.weight.dtype)
        new.lin.weight.copy_(layer.lin.weight)
        if layer.bias is not None:
            new.bias.copy_(layer.bias)
    new.train(layer.training)
    return new


def _converters():
    from torch_geometric.nn import GCNConv as PygGCNConv

    table = [(PygGCNConv, _convert_gcn)]
    try:
        from torch_geometric.nn import GATConv as PygGATConv

        from .nn.gat import convert_pyg_gat

        table.append((PygGATConv, convert_pyg_gat))
    except ImportError:  # GAT support not present
        pass
    return table


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
