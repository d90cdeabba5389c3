"""The paper's evaluation (§"Evaluation", appendix "GCN Evaluation") as ``corgnn bench``
experiments, run against PyTorch Geometric in the same process.

Each module declares one experiment (``attention``: two) as a
:class:`~corgnn.bench.spec.ExperimentSpec` named ``SPEC`` (its cells, summary,
plots, grid per preset and expected minutes), and :data:`EXPERIMENTS` lists them:
the ``corgnn bench`` subcommands, ``all`` and ``report`` all come from it.

=================  =================================================================
module             experiment (``corgnn bench NAME``)
=================  =================================================================
``gcn_layer``      ``gcn-layer``: one GCN layer on OGB-Arxiv, every scheme vs output
                   size, ``auto`` vs the fastest, caching benefits
``gcn``            ``gcn``: 2-layer GCN vs the PyG baselines on the five datasets
``gat_caching``    ``gat-caching``: 2-layer 8-head GAT, the four caching schemes
``gat``            ``gat``: 2-layer 8-head GAT vs the PyG baselines
``attention``      ``gatv2`` and ``transformer``: 2-layer 8-head GATv2 and
                   TransformerConv networks vs PyG's, time and peak memory with
                   issue 25's goals per cell (one module, two specs)
``formats``        ``formats``: GCN and SpMM/SDDMM in every sparse format vs CSC
``memory``         ``memory``: peak memory of one GCN layer per scheme and for PyG
``layers``         ``layers``: PyG's GraphSAGE/GIN/SGC/APPNP vs the same after optimize
``versus``         what ``gcn`` and ``gat`` share (cells, summary, plots)
``common``         dataset lists, size ranges, row queries and tables shared by all
=================  =================================================================

Module ``changing_graphs``, experiment ``changing-graphs``: PyG models on a new graph
every call (mini-batches, sampled subgraphs, fresh tensors, an explanation loop, the
first call of a process) vs the same after optimize; it measures its cells itself
(its spec's ``measure`` hook).

Every experiment takes ``--quick`` (a few minutes on 2 cores), the full grid by
default (trimmed to ~26 minutes on 2 cores; each ``SPEC.grids`` says what its full
grid leaves out), and the hidden ``--tiny`` (tests). Output:
``results.csv``/``results.json``, ``summary.md`` and PNG plots under ``--out``
(default ``benchmarks/results/<experiment>-<preset>-<time>``).

The ``expected_min`` of each spec: per-cell step times and compile times measured on
a 2-core AMD EPYC VM (2 threads, some background load; 1-thread points scaled by
1/1.6), summed over the grid with the preset's warm-up, memory and repetition rules,
times 1.06 (the ratio of measured to estimated wall time of the quick run); a run
adds about half a minute of imports, dataset generation and plots (see
``benchmarks/README.md``).
"""

from __future__ import annotations

from ..spec import ExperimentSpec
from . import attention, changing_graphs, formats, gat, gat_caching, gcn, gcn_layer, layers, memory

__all__ = ["EXPERIMENTS"]

EXPERIMENTS: tuple[ExperimentSpec, ...] = (
    gcn_layer.SPEC, gcn.SPEC, gat_caching.SPEC, gat.SPEC, *attention.SPECS, formats.SPEC, memory.SPEC, layers.SPEC, changing_graphs.SPEC,
)
"""Every experiment of ``corgnn bench``, in the order of ``all``, of the subcommands
and of the sections of ``summary.md``."""

