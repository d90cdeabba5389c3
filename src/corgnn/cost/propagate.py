"""Plan of a K-hop propagation layer (SGC ``S^K X Θ + b``, APPNP's ``K`` steps).

The paper's reordering argument (§"Analysis of the GCN Computational Graph", Table 1)
applied to ``K`` propagations: SGC's ``S^K X Θ`` can run its ``K`` SpMMs on the
``m`` input columns (propagate-first) or on the ``k`` output columns after the
transform (transform-first); its backward repeats them on the same widths. When the
input is a constant (no gradient: the dataset's features), propagate-first keeps
``S^K X`` across calls, so every later call runs no SpMM at all, forward or
backward (the cross-epoch form of the paper's cache; SGC's ``cached=True``).
APPNP (``k`` = None) only propagates: one candidate, cached the same way.

Costs use :mod:`corgnn.cost.gcn`'s kernel model (SpMM memory-bound, GEMM
FLOP-bound, :class:`~corgnn.cost.gcn.MachineModel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .gcn import MachineModel, format_number, gemm_cost, spmm_cost

__all__ = ["PROPAGATION_ORDERS", "OrderCost", "PropagationPlan", "plan_propagation"]

PROPAGATION_ORDERS = ("transform-first", "propagate-first")
"""Orders of SGC's ``S^K X Θ`` (APPNP: propagate-first only)."""


@dataclass(frozen=True)
class OrderCost:
    """Costs of one order for one call (forward, plus backward when training)."""

    order: str
    spmm_columns: tuple[int, ...]
    flops: int
    bytes: int
    time_s: float

    def row(self) -> dict:
        return {
            "order": self.order,
            "SpMMs (cols)": f"{len(self.spmm_columns)} x {self.spmm_columns[0]}" if self.spmm_columns else "-",
            "GFLOP": self.flops / 1e9,
            "MB moved": self.bytes / 1e6,
            "est. ms": self.time_s * 1e3,
        }


@dataclass(frozen=True)
class PropagationPlan:
    """The order chosen for one call, every order's cost and the reason."""

    order: str
    cached: bool  # S^K X (APPNP: the output) is kept across calls (constant input)
    costs: tuple[OrderCost, ...]
    reason: str
    layer: str
    n: int
    q: int
    m: int
    k: int | None
    K: int
    input_grad: bool
    training: bool

    @property
    def name(self) -> str:
        return self.order + ("+cache" if self.cached else "")

    def table(self) -> str:
        """Human-readable table of the candidates and the choice."""
        rows = [c.row() for c in self.costs]
        head = list(rows[0])
        widths = [max(len(h), *(len(format_number(r[h])) for r in rows)) for h in head]
        lines = [
            f"{self.layer} n={self.n} q={self.q} m={self.m}" + (f" k={self.k}" if self.k is not None else "")
            + f" K={self.K} input grad={'yes' if self.input_grad else 'no'}{'' if self.training else ' (inference)'}",
            "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  choice",
        ]
        for c, r in zip(self.costs, rows):
            lines.append("  ".join(format_number(r[h]).ljust(w) for h, w in zip(head, widths)) + ("  <==" if c.order == self.order else ""))
        lines.append(f"choice: {self.name} ({self.reason})")
        return "\n".join(lines)


def _order_cost(order: str, n, q, m, k, K, input_grad, training, cache_hit, mm: MachineModel) -> OrderCost:
    ops, cols = [], []

    def spmm(c, times=K):
        cols.extend([c] * times)
        ops.extend([spmm_cost(q, n, n, c, mm)] * times)

    if order == "transform-first":
        ops.append(gemm_cost(n, m, k, mm))
        spmm(k)
        if training:
            spmm(k)  # (S^T)^K G
            ops.append(gemm_cost(m, n, k, mm))  # dΘ = X^T (S^T)^K G
            if input_grad:
                ops.append(gemm_cost(n, k, m, mm))
    else:
        if not cache_hit:
            spmm(m)
        if k is not None:
            ops.append(gemm_cost(n, m, k, mm))
            if training:
                ops.append(gemm_cost(m, n, k, mm))  # dΘ = (S^K X)^T G
                if input_grad:
                    ops.append(gemm_cost(n, k, m, mm))
        if training and input_grad:
            spmm(m)  # dX = (S^T)^K (G Θ^T)
    flops = sum(f for f, _ in ops)
    nbytes = sum(b for _, b in ops)
    return OrderCost(order, tuple(cols), flops, nbytes, sum(f / mm.flop_rate + b / mm.bandwidth for f, b in ops))


def plan_propagation(
    n: int, q: int, m: int, k: int | None, K: int, input_grad: bool, *, training: bool = True,
    constant_input: bool = False, scheme: str = "auto", machine: MachineModel = MachineModel(),
    layer: str = "SGConv",
) -> PropagationPlan:
    """Choose the order of a K-hop propagation layer for one call.

    Args:
        n, q: nodes and stored entries of the propagation matrix ``S``.
        m: input features; k: output features of the Linear (None: propagation only,
            APPNP); K: propagation steps.
        input_grad: whether ``dL/dX`` is needed.
        training: False when no backward pass runs.
        constant_input: ``X`` is a constant (no gradient, unchanged between calls), so
            propagate-first keeps ``S^K X`` across calls: its cost is counted without
            SpMMs (the first call's ``K`` SpMMs amortised over the epochs).
        scheme: ``"auto"``, ``"transform-first"`` or ``"propagate-first"`` (forced;
            costs still reported).
        layer: name shown in :meth:`PropagationPlan.table`.

    Returns:
        :class:`PropagationPlan`.

    Raises:
        ValueError: negative sizes, ``K < 0``, an unknown scheme, or transform-first
            without a Linear.
    """
    for name, v in (("n", n), ("q", q), ("m", m), ("K", K), ("k", 0 if k is None else k)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    orders = PROPAGATION_ORDERS if k is not None else PROPAGATION_ORDERS[1:]
    if scheme != "auto" and scheme not in orders:
        raise ValueError(f"unknown {layer} scheme {scheme!r}; choose 'auto' or one of {list(orders)}")
    cached = constant_input and not input_grad
    costs = tuple(_order_cost(o, n, q, m, k, K, input_grad, training, cached and o == "propagate-first", machine) for o in orders)
    if scheme != "auto":
        best, reason = next(c for c in costs if c.order == scheme), "forced by the caller"
    else:
        best = min(costs, key=lambda c: round(c.time_s, 12))
        if len(costs) == 1:
            reason = f"{K} SpMMs on {m} columns" + ("; constant input: the result is kept across calls" if cached else "")
        else:
            other = next(c for c in costs if c is not best)
            reason = f"est. {best.time_s * 1e3:.3g} ms vs {other.time_s * 1e3:.3g} ms for {other.order}"
            if cached:
                reason += "; constant input: S^K X kept across calls (no SpMM after the first)"
    return PropagationPlan(best.order, cached and best.order == "propagate-first", costs, reason, layer, n, q, m, k, K, input_grad, training)
