"""GATv2 caching plan: what each caching scheme keeps for backward, and what it recomputes.

The GATv2 layer (Brody et al., "How Attentive are Graph Attention Networks?", PyG
``GATv2Conv``) maps ``x (n, m)`` to the source side ``XL = x W_l^T + b_l`` and the
target side ``XR = x W_r^T + b_r`` (each ``(n, h, k)``; one tensor with
``share_weights``), per-edge scores ``e = <a, LeakyReLU(XL[j] + XR[i])>`` and
attention ``alpha (q, h)`` over the ``q`` entries of the adjacency (self-loops
included), and the output ``(n, h, k)``. Unlike GAT (paper Table 4) the score does
not split into node terms, so there is no "node attention" level; the backward pass
needs ``XL``, ``XR`` and ``alpha``, and each scheme caches a prefix of that chain:

==============  ====================================  ===========================  ==========================
scheme          kept beyond ``x`` and params           backward recomputes          extra memory (float32)
==============  ====================================  ===========================  ==========================
none            ``lse (n, h)``                         ``XL``, ``XR`` (GEMMs),      ``4nh``
                                                       the scores, ``alpha``
features        ``XL``, ``XR (n, h, k)``, ``lse``      the scores, ``alpha``        ``8nhk + 4nh``
edge_weights    ``XL``, ``XR``, ``alpha (q, h)``       nothing but ``LeakyReLU'``   ``8nhk + 4qh``
==============  ====================================  ===========================  ==========================

``lse`` is each destination row's log-sum-exp of the scores (FlashAttention's row
statistic): with it the backward recomputes ``alpha_e = exp(e - lse_i)`` in one walk
of the row, without the max and sum walks. No scheme keeps a per-edge-and-channel
``(q, h, k)`` value: every backward recomputes ``t = XL[j] + XR[i]`` per edge for
``LeakyReLU'(t)``, which is the same work as the forward's scores. With
``share_weights`` (one input) ``XR = XL`` is kept once (``4nhk`` instead of
``8nhk``). Every scheme also keeps ``x`` (for the weight gradients) and, with
attention dropout, the 8-byte seed from which backward redraws the mask
(:mod:`corgnn.sparse.rng`).

The estimated time of a scheme is the cost of its recomputation (FLOPs / rate + bytes
/ bandwidth, :class:`~corgnn.cost.gcn.MachineModel`). More caching is never slower,
so without a budget the plan picks "edge_weights"; a ``memory_budget`` on the extra
bytes picks the fastest scheme that fits (:func:`corgnn.cost.gat.choose_cache`).
"""

from __future__ import annotations

from .gat import GATCacheCost, GATPlan, check_plan_args, choose_cache
from .gcn import MachineModel

__all__ = ["GATV2_CACHE_SCHEMES", "parse_gatv2_cache", "gatv2_saved_tensors", "gatv2_bytes_saved", "gatv2_scheme_cost", "plan_gatv2"]

GATV2_CACHE_SCHEMES: tuple[str, ...] = ("none", "features", "edge_weights")
_ALIASES = {"nocache": "none", "no": "none", "xl_xr": "features", "edge": "edge_weights", "alpha": "edge_weights", "full": "edge_weights"}
_EXP_FLOPS = 20  # one exp() counted as 20 FLOP-equivalents (as cost/gat.py)


def parse_gatv2_cache(cache: str) -> str:
    """Canonical GATv2 caching-scheme name (one of :data:`GATV2_CACHE_SCHEMES` or an alias).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if isinstance(cache, str):
        c = _ALIASES.get(cache, cache).replace("-", "_")
        if c in GATV2_CACHE_SCHEMES:
            return c
    raise ValueError(f"unknown GATv2 caching scheme {cache!r}; choose 'auto' or one of {GATV2_CACHE_SCHEMES}")


def gatv2_saved_tensors(
    scheme: str, n: int, q: int, h: int, k: int, m: int, *, value_bytes: int = 4, n_src: int | None = None, shared: bool = False,
) -> list[tuple[str, tuple[int, ...], int]]:
    """The activations ``scheme`` keeps for backward beyond ``x`` and the parameters:
    ``[(name, shape, bytes), ...]`` (see the module table). ``n`` destination nodes,
    ``n_src`` source nodes (default ``n``), ``shared``: ``XR`` is ``XL``."""
    scheme = parse_gatv2_cache(scheme)
    n_src = n if n_src is None else n_src
    check_plan_args(None, n=n, q=q, h=h, k=k, m=m, n_src=n_src)
    out: list[tuple[str, tuple[int, ...], int]] = []
    if scheme != "none":
        out.append(("XL", (n_src, h, k), n_src * h * k * value_bytes))
        if not shared:
            out.append(("XR", (n, h, k), n * h * k * value_bytes))
    if scheme == "edge_weights":
        out.append(("alpha", (q, h), q * h * value_bytes))
    else:
        out.append(("lse", (n, h), n * h * value_bytes))
    return out


def gatv2_bytes_saved(
    scheme: str, n: int, q: int, h: int, k: int, m: int, *, value_bytes: int = 4, include_input: bool = False,
    n_src: int | None = None, shared: bool = False,
) -> int:
    """Bytes ``scheme`` keeps for the backward pass: ``4nh`` / ``8nhk + 4nh`` /
    ``8nhk + 4qh`` for float32 (none / features / edge_weights; ``4nhk`` less with
    ``shared``), plus ``x (n, m)`` with ``include_input``.

    Raises:
        ValueError: unknown scheme or negative sizes.
    """
    extra = sum(b for _, _, b in gatv2_saved_tensors(scheme, n, q, h, k, m, value_bytes=value_bytes, n_src=n_src, shared=shared))
    return extra + ((n if n_src is None else n_src) * m * value_bytes if include_input else 0)


def gatv2_scheme_cost(scheme: str, n: int, q: int, h: int, k: int, m: int, mm: MachineModel = MachineModel(), *, shared: bool = False) -> GATCacheCost:
    """Memory and recomputation cost of ``scheme`` (see the module table)."""
    scheme = parse_gatv2_cache(scheme)
    vb, ib = mm.value_bytes, mm.index_bytes
    hk = h * k
    sides = 1 if shared else 2
    flops = nbytes = 0
    if scheme == "none":  # XL (and XR) = x W^T + b
        flops += sides * 2 * n * m * hk
        nbytes += sides * (n * m + m * hk + n * hk) * vb
    if scheme != "edge_weights":
        # the scores and alpha: one more walk of every row gathering XL[j] (h k values)
        flops += q * (4 * hk + h * _EXP_FLOPS)
        nbytes += q * (ib + hk * vb) + 2 * n * h * vb
    else:
        nbytes += q * h * vb  # read the cached alpha
    extra = gatv2_bytes_saved(scheme, n, q, h, k, m, value_bytes=vb, shared=shared)
    time_s = flops / mm.flop_rate + nbytes / mm.bandwidth
    return GATCacheCost(scheme, extra, extra + n * m * vb, flops, nbytes, time_s)


def plan_gatv2(
    n: int,
    q: int,
    h: int,
    k: int,
    m: int,
    *,
    cache: str = "auto",
    memory_budget: int | None = None,
    training: bool = True,
    value_bytes: int = 4,
    shared: bool = False,
    machine: MachineModel | None = None,
) -> GATPlan:
    """Choose the caching scheme of one GATv2 layer call.

    Args:
        n, q, h, k, m: nodes, adjacency entries, heads, features per head, input features.
        cache: ``"auto"`` or a scheme to force (costs are still reported).
        memory_budget: with ``"auto"``, the most bytes the layer may keep for backward
            beyond ``x`` and the parameters; ``None`` = unlimited ("edge_weights").
        training: False when no backward pass runs (the plan says "none").
        value_bytes: 4 (float32) or 8 (float64).
        shared: ``share_weights`` with one input (``XR = XL``, kept once).

    Returns:
        :class:`~corgnn.cost.gat.GATPlan` (``layer="GATv2"``; ``table()`` lists every scheme).

    Raises:
        ValueError: negative sizes or budget, unknown scheme.
    """
    check_plan_args(memory_budget, n=n, q=q, h=h, k=k, m=m)
    mm = machine or MachineModel(value_bytes=value_bytes)
    costs = tuple(gatv2_scheme_cost(s, n, q, h, k, m, mm, shared=shared) for s in GATV2_CACHE_SCHEMES)
    chosen = parse_gatv2_cache(cache) if cache != "auto" else "auto"
    full = "fastest: caches XL, XR and alpha, recomputes only LeakyReLU' per edge"
    return choose_cache(costs, (n, q, h, k, m), chosen, memory_budget, training, full, layer="GATv2")
