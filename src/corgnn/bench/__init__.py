"""Benchmark suite against PyTorch Geometric (``corgnn bench``).

Not imported by ``import corgnn``; matplotlib (plots) and tqdm (progress bar) are
imported only inside the functions that use them.

Layout:

* :mod:`~corgnn.bench.experiments` - one module per experiment, each declaring one
  :class:`~corgnn.bench.spec.ExperimentSpec`; ``experiments.EXPERIMENTS`` is the
  registry the CLI, ``all`` and ``report`` use.
* :mod:`~corgnn.bench.spec` - what a spec is: ``ExperimentSpec``, ``CellSpec``, the
  presets (``full``, ``quick``, ``tiny``).
* :mod:`~corgnn.bench.runner` - plans, measures and reports any list of specs (a
  spec with a ``measure`` hook measures its cells itself, e.g. ``changing-graphs``).
* :mod:`~corgnn.bench.harness` - timing and peak-memory measurement of one step.
* :mod:`~corgnn.bench.baselines` - the models timed: corgnn variants and PyG baselines.
* :mod:`~corgnn.bench.workloads` - the plain PyG models and inputs of
  ``changing-graphs`` (importable without corgnn, for its fresh-process case).
* :mod:`~corgnn.bench.report` - results files, Markdown tables, plots.
* :mod:`~corgnn.bench.spmm` - ``corgnn bench spmm``, the kernel-level benchmark.
* :mod:`~corgnn.bench.triton_aot` - ``corgnn bench triton-aot``, the Triton kernels
  compiled ahead of time for sm_80/sm_90 (no GPU needed), resource usage.
* :mod:`~corgnn.bench.gpu` - ``corgnn bench gpu``, the whole GPU evaluation as one command.
* :mod:`~corgnn.bench.cli` - the ``corgnn bench`` subcommands.
"""
