"""``corgnn warm``: compile corgnn's common Numba kernels into this machine's Numba
cache now, so that no later process pays the compile on its first call
(:mod:`corgnn.sparse.backends.numba_warmup`: what is compiled, where the cache lives,
what it saves)."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", action="store_true", help="only say whether the cache is warm and where it lives")


def run(args) -> int:
    import numba

    from .sparse.backends import numba_warmup
    from .sparse.backends.numba_threads import cache_folder

    marker = numba_warmup.marker_path()
    where = numba.config.CACHE_DIR or "the __pycache__ folders beside corgnn's sources"
    print(f"Numba cache: {where}; corgnn's marker folder: {cache_folder() or 'none writable'}")
    if args.status:
        warm = marker is not None and numba_warmup.is_marked(marker)
        print("warm" if warm else "cold: `corgnn warm` compiles the common kernels (or they compile on first use)")
        return 0
    t0 = time.perf_counter()
    numba_warmup.warm(progress=lambda name: print(f"  compiling {name} kernels ...", file=sys.stderr, flush=True))
    print(f"done in {time.perf_counter() - t0:.1f} s" + (f"; marker {marker}" if marker else "; no writable folder for the marker"))
    return 0
