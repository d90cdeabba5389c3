"""corgnn.distributed: row partitions, the halo exchange and partitioned training
against single-process full-graph results (gloo on localhost, spawned processes)."""

from __future__ import annotations

import pytest
import torch

import corgnn
from corgnn.cost.comm import PARTITIONED_SCHEMES, plan_partitioned_gcn
from corgnn.distributed import build_partitions, edge_cut, partition_nodes
from corgnn.distributed.train import _free_port


def _random_graph(n=60, q=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, q), generator=g), n


@pytest.mark.parametrize("method", ["range", "metis"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_partitions_reproduce_global_rows_and_exchange_lists(method, world):
    if method == "metis":
        pytest.importorskip("pymetis", reason="pymetis not installed")
    ei, n = _random_graph()
    A = corgnn.Graph(ei, num_nodes=n).gcn_adjacency(dtype=torch.float64)
    parts = partition_nodes(ei, n, world, method)
    assert parts.shape == (n,) and set(parts.tolist()) == set(range(world))
    H = torch.randn(n, 5, dtype=torch.float64)
    full = A.to_dense() @ H
    ps = build_partitions(A, parts)
    assert sorted(torch.cat([p.owned for p in ps]).tolist()) == list(range(n))
    for p in ps:
        assert torch.equal(parts[p.owned], torch.full((p.n_own,), p.rank))
        assert not (parts[p.halo] == p.rank).any()
        torch.testing.assert_close(p.A.to_dense() @ H[p.columns], full[p.owned])
        assert sum(p.recv_counts) == p.n_halo and sum(p.send_counts) == p.send_index.numel()
        assert p.totals["n_halo"] == sum(q.n_halo for q in ps)
    for r in ps:  # what r sends to s, in order, is s's halo block from r
        for s in ps:
            lo = sum(r.send_counts[: s.rank])
            sent = r.owned[r.send_index[lo: lo + r.send_counts[s.rank]]]
            lo = sum(s.recv_counts[: r.rank])
            assert torch.equal(sent, s.halo[lo: lo + s.recv_counts[r.rank]])
    assert edge_cut(ei, parts) == int((parts[ei[0]] != parts[ei[1]]).sum())
    if world == 1:
        assert edge_cut(ei, parts) == 0


def test_partition_bad_input():
    ei, n = _random_graph()
    with pytest.raises(ValueError, match="nparts"):
        partition_nodes(ei, n, 0)
    with pytest.raises(ValueError, match="nparts"):
        partition_nodes(ei, n, n + 1)
    with pytest.raises(ValueError, match="method"):
        partition_nodes(ei, n, 2, "spectral")


def test_partitioned_plan_counts_halo_bytes():
    kw = dict(world_size=2, halo_rows=100)
    tf = PARTITIONED_SCHEMES[0]
    pf = next(s for s in PARTITIONED_SCHEMES if s.cache)
    p = plan_partitioned_gcn(1000, 5000, 64, 16, input_grad=True, **kw)
    assert p.comm[tf.name] == (1600, 1600) and p.comm[pf.name] == (6400, 6400)
    assert p.comm_bytes(tf) == 3200 * 4 and "Halo exchange" in p.table()
    # a cached constant input sends nothing per call propagate-first (no input gradient)
    p = plan_partitioned_gcn(1000, 5000, 64, 16, input_grad=False, input_cached=True, **kw)
    assert p.comm[pf.name] == (0, 0)
    # a slow network tips the choice towards the scheme with fewer bytes
    slow = plan_partitioned_gcn(1000, 5000, 16, 18, input_grad=False, input_cached=True, network=corgnn.cost.comm.NetworkModel(bandwidth=1e3), **kw)
    assert slow.scheme.forward == "propagate-first"
    with pytest.raises(ValueError, match="not run partitioned"):
        plan_partitioned_gcn(10, 20, 4, 4, True, scheme="transform-first+split", **kw)
    with pytest.raises(ValueError, match="world_size"):
        plan_partitioned_gcn(10, 20, 4, 4, True, world_size=0, halo_rows=0)


def _grad_worker(rank, world, port):
    """Every scheme: the rows and the all-reduced gradients of the partitioned GCN
    equal the single-process layer's (float64)."""
    import os

    import torch.distributed as dist

    from corgnn.distributed import DistributedGCN, HaloPlan

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ei, n = _random_graph(n=50, q=250, seed=1)
        graph = corgnn.Graph(ei, num_nodes=n)
        A = graph.gcn_adjacency(dtype=torch.float64)
        part = build_partitions(A, partition_nodes(ei, n, world, "range"), [rank])[0]
        x = torch.randn(n, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        y = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(3))
        for scheme in PARTITIONED_SCHEMES:
            torch.manual_seed(0)
            ref = corgnn.nn.GCN(7, 6, 3, scheme=scheme.name).double()
            loss = torch.nn.functional.cross_entropy(ref(x, graph), y, reduction="sum")
            ref_grads = torch.autograd.grad(loss, list(ref.parameters()))
            torch.manual_seed(0)
            model = corgnn.nn.GCN(7, 6, 3).double()
            dmodel = DistributedGCN(model, part, HaloPlan(part), scheme=scheme.name)
            out = dmodel(x[part.owned])
            with torch.no_grad():
                torch.testing.assert_close(out, ref(x, graph)[part.owned])
            loss = torch.nn.functional.cross_entropy(out, y[part.owned], reduction="sum")
            grads = torch.autograd.grad(loss, list(model.parameters()))
            for g, r in zip(grads, ref_grads):
                dist.all_reduce(g)
                torch.testing.assert_close(g, r)
            assert dmodel.schemes() == [scheme.name] * 2
    finally:
        dist.destroy_process_group()


def test_partitioned_gcn_rows_and_gradients_equal_single_process():
    torch.multiprocessing.spawn(_grad_worker, args=(3, _free_port()), nprocs=3, join=True)


@pytest.fixture(scope="module")
def cora_runs():
    from corgnn.distributed import train_distributed
    from corgnn.train import TrainConfig, train

    cfg = TrainConfig(dataset="Cora", dropout=0.0, epochs=5, progress=False)
    try:
        single = train(cfg)
    except FileNotFoundError as e:
        pytest.skip(f"Cora not found: {e}")
    return single, {n: train_distributed(cfg, n) for n in (1, 2, 3)}


def test_losses_equal_single_process_for_2_and_3_ranks(cora_runs):
    """The invariant: dropout 0, same seed: per-epoch losses of 1, 2 and 3 ranks are
    those of single-process full-graph training (float32 rounding)."""
    single, runs = cora_runs
    ref = torch.tensor(single.extra["losses"])
    assert ref.numel() == 5 and ref[-1] < ref[0]
    for n, res in runs.items():
        assert res.extra["world_size"] == n
        torch.testing.assert_close(torch.tensor(res.extra["losses"]), ref, rtol=1e-5, atol=1e-6)
        assert res.schemes == single.schemes


def test_halo_bytes_and_edge_cut_reported(cora_runs):
    _, runs = cora_runs
    assert runs[1].extra["comm_bytes_per_epoch"] == 0 and runs[1].extra["edge_cut"] == 0
    for n in (2, 3):
        e = runs[n].extra
        assert e["edge_cut"] > 0 and e["halo_rows"] > 0
        # Cora, hidden 16: transform-first in both layers, so halo rows of XΘ with
        # k = 16 and 7 columns, forward and backward, float32; no input halo
        assert all(s.startswith("transform-first") for s in runs[n].schemes)
        assert e["comm_bytes_per_epoch"] == e["halo_rows"] * (16 + 7) * 2 * 4 and e["comm_bytes_setup"] == 0
    assert runs[3].extra["edge_cut"] >= runs[2].extra["edge_cut"]
