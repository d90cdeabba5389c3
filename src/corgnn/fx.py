"""``optimize``'s input-dropout rewrite (``torch.fx``): a dropout applied directly to a
model input that is mostly zeros becomes a dropout over its non-zeros.

Dropping a zero changes nothing, so inverted dropout over the stored non-zeros of
``x`` (keep each with probability ``1 - p``, scale by ``1 / (1 - p)``) has the same
distribution as ``torch.nn.functional.dropout(x, p)``, at the cost of ``nnz`` random
numbers instead of ``n * m`` (Cora: 49 k instead of 3.9 M), and when every user of
the result is a corgnn layer it hands that layer the sparse features directly (a CSR
whose pattern is built once per tensor version of ``x``; only the values are
redrawn), so no dense-to-CSR conversion runs per step. The random stream differs
from PyTorch's (as for GAT's attention dropout); the distribution does not.

Mechanism: ``torch.fx.symbolic_trace`` of the model's ``forward`` in training mode,
every submodule a leaf (only the top-level ``forward`` is traced, submodules are
called as they are). The rewritten forward is installed on the model *instance*
(``model.forward``) and runs only in training mode; in eval mode the model's own
``forward`` runs, unchanged. The model keeps its class, parameters, buffers,
``state_dict`` keys and hooks; it deep-copies and pickles. ``torch.nn.functional``
is never patched.

What is rewritten: ``F.dropout`` / ``torch.dropout`` / ``torch.nn.functional.dropout``
calls and ``nn.Dropout`` modules whose input is an argument of ``forward`` and which
are active in training mode (not in place). A model that cannot be traced
(data-dependent control flow, ``*args``, ...) is left unchanged, with a warning
that says why when its forward may apply a dropout. Python values read at trace time (``self.training``, other attributes,
shapes) are fixed in the rewritten training forward: changing such an attribute
later needs ``optimize`` again.
"""

from __future__ import annotations

import importlib
import inspect
import operator
import types
import warnings

import torch
from torch import fx, nn

__all__ = ["rewrite_input_dropout", "sparse_input_dropout", "InputDropout"]

_DROPOUT_FUNCTIONS = (nn.functional.dropout, torch.dropout)


class InputDropout:
    """Inverted dropout of one model input over its non-zeros (one per rewritten site).

    Calling it with ``x (n, m)`` float returns, in training, either a corgnn
    :class:`~corgnn.sparse.CSR` holding the kept non-zeros scaled by ``1/(1-p)``
    (``sparse_out=True``: every user takes sparse features) or the dense tensor of
    the same values; ``x``'s pattern (CSR) is built once per tensor version. ``x``
    that needs a gradient, is not a 2-D float tensor, or is more than
    :data:`corgnn.nn.base.SPARSE_FEATURE_DENSITY` non-zero gets
    ``torch.nn.functional.dropout`` itself.

    Args:
        p: drop probability in ``[0, 1)``.
        sparse_out: return the CSR (the result feeds only corgnn layers).
    """

    def __init__(self, p: float, sparse_out: bool):
        from .nn.base import FeatureCache

        if not 0.0 <= float(p) < 1.0:
            raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
        self.p, self.sparse_out = float(p), bool(sparse_out)
        self._features = FeatureCache()

    def __reduce__(self):
        return (type(self), (self.p, self.sparse_out))

    def __call__(self, x):
        from .nn.base import dropout

        if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or x.requires_grad or x.layout != torch.strided:
            return nn.functional.dropout(x, self.p, True)
        xs = self._features(x, x.size(0), x.size(1))
        if xs is None:
            return nn.functional.dropout(x, self.p, True)
        xs = xs.with_values(dropout(xs.val, self.p, True))
        if self.sparse_out:
            return xs
        out = torch.zeros_like(x)
        out[xs.row(), xs.col] = xs.val
        return out


def sparse_input_dropout(site: InputDropout, x):
    """Run one rewritten dropout site on ``x`` (the call the rewritten graph makes)."""
    return site(x)


class _TrainForward:
    """The rewritten training-mode forward installed as ``model.forward``: runs the
    traced code in training mode and the model class's own ``forward`` in eval mode.
    Holds the generated source (re-executed after unpickling) and its sites."""

    def __init__(self, module: nn.Module, src: str, globs: dict):
        self.module, self.src = module, src
        # (Python modules among the generated code's globals travel by name)
        self.globs = {k: v.__name__ if isinstance(v, types.ModuleType) else v for k, v in globs.items()}
        self.module_names = {k for k, v in globs.items() if isinstance(v, types.ModuleType)}
        scope = {k: importlib.import_module(v) if k in self.module_names else v for k, v in self.globs.items()}
        exec(compile(src, "<corgnn.fx rewritten forward>", "exec"), scope)
        self.fn = scope["forward"]

    def __reduce__(self):
        return (_rebuild_forward, (self.module, self.src, self.globs, sorted(self.module_names)))

    def __call__(self, *args, **kwargs):
        m = self.module
        if m.training:
            return self.fn(m, *args, **kwargs)
        return type(m).forward(m, *args, **kwargs)


def _rebuild_forward(module, src, globs, module_names):
    """Unpickle / deep-copy a :class:`_TrainForward` (its Python modules by name)."""
    return _TrainForward(module, src, {k: importlib.import_module(v) if k in module_names else v for k, v in globs.items()})


class _LeafTracer(fx.Tracer):
    """Traces only the top-level ``forward``: every submodule is a leaf."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


def _dropout_site(node: fx.Node, root: nn.Module):
    """``(p, x node)`` if ``node`` is an active, out-of-place dropout, else None."""
    if node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS:
        names = ("input", "p", "train", "inplace") if node.target is torch.dropout else ("input", "p", "training", "inplace")
        defaults = {"p": 0.5, "training": True, "train": True, "inplace": False}
        vals = dict(zip(names, node.args))
        vals.update(node.kwargs)
        p, train, inplace = vals.get("p", defaults["p"]), vals.get(names[2], defaults[names[2]]), vals.get("inplace", False)
        x = vals.get("input")
    elif node.op == "call_module" and type(root.get_submodule(node.target)) is nn.Dropout:
        d = root.get_submodule(node.target)
        p, train, inplace, x = d.p, True, d.inplace, (node.args[0] if node.args else node.kwargs.get("input"))
    else:
        return None
    if train is not True or inplace is not False or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
        return None
    return float(p), x


def _takes_sparse(user: fx.Node, node: fx.Node, root: nn.Module) -> bool:
    """Whether ``user`` is a corgnn layer taking ``node`` as its features ``x``."""
    from .nn.base import CorgnnConv

    if user.op != "call_module":
        return False
    layer = root.get_submodule(user.target)
    if not isinstance(layer, CorgnnConv) or not layer.sparse_features_allowed():
        return False
    first = user.args[0] if user.args else user.kwargs.get("x")
    others = [*user.args[1:], *(v for k, v in user.kwargs.items() if k != "x")]
    return first is node and not any(node in fx.node.map_arg(a, lambda n: [n]) if isinstance(a, fx.Node) else False for a in others)


def _may_drop_out(module: nn.Module) -> bool:
    """Whether an untraceable ``module``'s forward might apply a dropout: a direct
    ``nn.Dropout`` child, or "dropout" in its source (True when that is unreadable)."""
    if any(isinstance(m, nn.Dropout) for m in module.children()):
        return True
    try:
        return "dropout" in inspect.getsource(type(module).forward).lower()
    except (OSError, TypeError):
        return True


def rewrite_input_dropout(module: nn.Module) -> int:
    """Rewrite the dropouts of ``module``'s inputs into :class:`InputDropout` sites
    (see the module docstring); returns how many were rewritten (0: ``module`` is
    unchanged). Warns (``UserWarning``) and leaves ``module`` unchanged when its
    ``forward`` cannot be traced and may apply a dropout (silently when it has no
    ``nn.Dropout`` child and its source does not mention dropout).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module.__dict__.get("forward"), _TrainForward):
        return 0  # already rewritten
    if not any(isinstance(m, nn.Dropout) for m in module.modules()) and not _may_drop_out(module):
        return 0  # no dropout to find: no trace (~7 ms of optimize() on a 5-layer GIN)
    was_training = module.training
    try:
        module.train(True)
        graph = _LeafTracer().trace(module)
    except Exception as e:  # noqa: BLE001 - any tracing failure leaves the model as it is
        module.train(was_training)
        if not _may_drop_out(module):
            return 0  # (nothing to rewrite was lost: no warning)
        warnings.warn(
            f"corgnn.optimize: input dropout left as it is: torch.fx cannot trace {type(module).__name__}.forward "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", stacklevel=3,
        )
        return 0
    module.train(was_training)
    sites: dict[str, InputDropout] = {}
    for node in list(graph.nodes):
        found = _dropout_site(node, module)
        if found is None or not isinstance(found[1], fx.Node) or found[1].op != "placeholder":
            continue
        p, x = found
        sparse_out = bool(node.users) and all(_takes_sparse(u, node, module) for u in node.users)
        name = f"_corgnn_input_dropout_{len(sites)}"
        sites[name] = InputDropout(p, sparse_out)
        with graph.inserting_before(node):
            site = graph.create_node("call_function", operator.getitem, (graph.create_node("get_attr", "_corgnn_input_dropout"), name))
            new = graph.call_function(sparse_input_dropout, (site, x))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    if not sites:
        return 0
    graph.lint()
    code = graph.python_code(root_module="self")
    module._corgnn_input_dropout = sites
    module.forward = _TrainForward(module, code.src, code.globals)
    return len(sites)
