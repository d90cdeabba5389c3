"""``corgnn bench spmm``: SpMM and SDDMM of every sparse format against torch and PyG.

For each dataset the GCN adjacency
``A' = D^-1/2 (A+I) D^-1/2`` (float32, ``graph.gcn_adjacency(format=...)``) is
multiplied in every format, at ``f`` in {16, 64, 256}. Datasets (``--datasets``,
default all six):

* Cora and CiteSeer: real, read with :func:`corgnn.datasets.load_planetoid`;
* PubMed: through :func:`corgnn.datasets.load_dataset`: Planetoid's files when
  present (labelled "PubMed (real)"), else PubMed's real citation graph from its
  LINQS file (:func:`corgnn.datasets.load_pubmed_graph`, labelled "PubMed (real
  graph, synthetic features)"; only the graph is used here), else the stand-in;
* Flickr and OGB-Arxiv: the seeded synthetic stand-ins of
  :func:`corgnn.datasets.synthetic`, labelled "(synthetic)" (random graphs with a
  skewed degree distribution: no locality for a reordering to recover);
* SBM: :func:`corgnn.datasets.sbm_graph`, a stochastic block model of OGB-Arxiv's
  size whose communities are hidden by shuffled node ids, labelled "SBM (synthetic,
  community structure)": where row reordering has locality to recover.

``--quick`` runs Cora, CiteSeer, PubMed and the OGB-Arxiv stand-in at f = 64 only
(under 2 minutes).

* SpMM ``A' B``, ``B (n, f)``; baselines ``torch.sparse.mm`` on a torch CSR tensor
  and PyG's gather/scatter propagation ``scatter(B[col] * w, row, reduce="sum")``
  (``torch_geometric.utils.scatter``, what ``GCNConv.propagate`` runs).
* SDDMM ``A' ⊙ (B C)``, ``B (n, f)``, ``C = B'^T``; baselines
  ``torch.sparse.sampled_addmm`` (plus the scaling by ``w``) and PyG-style gathers
  ``(B[row] * B'[col]).sum(-1) * w`` (what an edge-level ``message`` computes).

Devices: ``--device cpu`` (default; Numba kernels) or ``--device cuda`` (the
``triton`` backend's kernels; torch.sparse is cuSPARSE there); ``--backend NAME``
forces one corgnn backend (e.g. ``torch``, the gather fallback). On CUDA every call
is timed between two ``torch.cuda.synchronize()``, and the stream bandwidth is a
device-to-device copy.

Reported per row: median time (ms) over ``--repeats`` calls after one warm-up (and
the min-max spread), the bytes of the paper's I/O model (:func:`corgnn.cost.io_model`,
Tables 6-7), the bandwidth that achieves (GB/s), that as a fraction of this
machine's stream bandwidth (a large tensor copy measured in the same run: bytes
read + written / time, the fastest of 5 copies, measured again before each dataset
because this machine's bandwidth drifts), and the speed-ups ``t_baseline / t_corgnn`` over
torch.sparse and over PyG (> 1: corgnn faster). Each corgnn result is checked
against torch's (max abs error column).

Kernel by format (the NOTEs in :mod:`corgnn.sparse.ops` give the measurements
behind each choice): CSR runs the row kernel; CSC its dual through the CSR->CSC
permutation (SDDMM walks CSC's own columns); COO the row kernel over a pointer array
built once from its sorted rows for SpMM, and a per-entry kernel for SDDMM; ELL its
own kernel over the ``(n, p)`` matrices up to a padding ratio of 4 and the row plan
above it (the real graphs here pad 30-60x); hybrid the row kernel on its CSR part,
then the entry-balanced COO kernel on the rest.

Reading the numbers: the I/O model is the paper's. It counts ``B`` once for SpMM
(the gathered rows actually cross the memory bus up to ``q`` times, so "of
stream" is far below 100 % for graphs larger than the caches and can exceed it for
graphs that fit in them), and it counts ELL's padded matrices in full although the
kernels stop at each row's length, so ELL's GB/s overstates the traffic. Compare
formats by time; the bandwidth columns say how far each is from the model's floor.
"""

from __future__ import annotations

import contextlib
import csv
import json
import platform
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..sparse.registry import FORMAT_NAMES

__all__ = ["add_arguments", "run", "bench_graph", "stream_bandwidth", "dataset_name", "BenchRow", "DATASETS", "FEATURES", "FORMATS", "SBM"]

SBM = "SBM"
"""``--datasets`` name of :func:`corgnn.datasets.sbm_graph` (not one of Table 5's)."""
DATASETS = ("Cora", "CiteSeer", "PubMed", "Flickr", "OGB-Arxiv", SBM)
REAL = ("Cora", "CiteSeer")
FEATURES = (16, 64, 256)
FORMATS = FORMAT_NAMES  # the list of corgnn.sparse.registry
OPS = ("spmm", "sddmm")
QUICK = dict(datasets=("Cora", "CiteSeer", "PubMed", "OGB-Arxiv"), features=(64,), repeats=3)
"""``--quick``: PubMed (~0.1 M non-zeros, a few seconds) is cheap beside the OGB-Arxiv
stand-in; Flickr and SBM are left to the full run."""


@dataclass
class BenchRow:
    """One measured (dataset, op, f, implementation)."""

    dataset: str
    n: int
    nnz: int
    max_degree: int
    op: str
    f: int
    impl: str  # a corgnn format name, or "torch.sparse" / "pyg"
    median_ms: float
    min_ms: float
    max_ms: float
    model_bytes: int  # I/O-model bytes (corgnn formats; CSR's for baselines)
    gbps: float  # model_bytes / median time
    frac_stream: float  # gbps / stream bandwidth
    vs_torch: float | None = None  # t_torch / t_this (> 1: faster than torch.sparse)
    vs_pyg: float | None = None  # t_pyg / t_this
    max_abs_err: float | None = None  # against torch's result


def stream_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, device="cpu") -> float:
    """Copy bandwidth of ``device`` in bytes/s: ``y.copy_(x)`` of ``nbytes``,
    counting ``2 * nbytes`` (read + write), the fastest of ``repeats`` after a warm-up.

    The fastest, not the median: on a machine whose bandwidth varies (this project's
    shared VM measured 24-63 GB/s within one hour) it is the conservative reference
    for "of stream" (the fraction is never flattered by a slow copy). :func:`run`
    measures it again before each dataset, so a fraction compares a kernel with the
    copy rate of the same minutes."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    ts = _times(lambda: y.copy_(x), repeats)
    return 2 * x.numel() * 4 / min(ts)


def _times(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones
    (each implementation is timed in its own block; its warm-up call also absorbs
    the hand-over between Numba's and torch's thread pools). CUDA work is
    synchronised before and after each call."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def dataset_name(name: str) -> str:
    """``--datasets`` spelling: :data:`SBM` (any case) or a Table 5 name
    (:func:`corgnn.datasets.canonical_name`; ValueError on unknown names)."""
    from ..datasets import canonical_name

    if isinstance(name, str) and name.strip().lower() == SBM.lower():
        return SBM
    try:
        return canonical_name(name)
    except ValueError as e:
        raise ValueError(f"{e} or {SBM!r}") from None


def _load(name: str, root, device="cpu"):
    """(label, Graph on ``device``) of a :func:`dataset_name` (see the module docstring)."""
    from ..datasets import load_dataset, load_planetoid, sbm_graph, synthetic
    from ..graph import Graph

    if name in REAL:
        data = load_planetoid(name, root)
    elif name == "PubMed":
        data = load_dataset(name, root)
    elif name == SBM:
        data = sbm_graph()
    else:
        data = synthetic(name)
    label = data.name if getattr(data, "synthetic", False) else f"{data.name} (real)"
    return label, Graph(data.edge_index.to(device), num_nodes=data.num_nodes)


def bench_graph(label: str, graph, features=FEATURES, formats=FORMATS, ops=OPS, repeats: int = 10, bandwidth: float | None = None, seed: int = 0) -> list[BenchRow]:
    """Measure every ``op x f x format`` and the baselines on ``graph``'s GCN adjacency.

    Args:
        label: dataset name printed in the rows.
        graph: a :class:`corgnn.Graph`; its device is the benchmark's (the dense
            operands are made there).
        features: values of ``f``.
        formats: corgnn formats to time.
        ops: ``"spmm"`` and/or ``"sddmm"``.
        repeats: timed calls per measurement (median reported) after one warm-up.
        bandwidth: stream bandwidth in bytes/s (default: measured now).
        seed: seed of the dense operands (a local generator; no global seeding).

    Returns:
        A list of :class:`BenchRow`.

    Raises:
        ValueError: unknown format/op, ``repeats < 1`` or empty ``features``.
    """
    from torch_geometric.utils import scatter

    from ..cost.io import MatrixStats
    from ..sparse import sddmm, spmm

    bad = [f for f in formats if f not in FORMATS] + [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown formats/ops {bad}; formats are {FORMATS}, ops {OPS}")
    if repeats < 1 or not features:
        raise ValueError(f"repeats must be >= 1 and features non-empty, got {repeats}, {features}")
    csr = graph.gcn_adjacency()
    dev = csr.device
    bw = bandwidth or stream_bandwidth(device=dev)
    n = csr.shape[0]
    stats = MatrixStats.of(csr)
    mats = {fmt: graph.gcn_adjacency(format=fmt) for fmt in formats}  # built once, cached on the graph
    w, row, col = csr.val, csr.row(), csr.col
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore")
        tcsr = torch.sparse_csr_tensor(csr.rowptr, col, w, (n, n), check_invariants=False)
    gen = torch.Generator().manual_seed(seed)
    rows: list[BenchRow] = []
    for f in features:
        B = torch.randn(n, f, generator=gen).to(dev)
        C = torch.randn(n, f, generator=gen).to(dev)
        for op in ops:
            if op == "spmm":
                ref_fn = lambda: torch.sparse.mm(tcsr, B)  # noqa: E731
                pyg_fn = lambda: scatter(B.index_select(0, col) * w.unsqueeze(1), row, dim=0, dim_size=n, reduce="sum")  # noqa: E731
                ours = {fmt: (lambda A=A: spmm(A, B)) for fmt, A in mats.items()}
                ref = ref_fn()
            else:
                Ct = C.t()
                ref_fn = lambda: torch.sparse.sampled_addmm(tcsr, B, Ct, beta=0.0).values() * w  # noqa: E731
                pyg_fn = lambda: (B.index_select(0, row) * C.index_select(0, col)).sum(-1) * w  # noqa: E731
                ours = {fmt: (lambda A=A: sddmm(A, B, Ct)) for fmt, A in mats.items()}
                ref = ref_fn()
            errs = {}
            for fmt, fn in ours.items():
                res = fn()
                if op == "sddmm":  # bring to CSR entry order to compare
                    res = _to_csr_order(mats[fmt], res)
                errs[fmt] = float((res - ref).abs().max()) if res.numel() else 0.0
            ts = {impl: _times(fn, repeats) for impl, fn in {"torch.sparse": ref_fn, "pyg": pyg_fn, **ours}.items()}
            med_ref, med_pyg = statistics.median(ts["torch.sparse"]), statistics.median(ts["pyg"])
            for impl, t in ts.items():
                nbytes = stats.io(op, impl if impl in FORMATS else "csr", f).bytes
                rows.append(_row(label, stats, op, f, impl, t, nbytes, bw, med_ref, med_pyg, errs.get(impl)))
    return rows


def _to_csr_order(A, vals: torch.Tensor) -> torch.Tensor:
    """Per-entry values of ``A`` (its own order) rearranged into its CSR's order."""
    if A.name in ("csr", "coo", "ell"):  # row-major already (the COO here is the CSR's)
        return vals
    if A.name == "csc":
        out = torch.empty_like(vals)
        out[A.perm] = vals
        return out
    return vals.index_select(0, A.csr_order())  # hybrid


def _row(label, stats, op, f, impl, ts, nbytes, bw, med_ref, med_pyg, err) -> BenchRow:
    med = statistics.median(ts)
    gbps = nbytes / med / 1e9
    return BenchRow(
        dataset=label, n=stats.n, nnz=stats.nnz, max_degree=stats.max_degree, op=op, f=f, impl=impl,
        median_ms=med * 1e3, min_ms=min(ts) * 1e3, max_ms=max(ts) * 1e3, model_bytes=nbytes,
        gbps=gbps, frac_stream=gbps * 1e9 / bw, vs_torch=med_ref / med, vs_pyg=med_pyg / med, max_abs_err=err,
    )


def format_table(rows: list[BenchRow]) -> str:
    """Fixed-width text table of ``rows``."""
    head = ["dataset", "op", "f", "impl", "median ms", "min-max ms", "model MB", "GB/s", "of stream", "vs torch", "vs PyG", "max err"]
    body = []
    for r in rows:
        body.append([
            r.dataset, r.op, str(r.f), r.impl, f"{r.median_ms:.3f}", f"{r.min_ms:.3g}-{r.max_ms:.3g}",
            f"{r.model_bytes / 1e6:.3g}", f"{r.gbps:.2f}", f"{100 * r.frac_stream:.1f}%",
            f"{r.vs_torch:.2f}x", f"{r.vs_pyg:.2f}x", "-" if r.max_abs_err is None else f"{r.max_abs_err:.1e}",
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _csv_list(s: str, cast=str) -> tuple:
    return tuple(cast(x.strip()) for x in s.split(",") if x.strip())


def add_arguments(p) -> None:
    p.add_argument("--datasets", type=_csv_list, default=None, help=f"comma-separated (default {','.join(DATASETS)}; Cora/CiteSeer real, PubMed's real graph when found, SBM a community-structured graph, the rest synthetic)")
    p.add_argument("--f", dest="features", type=lambda s: _csv_list(s, int), default=None, help="feature widths (default 16,64,256)")
    p.add_argument("--formats", type=_csv_list, default=FORMATS, help=f"corgnn formats (default {','.join(FORMATS)})")
    p.add_argument("--ops", type=_csv_list, default=OPS, help="spmm,sddmm (default both)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per measurement, median reported (default 10)")
    p.add_argument("--quick", action="store_true", help="defaults for a run under 2 min: Cora, CiteSeer, PubMed and synthetic OGB-Arxiv at f=64, 3 repeats")
    p.add_argument("--root", default=None, help="data root of the real datasets (see corgnn train --help)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the matrices and operands live (default cpu)")
    p.add_argument("--backend", default=None, help="force one corgnn kernel backend (numba, torch, triton; default: automatic)")
    p.add_argument("--out", default=None, help="directory to write spmm.csv and spmm.json")


def run(args) -> int:
    defaults = QUICK if args.quick else dict(datasets=DATASETS, features=FEATURES, repeats=10)
    datasets = tuple(dataset_name(d) for d in (args.datasets or defaults["datasets"]))  # ValueError on unknown names
    features = args.features or defaults["features"]
    repeats = args.repeats if args.repeats is not None else defaults["repeats"]
    bad = [x for x in args.formats if x not in FORMATS] + [o for o in args.ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown --formats/--ops {bad}; formats are {','.join(FORMATS)}, ops {','.join(OPS)}")
    if repeats < 1 or any(f < 1 for f in features):
        raise ValueError(f"--repeats and --f must be >= 1, got {repeats} and {features}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to torch on this machine")
    import numba

    from ..runtime import allocator_label
    from ..sparse import use_backend
    from ..sparse.dispatch import Case, select

    forced = (lambda: use_backend(args.backend)) if args.backend else contextlib.nullcontext  # None keeps $CORGNN_BACKEND
    with forced():  # ValueError on an unknown name
        backend = select(Case("spmm_rows", args.device, torch.float32)).name  # ValueError if it cannot run here
    machine = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    meta = {
        "threads": numba.get_num_threads(), "torch": torch.__version__,
        "numba": numba.__version__, "machine": machine, "device": args.device, "backend": backend,
        "datasets": list(datasets), "features": list(features), "repeats": repeats, "quick": bool(args.quick),
        "allocator": allocator_label(),
    }
    where = f"{machine}, backend {backend}" if args.device == "cuda" else f"{meta['threads']} threads, backend {backend}"
    print(f"stream copy bandwidth: fastest of 5 copies, measured before each dataset; {where}, CPU allocator {meta['allocator']}; medians of {repeats} calls; "
          "speed-ups are t_baseline / t_corgnn (> 1: corgnn faster)\n")
    rows: list[BenchRow] = []
    meta["stream_GBps_per_dataset"] = {}
    for name in datasets:
        label, graph = _load(name, args.root, args.device)
        bw_d = stream_bandwidth(device=args.device)  # the copy rate of these minutes (see stream_bandwidth)
        meta["stream_GBps_per_dataset"][label] = bw_d / 1e9
        with forced():
            got = bench_graph(label, graph, features, args.formats, args.ops, repeats, bw_d)
        print(f"{label}: n={got[0].n} nnz={got[0].nnz} (GCN adjacency, self-loops included) max degree={got[0].max_degree}; "
              f"stream copy now {bw_d / 1e9:.2f} GB/s")
        print(format_table(got) + "\n")
        rows += got
    meta["stream_GBps"] = max(meta["stream_GBps_per_dataset"].values())  # the run's best copy rate
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "spmm.csv", "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
            wr.writeheader()
            wr.writerows(asdict(r) for r in rows)
        (out / "spmm.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1, default=str))
        print(f"wrote {out / 'spmm.csv'} and {out / 'spmm.json'}")
    return 0

