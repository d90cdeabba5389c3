"""``corgnn bench EXPERIMENT [options]``: benchmark experiments against PyG.

Each experiment is a module exposing ``add_arguments(parser)`` and ``run(args) -> int``,
listed in :data:`EXPERIMENTS` (name -> (module, one-line help)).
"""

from __future__ import annotations

import importlib

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "spmm": ("corgnn.bench.spmm", "SpMM/SDDMM of every sparse format vs torch.sparse and PyG scatter"),
}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, (mod, help_) in EXPERIMENTS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        module = importlib.import_module(mod)
        module.add_arguments(sp)
        sp.set_defaults(_experiment=module.run)


def run(args) -> int:
    return int(args._experiment(args) or 0)
