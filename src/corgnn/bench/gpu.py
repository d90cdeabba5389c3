"""``corgnn bench gpu``: the whole GPU evaluation in one command (about 45 minutes;
``--minutes`` fits it, or the steps ``--only`` picks, to a shorter lease).

A thin orchestration of existing pieces, each run as its own process (one failing
or hanging step does not stop the others; each is killed at its allotment):

=================  ==================================================================
step               command
=================  ==================================================================
``check``          ``corgnn bench gpu-check --device cuda``: every layer, scheme,
                   cache and format against PyG's on the GPU (outputs, gradients)
``probe``          ``benchmarks/gpu_probe.py``: a Cora GCN and GAT step's host side
                   (launches, syncs, cProfile; how the wrap_triton dispatch was found)
``tests``          ``pytest`` on the op and layer tests (their CUDA parametrisations
                   run when CUDA is available); JUnit XML and the log kept
``spmm``           ``corgnn bench spmm --device cuda`` (automatic backend: triton)
``spmm-cusparse``  the same SpMM with ``--backend cusparse`` (row-plan formats): the
                   measurement that ranks cusparse against triton in dispatch
``gcn``, ``gat``   ``corgnn bench gcn|gat --device cuda --no-compile``: the grids
                   against PyG's eager baselines (COO, CSR; GAT also dgNN's fused
                   kernel where installed), peak memory from
                   ``torch.cuda.max_memory_allocated``; each stops starting cells at
                   its deadline and writes what it measured
``gatv2``,         the same for the attention layers beyond GAT (issue 25), half the
``transformer``    allotments
``*-compiled``     the ``torch.compile``'d PyG baseline of the same grid in a process
                   of its own (a CUDA error in a compiled kernel ends its process
                   only), its rows then merged into the eager step's results, whose
                   summary (fastest PyG per cell) is rebuilt
=================  ==================================================================

Everything goes under ``benchmarks/results/<gpu>-<date>/`` (``--out`` overrides):
one folder per step (its results, ``summary.md`` and plots), ``<step>.log``, and
``summary.md`` / ``gpu.json`` (the GPU's name, versions, each step's status and
wall time, the test counts, the steps' summaries).

Offline use: ``pip install --no-deps -e .`` in a checkout on the GPU machine, the
datasets copied into an ignored folder of it (``data/``), then
``corgnn bench gpu --root data``. ``--dry-run`` prints the plan and the time
estimate without running anything (any machine; CI runs it).

Timing: the bench harness times each step with ``time.perf_counter`` between
``torch.cuda.synchronize`` calls (see :mod:`corgnn.bench.harness`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Step", "TEST_FILES", "plan", "fit", "run_steps", "add_arguments", "run", "gpu_slug"]

TEST_FILES = (
    "tests/test_sparse.py", "tests/test_library.py", "tests/test_triton.py", "tests/test_cusparse.py",
    "tests/test_gcn.py", "tests/test_gcn_grad.py", "tests/test_gat.py", "tests/test_layers.py",
    "tests/test_propagation_cache.py",
)
"""The op and layer test files the ``tests`` step runs."""

CHECKOUT = Path(__file__).resolve().parents[3]
"""The checkout root (``src/corgnn/bench/gpu.py`` -> root) under an editable install:
the test files are read from its ``tests/``."""

COMPILED = "pyg-coo-compiled"
"""The benches' torch.compile'd PyG variant (:data:`corgnn.bench.baselines.PYG_VARIANTS`)."""

BUDGET_MIN = 45.0
"""The whole run's target (minutes); the allotments below sum to less."""


@dataclass(frozen=True)
class Step:
    """One process of the evaluation: ``argv`` (run with this Python), its time
    allotment in minutes (the estimate, and the kill timeout), what it measures,
    extra environment variables, and the step its results are merged into."""

    name: str
    argv: tuple[str, ...]
    minutes: float
    what: str
    env: tuple[tuple[str, str], ...] = ()
    merge_into: str | None = None
    """A bench step whose rows (the compiled baseline's) are merged into this other
    step's results once it ends (:func:`merge_compiled`)."""

    def command(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        return (env + " " if env else "") + "python " + " ".join(self.argv)


def gpu_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (a folder name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def plan(out: Path, root: str | None = None, quick: bool = False, minutes: float | None = None) -> list[Step]:
    """The steps, their commands writing under ``out``, with ``root`` (data root) passed on.

    ``quick``: each bench at its ``--quick`` preset (a check that everything runs,
    at most 20 minutes by the allotments). ``minutes``: the allotments scaled down to
    fit that many minutes (:func:`fit`; a short device lease).
    """
    out = out.resolve()
    root = str(Path(root).resolve()) if root else None
    data = ("--root", root) if root else ()
    q = ("--quick",) if quick else ()
    bench = ("-m", "corgnn.cli", "bench")
    env = (("CORGNN_DATA", root),) if root else ()
    # allotments: the full spmm grid is ~540 measurements of 10 calls plus each Triton
    # specialization's first compile (~1 s); gcn/gat's full grids are 8.8/9.1 min on 2
    # CPU cores, bounded here by --deadline-min (cells not started by then are recorded
    # as missing), one minute under the allotment for the report.
    # NOTE: the torch.compile'd PyG baseline runs in a process of its own, merged into
    # its bench's results afterwards (merge_into): on the H100 (2026-11-27) one of
    # Inductor's kernels for PyG's GAT failed with "misaligned address", which poisons
    # the process's CUDA context, and every later cell of that process failed with it.
    eager_min, compiled_min = (2.5, 1.5) if quick else (5.0, 4.0)
    steps = [
        Step("check", (*bench, "gpu-check", "--device", "cuda", "--out", str(out / "check")), 2.5,
             "corgnn's layers vs PyG's on CUDA: every GCN scheme, GAT cache and format, SAGE/GraphConv/GIN/SGC/APPNP/GATv2/Transformer, outputs and gradients"),
        Step("probe", (str(CHECKOUT / "benchmarks" / "gpu_probe.py"),), 1.0,
             "a Cora GCN and GAT training step, PyG's and optimize()d: ms, kernel launches, host syncs, corgnn's Python hotspots", env),
        Step("tests", ("-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out / 'tests.xml'}", *(str(CHECKOUT / f) for f in TEST_FILES)), 6.0,
             "op and layer tests (CUDA parametrisations included)", env),
        Step("spmm", (*bench, "spmm", "--device", "cuda", "--out", str(out / "spmm"), *data, *q), 5.0 if not quick else 2.0,
             "SpMM/SDDMM per format vs torch.sparse (cuSPARSE) and PyG scatter, automatic backend"),
        Step("spmm-cusparse", (*bench, "spmm", "--device", "cuda", "--backend", "cusparse", "--ops", "spmm", "--formats", "csr,csc,coo",
                               "--out", str(out / "spmm-cusparse"), *data, *q), 3.0 if not quick else 1.5,
             "the same SpMM on the cusparse backend (ranks it against triton)"),
    ]
    for name, what, share in (("gcn", "2-layer GCN vs PyG COO/CSR, time and peak memory", 1.0),
                              ("gat", "2-layer 8-head GAT vs PyG COO/CSR/fused, time and peak memory", 1.0),
                              ("gatv2", "2-layer 8-head GATv2 vs PyG COO/CSR, time and peak memory (issue 25's goals)", 0.5),
                              ("transformer", "2-layer 8-head TransformerConv vs PyG COO/CSR, time and peak memory (issue 25's goals)", 0.5)):
        common = ("--device", "cuda", "--no-progress", *data, *q)
        eager, compiled = eager_min * share, compiled_min * share
        steps += [
            Step(name, (*bench, name, "--no-compile", "--deadline-min", _deadline(eager), "--out", str(out / name), *common), eager,
                 what + " (PyG compiled: the next step)"),
            Step(f"{name}-compiled", (*bench, name, "--variants", COMPILED, "--deadline-min", _deadline(compiled), "--out", str(out / f"{name}-compiled"), *common),
                 compiled, f"PyG's torch.compile'd {name} in its own process, merged into {name}/", merge_into=name),
        ]
    return steps if minutes is None else fit(steps, minutes)


def _deadline(minutes: float) -> str:
    """A bench's ``--deadline-min`` for an allotment of ``minutes``: a quarter of it, at
    most one minute, left for the report."""
    return f"{minutes - min(1.0, minutes / 4):.3g}"


def fit(steps: list[Step], minutes: float) -> list[Step]:
    """The steps with their allotments scaled down to sum to ``minutes`` (never up);
    the benches' ``--deadline-min`` follows their allotment (a quarter of it, at most
    one minute, left for the report).

    Raises:
        ValueError: ``minutes`` not positive.
    """
    if not minutes > 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    scale = min(1.0, minutes / sum(s.minutes for s in steps))
    fitted = []
    for s in steps:
        m = s.minutes * scale
        argv = list(s.argv)
        if "--deadline-min" in argv:
            argv[argv.index("--deadline-min") + 1] = _deadline(m)
        fitted.append(Step(s.name, tuple(argv), m, s.what, s.env, s.merge_into))
    return fitted


def _test_counts(log: str) -> str:
    """pytest's closing line (``N passed, M failed ...``), or ``""``."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped).*?)(?: in [\d.]+s.*)?\s*=*$", log, flags=re.M)
    return found[-1] if found else ""


def run_steps(steps: list[Step], out: Path, meta: dict) -> list[dict]:
    """Run each step (a process, killed at its allotment), log it to
    ``out/<step>.log`` and write ``out/gpu.json`` and ``out/summary.md``; returns one
    record per step (``name``, ``status`` ``ok``/``failed (rc)``/``timed out``,
    ``wall_s``, ``log``, ``command``)."""
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for s in steps:
        log = out / f"{s.name}.log"
        print(f"[{time.strftime('%H:%M:%S')}] {s.name}: {s.command()}  (allotted {s.minutes:g} min)", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run([sys.executable, *s.argv], stdout=f, stderr=subprocess.STDOUT, timeout=s.minutes * 60,
                                    env=dict(os.environ, **dict(s.env))).returncode
                status = "ok" if rc == 0 else f"failed (rc {rc})"
            except subprocess.TimeoutExpired:
                status = "timed out"
        rec = {"name": s.name, "status": status, "wall_s": round(time.perf_counter() - t0, 1), "log": log.name, "command": s.command(), "what": s.what}
        if s.merge_into is not None:
            rec["merged"] = merge_compiled(out / s.merge_into, out / s.name, log.name)
        if s.name == "tests":
            rec["tests"] = _test_counts(log.read_text(errors="replace"))
        records.append(rec)
        print(f"  -> {status} in {rec['wall_s'] / 60:.1f} min", file=sys.stderr, flush=True)
        _write(out, meta, records)
    return records


def merge_compiled(main: Path, compiled: Path, log: str) -> str:
    """Put the compiled baseline's rows of the run in ``compiled`` into the run in
    ``main`` (whose own compiled rows are the ``--no-compile`` placeholders) and
    rebuild ``main``'s summary and plots; returns what was done, in words.

    A cell the compiled run did not record keeps its placeholder, its reason saying
    that the compiled process (``log``) recorded nothing for it."""
    from . import report
    from .experiments import EXPERIMENTS
    from .runner import write_report

    try:
        rows, meta = report.read_results(main)
    except FileNotFoundError:
        return f"nothing: {main.name}/ has no results"
    try:
        extra = [r for r in report.read_results(compiled)[0] if r["variant"] == COMPILED]
    except FileNotFoundError:
        extra = []

    def key(r):
        return tuple(r.get(k) for k in ("experiment", "dataset", "hidden", "heads", "model", "input_grad", "batch", "phase"))

    have = {key(r) for r in extra}
    kept = [r for r in rows if not (r["variant"] == COMPILED and key(r) in have)]
    for r in kept:
        if r["variant"] == COMPILED and r["status"] != "ok":
            r["reason"] = f"the compiled baseline's own process recorded nothing for this cell (see {log})"
    by_name = {e.name: e for e in EXPERIMENTS}
    write_report([by_name[n] for n in meta.get("experiments", []) if n in by_name], kept + extra, meta, main)
    return f"{len(have)} compiled rows merged into {main.name}/"


def _write(out: Path, meta: dict, records: list[dict]) -> None:
    (out / "gpu.json").write_text(json.dumps({**meta, "steps": records}, indent=1))
    lines = [f"# GPU evaluation: {meta.get('gpu', '?')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "gpu"]
    lines += ["", "| step | status | minutes | what |", "|---|---|---|---|"]
    for r in records:
        extra = f" ({r['tests']})" if r.get("tests") else ""
        lines.append(f"| {r['name']} | {r['status']}{extra} | {r['wall_s'] / 60:.1f} | {r['what']} ([log]({r['log']})) |")
    for r in records:
        sub = out / r["name"] / "summary.md"
        if sub.exists():
            lines += ["", f"## {r['name']}", "", re.sub(r"^(#+) ", r"##\1 ", sub.read_text(), flags=re.M)]  # its headings two levels down
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def add_arguments(p) -> None:
    p.add_argument("--root", default=None, help="data root with the real dataset files (e.g. data/, an ignored folder of the checkout)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default benchmarks/results/<gpu>-<date>)")
    p.add_argument("--quick", action="store_true", help="every bench at its --quick preset (at most 20 minutes by the allotments)")
    p.add_argument("--only", default=None, help="comma-separated step names to run (default all)")
    p.add_argument("--minutes", type=float, default=None, help="scale the chosen steps' allotments down to fit this many minutes (a short device lease)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate, run nothing (any machine)")


def run(args) -> int:
    """Plan (and unless ``--dry-run`` run) the GPU evaluation.

    Raises:
        ValueError: unknown ``--only`` step; ``--minutes`` not positive; no CUDA
            device (without ``--dry-run``).
    """
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        raise ValueError("corgnn bench gpu: no CUDA device is available to torch on this machine (use --dry-run to see the plan)")
    gpu = torch.cuda.get_device_name() if cuda else "<gpu>"
    out = args.out or Path("benchmarks") / "results" / f"{gpu_slug(gpu) if cuda else gpu}-{time.strftime('%Y%m%d')}"
    steps = plan(out, args.root, args.quick)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s.name for s in steps})
        if unknown:
            raise ValueError(f"--only: unknown steps {unknown}; choose from {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in names]
    if args.minutes is not None:
        steps = fit(steps, args.minutes)
    total = sum(s.minutes for s in steps)
    print(f"corgnn bench gpu on {gpu}: {len(steps)} steps, writing to {out}")
    for s in steps:
        print(f"  {s.name:<14} {s.minutes:>5.1f} min  {s.what}\n                 {s.command()}")
    print(f"estimate: at most {total:.0f} min (each step is stopped at its allotment; target {BUDGET_MIN:.0f} min)")
    if args.dry_run:
        return 0
    from importlib.metadata import version

    meta = {
        "gpu": gpu, "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__, "cuda": torch.version.cuda,
        "triton": version("triton"), "root": args.root, "quick": bool(args.quick),
    }
    records = run_steps(steps, out, meta)
    print(f"wrote {out}/summary.md")
    return 0 if all(r["status"] == "ok" for r in records) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m corgnn.bench.gpu", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
