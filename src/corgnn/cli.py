"""The ``corgnn`` command: ``train``, ``explain``, ``bench``, ``warm``.

The command keeps freed CPU memory in its process for reuse
(:func:`corgnn.runtime.reuse_freed_memory`; ``CORGNN_REUSE_FREED_MEMORY=0`` keeps
glibc's defaults), for every subcommand and for PyG's models as much as corgnn's.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = {
    "train": ("corgnn.training.cli", "train a 2-layer GCN (or GAT) on a real Planetoid dataset"),
    "explain": ("corgnn.explain", "print the cost tables and scheme choices for sizes or a dataset"),
    "bench": ("corgnn.bench.cli", "benchmarks against PyTorch Geometric"),
    "warm": ("corgnn.warmup", "compile corgnn's common Numba kernels into this machine's cache now (no compile on later first calls)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Parser of the ``corgnn`` command; only ``command``'s module is imported
    (so one subcommand's dependencies never break another's)."""
    parser = argparse.ArgumentParser(prog="corgnn", description="Fast GCN/GAT training by cached operator reordering.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (mod, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            module = importlib.import_module(mod)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if os.environ.get("CORGNN_REUSE_FREED_MEMORY", "1") != "0":
        from .runtime import reuse_freed_memory

        reuse_freed_memory()  # this process trains or benchmarks: keep freed tensors' pages (corgnn.runtime)
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:  # user errors: message, no traceback
        print(f"corgnn {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
