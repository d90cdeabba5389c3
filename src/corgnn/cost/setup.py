"""Whether a graph's propagation matrix is worth building: the setup cost in the plan.

A layer multiplies by its graph's matrix ``A`` (rows = targets, columns = sources).
On a new graph two ways are open (CPU):

* **build** ``A`` as a CSR (:meth:`corgnn.Graph.aggr_adjacency`: a counting sort in one
  pass, the walk of ``A^T`` for the backward, bound kernels), then run each product
  on the parallel row kernel;
* **scatter** over the graph's **edge list** as it came (an unsorted COO whose
  transpose is its two index arrays swapped: no build, no sort): ``spmm_coo``, each
  product's output rows split over the threads, every task reading every entry.

Which pays depends on how often the matrix will be used, which a graph cannot know
when it is new: a mini-batch's graph serves one forward and one backward product per
layer and is gone; a full-batch graph serves every epoch. So the plan is the rent-
or-buy rule (the "ski rental" problem): a graph scatters, and counts the time the
row kernel would have saved (its *rent*, :func:`scatter_rent_s`), until that rent
reaches the price of the build (:func:`build_s`); it then builds, once. A graph used
on and on pays at most the build twice over; one used a few times never builds.
On the small graphs of mini-batch training the scatter is as fast as the row kernel
(the rent is zero): they never build.

Times in seconds, from per-entry and per-entry-and-column rates measured with
corgnn's Numba kernels (the NOTEs below); ``threads`` is the thread count the row
kernel splits over (``torch.get_num_threads()``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

__all__ = ["BuildPlan", "scatter_s", "rows_s", "build_s", "scatter_rent_s", "free_columns"]

# NOTE (measured 2026-11-29 on the 2-core CI-type VM, min of 9 runs, mini-batches of
# 32 / 128 / 512 / 2048 molecule graphs, 4k / 17k / 68k / 270k entries with the
# diagonal, 16 and 64 columns): the scatter (spmm_coo) on one thread took 14 / 53 /
# 201 / 787 us at 16 columns and 31 / 113 / 451 / 3796 at 64, split over two (each
# task reads every entry, adds its own rows': the per-entry part stays) 10 / 29 us at
# 16 columns and 18 / 75 at 64 (32 / 128 graphs); the parallel row kernel (spmm_rows,
# 2 threads) 24 / 70 / 143 / 541 and 34 / 60 / 204 / 1219; the CSR build of the graph
# (validation included) 58 / 140 / 459 / 7050 us. Fitted below; the build's fixed
# part is what a new matrix costs in the training loop beyond the build kernel (the
# transposed walk, the bound launchers: ~150 us a batch there). A 5-layer GIN
# trained on batches of 128 graphs ran 1.08x PyG when the plan modelled the scatter
# on one thread (its matrix built at the third layer of each batch), 1.20x with
# the build never paying (the same process, alternating).
_SCATTER_FIXED_S = 3e-6
_SCATTER_ENTRY_S = 1.3e-9
_SCATTER_ENTRY_COLUMN_THREAD_S = 0.085e-9
_ROWS_FIXED_S = 15e-6
_ROWS_ENTRY_S = 1.2e-9
_ROWS_ENTRY_COLUMN_THREAD_S = 0.06e-9  # (one thread's rate: divided by the thread count)
_BUILD_FIXED_S = 150e-6
_BUILD_ENTRY_S = 6e-9


def scatter_s(nnz: int, columns: int, threads: int) -> float:
    """Seconds of one scatter product (``spmm_coo``) of ``nnz`` entries and ``columns``
    dense columns, its output rows split over ``threads``."""
    return _SCATTER_FIXED_S + nnz * (_SCATTER_ENTRY_S + columns * _SCATTER_ENTRY_COLUMN_THREAD_S / max(1, threads))


def rows_s(nnz: int, columns: int, threads: int) -> float:
    """Seconds of one product on a built matrix (the row kernel over ``threads``)."""
    return _ROWS_FIXED_S + nnz * (_ROWS_ENTRY_S + columns * _ROWS_ENTRY_COLUMN_THREAD_S / max(1, threads))


def build_s(nnz: int) -> float:
    """Seconds of building a graph's CSR of ``nnz`` entries, its transposed walk and
    launchers included."""
    return _BUILD_FIXED_S + nnz * _BUILD_ENTRY_S


@functools.lru_cache(maxsize=256)
def scatter_rent_s(nnz: int, columns: int, threads: int, products: int = 1) -> float:
    """What ``products`` scatter products cost beyond the row kernel's (never below 0:
    where the scatter is faster, scattering costs nothing to keep). Memoized (the
    sizes of a training loop repeat).

    Raises:
        ValueError: a negative ``nnz``, ``columns`` or ``products``, or ``threads < 1``.
    """
    if min(nnz, columns, products) < 0 or threads < 1:
        raise ValueError(f"scatter_rent_s: nnz, columns and products must be >= 0 and threads >= 1, got {nnz}, {columns}, {products}, {threads}")
    return products * max(0.0, scatter_s(nnz, columns, threads) - rows_s(nnz, columns, threads))


@functools.lru_cache(maxsize=256)
def free_columns(nnz: int, threads: int) -> float:
    """The widest product (dense columns) whose scatter over ``nnz`` entries costs no
    rent (:func:`scatter_rent_s` 0: the scatter is at least as fast as the row kernel;
    a product of fewer columns costs none either, as the scatter's per-column rate is
    the higher); ``inf`` when every width is free, -1 when none is. Memoized.

    Raises:
        ValueError: a negative ``nnz``, or ``threads < 1``.
    """
    if nnz < 0 or threads < 1:
        raise ValueError(f"free_columns: nnz must be >= 0 and threads >= 1, got {nnz}, {threads}")
    per_column = nnz * (_SCATTER_ENTRY_COLUMN_THREAD_S - _ROWS_ENTRY_COLUMN_THREAD_S) / threads
    slack = rows_s(nnz, 0, threads) - scatter_s(nnz, 0, threads)
    if per_column <= 0:
        return math.inf if slack >= 0 else -1
    if slack < 0:
        return -1
    width = math.floor(slack / per_column)
    while width >= 0 and scatter_rent_s(nnz, width, threads):  # (the closed form's rounding: what the rent says)
        width -= 1
    return width


class BuildPlan(NamedTuple):
    """The state of the rent-or-buy rule for one matrix after a product
    (:attr:`corgnn.Graph.last_setup`).

    Attributes:
        build: the rent paid reached the price: the matrix is built now.
        rent_s: the rent paid so far, the latest product's included (seconds).
        price_s: the build's price (seconds).

    (A NamedTuple: one is made per layer call on a mini-batch, built in C.)
    """

    build: bool
    rent_s: float
    price_s: float

    def line(self) -> str:
        """One line for ``corgnn explain``."""
        what = "build the CSR" if self.build else "scatter over the edge list"
        return f"graph setup: {what} (rent so far {self.rent_s * 1e6:.0f} us of a {self.price_s * 1e6:.0f} us build)"
