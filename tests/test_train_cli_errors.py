"""``corgnn train`` / ``corgnn explain`` refuse bad input with one line on stderr and
exit code 2, before any work (issue 23 item 7)."""

import os
import socket
import time

import pytest
import torch

from corgnn.cli import main


def _err(capsys, argv) -> str:
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 15  # refused up front, not after training or a rendezvous timeout
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"corgnn {argv[0]}: error: "), cap.err
    assert "Traceback" not in cap.err and cap.out == ""
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is valid here")
def test_cuda_device_without_cuda(capsys):
    assert "CUDA is not available" in _err(capsys, ["train", "--device", "cuda", "--no-progress"])
    assert "CUDA is not available" in _err(capsys, ["train", "--device", "cuda", "--nproc", "1", "--no-progress"])


def test_unknown_device(capsys):
    for dev in ("tpu", "gpu0", "cuda:x"):
        assert repr(dev) in _err(capsys, ["train", "--device", dev, "--no-progress"])


def test_json_path_checked_before_training(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir" / "s.json"
    assert "does not exist" in _err(capsys, ["train", "--no-progress", "--json", str(missing)])
    assert "is a directory" in _err(capsys, ["train", "--no-progress", "--json", str(tmp_path)])
    assert "--json" in _err(capsys, ["train", "--no-progress", "--nproc", "2", "--json", str(missing)])
    assert not missing.parent.exists()


def test_more_cpu_ranks_than_cores_refused(capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    msg = _err(capsys, ["train", "--no-progress", "--nproc", "99"])
    assert "--nproc 99" in msg and "2 cores" in msg and "--oversubscribe" in msg
    assert "--nproc" in _err(capsys, ["train", "--no-progress", "--oversubscribe"])


def test_taken_rendezvous_port_named(capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert f"port {port}" in _err(capsys, ["train", "--no-progress", "--nproc", "1", "--port", str(port)])
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        assert f"port {port}" in _err(capsys, ["train", "--no-progress", "--torchrun"])
    assert "1..65535" in _err(capsys, ["train", "--no-progress", "--nproc", "1", "--port", "70000"])


@pytest.mark.parametrize("sizes, what", [
    (["--n", "0", "--q", "0", "--m", "4", "--k", "4"], "--n must be >= 1"),
    (["--n", "10", "--q", "20", "--m", "0", "--k", "0"], "--m must be >= 1"),
    (["--n", "10", "--q", "0", "--m", "4", "--k", "4"], "--q must be >= 1"),
    (["--n", "10", "--q", str(10**30), "--m", "4", "--k", "4"], "do not fit"),
    (["--n", "10", "--q", "20", "--m", "4", "--k", "4", "--f", "0"], "--f must be >= 1"),
])
def test_explain_meaningless_sizes(capsys, sizes, what):
    assert what in _err(capsys, ["explain", *sizes])


def test_explain_non_integer_size_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["explain", "--n", "10", "--q", "1e30", "--m", "4", "--k", "4"])
    assert e.value.code == 2 and "invalid int value" in capsys.readouterr().err


def test_explain_sizes_still_explained(capsys):
    assert main(["explain", "--n", "10", "--q", "100", "--m", "4", "--k", "4"]) == 0
    assert "choice:" in capsys.readouterr().out
