"""PyG interop: ``optimize(model)`` swaps PyG layers for corgnn's equivalents;
``from_torch_sparse(t)`` turns a ``torch.sparse`` matrix into a corgnn CSR.

The conversions are the layers' own: each corgnn layer class names the PyG class it
replaces (``PYG_NAME``, the registry line) and says what of it it does not support
and how to build itself from it (:class:`corgnn.nn.base.CorgnnConv`'s
``pyg_unsupported`` / ``from_pyg``); this module walks the model.
"""

from __future__ import annotations

import warnings

from torch import nn

from ._validate import ModelInputs
from .nn.base import CorgnnConv, is_lazy
from .sparse.torch_sparse import from_torch_sparse

__all__ = ["optimize", "from_torch_sparse"]

# ----------------------------------------------------------------------- optimize


def _converters() -> list:
    """``[(PyG class, unsupported(layer) -> reasons, build(layer) -> module)]`` of every
    registered corgnn layer (:meth:`corgnn.nn.base.CorgnnConv.conversions`)."""
    import torch_geometric.nn as pyg

    return [(getattr(pyg, name), cls.pyg_unsupported, cls.from_pyg) for name, cls in CorgnnConv.conversions().items()]


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

    The model gets a forward pre-hook and an always-called forward hook
    (:class:`corgnn._validate.ModelInputs`): inside its forward the layers scan for
    NaN/Inf only the tensors its caller passed, not the activations it computes
    (PyG scans none; with a ``grad_fn`` they were never scanned).

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
    non-zeros when it is at most ``corgnn.nn.base.SPARSE_FEATURE_DENSITY`` non-zero
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
            elif is_lazy(m):
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
    if any(kept is not new for kept, new in memo.values()) or deferred:
        ModelInputs.install(module)  # (NaN/Inf scans for the caller's tensors only: corgnn._validate)
    if sparse_input_dropout:
        from .fx import rewrite_input_dropout

        rewrite_input_dropout(module)
    return module
