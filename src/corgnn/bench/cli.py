"""``corgnn bench EXPERIMENT [options]``: benchmark experiments against PyG.

Each experiment is an object exposing ``add_arguments(parser)`` and ``run(args) ->
int``, listed in :data:`EXPERIMENTS` (name -> (target, one-line help)). The target is
a module path (the module itself is the experiment) or ``"module:attribute"`` (an
attribute of the module is). An experiment whose module fails to import still gets
its subcommand, which reports the import error when run, so one broken experiment
does not take the others down.
"""

from __future__ import annotations

import importlib

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "spmm": ("corgnn.bench.spmm", "SpMM/SDDMM of every sparse format vs torch.sparse and PyG scatter"),
    "gcn-layer": ("corgnn.bench.experiments:EXPERIMENTS['gcn-layer']", "single GCN layer on OGB-Arxiv: every scheme vs output size, auto vs fastest"),
    "gcn": ("corgnn.bench.experiments:EXPERIMENTS['gcn']", "2-layer GCN vs PyG (COO, CSR, compiled) on the five datasets"),
    "gat-caching": ("corgnn.bench.experiments:EXPERIMENTS['gat-caching']", "2-layer 8-head GAT: time and memory of the four caching schemes"),
    "gat": ("corgnn.bench.experiments:EXPERIMENTS['gat']", "2-layer 8-head GAT vs PyG (COO, CSR, compiled, dgNN fused)"),
    "formats": ("corgnn.bench.experiments:EXPERIMENTS['formats']", "GCN and SpMM/SDDMM in every sparse format, relative to CSC"),
    "memory": ("corgnn.bench.experiments:EXPERIMENTS['memory']", "peak memory of one GCN layer per scheme and for PyG"),
    "all": ("corgnn.bench.experiments:ALL", "every experiment above except spmm, into one directory"),
    "report": ("corgnn.bench.experiments:REPORT", "rebuild summary.md and plots from a run directory's results.json"),
}


def resolve(target: str):
    """The experiment object named by a registry target.

    ``"pkg.mod"`` -> the module; ``"pkg.mod:NAME"`` -> ``pkg.mod.NAME``;
    ``"pkg.mod:NAME['key']"`` -> ``pkg.mod.NAME['key']``.

    Raises:
        ImportError / AttributeError / KeyError: the target does not exist.
    """
    mod, _, attr = target.partition(":")
    obj = importlib.import_module(mod)
    if not attr:
        return obj
    name, _, key = attr.partition("[")
    obj = getattr(obj, name)
    if key:
        obj = obj[key.rstrip("]").strip("'\"")]
    return obj


def _broken(name: str, err: Exception):
    def run(args) -> int:
        raise ValueError(f"benchmark {name!r} is unavailable: {type(err).__name__}: {err}")

    return run


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, (target, help_) in EXPERIMENTS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        try:
            exp = resolve(target)
        except Exception as e:  # noqa: BLE001 - keep the other experiments usable
            sp.set_defaults(_experiment=_broken(name, e))
            continue
        exp.add_arguments(sp)
        sp.set_defaults(_experiment=exp.run)


def run(args) -> int:
    return int(args._experiment(args) or 0)
