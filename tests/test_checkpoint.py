"""``corgnn train --checkpoint PATH [--checkpoint-every N] [--resume]`` (issue 23
item 8): a run stopped after k epochs and resumed to N has the loss curve of an
uninterrupted N-epoch run, single-process and over 2 ranks, with and without dropout;
a dead rank ends the run with one line naming it and the checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from corgnn.cli import main
from corgnn.datasets import find_data_root

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module", autouse=True)
def cora():
    try:
        find_data_root("Cora")
    except FileNotFoundError as e:
        pytest.skip(f"Cora not found: {e}")


def _run(tmp_path, name, *args) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["train", "--no-progress", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("model, dropout, ranks", [
    ("gcn", "0", None), ("gcn", "0.5", None), ("gat", "0.6", None), ("gcn", "0.5", "2"), ("gat", "0.6", "2"),
])
def test_resumed_run_continues_the_loss_curve(tmp_path, model, dropout, ranks):
    n, k = 6, 4
    common = ["--model", model, "--dropout", dropout, "--seed", "3"] + (["--nproc", ranks] if ranks else [])
    full = _run(tmp_path, "full", *common, "--epochs", str(n))
    ck = tmp_path / "run.ckpt"
    first = _run(tmp_path, "first", *common, "--epochs", str(k), "--checkpoint", str(ck), "--checkpoint-every", "2")
    assert ck.is_file() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    rest = _run(tmp_path, "rest", *common, "--epochs", str(n), "--checkpoint", str(ck), "--resume")
    losses = full["extra"]["losses"]
    assert len(losses) == n and losses[-1] != losses[0]
    assert first["extra"]["losses"] == losses[:k]
    assert rest["extra"]["resumed_from_epoch"] == k
    # the killed run's k losses followed by the resumed run's new ones: the uninterrupted curve
    assert first["extra"]["losses"] + rest["extra"]["losses"][k:] == losses
    for key in ("train_acc", "val_acc", "test_acc", "best_epoch"):
        assert rest[key] == full[key]
    assert torch.load(ck, weights_only=False)["epoch"] == n


def test_resume_refuses_another_run(tmp_path, capsys):
    ck = tmp_path / "c.ckpt"
    assert main(["train", "--no-progress", "--epochs", "2", "--checkpoint", str(ck)]) == 0
    capsys.readouterr()
    for args, what in ((["--dropout", "0.1"], "dropout"), (["--nproc", "1"], "this run is 1 rank(s)"), (["--epochs", "1"], "nothing left to train")):
        assert main(["train", "--no-progress", "--epochs", "2", "--checkpoint", str(ck), "--resume", *args]) == 2
        err = capsys.readouterr().err
        assert what in err and len(err.strip().splitlines()) == 1, err
    assert main(["train", "--no-progress", "--epochs", "2", "--checkpoint", str(ck), "--resume"]) == 2
    assert "nothing left to train with --epochs 2" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--checkpoint", str(tmp_path / "none.ckpt"), "--resume"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--resume"]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--checkpoint", str(tmp_path / "no" / "c.ckpt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _children(pid: int) -> list:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmd:
                out.append(int(d.name))
    return sorted(out)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the rank processes through /proc (Linux)")
def test_dead_rank_ends_the_run_with_one_line(tmp_path):
    ck = tmp_path / "run.ckpt"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corgnn.cli", "train", "--no-progress", "--nproc", "2", "--epochs", "1000000",
         "--checkpoint", str(ck), "--checkpoint-every", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while not ck.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert ck.exists(), proc.communicate(timeout=5) if proc.poll() is not None else "no checkpoint in 240 s"
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    last = err.strip()
    assert last.startswith("corgnn train: error: rank 1 was killed by SIGKILL"), err
    assert f"resume from checkpoint {ck}" in last and "--resume" in last
