"""Shared fixtures: small random graphs with the awkward cases PyG must agree on."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

# Without a GPU the ``triton`` backend's kernels run in Triton's interpreter on CPU
# tensors (slow: the tests forcing it use tiny graphs). Set before any test imports
# the kernels, which decide at definition whether they are interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON = pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="the triton package is not installed"))
KERNEL_BACKENDS = ["numba", "torch", TRITON]
"""Every backend that runs on CPU tensors (triton through its interpreter)."""


def make_graph(n: int = 40, q: int = 160, seed: int = 0, device="cpu"):
    """Directed random graph with duplicate edges, self-loops (incl. a duplicated
    loop) and isolated nodes (the last 3 ids have no edges)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, q), generator=g)
    extra = torch.tensor([[0, 0, 1, 2, 2, 5], [1, 1, 1, 2, 2, 4]])  # duplicates + self-loops
    return torch.cat([ei, extra], dim=1).to(device), n


@pytest.fixture
def graph():
    return make_graph()


@pytest.fixture(scope="session")
def cora():
    from corgnn.datasets import load_planetoid

    return load_planetoid("Cora")
