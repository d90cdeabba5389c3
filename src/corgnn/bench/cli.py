"""``corgnn bench EXPERIMENT [options]``: benchmark experiments against PyG.

Subcommands: ``spmm`` (the kernel-level benchmark of :mod:`corgnn.bench.spmm`, with
its own options), ``distributed`` (:mod:`corgnn.bench.distributed`, its own options),
``clients`` (PyG's example scripts, :mod:`corgnn.bench.clients`), ``gpu`` (the whole
GPU evaluation, :mod:`corgnn.bench.gpu`), ``triton-aot`` (ahead-of-time compilation of
the Triton kernels, :mod:`corgnn.bench.triton_aot`), one per spec of
:data:`corgnn.bench.experiments.EXPERIMENTS`
(options of :func:`corgnn.bench.runner.add_common_arguments`), ``all`` (every spec
into one directory) and ``report DIR`` (rebuild ``summary.md`` and the plots).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from . import clients, distributed, gpu, gpu_check, runner, spmm, triton_aot
from .experiments import EXPERIMENTS


def _report_arguments(p) -> None:
    p.add_argument("dir", type=Path, help="run directory holding results.json")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    commands = [
        ("spmm", "SpMM/SDDMM of every sparse format vs torch.sparse and PyG scatter", spmm.add_arguments, spmm.run),
        ("distributed", "halo bytes and epoch time of partitioned GCN training, 1..N local processes", distributed.add_arguments, distributed.run),
        ("clients", "PyG's examples/gcn.py and gat.py on Cora and mutag_gin.py on a MUTAG stand-in, with and without optimize()", clients.add_arguments, clients.run),
        ("gpu", "the whole GPU evaluation (tests, spmm, GCN and GAT vs PyG on CUDA) into benchmarks/results/<gpu>-<date>", gpu.add_arguments, gpu.run),
        ("gpu-check", "corgnn's layers vs PyG's on one device (every GCN scheme, GAT cache and format, SAGE/GraphConv/GIN/SGC/APPNP): outputs and gradients", gpu_check.add_arguments, gpu_check.run),
        ("triton-aot", "compile every Triton kernel specialization for sm_80/sm_90 (no GPU needed): registers, spills, shared memory", triton_aot.add_arguments, triton_aot.run),
    ]
    commands += [(e.name, e.help, runner.add_common_arguments, partial(runner.run_experiments, [e])) for e in EXPERIMENTS]
    commands += [
        ("all", "every experiment above except spmm, into one directory", runner.add_common_arguments, partial(runner.run_experiments, list(EXPERIMENTS))),
        ("report", "rebuild summary.md and plots from a run directory's results.json", _report_arguments, partial(runner.rebuild_report, EXPERIMENTS)),
    ]
    for name, help_, add, run_ in commands:
        sp = sub.add_parser(name, help=help_, description=help_)
        add(sp)
        sp.set_defaults(_experiment=run_)


def run(args) -> int:
    # (benchmarks measure steady-state speed: the parallel kernels from the first call,
    # not their serial first tier, whose tier-up compile would land in one timed cell;
    # set CORGNN_TIER_UP_S to measure the tiers)
    from ..sparse.backends.numba_warmup import TIER_ENV_VAR

    if TIER_ENV_VAR in os.environ:
        return int(args._experiment(args) or 0)
    os.environ[TIER_ENV_VAR] = "0"
    try:
        return int(args._experiment(args) or 0)
    finally:  # (an in-process caller, a test, keeps its environment)
        os.environ.pop(TIER_ENV_VAR, None)
