"""A/B of issue 12's levers on a 2-layer GCN training step, in one process.

    python benchmarks/ab_issue12.py cache [--datasets Cora,PubMed,OGB-Arxiv] [--hidden 16,256]
    python benchmarks/ab_issue12.py bias  [...]
    python benchmarks/ab_issue12.py prefetch  [--kinds paper,gat]
    python benchmarks/ab_issue12.py allocator [--kinds paper,pyg,floor]

``cache`` (lever 1): the same model with ``cache_propagation`` on ("after") and off
("before") in three forms: ``paper`` (corgnn.nn.GCN, no dropout, as the paper's
benchmarks), ``ogb`` (OGB's reference GCN: dropout 0.5 between the layers only) and
``kipf`` (dropout 0.5 on the input too: the cache must not apply; a control).
``bias`` (lever 2): the bias added by the SpMM's row kernel ("after") against a
separate ``out += bias`` pass ("before", the module's SpMM wrapped for the A/B).
``prefetch`` (lever 3): the Numba kernels' prefetching compilations where the
gathered operand exceeds ``PREFETCH_MIN_BYTES`` ("after", the default) against the
plain ones everywhere ("before"); models ``paper`` and ``gat`` (corgnn.nn.GAT, 8
heads of ``hidden / 8``). ``allocator`` (lever 4): :func:`corgnn.reuse_freed_memory`
on ("after") and off ("before", glibc's defaults), toggled around each timed block;
models ``paper``, ``pyg`` (PyG's GCNConv on a torch CSR ``adj_t``, cached) and
``floor`` (the dense-work floor MLP); also the minor page faults per step.

A step is forward + cross-entropy on the training nodes + backward (no optimiser
step). The process runs with :func:`corgnn.reuse_freed_memory` on, as the ``corgnn``
command does (lever 4; the ``cache`` and ``bias`` tables below were measured before
it existed, with glibc's defaults). Variants alternate within each round; reported: the median step time of each
and the median of the per-round ratios after/before (with its IQR). Datasets: Cora
(real), PubMed (its real graph, :func:`corgnn.datasets.load_pubmed_graph`: the LINQS
file from ``../shared/datasets/PubMed-graph``, ids in order of first appearance,
symmetrised, self-citations dropped; seeded synthetic TF-IDF-like features, 500
columns, about 10 % non-zero, random labels), and the seeded synthetic Table 5
stand-ins.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
from torch import nn

import corgnn.functional.gcn as fgcn
from corgnn import reuse_freed_memory
from corgnn.datasets import load_dataset, load_planetoid, load_pubmed_graph
from corgnn.nn import GCN, GCNConv
from corgnn.nn.gcn import dropout
from corgnn.sparse.backends import numba_kernels

def load(name: str):
    if name == "Cora":
        d = load_planetoid("Cora")
        d.name = "Cora (real)"
        return d
    if name == "PubMed":
        return load_pubmed_graph()  # DatasetNotFoundError when the LINQS file is absent
    return load_dataset(name)


class OGBGCN(nn.Module):
    """OGB's reference GCN (2 layers): dropout between the layers, none on the input."""

    def __init__(self, m, h, c, p=0.5):
        super().__init__()
        self.conv1, self.conv2, self.p = GCNConv(m, h), GCNConv(h, c), p

    def forward(self, x, ei):
        x = torch.relu(self.conv1(x, ei))
        return self.conv2(dropout(x, self.p, self.training), ei)


class PygCSR(nn.Module):
    """PyG's 2-layer GCN on ``adj_t`` (a torch CSR tensor), ``cached=True``."""

    def __init__(self, m, h, c):
        super().__init__()
        from torch_geometric.nn import GCNConv as PygGCNConv

        self.conv1, self.conv2 = PygGCNConv(m, h, cached=True), PygGCNConv(h, c, cached=True)
        self.adj_t = None

    def forward(self, x, ei):
        if self.adj_t is None:
            from torch_geometric.utils import to_torch_csr_tensor

            self.adj_t = to_torch_csr_tensor(ei.flip(0), size=(x.size(0), x.size(0)))
        return self.conv2(torch.relu(self.conv1(x, self.adj_t)), self.adj_t)


def build(kind: str, m: int, h: int, c: int) -> nn.Module:
    torch.manual_seed(0)
    if kind == "ogb":
        return OGBGCN(m, h, c)
    if kind == "gat":
        from corgnn.nn import GAT

        return GAT(m, max(1, h // 8), c, heads=8)
    if kind == "pyg":
        return PygCSR(m, h, c)
    if kind == "floor":
        from corgnn.bench.baselines import DenseFloor

        return DenseFloor(m, h, c)
    return GCN(m, h, c, dropout=0.5 if kind == "kipf" else 0.0)


def with_setting(fn, setter, value):
    """``fn`` with a ``context`` attribute: ``setter(value)`` on entry, ``setter(None)``
    (the default) on exit; :func:`ab` and :func:`faults` enter it around each timed
    block, so switching the setting is not timed."""
    @contextlib.contextmanager
    def context():
        setter(value)
        try:
            yield
        finally:
            setter(None)

    def run():
        fn()

    run.context = context
    return run


def _context(fn):
    return getattr(fn, "context", contextlib.nullcontext)()


def plain_kernels(value):
    """Lever 3's "before": no prefetching compilation is used (``value`` True)."""
    numba_kernels.PREFETCH_MIN_BYTES = 2**62 if value else _PREFETCH_MIN_BYTES


def allocator(value):
    """Lever 4: ``value`` False = glibc's defaults for the timed block; None = back to on."""
    reuse_freed_memory(value is not False)


_PREFETCH_MIN_BYTES = numba_kernels.PREFETCH_MIN_BYTES


def set_cache(model: nn.Module, on: bool) -> nn.Module:
    for mod in model.modules():
        if isinstance(mod, GCNConv):
            mod.cache_propagation = on
    return model


def separate_bias_spmm(A, B, *, bias=None, **kw):
    """The SpMM followed by a separate pass adding the bias (the code before lever 2)."""
    out = _SPMM(A, B, **kw)
    return out if bias is None else out.add_(bias)


_SPMM = fgcn.spmm


def step(model, d):
    model.zero_grad(set_to_none=True)
    out = model(d.x, d.edge_index)
    nn.functional.cross_entropy(out[d.train_mask], d.y[d.train_mask]).backward()


def faults(fn, reps: int = 3) -> float:
    """Median minor page faults of one call of ``fn`` (after one untimed call)."""
    import resource

    out = []
    with _context(fn):
        fn()
        for _ in range(reps):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            fn()
            out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(out)


def timed(fn, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def ab(before, after, rounds: int, budget_s: float = 0.4):
    """(median ms before, median ms after, median ratio, q1, q3) over ``rounds`` paired rounds."""
    for _ in range(2):
        before(), after()
    one = timed(before, 1) / 1e3
    reps = max(1, min(50, int(budget_s / max(one, 1e-6))))
    tb, ta, ratio = [], [], []
    for r in range(rounds):
        order = ((before, tb), (after, ta)) if r % 2 == 0 else ((after, ta), (before, tb))
        for fn, acc in order:
            with _context(fn):
                fn()  # untimed: the first step after a switch pays the switch (e.g. a trimmed heap)
                acc.append(timed(fn, reps))
        ratio.append(ta[-1] / tb[-1])
    q = statistics.quantiles(ratio, n=4)
    return statistics.median(tb), statistics.median(ta), statistics.median(ratio), q[0], q[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lever", choices=("cache", "bias", "prefetch", "allocator"))
    p.add_argument("--datasets", default="Cora,PubMed,OGB-Arxiv")
    p.add_argument("--hidden", default="16,256")
    p.add_argument("--kinds", default=None, help="models (default: cache paper,ogb,kipf; bias paper; prefetch paper,gat; allocator paper,pyg,floor)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="torch and Numba threads (default: as set)")
    args = p.parse_args()
    if args.threads:
        import numba

        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    default_kinds = {"cache": "paper,ogb,kipf", "bias": "paper", "prefetch": "paper,gat", "allocator": "paper,pyg,floor"}
    kinds = (args.kinds or default_kinds[args.lever]).split(",")
    allocator(None)  # as under the corgnn command: freed memory reused (lever 4; toggled by that lever's A/B)
    import numba

    print(f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()}; lever {args.lever}; {args.rounds} rounds")
    faults_head = " faults/step before | faults/step after |" if args.lever == "allocator" else ""
    print(f"| dataset | model | hidden | scheme layer 1 (after) | before ms | after ms | after/before (IQR) |{faults_head}")
    print("|---|---|---|---|---|---|---|" + ("---|---|" if faults_head else ""))
    for name in args.datasets.split(","):
        d = load(name)
        c = int(d.y.max()) + 1
        for kind in kinds:
            for h in map(int, args.hidden.split(",")):
                before = build(kind, d.x.size(1), h, c)
                after = copy.deepcopy(before)
                if args.lever == "cache":
                    set_cache(before, False)

                    def run_before():
                        step(before, d)
                elif args.lever == "prefetch":
                    run_before = with_setting(lambda: step(before, d), plain_kernels, True)
                elif args.lever == "allocator":
                    run_before = with_setting(lambda: step(before, d), allocator, False)
                else:
                    def run_before():
                        fgcn.spmm = separate_bias_spmm
                        try:
                            step(before, d)
                        finally:
                            fgcn.spmm = _SPMM
                tb, ta, r, q1, q3 = ab(run_before, lambda: step(after, d), args.rounds)
                plan = getattr(getattr(after, "conv1", None), "last_plan", None)
                scheme = getattr(plan, "scheme", "-")
                used = getattr(scheme, "name", scheme)  # GCN plans hold a Scheme, GAT plans its name
                extra = ""
                if args.lever == "allocator":
                    extra = f" {faults(run_before):.0f} | {faults(lambda: step(after, d)):.0f} |"
                print(f"| {d.name} | {kind} | {h} | {used} | {tb:.3g} | {ta:.3g} | {r:.3f} ({q1:.3f}-{q3:.3f}) |{extra}", flush=True)


if __name__ == "__main__":
    main()
