"""``corgnn explain``: why a scheme is chosen, as tables of costs.

Either explicit sizes (``--n --q --m --k [--input-grad]``) for one GCN layer, or a
dataset (``--dataset Cora --hidden 16``) for both layers of the 2-layer GCN, each
with its own m, k and input-gradient need (the first layer needs none).
"""

from __future__ import annotations

from .cost.gcn import plan_gcn

__all__ = ["add_arguments", "run", "explain_gcn"]


def explain_gcn(n: int, q: int, layers: list[tuple[int, int, bool]], scheme: str = "auto") -> str:
    """Cost tables of each ``(m, k, input_grad)`` layer on a graph of n nodes, q entries."""
    return "\n\n".join(plan_gcn(n, q, m, k, g, scheme=scheme).table() for m, k, g in layers)


def _dataset_shape(name: str, root):
    """(n, q incl. self-loops, features, classes, label) of a dataset."""
    from .datasets import load_planetoid
    from .graph import Graph

    data = load_planetoid(name, root)
    g = Graph(data.edge_index, num_nodes=data.num_nodes)
    q = g.gcn_adjacency().nnz
    return data.num_nodes, q, data.x.size(1), int(data.y.max()) + 1, f"{data.name} (real)", g


def add_arguments(p) -> None:
    p.add_argument("--dataset", default=None, help="dataset name (Cora, CiteSeer)")
    p.add_argument("--root", default=None, help="data root (see corgnn train --help)")
    p.add_argument("--hidden", type=int, default=16, help="hidden size of the 2-layer GCN (default 16)")
    p.add_argument("--n", type=int, help="nodes")
    p.add_argument("--q", type=int, help="stored entries of A' (edges + self-loops)")
    p.add_argument("--m", type=int, help="input features")
    p.add_argument("--k", type=int, help="output features")
    p.add_argument("--input-grad", action="store_true", help="the layer's input needs a gradient")
    p.add_argument("--scheme", default="auto", help="force a scheme (costs still shown)")


def run(args) -> int:
    if args.dataset:
        n, q, m, c, label, _ = _dataset_shape(args.dataset, args.root)
        print(f"{label}: n={n} q={q} (with self-loops) features={m} classes={c}, 2-layer GCN hidden={args.hidden}\n")
        print(explain_gcn(n, q, [(m, args.hidden, False), (args.hidden, c, True)], args.scheme))
        return 0
    missing = [k for k in ("n", "q", "m", "k") if getattr(args, k) is None]
    if missing:
        raise ValueError(f"give --dataset, or all of --n --q --m --k (missing: {', '.join('--' + k for k in missing)})")
    print(explain_gcn(args.n, args.q, [(args.m, args.k, args.input_grad)], args.scheme))
    return 0
