"""TransformerConv caching plan: what each caching scheme keeps for backward, and what
it recomputes (the counterpart of :mod:`corgnn.cost.gat`, paper Table 4, for PyG's
``TransformerConv``, i.e. graph dot-product attention).

A layer with ``h`` heads of ``c`` channels maps ``X (n, m)`` to queries, keys and
values ``Q, K, V = X W_q^T + b_q, ... (n, h, c)``, the scores
``s_e = <Q_i, K_j> / sqrt(c)`` and attention ``alpha (q, h)`` over the ``q`` edges
(no self-loops added), and ``out_i = sum_e alpha_e V_j (n, h, c)``. The backward pass
(:mod:`corgnn.functional.transformer`) needs ``Q, K, V`` and the attention (the
softmax backward's row sums ``D_i = <G_i, out_i>`` it takes from each row's own
entries, so no scheme keeps ``out``); each scheme keeps a prefix of that chain and
recomputes the rest, as FlashAttention keeps only the row's log-sum-exp:

============  =====================================  ==========================  ======================
scheme        kept beyond ``x`` and params            backward recomputes         extra memory (float32)
============  =====================================  ==========================  ======================
none          --                                     ``Q, K, V`` (3 GEMMs),      0
                                                     ``lse`` (forward kernel)
features      ``Q, K, V (n, h, c)``                  ``lse`` (forward kernel)    ``12nhc``
row_stats     ``Q, K, V``, ``lse (n, h)``            ``alpha`` from ``lse``      ``12nhc + 4nh``
                                                     (one dot per edge and head)
edge_weights  ``Q, K, V``, ``alpha (q, h)``          nothing                     ``12nhc + 4qh``
============  =====================================  ==========================  ======================

(float64 doubles the bytes; with ``f`` edge features per edge "row_stats" and
"edge_weights" also keep ``Ae = sum_e alpha_e attr_e (n, h, f)``). Every scheme also keeps ``x`` (for ``dL/dW = dQ^T X``,
...) and, with attention dropout, the 8-byte seed from which the backward redraws
the mask. The estimated time of a scheme is the cost of its recomputation
(:class:`~corgnn.cost.gcn.MachineModel`); more caching is never slower, so without a
``memory_budget`` the plan picks "edge_weights"; with one, the fastest scheme that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gat import GATCacheCost, GATPlan
from .gcn import MachineModel

__all__ = ["TRANSFORMER_CACHE_SCHEMES", "TransformerPlan", "transformer_saved_tensors", "transformer_bytes_saved", "plan_transformer", "parse_transformer_cache"]

TRANSFORMER_CACHE_SCHEMES: tuple[str, ...] = ("none", "features", "row_stats", "edge_weights")
_ALIASES = {"nocache": "none", "no": "none", "qkv": "features", "stats": "row_stats", "lse": "row_stats", "edge": "edge_weights", "alpha": "edge_weights", "full": "edge_weights"}
_EXP_FLOPS = 20  # one exp() counted as 20 FLOP-equivalents (as cost.gat)


def parse_transformer_cache(cache: str) -> str:
    """Canonical caching-scheme name (one of :data:`TRANSFORMER_CACHE_SCHEMES`, or an alias).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if isinstance(cache, str):
        c = _ALIASES.get(cache, cache).replace("-", "_")
        if c in TRANSFORMER_CACHE_SCHEMES:
            return c
    raise ValueError(f"unknown TransformerConv caching scheme {cache!r}; choose 'auto' or one of {TRANSFORMER_CACHE_SCHEMES}")


def _check_sizes(**sizes) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")


def transformer_saved_tensors(scheme: str, n: int, q: int, h: int, c: int, *, n_src: int | None = None, edge_dim: int = 0, value_bytes: int = 4) -> list[tuple[str, tuple[int, ...], int]]:
    """The activations ``scheme`` keeps for backward beyond ``x`` and the parameters:
    ``[(name, shape, bytes), ...]`` (see the module table); ``n`` destination nodes,
    ``n_src`` source nodes (default ``n``), ``q`` edges, ``h`` heads, ``c`` channels,
    ``edge_dim`` edge features (``f``: "row_stats" and "edge_weights" also keep
    ``Ae = sum_e alpha_e attr_e (n, h, f)``; the edge features themselves are an input)."""
    scheme = parse_transformer_cache(scheme)
    n_src = n if n_src is None else n_src
    _check_sizes(n=n, q=q, h=h, c=c, n_src=n_src, edge_dim=edge_dim)
    out: list[tuple[str, tuple[int, ...], int]] = []
    if scheme != "none":
        out += [("Q", (n, h, c), n * h * c * value_bytes), ("K", (n_src, h, c), n_src * h * c * value_bytes), ("V", (n_src, h, c), n_src * h * c * value_bytes)]
    if scheme in ("row_stats", "edge_weights") and edge_dim:
        out.append(("Ae", (n, h, edge_dim), n * h * edge_dim * value_bytes))
    if scheme == "row_stats":
        out.append(("lse", (n, h), n * h * value_bytes))
    if scheme == "edge_weights":
        out.append(("alpha", (q, h), q * h * value_bytes))
    return out


def transformer_bytes_saved(scheme: str, n: int, q: int, h: int, c: int, m: int, *, n_src: int | None = None, edge_dim: int = 0, value_bytes: int = 4, include_input: bool = False) -> int:
    """Bytes ``scheme`` keeps for the backward pass: ``0`` / ``12nhc`` / ``12nhc + 4nh``
    / ``12nhc + 4qh`` for float32 (none / features / row_stats / edge_weights, one
    node set; with ``edge_dim`` f the last two add ``4nhf``), plus the input ``x (n, m)``
    with ``include_input``.

    Raises:
        ValueError: unknown scheme or negative sizes.
    """
    extra = sum(b for _, _, b in transformer_saved_tensors(scheme, n, q, h, c, n_src=n_src, edge_dim=edge_dim, value_bytes=value_bytes))
    return extra + (n * m * value_bytes if include_input else 0)


def scheme_cost(scheme: str, n: int, q: int, h: int, c: int, m: int, mm: MachineModel = MachineModel(), edge_dim: int = 0) -> GATCacheCost:
    """Memory and recomputation cost of ``scheme`` (see the module table; ``edge_dim``
    adds each edge's ``f`` features to the walks that recompute the scores)."""
    scheme = parse_transformer_cache(scheme)
    vb, ib = mm.value_bytes, mm.index_bytes
    hc = h * c
    flops = nbytes = 0
    if scheme == "none":  # Q, K, V = X W^T + b: three GEMMs
        flops += 3 * 2 * n * m * hc
        nbytes += 3 * (n * m + m * hc + n * hc) * vb
    if scheme in ("none", "features"):  # the forward kernel again: scores, softmax, SpMM
        flops += q * h * (4 * (c + edge_dim) + _EXP_FLOPS)
        nbytes += q * (ib + 2 * hc * vb + edge_dim * vb) + 2 * n * hc * vb
    elif scheme == "row_stats":  # alpha_e = exp(<Q_i, K_j> scale - lse_i): one more dot per edge
        flops += q * h * (2 * (c + edge_dim) + _EXP_FLOPS)
        nbytes += q * hc * vb + n * h * vb
    else:
        nbytes += q * h * vb  # read the cached alpha
    extra = transformer_bytes_saved(scheme, n, q, h, c, m, edge_dim=edge_dim, value_bytes=vb)
    time_s = flops / mm.flop_rate + nbytes / mm.bandwidth
    return GATCacheCost(scheme, extra, extra + n * m * vb, flops, nbytes, time_s)


@dataclass(frozen=True)
class TransformerPlan(GATPlan):
    """The caching scheme of one ``TransformerConv`` call, every candidate's cost and
    the reason (``k`` = channels per head ``c``, ``m`` input features)."""

    def table(self) -> str:
        """Human-readable table of every scheme's cost and the choice."""
        return super().table().replace("GAT layer", "TransformerConv layer", 1)


def plan_transformer(
    n: int,
    q: int,
    h: int,
    c: int,
    m: int,
    *,
    cache: str = "auto",
    memory_budget: int | None = None,
    training: bool = True,
    value_bytes: int = 4,
    machine: MachineModel | None = None,
    edge_dim: int = 0,
) -> TransformerPlan:
    """Choose the caching scheme of one ``TransformerConv`` call.

    Args:
        n, q, h, c, m: nodes, edges, heads, channels per head, input features.
        cache: ``"auto"`` or a scheme to force (costs are still reported).
        memory_budget: with ``"auto"``, the most bytes the call may keep for backward
            beyond ``x`` and the parameters; ``None`` = unlimited ("edge_weights").
        training: False when no backward pass runs (nothing is cached: "none").
        value_bytes: 4 (float32) or 8 (float64).
        edge_dim: edge features per edge (0: none).

    Returns:
        :class:`TransformerPlan`.

    Raises:
        ValueError: negative sizes or budget, unknown scheme.
    """
    _check_sizes(n=n, q=q, h=h, c=c, m=m, edge_dim=edge_dim)
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 0):
        raise ValueError(f"memory_budget must be None or a non-negative int (bytes), got {memory_budget!r}")
    mm = machine or MachineModel(value_bytes=value_bytes)
    costs = tuple(scheme_cost(s, n, q, h, c, m, mm, edge_dim) for s in TRANSFORMER_CACHE_SCHEMES)
    args = (n, q, h, c, m)
    if cache != "auto":
        return TransformerPlan(parse_transformer_cache(cache), costs, "forced by the caller", *args, training=training, forced=True, memory_budget=memory_budget)
    if not training:
        return TransformerPlan("none", costs, "inference: no backward pass, nothing cached", *args, training=False, memory_budget=memory_budget)
    fits = [cc for cc in costs if memory_budget is None or cc.extra_bytes <= memory_budget]
    best = min(fits, key=lambda cc: (cc.time_s, cc.extra_bytes))
    if memory_budget is None:
        reason = "fastest: keeps Q, K, V and alpha, no recomputation"
    else:
        reason = f"fastest within the budget of {memory_budget} bytes (keeps {best.extra_bytes} extra bytes)"
    return TransformerPlan(best.scheme, costs, reason, *args, training=True, memory_budget=memory_budget)

