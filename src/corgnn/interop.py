"""PyG interop: ``optimize(model)`` swaps PyG layers for corgnn's equivalents;
``from_torch_sparse(t)`` turns a ``torch.sparse`` matrix into a corgnn CSR.

Every PyG converter lives here: one pair of functions per PyG layer class (what it
does not support, how to build its replacement), listed in :func:`_converters`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .sparse.torch_sparse import from_torch_sparse

__all__ = ["optimize", "from_torch_sparse"]

_MODULE_HOOKS = (
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook",
)
"""``torch.nn.Module`` hook state carried from a PyG layer to its replacement (the
forward and backward hooks a user registered on the layer itself)."""

_TORCH_MODULE_ATTRS = frozenset(vars(nn.Module()))


def _message_passing_unsupported(layer, flows: tuple[str, ...] = ("source_to_target",), aggrs: tuple[str, ...] = ("add", "sum")) -> list[str]:
    """Options of PyG's ``MessagePassing`` base that the corgnn layer does not honour:
    a ``flow`` not in ``flows`` or another aggregation, hooks on its
    ``propagate``/``message``/... steps (corgnn has no such steps to run them on)."""
    unsupported = []
    if getattr(layer, "flow", "source_to_target") not in flows:
        unsupported.append(f"flow={layer.flow!r}")
    if not isinstance(getattr(layer, "aggr", "add"), str) or getattr(layer, "aggr", "add") not in aggrs:
        unsupported.append(f"aggr={layer.aggr!r}")
    hooks = sorted(k for k, v in vars(layer).items() if k.endswith("_hooks") and k not in _TORCH_MODULE_ATTRS and v)
    if hooks:
        unsupported.append(f"MessagePassing hooks ({', '.join(hooks)})")
    return unsupported


def _lazy(layer: nn.Module) -> bool:
    """Whether ``layer`` still has lazy parameters (PyG ``in_channels=-1`` before its
    first forward): their shapes, hence the replacement's, are not known yet."""
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in layer.parameters())


def _not_parameters(params: dict) -> list[str]:
    """Names in ``params`` whose value is neither None nor a plain ``nn.Parameter``
    (e.g. a ``torch.nn.utils.parametrize`` property): those cannot be shared."""
    return [f"{name} is not a Parameter" for name, p in params.items() if p is not None and not isinstance(p, nn.Parameter)]


def _adopt(make, layer: nn.Module, params: dict) -> nn.Module:
    """``make()`` holding ``layer``'s own Parameter objects (``new.<name> = params[name]``,
    None entries skipped), in ``layer``'s training mode, with the forward and backward
    hooks registered on ``layer`` (the very same hook dicts, so their handles still
    remove them).

    ``make`` runs on the meta device: its own parameters are never allocated or
    initialised, so converting draws nothing from torch's random generator (a seeded
    run makes the same draws with and without ``optimize``).
    """
    with torch.device("meta"):
        new = make()
    for name, p in params.items():
        if p is not None:
            owner, _, attr = name.rpartition(".")
            setattr(new.get_submodule(owner), attr, p)
    left = [name for name, t in [*new.named_parameters(), *new.named_buffers()] if t.is_meta]
    if left:  # pragma: no cover - a converter missed a parameter
        raise RuntimeError(f"corgnn.optimize: {type(layer).__name__} -> {type(new).__name__} left {left} unset")
    for attr in _MODULE_HOOKS:
        if hasattr(layer, attr):
            setattr(new, attr, getattr(layer, attr))
    new.train(layer.training)
    return new


# ------------------------------------------------------------------------ GCNConv


def _gcn_params(layer) -> dict:
    return {"lin.weight": layer.lin.weight, "bias": layer.bias}


def _gcn_unsupported(layer) -> list[str]:
    """Options of a PyG ``GCNConv`` corgnn's GCNConv does not support: those of
    :func:`_message_passing_unsupported`, a ``lin.bias``."""
    unsupported = _message_passing_unsupported(layer, ("source_to_target", "target_to_source")) + _not_parameters(_gcn_params(layer))
    if getattr(layer.lin, "bias", None) is not None:
        unsupported.append("lin.bias")
    return unsupported


def _build_gcn(layer) -> nn.Module:
    """corgnn :class:`GCNConv` sharing the (materialised) PyG layer's parameters."""
    from .nn.gcn import GCNConv

    weight = layer.lin.weight  # (out, in); PyG keeps in_channels=-1 for a lazy layer
    return _adopt(lambda: GCNConv(
        weight.size(1), weight.size(0), bias=layer.bias is not None, improved=layer.improved,
        add_self_loops=layer.add_self_loops, normalize=layer.normalize, flow=layer.flow,
    ), layer, _gcn_params(layer))


# ------------------------------------------------------------------------ GATConv


_GAT_LINEARS = ("lin", "lin_src", "lin_dst", "lin_edge", "res")
"""PyG ``GATConv``'s bias-free ``Linear`` submodules (each present or None)."""


def _gat_params(layer) -> dict:
    params = {f"{name}.weight": getattr(layer, name).weight for name in _GAT_LINEARS if getattr(layer, name, None) is not None}
    params.update(att_src=layer.att_src, att_dst=layer.att_dst, att_edge=getattr(layer, "att_edge", None), bias=layer.bias)
    return params


def _gat_unsupported(layer) -> list[str]:
    """Options of a PyG ``GATConv`` corgnn's GATConv does not support: a bias on one
    of its ``Linear`` transforms, those of :func:`_message_passing_unsupported`.
    Bipartite ``in_channels`` (``lin_src``/``lin_dst``), edge features (``edge_dim``,
    ``fill_value``) and ``residual=True`` are converted."""
    unsupported = _message_passing_unsupported(layer)
    if getattr(layer, "lin", None) is None and (getattr(layer, "lin_src", None) is None or getattr(layer, "lin_dst", None) is None):
        unsupported.append("no lin nor lin_src/lin_dst")
        return unsupported
    if getattr(layer, "edge_dim", None) is not None and (getattr(layer, "lin_edge", None) is None or getattr(layer, "att_edge", None) is None):
        unsupported.append(f"edge_dim={layer.edge_dim} without lin_edge/att_edge")
    if getattr(layer, "residual", False) and getattr(layer, "res", None) is None:
        unsupported.append("residual=True without res")
    unsupported += _not_parameters(_gat_params(layer))
    for name in _GAT_LINEARS:
        lin = getattr(layer, name, None)
        if lin is not None and getattr(lin, "bias", None) is not None:
            unsupported.append(f"{name}.bias")
    return unsupported


def _build_gat(layer) -> nn.Module:
    """corgnn :class:`GATConv` sharing the (materialised) PyG layer's parameters."""
    from .nn.gat import GATConv

    if layer.lin is not None:
        in_channels = layer.lin.weight.size(1)  # (PyG keeps in_channels=-1 for a lazy layer)
    else:
        in_channels = (layer.lin_src.weight.size(1), layer.lin_dst.weight.size(1))
    lin_edge = getattr(layer, "lin_edge", None)
    return _adopt(lambda: GATConv(
        in_channels, layer.out_channels, heads=layer.heads, concat=layer.concat,
        negative_slope=layer.negative_slope, dropout=layer.dropout, add_self_loops=layer.add_self_loops,
        edge_dim=None if lin_edge is None else lin_edge.weight.size(1), fill_value=getattr(layer, "fill_value", "mean"),
        bias=layer.bias is not None, residual=getattr(layer, "res", None) is not None,
    ), layer, _gat_params(layer))


# ------------------------------------------- SAGEConv, GraphConv, GINConv, SGConv, APPNP


def _linear_params(layer, names: tuple[str, ...]) -> dict:
    """``{"<lin>.weight", "<lin>.bias"}`` of the layer's ``Linear`` submodules ``names`` (absent ones skipped)."""
    return {f"{n}.{p}": getattr(getattr(layer, n), p, None) for n in names if getattr(layer, n, None) is not None for p in ("weight", "bias")}


_LINEAR_LAYERS = {  # PyG class name -> (its Linears, those PyG builds without bias, its aggregations corgnn runs as one SpMM)
    "SAGEConv": (("lin", "lin_l", "lin_r"), ("lin_r",), ("mean", "add", "sum")),
    "GraphConv": (("lin_rel", "lin_root"), ("lin_root",), ("mean", "add", "sum")),
    "SGConv": (("lin",), (), ("add", "sum")),
    "APPNP": ((), (), ("add", "sum")),
    "GINConv": ((), (), ("add", "sum")),
}


def _layer_unsupported(layer) -> list[str]:
    """Options of a PyG SAGEConv, GraphConv, GINConv, SGConv or APPNP that corgnn's
    layer does not support: those of :func:`_message_passing_unsupported` (other
    aggregations included), bipartite ``in_channels``, an SGConv ``cached=True``
    whose ``S^K X`` is already computed, a bias PyG never builds, a non-Parameter."""
    lins, no_bias, aggrs = _LINEAR_LAYERS[type(layer).__name__]
    unsupported = _message_passing_unsupported(layer, aggrs=aggrs)
    if isinstance(getattr(layer, "in_channels", 0), (tuple, list)):
        unsupported.append(f"bipartite in_channels={tuple(layer.in_channels)}")
    if getattr(layer, "_cached_x", None) is not None:
        unsupported.append("cached=True with S^K X already computed")
    unsupported += [f"{n}.bias" for n in no_bias if getattr(getattr(layer, n, None), "bias", None) is not None]
    if type(layer).__name__ == "APPNP" and not 0.0 <= float(layer.dropout) < 1.0:
        unsupported.append(f"dropout={layer.dropout!r} (corgnn's APPNP takes [0, 1))")
    return unsupported + _not_parameters(_linear_params(layer, lins))


def _build_layer(layer) -> nn.Module:
    """corgnn's SAGEConv / GraphConv / GINConv / SGConv / APPNP sharing the PyG layer's
    parameters (GINConv: its very ``nn`` module and ``eps``)."""
    from . import nn as cnn

    kind = type(layer).__name__
    params = _linear_params(layer, _LINEAR_LAYERS[kind][0])
    bias = lambda lin: getattr(lin, "bias", None) is not None  # noqa: E731
    if kind == "SAGEConv":
        w = layer.lin_l.weight
        make = lambda: cnn.SAGEConv(  # noqa: E731
            w.size(1), w.size(0), aggr=layer.aggr, normalize=layer.normalize, root_weight=layer.root_weight,
            project=layer.project, bias=bias(layer.lin_l),
        )
    elif kind == "GraphConv":
        w = layer.lin_rel.weight
        make = lambda: cnn.GraphConv(w.size(1), w.size(0), aggr=layer.aggr, bias=bias(layer.lin_rel))  # noqa: E731
    elif kind == "SGConv":
        w = layer.lin.weight
        make = lambda: cnn.SGConv(w.size(1), w.size(0), K=layer.K, cached=layer.cached, add_self_loops=layer.add_self_loops, bias=bias(layer.lin))  # noqa: E731
    elif kind == "APPNP":
        make = lambda: cnn.APPNP(  # noqa: E731
            layer.K, layer.alpha, dropout=layer.dropout, cached=layer.cached, add_self_loops=layer.add_self_loops, normalize=layer.normalize,
        )
    else:
        params = {"nn": layer.nn, "eps": layer.eps}
        make = lambda: cnn.GINConv(nn.Identity(), eps=layer.initial_eps, train_eps=isinstance(layer.eps, nn.Parameter))  # noqa: E731
    return _adopt(make, layer, params)


def _converters():
    """``[(PyG class, unsupported(layer) -> list of reasons, build(layer) -> module)]``."""
    import torch_geometric.nn as pyg

    return [(pyg.GCNConv, _gcn_unsupported, _build_gcn), (pyg.GATConv, _gat_unsupported, _build_gat)] + [
        (getattr(pyg, name), _layer_unsupported, _build_layer) for name in _LINEAR_LAYERS
    ]


# ----------------------------------------------------------------------- optimize


class _ConvertAfterFirstCall:
    """Forward hook that :func:`optimize` leaves on a lazy PyG layer (``in_channels=-1``
    not yet materialised): after the layer's first forward (PyG's own, which
    materialises the parameters) it removes itself, builds the replacement and puts
    it in every ``(parent, attribute)`` where ``optimize`` found the layer.

    A plain class (not a closure) so that a model carrying it pickles and deep-copies.
    """

    def __init__(self, build, sites: list):
        self.build, self.sites, self.handle = build, sites, None

    def __call__(self, layer, args, output):
        self.handle.remove()
        new = self.build(layer)
        for parent, name in self.sites:
            if parent._modules.get(name) is layer:
                setattr(parent, name, new)


def optimize(module: nn.Module, *, sparse_input_dropout: bool = True) -> nn.Module:
    """Replace every PyG ``GCNConv``, ``GATConv``, ``SAGEConv``, ``GraphConv``,
    ``GINConv``, ``SGConv`` and ``APPNP`` inside ``module`` by corgnn's, and
    (``sparse_input_dropout``) rewrite a dropout of a mostly-zero model input into a
    dropout over its non-zeros.

    The replacements hold the PyG layers' own ``Parameter`` objects (not copies), so
    ``requires_grad`` (frozen parameters stay frozen), device, dtype, weight tying,
    hooks registered on the parameters and an optimizer built before ``optimize``
    all carry over; they take the layer's training mode and the forward/backward
    hooks registered on the layer module itself, and give the same outputs and
    gradients. A layer object used at several places (a shared module) gets one
    replacement used at all of them.

    Not carried: state-dict hooks on the layer, hooks on its submodules (``lin``),
    other attributes set on the layer object. A layer using an option corgnn does not
    support (e.g. GATConv's ``flow="target_to_source"``, hooks on PyG's ``propagate`` steps) is
    left untouched with a warning, never silently changed.

    Lazy layers (``in_channels=-1``) whose parameters are not materialised yet are
    converted after their first forward: that call runs PyG's layer (which
    materialises them) and a hook then swaps in the replacement wherever the layer
    is referenced; later calls run corgnn's. A bare lazy layer passed in is returned
    unchanged with a warning (there is no parent to swap it in); call ``optimize``
    again after its first forward.

    Input dropout (:mod:`corgnn.fx`, README "optimize() and input dropout"): with
    ``sparse_input_dropout=True`` (default) the model's ``forward`` is traced with
    ``torch.fx`` and each active ``F.dropout``/``torch.dropout``/``nn.Dropout``
    applied directly to one of its inputs runs, in training mode, over that input's
    non-zeros when it is at most ``corgnn.nn.gcn.SPARSE_FEATURE_DENSITY`` non-zero
    (and hands a corgnn layer its sparse features directly). Same distribution as
    PyTorch's dropout, a different random stream; eval mode runs the model's own
    ``forward``. A model ``torch.fx`` cannot trace keeps its forward (warning).

    Args:
        module: any ``torch.nn.Module``; a bare PyG layer returns its replacement.
        sparse_input_dropout: apply the input-dropout rewrite (default True);
            False leaves the model's ``forward`` untouched.

    Returns:
        ``module`` itself, modified in place (or the replacement of a bare layer).

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    table = _converters()
    memo: dict[int, tuple] = {}  # id(PyG layer) -> (layer: keeps the id taken, replacement or layer kept)
    deferred: dict[int, _ConvertAfterFirstCall] = {}  # id(lazy PyG layer) -> its hook
    visited: set[int] = set()

    def replacement(m: nn.Module, site: tuple | None) -> nn.Module | None:
        """What replaces ``m`` (``m`` itself when kept), None if ``m`` is no PyG layer."""
        entry = next(((bad, build) for cls, bad, build in table if type(m) is cls), None)
        if entry is None:
            return None
        bad, build = entry
        if id(m) not in memo:
            unsupported = bad(m)
            if unsupported:
                warnings.warn(f"corgnn.optimize: left {type(m).__name__} unchanged (unsupported: {', '.join(unsupported)})", stacklevel=3)
                memo[id(m)] = (m, m)
            elif _lazy(m):
                if site is None:
                    warnings.warn(
                        f"corgnn.optimize: left lazy {type(m).__name__} (in_channels=-1) unchanged; "
                        "call optimize on it again after its first forward", stacklevel=3,
                    )
                else:
                    hook = deferred[id(m)] = _ConvertAfterFirstCall(build, [])
                    hook.handle = m.register_forward_hook(hook)
                memo[id(m)] = (m, m)
            else:
                memo[id(m)] = (m, build(m))
        if site is not None and id(m) in deferred:
            deferred[id(m)].sites.append(site)
        return memo[id(m)][1]

    def walk(parent: nn.Module) -> None:
        if id(parent) in visited:
            return
        visited.add(id(parent))
        for name, child in list(parent._modules.items()):  # every name, shared children included
            if child is None:
                continue
            new = replacement(child, (parent, name))
            if new is None:
                walk(child)
            elif new is not child:
                setattr(parent, name, new)

    top = replacement(module, None)
    if top is not None:
        return top
    walk(module)
    if sparse_input_dropout:
        from .fx import rewrite_input_dropout

        rewrite_input_dropout(module)
    return module
