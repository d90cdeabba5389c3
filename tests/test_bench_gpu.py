"""``corgnn bench gpu``: the dry run (what CI can run without a GPU: the plan and
its time estimate), the step runner on stand-in steps (status, timeout, logs,
summary), and its argument errors."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from corgnn.bench import gpu
from corgnn.cli import main


def test_dry_run_prints_the_plan_within_budget(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["bench", "gpu", "--dry-run", "--root", str(tmp_path / "data"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    steps = gpu.plan(out, str(tmp_path / "data"))
    assert [s.name for s in steps] == ["check", "probe", "tests", "spmm", "spmm-cusparse", "gcn", "gcn-compiled", "gat", "gat-compiled",
                                         "gatv2", "gatv2-compiled", "transformer", "transformer-compiled"]
    for s in steps:
        assert s.command() in text
        if s.name == "check":
            assert "gpu-check --device cuda" in s.command() and f"--out {out.resolve() / 'check'}" in s.command()
        elif s.name == "probe":
            assert s.argv[0].endswith("benchmarks/gpu_probe.py") and (gpu.CHECKOUT / "benchmarks" / "gpu_probe.py").exists()
        elif s.name != "tests":  # every bench on CUDA, reading the given data root, writing under out
            assert "--device cuda" in s.command() and f"--root {tmp_path / 'data'}" in s.command()
            assert f"--out {out.resolve() / s.name}" in s.command()
    assert dict(steps[1].env)["CORGNN_DATA"] == dict(steps[2].env)["CORGNN_DATA"] == str(tmp_path / "data")
    assert all((gpu.CHECKOUT / f).exists() for f in gpu.TEST_FILES)
    total = sum(s.minutes for s in steps)
    assert total <= gpu.BUDGET_MIN and f"at most {total:.0f} min" in text
    assert not out.exists()  # a dry run writes nothing
    quick = gpu.plan(out, None, quick=True)
    assert sum(s.minutes for s in quick) < total and all("--quick" in s.argv for s in quick if s.name not in ("tests", "check", "probe"))
    assert "bench gcn --variants pyg-coo-compiled" in steps[6].command() and "--no-compile" in steps[5].command()


def test_run_steps_records_status_logs_and_summaries(tmp_path):
    out = tmp_path / "run"
    (out / "ok").mkdir(parents=True)
    (out / "ok" / "summary.md").write_text("# ok section\n\nspeedup 2x\n")
    steps = [
        gpu.Step("tests", ("-c", "print('===== 7 passed, 2 skipped in 3.10s =====')"), 0.5, "stand-in tests"),
        gpu.Step("ok", ("-c", "import os; print(os.environ['GPU_TEST'])"), 0.5, "succeeds", (("GPU_TEST", "env passed"),)),
        gpu.Step("bad", ("-c", "raise SystemExit(3)"), 0.5, "fails"),
        gpu.Step("slow", ("-c", "import time; time.sleep(30)"), 0.02, "hangs"),
    ]
    records = gpu.run_steps(steps, out, {"gpu": "Test GPU"})
    assert [r["status"] for r in records] == ["ok", "ok", "failed (rc 3)", "timed out"]
    assert records[0]["tests"] == "7 passed, 2 skipped"
    assert (out / "ok.log").read_text().strip() == "env passed"
    saved = json.loads((out / "gpu.json").read_text())
    assert saved["gpu"] == "Test GPU" and [r["name"] for r in saved["steps"]] == ["tests", "ok", "bad", "slow"]
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU evaluation: Test GPU")
    assert "| bad | failed (rc 3) |" in summary and "| tests | ok (7 passed, 2 skipped) |" in summary
    assert "## ok" in summary and "### ok section" in summary and "speedup 2x" in summary


def test_errors(tmp_path):
    with pytest.raises(ValueError, match=r"--only: unknown steps \['nope'\]"):
        gpu.main(["--dry-run", "--only", "gcn,nope", "--out", str(tmp_path)])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            gpu.main(["--out", str(tmp_path)])
    assert gpu.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_only_selects_steps(tmp_path, capsys):
    assert gpu.main(["--dry-run", "--only", "gcn,gat", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "2 steps" in text and "bench gcn" in text and "bench spmm" not in text and sys.executable not in text


def test_minutes_fit_the_steps_to_a_lease(tmp_path, capsys):
    """``--minutes``: the allotments scaled down to the lease, the benches' deadlines
    with them (each still stops before its kill), never scaled up."""
    full = gpu.plan(tmp_path, None)
    fitted = gpu.plan(tmp_path, None, minutes=9)
    assert [s.name for s in fitted] == [s.name for s in full]
    assert sum(s.minutes for s in fitted) == pytest.approx(9)
    for a, b in zip(full, fitted):
        assert b.minutes == pytest.approx(a.minutes * 9 / sum(s.minutes for s in full))
        if "--deadline-min" in b.argv:
            deadline = float(b.argv[b.argv.index("--deadline-min") + 1])
            assert 0 < deadline < b.minutes
    assert [s.minutes for s in gpu.fit(full, 1000)] == [s.minutes for s in full]
    with pytest.raises(ValueError, match="minutes must be positive"):
        gpu.fit(full, 0)
    assert gpu.main(["--dry-run", "--only", "check,gcn", "--minutes", "3", "--out", str(tmp_path)]) == 0
    assert "at most 3 min" in capsys.readouterr().out


def test_compiled_baseline_runs_apart_and_is_merged(tmp_path, monkeypatch):
    """The compiled PyG baseline is its own step (a CUDA error in a compiled kernel
    ends only that process) and its rows replace the ``--no-compile`` placeholders of
    the eager run, whose summary is rebuilt with them; cells it did not record keep
    the placeholder, saying why. (The compiled rows here are the eager run's pyg-coo
    rows renamed: the merge, not torch.compile, is under test.)"""
    from corgnn.bench import report

    steps = {s.name: s for s in gpu.plan(tmp_path, None)}
    assert "--no-compile" in steps["gat"].argv and steps["gat-compiled"].merge_into == "gat"
    assert steps["gat-compiled"].argv[steps["gat-compiled"].argv.index("--variants") + 1] == gpu.COMPILED
    main_dir, comp_dir = tmp_path / "gat", tmp_path / "gat-compiled"
    assert main(["bench", "gat", "--tiny", "--no-compile", "--no-progress", "--variants", "corgnn,pyg-coo,pyg-coo-compiled", "--out", str(main_dir)]) == 0
    rows, meta = report.read_results(main_dir)
    placeholders = [r for r in rows if r["variant"] == gpu.COMPILED]
    assert placeholders and all(r["status"] != "ok" for r in placeholders)
    fake = [dict(r, variant=gpu.COMPILED) for r in rows if r["variant"] == "pyg-coo" and r["hidden"] == 2]
    report.write_results(fake, comp_dir, meta)
    done = gpu.merge_compiled(main_dir, comp_dir, "gat-compiled.log")
    assert done == f"{len(fake)} compiled rows merged into gat/"
    merged, _ = report.read_results(main_dir)
    compiled = [r for r in merged if r["variant"] == gpu.COMPILED]
    assert sorted(r["status"] for r in compiled if r["hidden"] == 2) == ["ok"] * len(fake)
    assert all("recorded nothing" in r["reason"] for r in compiled if r["hidden"] == 4)
    assert len(merged) == len(rows)
    assert "comp" in (main_dir / "summary.md").read_text()  # the rebuilt summary sees the compiled baseline
    assert gpu.merge_compiled(tmp_path / "none", comp_dir, "x.log").startswith("nothing")
