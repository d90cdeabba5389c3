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

FORCED_TRITON_INTERPRETER = (
    os.environ.get("CORGNN_BACKEND", "") == "triton"
    and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    and not torch.cuda.is_available()
)
"""The run CI makes second (``CORGNN_BACKEND=triton TRITON_INTERPRET=1`` on CPU): every
kernel of every layer test runs in Triton's interpreter, one program at a time."""

FAST_GRADCHECK = FORCED_TRITON_INTERPRETER
"""``fast_mode`` for the layer tests' gradcheck/gradgradcheck: random projections of the
Jacobian instead of every entry when each kernel call is interpreted (full Jacobians
took minutes per test there); exact entry-by-entry checks everywhere else."""

HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_ON_CPU = HAS_TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
"""Whether the triton backend runs CPU tensors here (through Triton's interpreter):
always without a GPU; on a CUDA machine only when ``TRITON_INTERPRET=1`` is set."""
needs_triton_on_cpu = pytest.mark.skipif(
    not TRITON_ON_CPU,
    reason="the triton backend on CPU tensors needs Triton's interpreter, which a CUDA machine leaves off "
    "(TRITON_INTERPRET unset); there `corgnn bench gpu-check --device cuda` runs every layer on the kernels"
    if HAS_TRITON else "the triton package is not installed",
)
TRITON = pytest.param("triton", marks=needs_triton_on_cpu)
KERNEL_BACKENDS = ["numba", "torch", TRITON]
"""Every backend that runs on CPU tensors (triton through its interpreter)."""


def eight_head_tier(monkeypatch, heads: int) -> None:
    """With 8 heads, the tiered Numba kernels run their parallel compilations for the
    rest of the test: only those carry the attention helpers' eight-head paths
    (``numba_kernels.HEADS8``); the serial first tiers run the loops (the same code
    any other head count tests)."""
    if heads == 8:
        from corgnn.sparse.backends import numba_warmup

        monkeypatch.setattr(numba_warmup.Tier, "parallel", lambda self: True)


def make_graph(n: int = 40, q: int = 160, seed: int = 0, device="cpu"):
    """Directed random graph with duplicate edges, self-loops (incl. a duplicated
    loop) and isolated nodes (the last 3 ids have no edges)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, q), generator=g)
    extra = torch.tensor([[0, 0, 1, 2, 2, 5], [1, 1, 1, 2, 2, 4]])  # duplicates + self-loops
    return torch.cat([ei, extra], dim=1).to(device), n


def leaves_graph(n: int = 40, targets: int = 8, q: int = 60, seed: int = 1):
    """Edges into the first ``targets`` nodes only (with a duplicate and a self-loop),
    as a sampled subgraph's last hop: most rows of ``A`` are empty."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, n, (q,), generator=g), torch.randint(0, targets, (q,), generator=g)])
    return torch.cat([ei, torch.tensor([[5, 5, 3], [2, 2, 3]])], 1), n


@pytest.fixture
def graph():
    return make_graph()


@pytest.fixture(scope="session")
def cora():
    from corgnn.datasets import load_planetoid

    return load_planetoid("Cora")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "large_graph: runs on a Cora-sized graph (tests taking the `cora` fixture are marked "
        "automatically); skipped when the Triton interpreter is forced on CPU",
    )


def pytest_collection_modifyitems(config, items):
    """Under the forced Triton interpreter, skip Cora-sized tests: at ~5 ms per kernel
    program one Cora layer call takes minutes. The same layer code runs there on the
    tiny graphs of :func:`make_graph`, and on Cora in the normal run."""
    if not FORCED_TRITON_INTERPRETER:
        return
    skip = pytest.mark.skip(reason="Cora-sized graph: too slow for the Triton interpreter (CORGNN_BACKEND=triton TRITON_INTERPRET=1); covered on tiny graphs in this run and on Cora in the normal run")
    for item in items:
        if "cora" in getattr(item, "fixturenames", ()) or item.get_closest_marker("large_graph"):
            item.add_marker(skip)
