"""Input validation shared by every public entry point.

Every check raises a ``ValueError`` or ``TypeError`` that names the offending
argument and says what was expected, *before* any computation starts.
"""

from __future__ import annotations

import math
import operator
import threading

import torch

__all__ = [
    "check_edge_index",
    "check_edge_weight",
    "check_features",
    "check_finite",
    "computed_in_model",
    "ModelInputs",
    "check_float_dtype",
    "FLOAT_DTYPES",
    "check_shape",
    "check_index",
    "can_read",
    "index_stats",
    "min_max",
    "ptr_terms",
    "check_ptr",
    "check_range",
    "check_sorted",
    "validate_compressed",
    "validate_coo",
]

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
"""Value dtypes the layers take; half precision (bfloat16, float16) is accumulated in
float32 inside the kernels and returned in its own dtype."""


def check_float_dtype(name: str, dtype: torch.dtype) -> None:
    """Raise ``TypeError`` naming ``dtype`` and :data:`FLOAT_DTYPES` unless it is one."""
    if dtype not in FLOAT_DTYPES:
        ok = ", ".join(str(d).replace("torch.", "") for d in FLOAT_DTYPES)
        raise TypeError(f"{name} is {str(dtype).replace('torch.', '')}; supported dtypes are {ok}")


def check_finite(name: str, t: torch.Tensor) -> None:
    """Raise ``ValueError`` if floating tensor ``t`` holds NaN or Inf."""
    if not t.is_floating_point() or not t.numel():
        return
    # NOTE: a sum is NaN/Inf whenever an element is (NaN and Inf propagate), and it
    # costs one read (30x cheaper than isfinite().all()); only when the sum is not
    # finite (which a finite overflow can also cause) is every element checked.
    # (a Python float test of the sum: no second kernel on a 0-d tensor)
    if math.isfinite(float(t.detach().sum())):
        return
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s); clean the input first")


def check_edge_index(edge_index, num_nodes: int | None) -> int:
    """Validate a PyG ``edge_index`` and return the node count.

    Args:
        edge_index: ``(2, q)`` integer tensor, row 0 = source, row 1 = target.
        num_nodes: number of nodes, or ``None`` to infer ``max(edge_index) + 1``.

    Raises:
        TypeError: not a tensor, or not an integer dtype.
        ValueError: wrong shape, negative ids, ids ``>= num_nodes``.
    """
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor of shape (2, q), got {type(edge_index).__name__}")
    if edge_index.layout != torch.strided:
        raise TypeError(
            f"edge_index is a sparse ({edge_index.layout}) adjacency, not a (2, q) edge list; the layers take it "
            "directly (PyG's adj_t: row = target), a Graph is built from one with Graph.from_sparse"
        )
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must have an integer dtype (torch.int64), got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape (2, q), got {tuple(edge_index.shape)}")
    q = edge_index.size(1)
    if num_nodes is not None:
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
            raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    if q:
        lo, hi = (int(v) for v in torch.aminmax(edge_index))  # (one pass, not a min and a max)
        if lo < 0:
            raise ValueError(f"edge_index holds a negative node id ({lo}); node ids must be in [0, num_nodes)")
        if num_nodes is None:
            num_nodes = hi + 1
        elif hi >= num_nodes:
            raise ValueError(
                f"edge_index holds node id {hi} but num_nodes={num_nodes}; ids must be in [0, num_nodes)"
            )
    elif num_nodes is None:
        num_nodes = 0
    if num_nodes >= 2**31 - 1:
        raise ValueError(f"num_nodes={num_nodes} is too large (at most 2**31 - 2 supported)")
    return num_nodes


def check_edge_weight(edge_weight, num_edges: int) -> None:
    """Validate an optional ``(q,)`` floating edge weight vector."""
    if edge_weight is None:
        return
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a torch.Tensor of shape ({num_edges},), got {type(edge_weight).__name__}")
    if not edge_weight.is_floating_point():
        raise TypeError(f"edge_weight must be a floating tensor, got {edge_weight.dtype}")
    if edge_weight.dim() != 1 or edge_weight.numel() != num_edges:
        raise ValueError(
            f"edge_weight must have shape ({num_edges},) (one weight per edge), got {tuple(edge_weight.shape)}"
        )
    check_finite("edge_weight", edge_weight)


def check_features(name: str, x, num_nodes: int, channels: int | None = None) -> None:
    """Validate node features ``x``: ``(num_nodes, channels)`` floating and finite.

    NaN/Inf are looked for in the caller's data only: a tensor with a ``grad_fn``
    (an activation the model computed, e.g. the previous layer's output) is not
    scanned, since a non-finite value there comes from the model's own arithmetic
    (PyG scans none) and the scan would cost one pass over ``x`` in every layer of
    every step (~15 us on a mini-batch of 800 nodes x 64 channels)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (num_nodes, channels), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor (float32, float64, bfloat16 or float16), got {x.dtype}")
    check_float_dtype(name, x.dtype)
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_nodes, channels), got shape {tuple(x.shape)}")
    if x.size(0) != num_nodes:
        raise ValueError(f"{name} has {x.size(0)} rows but the graph has {num_nodes} nodes")
    if channels is not None and x.size(1) != channels:
        raise ValueError(f"{name} has {x.size(1)} columns but the layer expects in_channels={channels}")
    if x.grad_fn is None and not computed_in_model(x):
        check_finite(name, x)


# ------------------------------------------ the tensors a caller passed to its model
# NOTE (issue 21): under ``torch.no_grad`` (evaluation, inference) the activations a
# model computes carry no ``grad_fn``, so without more to go on every layer's input
# looked like the caller's data and was scanned for NaN/Inf: ~160 us of a ~1.4 ms GIN
# evaluation forward on 32 small graphs with every layer's scan removed, and 55-100 us
# less with this scope (the caller's x still scanned; measured 2026-11-29, 2-core VM,
# one process, hooked and unhooked models alternating), where PyG scans none. ``optimize()`` therefore marks its model's forward
# (:class:`ModelInputs`): inside it, only the tensors the caller passed are scanned.


class _Scope(threading.local):
    def __init__(self):
        self.inputs: list = []  # per running optimize()d forward, innermost last: frozenset of ids, or None (unknown)


_SCOPE = _Scope()


def computed_in_model(t: torch.Tensor) -> bool:
    """Whether ``t`` was computed inside the forward of an ``optimize()``d model that
    is running now (in this thread): not one of the tensors its caller passed
    (:class:`ModelInputs`). False outside such a forward, and when its inputs could
    not all be listed (then every tensor counts as the caller's)."""
    stack = _SCOPE.inputs
    if not stack:
        return False
    ids = stack[-1]
    return ids is not None and id(t) not in ids


def _input_ids(args: tuple, kwargs: dict) -> frozenset | None:
    """The ids of the tensors in a forward's arguments: direct, in lists, tuples and
    dicts, and in PyG ``Data`` / ``Batch`` / ``HeteroData`` objects (their stores);
    None when an argument is something else that might hold tensors."""
    ids = set()

    def add(v) -> bool:  # (False: v may hold tensors that cannot be listed)
        if isinstance(v, torch.Tensor):
            ids.add(id(v))
            return True
        if v is None or isinstance(v, (bool, int, float, str)):
            return True
        if isinstance(v, (list, tuple)):
            return all(add(u) for u in v)
        if isinstance(v, dict):
            return all(add(u) for u in v.values())
        stores = getattr(v, "stores", None)  # (PyG's BaseData: a list of attribute mappings)
        return isinstance(stores, list) and all(add(dict(store)) for store in stores)

    if not (all(add(v) for v in args) and all(add(v) for v in kwargs.values())):
        return None
    return frozenset(ids)


class ModelInputs:
    """What :func:`corgnn.optimize` puts on the model it returns: a forward pre-hook
    and an always-called forward hook (run also on an exception) bracketing each
    forward, so that :func:`check_features` scans for NaN/Inf the
    tensors the caller passed and not the activations the model computes (as it
    already skips those with a ``grad_fn``): the forward's tensor arguments (also
    inside lists, tuples, dicts and PyG data objects) are recorded by identity for
    the duration (with autograd on nothing is recorded: activations then carry a
    ``grad_fn``). A layer called outside such a forward scans its input as before.
    Plain callables of a module-level class: a model carrying them pickles and
    deep-copies. Inactive while ``torch.compile`` traces."""

    @staticmethod
    def install(module: torch.nn.Module) -> None:
        """Register the hooks on ``module`` once (a second ``optimize`` adds none)."""
        if any(isinstance(h, _EnterModel) for h in module._forward_pre_hooks.values()):
            return
        module.register_forward_pre_hook(_EnterModel(), with_kwargs=True)
        module.register_forward_hook(_LeaveModel(), with_kwargs=True, always_call=True)


class _EnterModel:
    def __call__(self, module, args, kwargs):
        if not torch.compiler.is_compiling():
            # (with autograd on, the activations that matter carry a grad_fn: no list needed)
            _SCOPE.inputs.append(None if torch.is_grad_enabled() else _input_ids(args, kwargs))


class _LeaveModel:
    def __call__(self, module, args, kwargs, output):
        if not torch.compiler.is_compiling() and _SCOPE.inputs:
            _SCOPE.inputs.pop()


# --------------------------------------------- index arrays of the sparse formats
# (here, not in corgnn.sparse.formats: the O(q) builders of corgnn.sparse.build check
# their arguments with them too, and formats imports build)


def check_shape(shape, what: str) -> tuple[int, int]:
    """``shape`` as an ``(n, m)`` tuple of non-negative ints (symbolic sizes kept
    while ``torch.compile`` traces).

    Raises:
        TypeError: not a pair of ints.
        ValueError: a negative size.
    """
    if torch.compiler.is_compiling():  # symbolic sizes while tracing (the traced paths build their arrays in the library)
        return tuple(shape)
    try:
        n, m = shape
    except (TypeError, ValueError):
        raise TypeError(f"{what}: shape must be a pair (n, m) of ints, got {shape!r}") from None
    if any(isinstance(d, torch.SymInt) for d in (n, m)):
        return (n, m)
    if any(isinstance(d, bool) or not hasattr(d, "__index__") for d in (n, m)):
        raise TypeError(f"{what}: shape must be a pair (n, m) of ints, got {shape!r}")
    n, m = operator.index(n), operator.index(m)
    if n < 0 or m < 0:
        raise ValueError(f"{what}: shape must be non-negative, got {(n, m)}")
    return (n, m)


def check_index(t, name: str, what: str, *, dim: int = 1, dtype: torch.dtype = torch.long, device=None) -> None:
    """Structural checks of one index tensor: a tensor of ``dtype`` with ``dim``
    dimensions (on ``device`` when given).

    Raises:
        TypeError: not a tensor, or another dtype.
        ValueError: another number of dimensions, or another device.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a {dtype} tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{what}: {name} must have dtype {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{what}: {name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{what}: {name} is on {t.device} but the other index arrays are on {device}")


def can_read(*tensors) -> bool:
    """Whether the tensors hold data that may be read (not fake / meta under tracing)."""
    return not torch.compiler.is_compiling() and all(t.device.type != "meta" for t in tensors)


def index_stats(*terms: torch.Tensor) -> list:
    """The 0-d tensors ``terms`` read to the host in one transfer (one sync)."""
    if not terms:
        return []
    return torch.stack([t.reshape(()).to(torch.long) for t in terms]).tolist()


def min_max(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if t.numel() == 0:  # (0, -1): inside every range
        return torch.zeros((), dtype=torch.long, device=t.device), torch.full((), -1, dtype=torch.long, device=t.device)
    lo, hi = torch.aminmax(t)
    return lo, hi


def ptr_terms(ptr: torch.Tensor) -> list[torch.Tensor]:
    """``[ptr[0], ptr[-1], number of decreasing steps]``."""
    return [ptr[0], ptr[-1], (ptr[1:] < ptr[:-1]).sum()]


def check_ptr(stats, name: str, what: str, nnz: int, idx_name: str) -> None:
    first, last, drops = stats
    if first != 0:
        raise ValueError(f"{what}: {name} must start at 0, got {first}")
    if drops:
        raise ValueError(f"{what}: {name} must be non-decreasing ({drops} decreasing step(s))")
    if last != nnz:
        raise ValueError(f"{what}: {name} must end at nnz = len({idx_name}) = {nnz}, got {last}")


def check_range(stats, name: str, what: str, size: int, low: int = 0) -> None:
    lo, hi = stats
    if lo < low or hi >= size:
        bad = lo if lo < low else hi
        raise ValueError(f"{what}: {name} must lie in [{low}, {size}), found {bad}")


def check_sorted(drops: int, name: str, what: str) -> None:
    if drops:
        raise ValueError(f"{what}: {name} must be sorted (non-decreasing) for a row-sorted format ({drops} decreasing step(s))")


def validate_compressed(ptr, idx, shape, what: str, ptr_name: str, idx_name: str, *, check: bool) -> tuple[int, int]:
    """Checks of a compressed pair (``ptr (n+1,)``, ``idx (nnz,)`` in ``[0, m)``) with
    ``(n, m) = shape`` (CSR: rows; CSC passes the transposed shape). Returns the shape.

    Raises:
        TypeError / ValueError: as described in :data:`corgnn.sparse.formats.VALIDATION_DOC`.
    """
    shape = check_shape(shape, what)
    check_index(ptr, ptr_name, what)
    check_index(idx, idx_name, what, device=ptr.device)
    n, m = shape
    if ptr.numel() != n + 1:
        raise ValueError(f"{what}: {ptr_name} must have shape ({n + 1},) for {n} compressed rows, got {tuple(ptr.shape)}")
    if check and can_read(ptr, idx):
        s = index_stats(*ptr_terms(ptr), *min_max(idx))
        check_ptr(s[:3], ptr_name, what, idx.numel(), idx_name)
        check_range(s[3:], idx_name, what, m)
    return shape


def validate_coo(row, col, shape, what: str, *, check: bool, sorted_rows: bool = False) -> tuple[int, int]:
    """Checks of coordinate arrays ``row (nnz,)`` in ``[0, n)`` and ``col (nnz,)`` in
    ``[0, m)`` (and, with ``sorted_rows``, ``row`` non-decreasing). Returns the shape.

    Raises:
        TypeError / ValueError: as described in :data:`corgnn.sparse.formats.VALIDATION_DOC`.
    """
    shape = check_shape(shape, what)
    check_index(row, "row", what)
    check_index(col, "col", what, device=row.device)
    if row.shape != col.shape:
        raise ValueError(f"{what}: row and col must have equal length, got {tuple(row.shape)} and {tuple(col.shape)}")
    if check and can_read(row, col):
        terms = [*min_max(row), *min_max(col)]
        if sorted_rows:
            terms.append((row[1:] < row[:-1]).sum())
        s = index_stats(*terms)
        check_range(s[0:2], "row", what, shape[0])
        check_range(s[2:4], "col", what, shape[1])
        if sorted_rows:
            check_sorted(s[4], "row", what)
    return shape
