"""GAT caching plan: what each caching scheme keeps for backward, and what it recomputes.

Paper §"Analysis of the GAT Computation", Table 4 ("Comparison of time-memory
trade-offs in GAT") and appendix "GAT Caching". A GAT layer with ``h`` heads maps
``X (n, m)`` to ``M = XΘ (n, h, k)``, node attention ``s, d (n, h)``, edge attention
``alpha (q, h)`` over the ``q`` entries of the adjacency (self-loops included) and the
output ``(n, h, k)``. The backward pass needs ``M``, ``alpha`` and the LeakyReLU mask;
each scheme caches a prefix of that chain and recomputes the rest:

================  ===============================  =========================  =========================
scheme            kept beyond ``x`` and params      backward recomputes        Table 4 extra memory
================  ===============================  =========================  =========================
none              --                               ``M = XΘ`` (GEMM), s, d,   0
                                                   alpha, mask
features          ``M (n, h, k)``                  s, d, alpha, mask          ``4nhk``
node_attention    ``M``, ``s, d (n, h)``           alpha, mask                ``4nh(k+2)``
edge_weights      ``M``, ``alpha (q, h)``,         nothing                    ``4nhk + 5qh``
                  mask ``(q, h)`` bool
================  ===============================  =========================  =========================

(the byte counts are for float32; float64 doubles the value bytes, the bool mask
stays one byte per entry). Every scheme also keeps ``x`` (for ``dL/dΘ = X^T dL/dM``)
and refers to the parameters, which cost no extra memory, and, with attention
dropout, the 8-byte RNG seed from which the backward pass redraws the mask.

The estimated time of each scheme is the cost of its recomputation (FLOPs / rate +
bytes / bandwidth, :class:`~corgnn.cost.gcn.MachineModel`); the forward and the rest
of the backward are common to all. More caching is never slower, so the fastest
scheme is "edge_weights" (the paper's choice, §"Evaluation against baselines"); a
``memory_budget`` on the extra bytes picks the fastest scheme that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gcn import MachineModel

__all__ = ["GAT_CACHE_SCHEMES", "GATCacheCost", "GATPlan", "bytes_saved", "saved_tensors", "plan_gat", "parse_cache", "static_cache_name", "choose_cache", "check_plan_args"]

GAT_CACHE_SCHEMES: tuple[str, ...] = ("none", "features", "node_attention", "edge_weights")
_ALIASES = {"nocache": "none", "no": "none", "m": "features", "node": "node_attention", "edge": "edge_weights", "full": "edge_weights", "paper": "edge_weights"}
_EXP_FLOPS = 20  # one exp() counted as 20 FLOP-equivalents


def parse_cache(cache: str) -> str:
    """Canonical caching-scheme name (one of :data:`GAT_CACHE_SCHEMES`, or an alias).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if isinstance(cache, str):
        c = _ALIASES.get(cache, cache).replace("-", "_")
        if c in GAT_CACHE_SCHEMES:
            return c
    raise ValueError(f"unknown GAT caching scheme {cache!r}; choose 'auto' or one of {GAT_CACHE_SCHEMES}")


def _check_sizes(**sizes) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")


def saved_tensors(scheme: str, n: int, q: int, h: int, k: int, m: int, *, value_bytes: int = 4) -> list[tuple[str, tuple[int, ...], int]]:
    """The activations ``scheme`` keeps for backward beyond ``x`` and the parameters:
    ``[(name, shape, bytes), ...]`` (paper Table 4, "Cached values")."""
    scheme = parse_cache(scheme)
    _check_sizes(n=n, q=q, h=h, k=k, m=m)
    out: list[tuple[str, tuple[int, ...], int]] = []
    if scheme in ("features", "node_attention", "edge_weights"):
        out.append(("M", (n, h, k), n * h * k * value_bytes))
    if scheme == "node_attention":
        out += [("s", (n, h), n * h * value_bytes), ("d", (n, h), n * h * value_bytes)]
    if scheme == "edge_weights":
        out += [("alpha", (q, h), q * h * value_bytes), ("leaky_mask", (q, h), q * h)]
    return out


def bytes_saved(scheme: str, n: int, q: int, h: int, k: int, m: int, *, value_bytes: int = 4, include_input: bool = False) -> int:
    """Bytes ``scheme`` keeps for the backward pass (paper Table 4, "Additional memory use").

    Args:
        scheme: one of :data:`GAT_CACHE_SCHEMES`.
        n: nodes; q: adjacency entries (self-loops included); h: heads; k: output
            features per head; m: input features.
        value_bytes: 4 (float32) or 8 (float64).
        include_input: add the input ``x (n, m)``, which every scheme keeps.

    Returns:
        ``0`` / ``4nhk`` / ``4nh(k+2)`` / ``4nhk + 5qh`` for float32
        (none / features / node_attention / edge_weights), plus ``n m value_bytes``
        with ``include_input``.

    Raises:
        ValueError: unknown scheme or negative sizes.
    """
    extra = sum(b for _, _, b in saved_tensors(scheme, n, q, h, k, m, value_bytes=value_bytes))
    return extra + (n * m * value_bytes if include_input else 0)


@dataclass(frozen=True)
class GATCacheCost:
    """Cost of one caching scheme for one layer call."""

    scheme: str
    extra_bytes: int  # kept for backward beyond x and the parameters (Table 4)
    saved_bytes: int  # extra_bytes + x
    recompute_flops: int  # FLOPs the backward spends recomputing what was not cached
    recompute_bytes: int  # bytes moved by that recomputation
    time_s: float  # estimated recomputation time

    def row(self) -> dict:
        return {
            "scheme": self.scheme,
            "extra MB": self.extra_bytes / 1e6,
            "saved MB": self.saved_bytes / 1e6,
            "recompute MFLOP": self.recompute_flops / 1e6,
            "est. recompute ms": self.time_s * 1e3,
        }


def scheme_cost(scheme: str, n: int, q: int, h: int, k: int, m: int, mm: MachineModel = MachineModel()) -> GATCacheCost:
    """Memory and recomputation cost of ``scheme`` (see the module table)."""
    scheme = parse_cache(scheme)
    vb, ib = mm.value_bytes, mm.index_bytes
    hk = h * k
    flops = nbytes = 0
    if scheme == "none":  # M = X Θ
        flops += 2 * n * m * hk
        nbytes += (n * m + m * hk + n * hk) * vb
    if scheme in ("none", "features"):  # s, d
        flops += 4 * n * hk
        nbytes += (n * hk + 2 * hk + 2 * n * h) * vb
    if scheme != "edge_weights":
        # alpha and the mask: two extra walks of every row (max, sum) gathering s[src]
        flops += q * h * (2 * _EXP_FLOPS + 6)
        nbytes += 2 * q * (ib + h * vb) + 2 * n * h * vb
    else:
        nbytes += q * h * (vb + 1)  # read the cached alpha and mask instead of s[src]
    extra = bytes_saved(scheme, n, q, h, k, m, value_bytes=vb)
    time_s = flops / mm.flop_rate + nbytes / mm.bandwidth
    return GATCacheCost(scheme, extra, extra + n * m * vb, flops, nbytes, time_s)


@dataclass(frozen=True)
class GATPlan:
    """The caching scheme for one GAT layer call, every candidate's cost and the reason."""

    scheme: str
    costs: tuple[GATCacheCost, ...]
    reason: str
    n: int
    q: int
    h: int
    k: int
    m: int
    training: bool = True
    forced: bool = False
    memory_budget: int | None = None
    layer: str = "GAT"  # the layer named in :meth:`table` (GATv2 shares this plan record)

    @property
    def cost(self) -> GATCacheCost:
        return next(c for c in self.costs if c.scheme == self.scheme)

    def table(self) -> str:
        """Human-readable table of every scheme's cost and the choice."""
        rows = [c.row() for c in self.costs]
        head = list(rows[0])
        fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
        widths = [max(len(t), *(len(fmt(r[t])) for r in rows)) for t in head]
        lines = [
            f"{self.layer} layer n={self.n} q={self.q} heads={self.h} k={self.k} m={self.m}{'' if self.training else ' (inference)'}",
            "  ".join(t.ljust(w) for t, w in zip(head, widths)) + "  choice",
        ]
        for c, r in zip(self.costs, rows):
            lines.append("  ".join(fmt(r[t]).ljust(w) for t, w in zip(head, widths)) + ("  <==" if c.scheme == self.scheme else ""))
        lines.append(f"choice: {self.scheme} ({self.reason})")
        return "\n".join(lines)


def plan_gat(
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
    machine: MachineModel | None = None,
) -> GATPlan:
    """Choose the caching scheme of one GAT layer call.

    Args:
        n, q, h, k, m: nodes, adjacency entries, heads, features per head, input features.
        cache: ``"auto"`` or a scheme to force (costs are still reported).
        memory_budget: with ``"auto"``, the most bytes the layer may keep for
            backward beyond ``x`` and the parameters (Table 4's extra memory);
            ``None`` = unlimited, which picks "edge_weights".
        training: False when no backward pass runs (nothing is cached; the plan
            says "none").
        value_bytes: 4 (float32) or 8 (float64).

    Returns:
        :class:`GATPlan`.

    Raises:
        ValueError: negative sizes or budget, unknown scheme.
    """
    check_plan_args(memory_budget, n=n, q=q, h=h, k=k, m=m)
    mm = machine or MachineModel(value_bytes=value_bytes)
    costs = tuple(scheme_cost(s, n, q, h, k, m, mm) for s in GAT_CACHE_SCHEMES)
    full = "fastest: caches M, alpha and the LeakyReLU mask, no recomputation (paper's choice)"
    return choose_cache(costs, (n, q, h, k, m), parse_cache(cache) if cache != "auto" else "auto", memory_budget, training, full)


def check_plan_args(memory_budget: int | None, **sizes) -> None:
    """Raise ValueError for a negative (or non-int) size or ``memory_budget``."""
    _check_sizes(**sizes)
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 0):
        raise ValueError(f"memory_budget must be None or a non-negative int (bytes), got {memory_budget!r}")


def choose_cache(
    costs: tuple[GATCacheCost, ...], sizes: tuple[int, int, int, int, int], cache: str, memory_budget: int | None,
    training: bool, unlimited_reason: str, layer: str = "GAT",
) -> GATPlan:
    """The plan over candidate ``costs`` (one per scheme, least caching first): a forced
    ``cache`` (already a canonical name) as given; inference caches nothing (the
    first scheme); else the fastest within ``memory_budget`` (fewest bytes on a tie;
    the least memory when none fits), ``unlimited_reason`` naming it without a budget. Shared by :func:`plan_gat` and
    :func:`corgnn.cost.gatv2.plan_gatv2`. ``sizes`` = ``(n, q, h, k, m)``."""
    if cache != "auto":
        return GATPlan(cache, costs, "forced by the caller", *sizes, training=training, forced=True, memory_budget=memory_budget, layer=layer)
    if not training:
        return GATPlan(costs[0].scheme, costs, "inference: no backward pass, nothing cached", *sizes, training=False, memory_budget=memory_budget, layer=layer)
    fits = [c for c in costs if memory_budget is None or c.extra_bytes <= memory_budget]
    best = min(fits or costs, key=lambda c: (c.time_s, c.extra_bytes) if fits else (c.extra_bytes, c.time_s))
    if memory_budget is None:
        reason = unlimited_reason
    elif not fits:
        reason = f"no scheme fits the budget of {memory_budget} bytes: the least memory (keeps {best.extra_bytes} extra bytes)"
    else:
        reason = f"fastest within the budget of {memory_budget} bytes (keeps {best.extra_bytes} extra bytes)"
    return GATPlan(best.scheme, costs, reason, *sizes, training=True, memory_budget=memory_budget, layer=layer)


@torch.compiler.assume_constant_result
def static_cache_name(h: int, k: int, m: int, cache: str = "auto", memory_budget: int | None = None, training: bool = True) -> str:
    """The caching scheme a GAT layer uses under ``torch.compile``, where ``n`` and
    ``q`` are not known at trace time: a forced scheme as given; ``"auto"`` without
    a budget gives "edge_weights" (the fastest, as :func:`plan_gat`, whatever the
    sizes); with a ``memory_budget``, which is absolute bytes and so needs the sizes,
    the least-memory scheme "none" (documented: force a scheme to keep more).
    Inference caches nothing. Evaluated once at trace time (a graph constant).
    """
    if cache != "auto":
        return parse_cache(cache)
    if not training:
        return "none"
    return "edge_weights" if memory_budget is None else "none"
