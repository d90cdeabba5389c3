"""GCN scheme plan: FLOPs, bytes moved and transient memory of every scheme.

Paper §"Analysis of the GCN Computational Graph", Tables 1-2 and appendix "No memory
overhead with GCN caching". The layer computes ``X' = A' X Θ + b`` with ``A'`` sparse
``(n, n)`` with ``q`` stored entries, ``X (n, m)``, ``Θ (m, k)``.

Schemes (forward / backward / cache):

============================  =========================  ==============================
scheme                        forward                    backward (grad of Θ; of X if needed)
============================  =========================  ==============================
transform-first+fused         SpMM(A', XΘ)   [k cols]    P = A'^T G [k]; dΘ = X^T P; dX = P Θ^T
transform-first+split         SpMM(A', XΘ)   [k]         dΘ = (A'X)^T G [recompute, m]; dX = A'^T (G Θ^T) [m]
propagate-first+fused         (A'X) Θ        [m]         as transform-first+fused
propagate-first+split         (A'X) Θ        [m]         as transform-first+split (recomputes A'X)
propagate-first+split+cache   (A'X) Θ, keeps A'X [m]     dΘ = (A'X)^T G [no SpMM]; dX = A'^T (G Θ^T) [m]
...+cache+reuse               (A'X) Θ, A'X kept [-]      dΘ = (A'X)^T G [no SpMM]; no dX
============================  =========================  ==============================

The last one (issue 12, lever 1) reuses ``A'X`` kept *across calls*: when ``X`` is a
constant (a first layer reading the dataset's features, no input dropout), ``A'X``
is the same every epoch, so after the call that computes it the layer runs no SpMM
at all; it is a candidate only when the caller can keep ``A'X`` (``plan_gcn(...,
reuse=True)``), costs its steady state (no SpMM) and counts the ``n m`` values it
keeps (``kept``). With sparse ``X`` the dense ``A'X`` can lose to transform-first
over ``X``'s non-zeros; the same cost model decides.

All schemes run GEMMs of the same shapes; they differ in how many SpMMs run and on
how many columns. The plan estimates time as ``FLOPs / flop_rate + bytes /
bandwidth`` per kernel (SpMM is memory-bound, paper Table 6) and picks the cheapest,
breaking ties towards less transient memory. Its decisions reproduce the usage
conditions of Tables 1-2 (``k < m``, ``k < 2m``, ``k < m/2``): see ``tests/test_cost.py``.

The cache costs no memory (appendix): the cached scheme keeps ``A'X (n, m)`` for
backward *instead of* ``X (n, m)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["GCNScheme", "GCN_SCHEMES", "REUSE_SCHEME", "SchemeCost", "GCNPlan", "plan_gcn", "PLAN_SIGNIFICANT_BITS", "rounded_size", "parse_scheme", "MachineModel", "static_scheme_name", "REPRESENTATIVE_DEGREE",
           "spmm_cost", "gemm_cost", "format_number"]


@dataclass(frozen=True)
class GCNScheme:
    """One way of running a GCN layer: forward order, backward order, caching."""

    forward: str  # "transform-first" | "propagate-first"
    backward: str  # "fused-propagate" | "split-propagate"
    cache: bool = False  # keep A'X from a propagate-first forward for backward
    reuse: bool = False  # A'X of constant X kept across calls (computed by an earlier call)

    def __post_init__(self):
        if self.forward not in ("transform-first", "propagate-first"):
            raise ValueError(f"forward must be 'transform-first' or 'propagate-first', got {self.forward!r}")
        if self.backward not in ("fused-propagate", "split-propagate"):
            raise ValueError(f"backward must be 'fused-propagate' or 'split-propagate', got {self.backward!r}")
        if self.cache and (self.forward, self.backward) != ("propagate-first", "split-propagate"):
            raise ValueError("caching A'X needs the propagate-first forward and split-propagate backward")
        if self.reuse and not self.cache:
            raise ValueError("reusing A'X across calls needs the cached scheme (propagate-first+split+cache)")

    @property
    def name(self) -> str:
        return f"{self.forward}+{self.backward.split('-')[0]}" + ("+cache" if self.cache else "") + ("+reuse" if self.reuse else "")

    def __str__(self) -> str:
        return self.name


GCN_SCHEMES: tuple[GCNScheme, ...] = (
    GCNScheme("transform-first", "fused-propagate"),
    GCNScheme("transform-first", "split-propagate"),
    GCNScheme("propagate-first", "fused-propagate"),
    GCNScheme("propagate-first", "split-propagate"),
    GCNScheme("propagate-first", "split-propagate", cache=True),
)
REUSE_SCHEME = GCNScheme("propagate-first", "split-propagate", cache=True, reuse=True)
"""The scheme reusing ``A'X`` of constant features across calls; chosen only by
``plan_gcn(..., reuse=True)`` (not forcible: it needs ``A'X`` kept by the layer)."""
_BY_NAME = {s.name: s for s in GCN_SCHEMES}
_ALIASES = {"tf": "transform-first+fused", "pf": "propagate-first+split+cache", "cached": "propagate-first+split+cache", "pyg": "transform-first+fused"}


def parse_scheme(scheme: "str | GCNScheme") -> GCNScheme:
    """A :class:`GCNScheme` from its name (``"transform-first+fused"``, ...) or alias.

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if isinstance(scheme, GCNScheme):
        return scheme
    s = _ALIASES.get(scheme, scheme)
    if s not in _BY_NAME:
        raise ValueError(f"unknown GCN scheme {scheme!r}; choose 'auto' or one of {sorted(_BY_NAME)} (aliases {sorted(_ALIASES)})")
    return _BY_NAME[s]


@dataclass(frozen=True)
class MachineModel:
    """Rates used to turn FLOPs and bytes into an estimated time (seconds).

    Only ratios matter for the choice; defaults are typical of one CPU socket
    (a GEMM-bound rate and a stream bandwidth). ``index_bytes`` / ``value_bytes``
    are the sizes of a stored index and a value.
    """

    flop_rate: float = 100e9
    bandwidth: float = 10e9
    value_bytes: int = 4
    index_bytes: int = 8


@dataclass(frozen=True)
class SchemeCost:
    """Costs of one scheme for one layer call."""

    scheme: GCNScheme
    flops: int
    bytes: int
    spmm_columns: tuple[int, ...]  # columns of each SpMM run (forward then backward)
    transient_forward: int  # values alive in the forward beyond inputs/outputs
    saved: int  # values kept for the backward pass
    transient_backward: int  # values allocated in backward beyond the gradients returned
    time_s: float
    kept: int = 0  # values kept across calls (A'X of the reuse scheme)

    def row(self) -> dict:
        return {
            "scheme": self.scheme.name,
            "SpMMs (cols)": " + ".join(map(str, self.spmm_columns)) or "-",
            "GFLOP": self.flops / 1e9,
            "MB moved": self.bytes / 1e6,
            "saved (values)": self.saved,
            "transient fwd;bwd": f"{self.transient_forward};{self.transient_backward}",
            "kept (values)": self.kept,
            "est. ms": self.time_s * 1e3,
        }


@dataclass(frozen=True)
class GCNPlan:
    """The choice for one layer call, with every candidate's cost and the reason."""

    scheme: GCNScheme
    costs: tuple[SchemeCost, ...]
    reason: str
    n: int
    q: int
    m: int
    k: int
    input_grad: bool
    training: bool = True
    forced: bool = False
    x_nnz: int | None = None
    reuse: bool = False
    costed_at: tuple[int, int, int | None] | None = None
    """``(n, q, x_nnz)`` the costs were estimated at when they differ from the call's
    sizes (``plan_gcn(..., approximate=True)``: sizes rounded to
    :data:`PLAN_SIGNIFICANT_BITS`); None: at the call's own sizes."""
    rows: int | None = None
    """Rows of ``A'`` holding entries when the products of ``A'X`` run on those only
    (:func:`scheme_cost`); None: all ``n``."""

    def table(self) -> str:
        """Human-readable table of every scheme's cost and the choice."""
        rows = [c.row() for c in self.costs]
        head = list(rows[0])
        widths = [max(len(h), *(len(format_number(r[h])) for r in rows)) for h in head]
        lines = [
            f"GCN layer n={self.n} q={self.q} m={self.m} k={self.k} "
            f"input grad={'yes' if self.input_grad else 'no'}{'' if self.training else ' (inference)'}"
            + (f" sparse X nnz={self.x_nnz}" if self.x_nnz is not None else "")
            + (f" rows with entries={self.rows}" if self.rows is not None else "")
            + (" constant X (A'X can be kept across calls)" if self.reuse else ""),
            "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  choice",
        ]
        for c, r in zip(self.costs, rows):
            mark = "  <==" if c.scheme == self.scheme else ""
            lines.append("  ".join(format_number(r[h]).ljust(w) for h, w in zip(head, widths)) + mark)
        lines.append(f"choice: {self.scheme.name} ({self.reason})")
        if self.costed_at is not None:
            n, q, x_nnz = self.costed_at
            lines.append(f"(costs estimated at n={n} q={q}{'' if x_nnz is None else f' x_nnz={x_nnz}'}: sizes rounded to "
                         f"{PLAN_SIGNIFICANT_BITS} significant bits, so a graph that changes every call reuses a plan)")
        return "\n".join(lines)


def format_number(v) -> str:
    """``v`` for a cost table: floats to 4 significant digits, the rest as ``str``."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def spmm_cost(q: int, n_out: int, n_in: int, cols: int, mm: MachineModel) -> tuple[int, int]:
    """(flops, bytes) of one SpMM: CSR arrays, gathered operand and output (paper Table 6)."""
    flops = 2 * q * cols
    nbytes = q * (mm.index_bytes + mm.value_bytes) + (n_out + 1) * mm.index_bytes + (n_in + n_out) * cols * mm.value_bytes
    return flops, nbytes


def gemm_cost(a: int, b: int, c: int, mm: MachineModel) -> tuple[int, int]:
    """(flops, bytes) of one dense ``(a, b) x (b, c)`` product (paper Table 6)."""
    return 2 * a * b * c, (a * b + b * c + a * c) * mm.value_bytes


def scheme_cost(
    s: GCNScheme, n: int, q: int, m: int, k: int, input_grad: bool, training: bool = True, mm: MachineModel = MachineModel(), x_nnz: int | None = None,
    rows: int | None = None,
) -> SchemeCost:
    """FLOPs, bytes, transient values and estimated time of scheme ``s``.

    ``rows``: the rows of ``A'`` that hold entries, when the layer computes ``A'X``
    and the products on its rows for those only (:meth:`corgnn.sparse.CSR.nonempty_rows`;
    a sampled subgraph's last hop has no incoming edges); None: all ``n``. Then the
    propagate-first GEMMs, ``A'X`` and the split backward's ``G Θ^T`` are ``rows``
    long; transform-first still computes ``XΘ`` for every node (any can be a source).

    ``x_nnz``: non-zeros of sparse input features; the products that read ``X``
    directly (``XΘ`` forward, ``X^T P`` fused backward) then cost SpMMs over them.
    ``s.reuse``: the steady state of reusing ``A'X`` kept from an earlier call (no
    SpMM; its ``n m`` values counted in ``kept``; no ``dX``: ``X`` is constant).
    """

    ops: list[tuple[str, tuple[int, int]]] = []
    spmm_cols: list[int] = []
    r = n if rows is None else rows

    def spmm(cols, n_out=r, n_in=n):  # (A'^T walks: n_out=n, n_in=r)
        spmm_cols.append(cols)
        ops.append(("spmm", spmm_cost(q, n_out, n_in, cols, mm)))

    gemm = lambda a, b, c: ops.append(("gemm", gemm_cost(a, b, c, mm)))  # noqa: E731

    # forward
    def x_theta():  # X Θ, or the forward SpMM over sparse X's non-zeros
        ops.append(("gemm", gemm_cost(n, m, k, mm)) if x_nnz is None else ("spmm", spmm_cost(x_nnz, n, m, k, mm)))

    def xt_p():  # X^T P, or the transposed SpMM over sparse X's non-zeros
        ops.append(("gemm", gemm_cost(m, n, k, mm)) if x_nnz is None else ("spmm", spmm_cost(x_nnz, m, n, k, mm)))

    if s.reuse and input_grad:
        raise ValueError("reusing A'X across calls needs a constant X (input_grad=False)")
    if s.forward == "transform-first":
        x_theta()
        spmm(k)
        t_fwd = n * k
    else:
        if not s.reuse:
            spmm(m)
        gemm(r, m, k)
        t_fwd = 0 if s.reuse else r * m
    saved = (r if s.cache else n) * m if training else 0  # X, or A'X in its place when cached
    t_bwd = 0
    if training:
        ops.append(("bias", (n * k, n * k * mm.value_bytes)))
        if s.backward == "fused-propagate":
            spmm(k, n, r)  # P = A'^T G
            xt_p()  # dΘ = X^T P
            if input_grad:
                gemm(n, k, m)  # dX = P Θ^T
            t_bwd = n * k
        else:
            if not s.cache:
                spmm(m)  # recompute A'X
                t_bwd += r * m
            gemm(m, r, k)  # dΘ = (A'X)^T G
            if input_grad:
                gemm(r, k, m)  # G Θ^T
                spmm(m, n, r)  # dX = A'^T (G Θ^T)
                t_bwd += n * m
    flops = sum(c[0] for _, c in ops)
    nbytes = sum(c[1] for _, c in ops)
    time_s = sum(f / mm.flop_rate + b / mm.bandwidth for _, (f, b) in ops)
    return SchemeCost(s, flops, nbytes, tuple(spmm_cols), t_fwd, saved, t_bwd, time_s, kept=r * m if s.reuse else 0)


def plan_gcn(
    n: int,
    q: int,
    m: int,
    k: int,
    input_grad: bool,
    *,
    training: bool = True,
    scheme: "str | GCNScheme" = "auto",
    machine: MachineModel = MachineModel(),
    candidates: tuple[GCNScheme, ...] = GCN_SCHEMES,
    x_nnz: int | None = None,
    reuse: bool = False,
    reuse_extra_memory: bool = False,
    approximate: bool = False,
    rows: int | None = None,
) -> GCNPlan:
    """Choose the GCN scheme for one call.

    Args:
        n: nodes; q: stored entries of ``A'`` (self-loops included); m: input
            features; k: output features.
        input_grad: whether ``dL/dX`` is needed (False for a network's first layer).
        training: False when no backward pass will run (only the forward counts).
        scheme: ``"auto"`` or a scheme name to force (the costs are still reported).
        machine: rates turning FLOPs and bytes into time.
        candidates: schemes ``"auto"`` may pick from (e.g. the uncached ones, to
            reproduce Table 1).
        x_nnz: non-zeros of the input features when they are used as a sparse
            matrix (see :class:`corgnn.nn.GCNConv`); None for dense features.
        reuse: ``X`` is a constant whose ``A'X`` the caller can keep across calls
            (:class:`corgnn.nn.GCNConv` with ``cache_propagation=True``); adds
            :data:`REUSE_SCHEME` to the ``"auto"`` candidates, costed in its steady
            state (no SpMM) with ``n m`` kept values. Ignored with ``input_grad``.
        reuse_extra_memory: let the reuse scheme raise memory. By default (False)
            it is a candidate only when its ``n m`` kept values are no more than the
            transient values (forward + backward) of the best scheme without it, so
            keeping ``A'X`` never raises a step's peak memory: it replaces the
            ``A'X`` that propagate-first+split+cache holds anyway (k >= m/2), and is
            left out where transform-first's ``2 n k`` transients are smaller.
        approximate: cost the schemes at ``n``, ``q`` and ``x_nnz`` rounded down to
            :data:`PLAN_SIGNIFICANT_BITS` significant bits (at most 1.6 % smaller),
            so that calls on graphs of nearly the same size share one plan (the
            layers' setting: a graph that changes every call, e.g. a mini-batch,
            would otherwise pay a full plan, ~60 us, per layer and call). The
            returned plan carries the call's own sizes and ``costed_at``.
        rows: the rows of ``A'`` holding entries when the layer runs ``A'X``'s
            products on those rows only (see :func:`scheme_cost`); None: all ``n``.
            Rounded like ``n`` with ``approximate``.

    Returns:
        :class:`GCNPlan` with the chosen scheme, every scheme's cost and the reason.

    Raises:
        ValueError: negative sizes or an unknown scheme name.
    """
    args = (n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows)
    try:
        return _memo(*args, approximate=approximate)
    except TypeError:  # (an unhashable argument, e.g. a list of candidates: plan without the memo)
        return _plan_gcn(*args)


_PLANS: dict = {}
"""Plans by a key of plain values (the machine and candidate set by identity, held in
the entry), in front of :func:`_plan_gcn_memo`: the dataclasses among its arguments
hash in Python, ~3 us per lookup there, paid per layer on every new mini-batch's
sizes. Cleared when :data:`_PLANS_SIZE` entries are kept."""
_PLANS_SIZE = 4096


def _memo(n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows, approximate=False) -> GCNPlan:
    """The plan of these arguments (``approximate``: :func:`_plan_gcn_approximate`'s,
    else :func:`_plan_gcn_memo`'s), through :data:`_PLANS` where they allow it (a
    scheme name, a tuple of candidates)."""
    plain = type(scheme) is str and type(candidates) is tuple
    if plain:
        key = (n, q, m, k, input_grad, training, scheme, id(machine), id(candidates), x_nnz, reuse, reuse_extra_memory, rows, approximate)
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is machine and hit[1] is candidates:
            return hit[2]
    args = (n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows)
    plan = _plan_gcn_approximate(*args) if approximate else _plan_gcn_memo(*args)
    if plain:
        if len(_PLANS) >= _PLANS_SIZE:
            _PLANS.clear()
        _PLANS[key] = (machine, candidates, plan)  # (holding both: their ids stay theirs)
    return plan


PLAN_SIGNIFICANT_BITS = 6
"""Significant bits of the sizes ``plan_gcn(..., approximate=True)`` costs at."""


def rounded_size(v: int | None) -> int | None:
    """``v`` rounded down to :data:`PLAN_SIGNIFICANT_BITS` significant bits (exact
    below ``2**PLAN_SIGNIFICANT_BITS``; None stays None)."""
    if v is None or v < (1 << PLAN_SIGNIFICANT_BITS):
        return v
    drop = v.bit_length() - PLAN_SIGNIFICANT_BITS
    return (v >> drop) << drop


def _plan_gcn_approximate(n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows) -> GCNPlan:
    at = (rounded_size(n), rounded_size(q), rounded_size(x_nnz))
    if n < 0 or q < 0 or (at == (n, q, x_nnz) and rounded_size(rows) == rows):
        return _memo(n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows)
    plan = _memo(at[0], at[1], m, k, input_grad, training, scheme, machine, candidates, at[2], reuse, reuse_extra_memory, rounded_size(rows))
    # NOTE: the rounded plan with the call's sizes, copied field by field:
    # ``dataclasses.replace`` runs the generated ``__init__`` (~3 us), paid by every
    # layer on every new mini-batch (its sizes miss the exact-size memo above).
    out = object.__new__(GCNPlan)
    out.__dict__.update(plan.__dict__)
    out.__dict__.update(n=n, q=q, x_nnz=x_nnz, rows=rows, costed_at=at)
    return out


@functools.lru_cache(maxsize=1024)
def _plan_gcn_memo(*args) -> GCNPlan:
    """:func:`_plan_gcn`, memoised: a plan is a pure function of its (hashable, frozen)
    arguments, and a training loop asks for the same one every step (~35 us each)."""
    return _plan_gcn(*args)


def _plan_gcn(n, q, m, k, input_grad, training, scheme, machine, candidates, x_nnz, reuse, reuse_extra_memory, rows=None) -> GCNPlan:
    for name, v in (("n", n), ("q", q), ("m", m), ("k", k)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if rows is not None and not 0 <= rows <= n:
        raise ValueError(f"rows must be in [0, n={n}], got {rows}")
    reuse = reuse and not input_grad and scheme == "auto"
    if not candidates:
        raise ValueError("candidates must name at least one scheme")
    costs = tuple(scheme_cost(s, n, q, m, k, input_grad, training, machine, x_nnz, rows) for s in candidates)
    if reuse:
        kept = scheme_cost(REUSE_SCHEME, n, q, m, k, input_grad, training, machine, x_nnz, rows)
        # NOTE: the memory rule: without reuse_extra_memory, keeping A'X (n m values
        # between calls) may not exceed the peak transients of the step it replaces.
        best_plain = min(costs, key=lambda c: c.time_s)
        if reuse_extra_memory or kept.kept <= best_plain.transient_forward + best_plain.transient_backward:
            costs += (kept,)
        else:
            reuse = False
    if scheme != "auto":
        chosen = parse_scheme(scheme)
        return GCNPlan(chosen, costs, "forced by the caller", n, q, m, k, input_grad, training, forced=True, x_nnz=x_nnz, rows=rows)
    best = min(costs, key=lambda c: (round(c.time_s, 12), c.transient_forward + c.transient_backward + c.kept, len(c.spmm_columns)))
    runner_up = min((c for c in costs if c is not best), key=lambda c: c.time_s, default=best)
    if best.scheme.reuse:
        reason = (
            f"constant X: A'X kept across calls ({n}x{m} values, {n * m * machine.value_bytes / 1e6:.3g} MB at "
            f"{machine.value_bytes} B each), no SpMM after the call that computes it; est. {best.time_s * 1e3:.3g} ms "
            f"vs {runner_up.time_s * 1e3:.3g} ms for {runner_up.scheme.name}"
        )
    elif not training:
        reason = f"inference: SpMM on {'k' if best.scheme.forward == 'transform-first' else 'm'} columns (k={k}, m={m})"
    else:
        cond = "k < m" if input_grad else "k < m/2"
        reason = (
            f"est. {best.time_s * 1e3:.3g} ms vs {runner_up.time_s * 1e3:.3g} ms for {runner_up.scheme.name} "
            f"(Table 2: transform-first+fused when {cond}, else propagate-first+split+cache)"
        )
    return GCNPlan(best.scheme, costs, reason, n, q, m, k, input_grad, training, x_nnz=x_nnz, reuse=reuse, rows=rows)


REPRESENTATIVE_DEGREE = 10
"""Entries per row of ``A'`` assumed by :func:`static_scheme_name` (self-loop included)."""


@torch.compiler.assume_constant_result
def static_scheme_name(m: int, k: int, input_grad: bool, training: bool = True, scheme: str = "auto") -> str:
    """Name of the scheme :func:`plan_gcn` picks without the graph's sizes, for code
    traced by ``torch.compile`` (where ``n`` is symbolic and ``q`` data-dependent):
    the plan of a 1024-node graph with :data:`REPRESENTATIVE_DEGREE` entries per row.
    Every cost is linear in ``n`` at a fixed degree, and the choice depends on ``m``,
    ``k`` and ``input_grad`` (Table 2's conditions), hardly on the degree
    (``tests/test_cost.py`` checks this over a grid). Evaluated once at trace time
    (a constant of the compiled graph).
    """
    n = 1024
    return plan_gcn(n, n * REPRESENTATIVE_DEGREE, m, k, input_grad, training=training, scheme=scheme).scheme.name
