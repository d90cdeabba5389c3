"""corgnn.distributed: row partitions, the halo exchange and partitioned training
against single-process full-graph results (gloo on localhost, spawned processes)."""

from __future__ import annotations

import pytest
import torch

import corgnn
from corgnn.cost.comm import PARTITIONED_SCHEMES, plan_partitioned_gcn
from corgnn.distributed import build_partitions, edge_cut, partition_nodes
from corgnn.distributed.train import free_port


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


def _exactness_checks(rank, world):
    """Every GCN scheme and GAT: the rows and the all-reduced gradients of the
    partitioned model equal the single-process model's (float64, tiny graph)."""
    import torch.distributed as dist

    from corgnn.distributed import DistributedGAT, DistributedGCN, HaloPlan

    ei, n = _random_graph(n=50, q=250, seed=1)
    graph = corgnn.Graph(ei, num_nodes=n)
    parts = partition_nodes(ei, n, world, "range")
    x = torch.randn(n, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(3))
    cases = [("gcn", s.name) for s in PARTITIONED_SCHEMES] + [("gat", None)]
    for kind, scheme in cases:
        torch.manual_seed(0)
        ref = (corgnn.nn.GCN(7, 6, 3, scheme=scheme) if kind == "gcn" else corgnn.nn.GAT(7, 4, 3, heads=2)).double()
        out_ref = ref(x, graph)
        ref_grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out_ref, y, reduction="sum"), list(ref.parameters()))
        torch.manual_seed(0)
        model = (corgnn.nn.GCN(7, 6, 3) if kind == "gcn" else corgnn.nn.GAT(7, 4, 3, heads=2)).double()
        A = graph.gcn_adjacency(dtype=torch.float64) if kind == "gcn" else graph.gat_adjacency()
        part = build_partitions(A, parts, [rank])[0]
        if kind == "gcn":
            dmodel = DistributedGCN(model, part, HaloPlan(part), scheme=scheme)
            assert dmodel.schemes() == [scheme] * 2
        else:
            dmodel = DistributedGAT(model, part, HaloPlan(part))
        out = dmodel(x[part.owned])
        torch.testing.assert_close(out, out_ref.detach()[part.owned])
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y[part.owned], reduction="sum"), list(model.parameters()))
        for g, r in zip(grads, ref_grads):
            dist.all_reduce(g)
            torch.testing.assert_close(g, r)


def _worker(rank, world, port, out_dir):
    """One process group per world size: the exactness checks, then Cora training
    (dropout 0, 5 epochs) of GCN and GAT through :func:`train_rank`."""
    import json
    import os
    from dataclasses import asdict

    import torch.distributed as dist

    from corgnn.training import train_rank
    from corgnn.train import TrainConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _exactness_checks(rank, world)
        for model in ("gcn", "gat"):
            res = train_rank(TrainConfig(dataset="Cora", model=model, dropout=0.0, epochs=5, progress=False))
            if rank == 0:
                with open(os.path.join(out_dir, f"{model}-{world}.json"), "w") as f:
                    json.dump(asdict(res), f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cora_runs(tmp_path_factory):
    """Single-process ``train`` (GCN, GAT), ``corgnn train --nproc 1`` (GCN) and 2
    and 3 spawned ranks (GCN, GAT), dropout 0, 5 epochs, same seed."""
    import json

    from corgnn.cli import main
    from corgnn.train import TrainConfig, train

    try:
        single = {m: train(TrainConfig(dataset="Cora", model=m, dropout=0.0, epochs=5, progress=False)) for m in ("gcn", "gat")}
    except FileNotFoundError as e:
        pytest.skip(f"Cora not found: {e}")
    out = tmp_path_factory.mktemp("dist")
    runs = {}
    assert main(["train", "--nproc", "1", "--epochs", "5", "--dropout", "0", "--no-progress", "--json", str(out / "cli.json")]) == 0
    runs[("gcn", 1)] = json.loads((out / "cli.json").read_text())
    for world in (2, 3):
        torch.multiprocessing.spawn(_worker, args=(world, free_port(), str(out)), nprocs=world, join=True)
        for m in ("gcn", "gat"):
            runs[(m, world)] = json.loads((out / f"{m}-{world}.json").read_text())
    return {m: r.extra for m, r in single.items()}, {k: (r["schemes"], r["extra"]) for k, r in runs.items()}


def test_losses_equal_single_process_for_1_2_and_3_ranks(cora_runs):
    """The invariant: dropout 0, same seed: per-epoch losses with 1, 2 and 3 ranks
    are those of single-process full-graph training (float32 rounding), GCN and GAT
    (the rows and gradients are checked exactly in float64 in the workers)."""
    single, runs = cora_runs
    assert set(runs) == {("gcn", 1), ("gcn", 2), ("gcn", 3), ("gat", 2), ("gat", 3)}
    for (model, world), (_, e) in runs.items():
        ref = torch.tensor(single[model]["losses"])
        assert ref.numel() == 5 and ref[-1] < ref[0]
        assert e["world_size"] == world
        torch.testing.assert_close(torch.tensor(e["losses"]), ref, rtol=1e-5, atol=1e-6)


def test_halo_bytes_and_edge_cut_reported(cora_runs):
    _, runs = cora_runs
    assert runs[("gcn", 1)][1]["comm_bytes_per_epoch"] == 0 and runs[("gcn", 1)][1]["edge_cut"] == 0
    for world in (2, 3):
        schemes, e = runs[("gcn", world)]
        assert e["edge_cut"] > 0 and e["halo_rows"] > 0
        # Cora, hidden 16: transform-first in both layers, so halo rows of XΘ with
        # k = 16 and 7 columns, forward and backward, float32; no input halo
        assert all(s.startswith("transform-first") for s in schemes)
        assert e["comm_bytes_per_epoch"] == e["halo_rows"] * (16 + 7) * 2 * 4 and e["comm_bytes_setup"] == 0
        # GAT: halo rows of XΘ with 8 heads x 8 and 1 x 7 columns, forward and backward
        _, g = runs[("gat", world)]
        assert g["comm_bytes_per_epoch"] == g["halo_rows"] * (64 + 7) * 2 * 4
    assert runs[("gcn", 3)][1]["edge_cut"] >= runs[("gcn", 2)][1]["edge_cut"]


def test_global_dropout_mask_does_not_depend_on_the_split():
    from corgnn.distributed import GlobalDropout

    h = torch.randn(30, 4)
    rows = torch.tensor([3, 17, 5, 29])
    full = GlobalDropout(0.5, 30, seed=7)(h, torch.arange(30), True)
    part = GlobalDropout(0.5, 30, seed=7)(h[rows], rows, True)
    torch.testing.assert_close(part, full[rows])
    assert (full == 0).any() and (full != 0).any()
    assert GlobalDropout(0.5, 30, seed=7)(h, torch.arange(30), False) is h


def test_cli_rejects_bad_distributed_options():
    from corgnn.cli import main

    assert main(["train", "--nproc", "0"]) == 2
    assert main(["train", "--nproc", "2", "--batch-size", "10"]) == 2
    assert main(["train", "--nproc", "2", "--format", "ell"]) == 2
    assert main(["train", "--nproc", "2", "--torchrun"]) == 2
    assert main(["explain", "--n", "10", "--q", "20", "--m", "4", "--k", "4", "--nproc", "2"]) == 2


def test_explain_shows_the_halo_term(capsys):
    from corgnn.cli import main
    from corgnn.datasets import find_data_root

    try:
        find_data_root("Cora")
    except FileNotFoundError as e:
        pytest.skip(f"Cora not found: {e}")
    assert main(["explain", "--dataset", "Cora", "--nproc", "2", "--partition", "range", "--network-gbps", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "Split over 2 ranks (range)" in out and out.count("Halo exchange over 2 ranks") == 2
    # on a slow link the first layer takes the cached input halo: nothing sent per call
    assert "-> propagate-first+split+cache" in out and "halo 0 values per call" in out
