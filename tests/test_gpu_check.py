"""``corgnn bench gpu-check``: corgnn's layers against PyG's on one device. On CPU
here (the Numba kernels); the GPU evaluation runs it on CUDA."""

from __future__ import annotations

import json
import math

import pytest
import torch

from corgnn.bench import gpu_check
from corgnn.cli import main


def test_every_layer_passes_on_cpu_and_the_report_is_written(tmp_path, capsys):
    out = tmp_path / "check"
    assert main(["bench", "gpu-check", "--nodes", "300", "--edges", "1500", "--hub", "200", "--out", str(out)]) == 0
    saved = json.loads((out / "results.json").read_text())
    names = [r["check"] for r in saved["rows"]]
    assert len(names) == len(gpu_check.checks()) and saved["backend"] == "numba"
    for layer in ("GCNConv scheme=propagate-first+split+cache", "GATConv cache=node_attention", "GATConv format=ell", "SAGEConv", "GraphConv", "GINConv", "SGConv", "APPNP"):
        assert any(n.startswith(layer) for n in names), layer
    assert all(r["ok"] and r["max_rel_err"] <= r["tolerance"] for r in saved["rows"])
    assert f"{len(names)} of {len(names)} checks within tolerance" in capsys.readouterr().out


def test_a_wrong_layer_fails_the_check(monkeypatch, tmp_path):
    """The check can fail: a corgnn layer whose output is off by 1e-6 relative fails in
    float64 (tolerance 1e-10) and the command exits 1; an exception is a failed row."""
    from corgnn.nn import GCNConv

    real = GCNConv.forward
    monkeypatch.setattr(GCNConv, "forward", lambda self, *a, **k: real(self, *a, **k) * (1 + 1e-6))
    rows = gpu_check.run_checks(n=50, q=200, hub=20, only="GCNConv scheme=auto weighted f64")
    assert len(rows) == 1 and not rows[0]["ok"] and rows[0]["max_rel_err"] > 1e-7
    assert main(["bench", "gpu-check", "--nodes", "50", "--edges", "200", "--hub", "20", "--only", "GCNConv scheme=auto"]) == 1
    monkeypatch.setattr(GCNConv, "forward", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    rows = gpu_check.run_checks(n=50, q=200, hub=20, only="GCNConv scheme=auto weighted f32")
    assert not rows[0]["ok"] and "boom" in rows[0]["worst"] and math.isnan(rows[0]["max_rel_err"])


def test_the_asked_scheme_is_the_one_that_ran(monkeypatch):
    from corgnn.nn import GCNConv

    monkeypatch.setattr(GCNConv, "scheme", property(lambda self: "auto", lambda self, v: None), raising=False)
    rows = gpu_check.run_checks(n=50, q=200, hub=20, only="GCNConv scheme=propagate-first+split weighted f64")
    assert not rows[0]["ok"] and "asked scheme=propagate-first+split" in rows[0]["worst"]


def test_errors(capsys):
    """Bad arguments: exit status 2 with the message, before any check runs."""
    cases = [(["--nodes", "3"], "--nodes must be >= 4"), (["--backend", "nope"], "--backend: unknown backend 'nope'")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda: no CUDA device"))
    for argv, message in cases:
        assert main(["bench", "gpu-check", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "checks within tolerance" not in err
