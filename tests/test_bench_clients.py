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


@pytest.mark.parametrize("script", clients.SCRIPTS)
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
