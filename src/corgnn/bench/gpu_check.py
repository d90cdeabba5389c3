"""``corgnn bench gpu-check``: corgnn's layers against PyG's own, on one device.

The correctness step of the GPU evaluation (``corgnn bench gpu``): every GCN scheme,
every GAT caching scheme and format, and every other layer ``optimize()`` converts
(SAGE, GraphConv, GIN, SGC, APPNP, GATv2, Transformer), each run by corgnn and by PyG on the same device
with the same parameters, input and upstream gradient. It compares the output and
every gradient (input and each parameter) by ``||ours - pyg|| / ||pyg||`` in float64
(tolerance 1e-10) and float32 (1e-4), with :data:`FLOOR` under a gradient that is
zero in exact arithmetic; a NaN or a missing gradient fails.

The graph is the awkward case: duplicate edges, self-loops, isolated nodes, edge
weights, and one hub row with most of the edges (the Triton kernels split long rows
across programs). Fresh random inputs per check (``--seed``).

On CPU it runs on the Numba kernels (CI runs it so); on CUDA on the device's
automatic backend (``triton``), or ``--backend``.

Output: a table on stdout, ``results.json`` and ``summary.md`` under ``--out``; exit
status 1 when any check fails.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Check", "checks", "graph", "compare", "run_checks", "add_arguments", "run"]

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
"""Largest relative error ``||ours - pyg|| / ||pyg||`` per dtype."""


@dataclass(frozen=True)
class Check:
    """One comparison: a PyG layer ``make()`` builds, the corgnn options set on its
    ``optimize()``d copy (``scheme``, ``cache``, ``format``), and the dtype."""

    name: str
    make: object
    options: tuple[tuple[str, str], ...]
    dtype: torch.dtype
    weighted: bool = False


def graph(n: int, q: int, hub: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_weight)``: ``q`` random edges among the first ``n - 3``
    nodes (the last 3 isolated), ``hub`` more into node 0, a duplicated edge and a
    duplicated self-loop; weights in (0, 1]. int64 / float64 on ``device``."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, q), generator=g)
    hub_edges = torch.stack([torch.randint(0, n - 3, (hub,), generator=g), torch.zeros(hub, dtype=torch.long)])
    extra = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 1, 2, 2]])
    ei = torch.cat([ei, hub_edges, extra], 1)
    ew = torch.rand(ei.size(1), generator=g, dtype=torch.float64) * 0.9 + 0.1
    return ei.to(device), ew.to(device)


def checks(m: int = 12, k: int = 8) -> list[Check]:
    """Every check: ``m`` input and ``k`` output channels."""
    from torch_geometric import nn as pyg

    from corgnn.cost import GAT_CACHE_SCHEMES, GCN_SCHEMES

    out = []
    for dtype in (torch.float64, torch.float32):
        d = "f64" if dtype == torch.float64 else "f32"
        for s in ["auto"] + [s.name for s in GCN_SCHEMES]:
            out.append(Check(f"GCNConv scheme={s} weighted {d}", lambda: pyg.GCNConv(m, k), (("scheme", s),), dtype, True))
        for c in GAT_CACHE_SCHEMES:
            for heads, concat in ((1, True), (4, True), (4, False)):
                out.append(Check(f"GATConv cache={c} heads={heads} concat={concat} {d}",
                                 lambda heads=heads, concat=concat: pyg.GATConv(m, k, heads=heads, concat=concat), (("cache", c),), dtype))
        for fmt in ("coo", "csc", "ell", "hybrid"):
            out.append(Check(f"GATConv format={fmt} heads=2 {d}", lambda: pyg.GATConv(m, k, heads=2), (("format", fmt),), dtype))
        out += [
            Check(f"SAGEConv mean {d}", lambda: pyg.SAGEConv(m, k), (), dtype),
            Check(f"SAGEConv sum {d}", lambda: pyg.SAGEConv(m, k, aggr="sum"), (), dtype),
            Check(f"GraphConv weighted {d}", lambda: pyg.GraphConv(m, k), (), dtype, True),
            Check(f"GINConv train_eps {d}", lambda: pyg.GINConv(torch.nn.Sequential(torch.nn.Linear(m, k), torch.nn.ReLU(), torch.nn.Linear(k, k)), train_eps=True), (), dtype),
            Check(f"SGConv K=2 weighted {d}", lambda: pyg.SGConv(m, k, K=2), (), dtype, True),
            Check(f"APPNP K=5 weighted {d}", lambda: pyg.APPNP(K=5, alpha=0.1), (), dtype, True),
            Check(f"GATv2Conv heads=4 concat=True {d}", lambda: pyg.GATv2Conv(m, k, heads=4), (), dtype),
            Check(f"GATv2Conv heads=2 share_weights {d}", lambda: pyg.GATv2Conv(m, k, heads=2, share_weights=True, concat=False), (), dtype),
            Check(f"TransformerConv heads=4 concat=True {d}", lambda: pyg.TransformerConv(m, k, heads=4), (), dtype),
            Check(f"TransformerConv heads=2 beta concat=False {d}", lambda: pyg.TransformerConv(m, k, heads=2, beta=True, concat=False), (), dtype),
        ]
    return out


FLOOR = 1e-3
"""A tensor's error is relative to its own norm, or to this fraction of the largest
norm among the check's tensors when its own is smaller: a gradient that is zero in
exact arithmetic (TransformerConv's key bias: softmax ignores a shift shared by a
row's scores) is rounding noise in both, and its own norm says nothing."""


def _rel(a: torch.Tensor | None, b: torch.Tensor | None, scale: float) -> float:
    if a is None or b is None:
        return math.inf if (a is None) != (b is None) else 0.0
    a, b = a.double(), b.double()
    if not bool(torch.isfinite(a).all()):
        return math.nan
    ref = max(float(b.norm()), FLOOR * scale)
    return float((a - b).norm()) / (ref if ref > 0 else 1.0)


def compare(check: Check, n: int, q: int, hub: int, seed: int, device) -> dict:
    """Run ``check`` on ``device``: the largest relative error over the output and every
    gradient, which one it was, and whether it is within the dtype's tolerance."""
    import corgnn

    torch.manual_seed(seed)
    ref = check.make().to(device=device, dtype=check.dtype)
    with torch.no_grad():
        for p in ref.parameters():  # PyG zero-initialises biases: make them count
            if p.dim() == 1 and float(p.abs().sum()) == 0:
                p.normal_()
    ours = corgnn.optimize(copy.deepcopy(ref))
    if type(ours).__module__.startswith("torch_geometric"):
        raise RuntimeError(f"{check.name}: optimize() left the PyG layer unconverted")
    for key, value in check.options:
        setattr(ours, key, value)
    ei, ew = graph(n, q, hub, seed, device)
    ew = ew.to(check.dtype) if check.weighted else None
    in_ch = getattr(ref, "in_channels", 12)
    x = torch.randn(n, in_ch if in_ch > 0 else 12, dtype=check.dtype, device=device)
    results = []
    for layer in (ref, ours):
        xi = x.clone().requires_grad_(True)
        out = layer(xi, ei) if ew is None else layer(xi, ei, ew)
        if len(results) == 0:
            upstream = torch.randn_like(out)
        out.backward(upstream)
        results.append([("output", out.detach()), ("grad x", xi.grad)] + [(f"grad {name}", p.grad) for name, p in layer.named_parameters()])
    for key, value in check.options:  # the option asked for is the one that ran
        ran = {"scheme": lambda: ours.last_plan.scheme.name, "cache": lambda: ours.last_cache}.get(key)
        if ran is not None and value != "auto" and ran() != value:
            raise RuntimeError(f"{check.name}: asked {key}={value}, ran {ran()}")
    worst, where = 0.0, ""
    scale = max(float(t.double().norm()) for _, t in results[0] if t is not None)
    for (name, want), (_, got) in zip(*results):
        err = _rel(got, want, scale)
        if not err <= worst:  # NaN and inf win
            worst, where = err, name
    ok = worst <= TOLERANCE[check.dtype]
    return {"check": check.name, "dtype": str(check.dtype).replace("torch.", ""), "max_rel_err": worst, "worst": where,
            "ok": bool(ok), "tolerance": TOLERANCE[check.dtype]}


def run_checks(device: str = "cpu", n: int = 3000, q: int = 20000, hub: int = 4000, seed: int = 0, only: str | None = None, progress: bool = False) -> list[dict]:
    """Every check (or those whose name contains ``only``) on ``device``; one record each
    (an exception is a failed record with its message); ``progress``: a line per check
    to stderr as it ends."""
    rows = []
    for i, c in enumerate(checks()):
        if only and only not in c.name:
            continue
        t0 = time.perf_counter()
        try:
            row = compare(c, n, q, hub, seed + i, device)
        except Exception as e:  # noqa: BLE001 - recorded, the other checks go on
            row = {"check": c.name, "dtype": str(c.dtype).replace("torch.", ""), "max_rel_err": math.nan, "worst": f"{type(e).__name__}: {e}"[:300],
                   "ok": False, "tolerance": TOLERANCE[c.dtype]}
        row["seconds"] = round(time.perf_counter() - t0, 3)
        rows.append(row)
        if progress:  # a step killed at its allotment still leaves these in its log
            print(f"{'ok ' if row['ok'] else 'BAD'} {row['max_rel_err']:.1e} {row['seconds']:6.2f}s {c.name}", file=sys.stderr, flush=True)
    return rows


def add_arguments(p) -> None:
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--backend", default=None, help="force a sparse backend (default: the device's automatic choice)")
    p.add_argument("--nodes", type=int, default=3000, help="nodes of the check graph (default 3000)")
    p.add_argument("--edges", type=int, default=20000, help="random edges (default 20000)")
    p.add_argument("--hub", type=int, default=4000, help="edges into the hub node 0 (default 4000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="only checks whose name contains this")
    p.add_argument("--out", type=Path, default=None, help="write results.json and summary.md here")


def run(args) -> int:
    """Run the checks; print the table; 0 when every check passed, else 1.

    Raises:
        ValueError: ``--device cuda`` without CUDA; ``--nodes`` under 4 or a negative
            edge count; an unknown ``--backend``.
    """
    from corgnn.sparse import available_backends, use_backend
    from corgnn.sparse.dispatch import Case, select

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to torch on this machine")
    if args.nodes < 4 or args.edges < 0 or args.hub < 0:
        raise ValueError(f"--nodes must be >= 4 and --edges/--hub >= 0, got {args.nodes}, {args.edges}, {args.hub}")
    known = available_backends()
    if args.backend is not None and args.backend not in known:
        raise ValueError(f"--backend: unknown backend {args.backend!r}; choose from {sorted(known)}")
    device = torch.device(args.device)
    with use_backend(args.backend) if args.backend else contextlib.nullcontext():
        backend = select(Case("spmm_rows", device.type, torch.float32)).name
        rows = run_checks(args.device, args.nodes, args.edges, args.hub, args.seed, args.only, progress=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    failed = [r for r in rows if not r["ok"]]
    lines = [f"# corgnn vs PyG layers on {name} (backend {backend})", "",
             f"{len(rows) - len(failed)} of {len(rows)} checks within tolerance; graph: {args.nodes} nodes, "
             f"{args.edges} random + {args.hub} hub edges, duplicates, self-loops, isolated nodes.", "",
             "| check | max rel err | worst | ok |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['max_rel_err']:.2e} | {r['worst']} | {'yes' if r['ok'] else '**NO**'} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": device.type, "gpu": name if device.type == "cuda" else "", "backend": backend, "torch": torch.__version__}
        (args.out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        (args.out / "summary.md").write_text(text)
    return 1 if failed else 0

