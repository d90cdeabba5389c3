"""``corgnn bench clients``: PyG's example scripts reproduced, with and without optimize()."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from corgnn.bench import clients
from corgnn.datasets import synthetic


@pytest.fixture(scope="module")
def tiny():
    data = synthetic("Cora", nodes=120, edges=480, features=40)
    g = torch.Generator().manual_seed(0)
    data.x = data.x.abs() * (torch.rand(data.x.shape, generator=g) < 0.04)  # bag-of-words-like: mostly zeros
    return data


@pytest.mark.parametrize("script", ["gcn", "gat"])
def test_clients_same_start_and_rewrite(tiny, script):
    built = {v: clients.build_client(script, v, tiny) for v in clients.VARIANTS}
    ref = {k: t.clone() for k, t in built["pyg"][0].state_dict().items()}
    for v, (model, _, epoch) in built.items():
        got = model.state_dict()
        assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
        assert ("forward" in vars(model)) == (v == "optimize")
        loss, accs = epoch()
        assert math.isfinite(loss) and len(accs) == 3 and all(0 <= a <= 1 for a in accs)
    with pytest.raises(ValueError, match="script must be"):
        clients.build_client("sage", "pyg", tiny)


def test_clients_run_writes_results(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(clients, "load_cora", lambda: tiny)
    p = argparse.ArgumentParser()
    clients.add_arguments(p)
    args = p.parse_args(["--scripts", "gcn", "--epochs", "2", "--warmup", "1", "--out", str(tmp_path)])
    assert clients.run(args) == 0
    res = json.loads((tmp_path / "results.json").read_text())["results"]["gcn"]
    assert set(res) == set(clients.VARIANTS) and res["pyg"]["speedup"] == 1.0
    assert all(r["epochs"] == 2 and r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in res.values())
    assert "gcn.py | optimize |" in (tmp_path / "summary.md").read_text()


def test_mutag_gin_client_trains_as_pyg():
    """``mutag_gin.py``: the same start in every variant, the same first epoch (loss and
    accuracies, dropout drawn from the same seed) with and without optimize(), and
    the stand-in's shape (MUTAG: 188 graphs, 7 one-hot features, 10 % for testing)."""
    train, test = clients.mutag_standin()
    assert len(train) == 169 and len(test) == 19
    assert all(d.x.shape[1] == 7 and torch.equal(d.x.sum(1), torch.ones(d.num_nodes)) and 10 <= d.num_nodes <= 28 for d in train + test)
    built = {v: clients.build_client("mutag_gin", v, (train, test)) for v in clients.VARIANTS}
    ref = {k: t.clone() for k, t in built["pyg"][0].state_dict().items()}
    first = {}
    for v, (model, _, epoch) in built.items():
        got = model.state_dict()
        assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
        torch.manual_seed(1)
        first[v] = epoch()
        loss, accs = first[v]
        assert math.isfinite(loss) and len(accs) == 2 and all(0 <= a <= 1 for a in accs)
    assert any(type(m).__module__.startswith("corgnn") for m in built["optimize"][0].modules())
    for v in clients.VARIANTS:
        assert first[v][0] == pytest.approx(first["pyg"][0], rel=1e-4) and first[v][1] == first["pyg"][1]
