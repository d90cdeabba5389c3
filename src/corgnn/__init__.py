"""corgnn: fast GCN/GAT training by cached operator reordering.

Paper: "Cached Operator Reordering: A Unified View for Fast GNN Training".
"""

from . import cost, nn, sparse
from ._cache import clear_caches
from .graph import Graph
from .interop import optimize
from .pyg_compat import trace_safe_edge_index_repr
from .runtime import reuse_freed_memory

trace_safe_edge_index_repr()  # PyG's EdgeIndex repr reads values, also fake ones under torch.compile (issue 23)

__version__ = "0.1.0"
__all__ = ["Graph", "optimize", "reuse_freed_memory", "clear_caches", "nn", "sparse", "cost", "__version__"]
