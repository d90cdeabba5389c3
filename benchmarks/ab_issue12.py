"""A/B of issue 12's levers on a 2-layer GCN training step, in one process.

    python benchmarks/ab_issue12.py cache [--datasets Cora,PubMed,OGB-Arxiv] [--hidden 16,256]
    python benchmarks/ab_issue12.py bias  [...]

``cache`` (lever 1): the same model with ``cache_propagation`` on ("after") and off
("before") in three forms: ``paper`` (corgnn.nn.GCN, no dropout, as the paper's
benchmarks), ``ogb`` (OGB's reference GCN: dropout 0.5 between the layers only) and
``kipf`` (dropout 0.5 on the input too: the cache must not apply; a control).
``bias`` (lever 2): the bias added by the SpMM's row kernel ("after") against a
separate ``out += bias`` pass ("before", the module's SpMM wrapped for the A/B).

A step is forward + cross-entropy on the training nodes + backward (no optimiser
step). Variants alternate within each round; reported: the median step time of each
and the median of the per-round ratios after/before (with its IQR). Datasets: Cora
(real), PubMed (its real graph, :func:`corgnn.datasets.load_pubmed_graph`: the LINQS
file from ``../shared/datasets/PubMed-graph``, ids in order of first appearance,
symmetrised, self-citations dropped; seeded synthetic TF-IDF-like features, 500
columns, about 10 % non-zero, random labels), and the seeded synthetic Table 5
stand-ins.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import corgnn.functional.gcn as fgcn
from corgnn.datasets import load_dataset, load_planetoid, load_pubmed_graph
from corgnn.nn import GCN, GCNConv
from corgnn.nn.gcn import dropout

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


def build(kind: str, m: int, h: int, c: int) -> nn.Module:
    torch.manual_seed(0)
    if kind == "ogb":
        return OGBGCN(m, h, c)
    return GCN(m, h, c, dropout=0.5 if kind == "kipf" else 0.0)


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
            acc.append(timed(fn, reps))
        ratio.append(ta[-1] / tb[-1])
    q = statistics.quantiles(ratio, n=4)
    return statistics.median(tb), statistics.median(ta), statistics.median(ratio), q[0], q[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lever", choices=("cache", "bias"))
    p.add_argument("--datasets", default="Cora,PubMed,OGB-Arxiv")
    p.add_argument("--hidden", default="16,256")
    p.add_argument("--kinds", default="paper,ogb,kipf", help="models (lever cache); lever bias uses paper")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="torch and Numba threads (default: as set)")
    args = p.parse_args()
    if args.threads:
        import numba

        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    kinds = args.kinds.split(",") if args.lever == "cache" else ["paper"]
    import numba

    print(f"threads: torch {torch.get_num_threads()}, numba {numba.get_num_threads()}; lever {args.lever}; {args.rounds} rounds")
    print("| dataset | model | hidden | scheme layer 1 (after) | before ms | after ms | after/before (IQR) |")
    print("|---|---|---|---|---|---|---|")
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
                else:
                    def run_before():
                        fgcn.spmm = separate_bias_spmm
                        try:
                            step(before, d)
                        finally:
                            fgcn.spmm = _SPMM
                tb, ta, r, q1, q3 = ab(run_before, lambda: step(after, d), args.rounds)
                used = after.conv1.last_plan.scheme.name
                print(f"| {d.name} | {kind} | {h} | {used} | {tb:.3g} | {ta:.3g} | {r:.3f} ({q1:.3f}-{q3:.3f}) |", flush=True)


if __name__ == "__main__":
    main()
