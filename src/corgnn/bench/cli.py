"""``corgnn bench EXPERIMENT``: benchmark experiments (filled in by the bench suite)."""

from __future__ import annotations

EXPERIMENTS: dict = {}


def add_arguments(p) -> None:
    p.add_argument("experiment", help="experiment name")


def run(args) -> int:
    raise ValueError(f"unknown experiment {args.experiment!r}; available: {sorted(EXPERIMENTS) or 'none yet'}")
