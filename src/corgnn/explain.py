"""``corgnn explain``: why a scheme is chosen, as tables of costs.

Either explicit sizes (``--n --q --m --k [--input-grad]``) for one GCN layer, or a
dataset (``--dataset Cora --hidden 16``) for both layers of the 2-layer GCN, each
with its own m, k and input-gradient need (the first layer needs none).

With a dataset (or ``--max-degree`` beside explicit sizes) it also prints the I/O
model of SpMM and SDDMM in every sparse format at ``--f`` columns (paper Tables 6-7,
:mod:`corgnn.cost.io`) and the format ``format="auto"`` picks. Cora and CiteSeer
are read from disk; other Table 5 names use the real files when present (for
PubMed, its real graph with synthetic features, labelled so, when only that is
found), else the seeded synthetic stand-in, labelled "(synthetic)". ``--adjacency raw`` models the
input edges as the paper's tables do (Cora: n=2708, q=10556, p=168) instead of the
GCN adjacency with self-loops.
"""

from __future__ import annotations

import torch

from .cost.gcn import GCN_SCHEMES, plan_gcn
from .cost.io import IO_FORMATS, MatrixStats, choose_format
from .functional.gcn import COMPOSED_SCHEME, ROWS_MIN_MACS, composed_first, small_product
from .nn.models import MODELS, build_model

__all__ = ["add_arguments", "run", "explain_gcn", "explain_formats", "explain_partitioned", "explain_model"]


def explain_gcn(n: int, q: int, layers: list[tuple], scheme: str = "auto") -> str:
    """Cost tables of each ``(m, k, input_grad[, x_nnz[, constant]])`` layer on a graph
    of n nodes, q entries (``x_nnz``: non-zeros of sparse input features, as GCNConv
    uses them; ``constant``: the input is constant, so ``A'X`` may be kept across
    calls, GCNConv's ``cache_propagation``)."""
    tables = []
    for m, k, input_grad, *rest in layers:
        x_nnz, constant = (list(rest) + [None, False])[:2]
        # (the candidates in the layers' order, for a training step on the built CSR: a tie on a small
        # product goes to the composition; without a backward or on an edge list every tie does, composes)
        candidates = GCN_SCHEMES if x_nnz is not None else composed_first(GCN_SCHEMES, n, m, k)
        plan = plan_gcn(n, q, m, k, input_grad, scheme=scheme, x_nnz=x_nnz, reuse=constant, candidates=candidates)
        table = plan.table()
        if plan.scheme == COMPOSED_SCHEME and x_nnz is None and small_product(n, m, k):
            table += (f"\nruns as spmm(A', X) then torch's own linear (a product of {n * m * k:,} < {ROWS_MIN_MACS:,} "
                      "multiply-adds on CPU: corgnn.functional.gcn.runs_composed)")
        tables.append(table)
    return "\n\n".join(tables)


def explain_formats(stats: MatrixStats, f: int, auto_widths: tuple[int, ...] = ()) -> str:
    """I/O-model table of SpMM and SDDMM in every format (paper Tables 6-7) at ``f``
    columns, and the format ``"auto"`` picks at ``f`` and at each of ``auto_widths``.

    A format the stats cannot model (hybrid without its COO-part size) shows ``-``.
    """
    head = ["format", "SpMM MFLOP", "SpMM MB", "SpMM FLOP/B", "SDDMM MFLOP", "SDDMM MB", "SDDMM FLOP/B"]
    body = []
    for fmt in IO_FORMATS:
        cells = [fmt]
        for op in ("spmm", "sddmm"):
            try:
                c = stats.io(op, fmt, f)
            except ValueError:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{c.flops / 1e6:.4g}", f"{c.bytes / 1e6:.4g}", f"{c.intensity:.3f}"]
        body.append(cells)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    hyb = f"hybrid t={stats.hybrid_t}, {stats.hybrid_coo_nnz} entries in its COO part" if stats.hybrid_coo_nnz is not None else "hybrid split unknown"
    lines = [
        f"Sparse formats, I/O model (paper Tables 6-7; 4-byte values and indices), f={f}: "
        f"n={stats.n} nnz={stats.nnz} max degree={stats.max_degree}, ELL padding {stats.padding_ratio:.1f}x, {hyb}",
        "  ".join(h.ljust(w) for h, w in zip(head, widths)),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    for width in dict.fromkeys((f,) + tuple(auto_widths)):
        ch = choose_format(stats, width)
        lines.append(f'format="auto" at f={width}: {ch.format} ({ch.reason})')
    return "\n".join(lines)


def explain_partitioned(g, layers: list[tuple], nproc: int, method: str = "auto", network_gbps: float = 10.0) -> str:
    """Cost tables with the halo-exchange term (:func:`corgnn.cost.comm.plan_partitioned_gcn`)
    of each ``(m, k, input_grad)`` layer of a GCN on Graph ``g`` split over ``nproc``
    ranks (the first layer's constant input halo counted as cached)."""
    from .cost.comm import NetworkModel, plan_partitioned_gcn
    from .distributed.partition import build_partitions, edge_cut, partition_nodes

    if network_gbps <= 0:
        raise ValueError(f"--network-gbps must be > 0, got {network_gbps}")
    parts = partition_nodes(g.edge_index, g.num_nodes, nproc, method)
    t = build_partitions(g.gcn_adjacency(), parts, [0])[0].totals
    net = NetworkModel(bandwidth=network_gbps * 1e9 / 8)
    head = f"Split over {nproc} ranks ({method}): edge cut {edge_cut(g.edge_index, parts)}, {t['n_halo']} halo rows in all"
    plans = [plan_partitioned_gcn(t["n"], t["nnz"], m, k, ig, world_size=nproc, halo_rows=t["n_halo"], input_cached=i == 0, network=net)
             for i, (m, k, ig) in enumerate(layers)]
    return "\n\n".join([head] + [p.table() for p in plans])


def _dataset_shape(name: str, root, width: int):
    """(n, q incl. self-loops, features, classes, label, Graph, x_nnz) of a dataset:
    real Cora/CiteSeer (and any Table 5 dataset whose files are found), else the
    synthetic stand-in; ``x_nnz`` None when a first layer of ``width`` output columns
    keeps the features dense (:func:`corgnn.nn.base.sparse_feature_density`)."""
    from .datasets import canonical_name, load_dataset, load_planetoid
    from .graph import Graph

    if canonical_name(name) in ("Cora", "CiteSeer"):
        data = load_planetoid(name, root)
        data.synthetic = False
    else:
        data = load_dataset(name, root)
    g = Graph(data.edge_index, num_nodes=data.num_nodes)
    q = g.gcn_adjacency().nnz
    label = data.name if getattr(data, "synthetic", False) else f"{data.name} (real)"
    from .nn.base import sparse_feature_density

    x_nnz = int(torch.count_nonzero(data.x))
    if x_nnz > sparse_feature_density(width) * data.x.numel():
        x_nnz = None  # dense features: a first GCNConv of ``width`` output columns keeps them dense
    return data.num_nodes, q, data.x.size(1), int(data.y.max()) + 1, label, g, x_nnz


def _raw_stats(g) -> MatrixStats:
    """Stats of the input edges alone (rows = targets), as the paper's Tables 6-7 count them."""
    import torch

    from .sparse.formats import CSR

    ones = torch.ones(g.num_edges)
    n = g.num_nodes
    return MatrixStats.of(CSR.from_coo(g.edge_index[1], g.edge_index[0], ones, (n, n)))


def add_arguments(p) -> None:
    p.add_argument("--dataset", default=None, help="dataset name (Cora, CiteSeer)")
    p.add_argument("--root", default=None, help="data root (see corgnn train --help)")
    p.add_argument("--hidden", type=int, default=16, help="hidden size of the 2-layer GCN (default 16)")
    p.add_argument("--n", type=int, help="nodes")
    p.add_argument("--q", type=int, help="stored entries of A' (edges + self-loops)")
    p.add_argument("--m", type=int, help="input features")
    p.add_argument("--k", type=int, help="output features")
    p.add_argument("--input-grad", action="store_true", help="the layer's input needs a gradient")
    p.add_argument("--constant-input", action="store_true",
                   help="with --n..--k: the input is constant (no grad, no input dropout), so A'X may be kept across calls")
    p.add_argument("--input-dropout", action="store_true",
                   help="with --dataset: the first layer's input is dropped out (a new tensor every call): no A'X kept across calls")
    p.add_argument("--scheme", default="auto", help="force a scheme (costs still shown)")
    p.add_argument("--f", type=int, default=64, help="dense columns of the SpMM/SDDMM I/O tables (default 64, as Tables 6-7)")
    p.add_argument("--adjacency", choices=("gcn", "raw"), default="gcn",
                   help="matrix of the I/O tables: the GCN adjacency with self-loops (default) or the raw edges (as the paper)")
    p.add_argument("--max-degree", type=int, help="with --n --q: longest row, to print the I/O tables for those sizes")
    p.add_argument("--nproc", type=int, default=None, help="with --dataset: split the graph over N ranks and add the halo-exchange term")
    p.add_argument("--partition", default="auto", choices=("auto", "metis", "range"), help="node split for --nproc (default auto)")
    p.add_argument("--network-gbps", type=float, default=10.0, help="network bandwidth per rank for --nproc, Gbit/s (default 10)")
    p.add_argument("--model", choices=tuple(n for n in MODELS if n not in ("gcn", "gat")), default=None,
                   help="with --dataset: the plans of that corgnn train model's layers in a training call (instead of the GCN's)")


def explain_model(model: str, dataset: str, root=None, hidden: int | None = None) -> str:
    """Plans (cost tables, choice, reason) of each planned layer of the ``corgnn train``
    model ``model`` in one training-mode call on ``dataset`` (row-normalised features)."""
    from .datasets import load_planetoid
    from .graph import Graph
    if hidden is not None and hidden < 1:
        raise ValueError(f"--hidden must be >= 1, got {hidden}")
    data = load_planetoid(dataset, root)
    x = data.x / data.x.sum(1, keepdim=True).clamp_min(1.0)
    net = build_model(model, x.size(1), int(data.y.max()) + 1, hidden=hidden)
    graph = Graph(data.edge_index, num_nodes=data.num_nodes)
    net(x, graph)
    tables = [
        (f"{name} ({type(m).__name__}, its aggregation + Linear as a GCN product):\n" if hasattr(m.last_plan, "scheme") and not isinstance(m.last_plan.scheme, str)
         else f"{name} ({type(m).__name__}, caching scheme):\n" if isinstance(getattr(m.last_plan, "scheme", None), str) else "") + m.last_plan.table()
        for name, m in net.named_modules() if getattr(m, "last_plan", None) is not None
    ]
    setup = "" if graph.last_setup is None else graph.last_setup.line() + " (the graph is new in this call)\n\n"
    return f"{data.name}: {model} model of corgnn train, one training call\n\n" + setup + "\n\n".join(tables)


def _check_sizes(args) -> None:
    """ValueError naming the first size argument that cannot describe a GCN layer."""
    for name in ("n", "q", "m", "k", "hidden", "f", "nproc"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name} must be >= 1, got {v}")
    if args.n is not None and args.q is not None and args.q > args.n * args.n:
        raise ValueError(f"--q {args.q} entries do not fit in an n x n matrix with --n {args.n} (at most {args.n * args.n})")
    if args.max_degree is not None and args.max_degree < 0:
        raise ValueError(f"--max-degree must be >= 0, got {args.max_degree}")


def run(args) -> int:
    _check_sizes(args)
    if args.model:
        if not args.dataset:
            raise ValueError("--model needs --dataset")
        print(explain_model(args.model, args.dataset, args.root, None if args.hidden == 16 else args.hidden))
        return 0
    if args.dataset:
        n, q, m, c, label, g, x_nnz = _dataset_shape(args.dataset, args.root, args.hidden)
        sparse_note = f", features used as a sparse matrix ({x_nnz} non-zeros)" if x_nnz is not None else ""
        print(f"{label}: n={n} q={q} (with self-loops) features={m} classes={c}{sparse_note}, 2-layer GCN hidden={args.hidden}")
        constant = not args.input_dropout
        print("first layer: " + ("constant features (no input dropout): A'X may be kept across calls\n" if constant else "input dropout: features change every call, A'X not kept\n"))
        print(explain_gcn(n, q, [(m, args.hidden, False, x_nnz, constant), (args.hidden, c, True)], args.scheme))
        if args.nproc is not None:
            print("\n" + explain_partitioned(g, [(m, args.hidden, False), (args.hidden, c, True)], args.nproc, args.partition, args.network_gbps))
        if x_nnz is not None:
            from .cost.features import plan_feature_conversion

            for uses, what in ((None, "the dataset's x (reused every step)"), (1, "a new tensor every step (e.g. after a dropout)")):
                print(f"{what}: " + plan_feature_conversion(n, m, x_nnz, args.hidden, training=True, uses=uses).line())
        if args.adjacency == "raw":
            stats, what = _raw_stats(g), "raw input edges (no self-loops, as the paper's tables)"
        else:
            stats, what = MatrixStats.of(g.gcn_adjacency()), "GCN adjacency A' (with self-loops)"
        print(f"\n{label}, {what}:")
        print(explain_formats(stats, args.f, (min(m, args.hidden), min(args.hidden, c))))
        return 0
    if args.nproc is not None:
        raise ValueError("--nproc needs --dataset (the halo comes from partitioning the graph)")
    missing = [k for k in ("n", "q", "m", "k") if getattr(args, k) is None]
    if missing:
        raise ValueError(f"give --dataset, or all of --n --q --m --k (missing: {', '.join('--' + k for k in missing)})")
    print(explain_gcn(args.n, args.q, [(args.m, args.k, args.input_grad, None, args.constant_input)], args.scheme))
    if args.max_degree is not None:
        if args.max_degree < 0 or args.max_degree * args.n < args.q:
            raise ValueError(f"--max-degree {args.max_degree} cannot hold q={args.q} entries in n={args.n} rows")
        print()
        print(explain_formats(MatrixStats(args.n, args.q, args.max_degree), args.f, (min(args.m, args.k),)))
    return 0
