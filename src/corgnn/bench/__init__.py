"""Benchmark suite against PyTorch Geometric (``corgnn bench``)."""
