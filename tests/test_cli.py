import json

import pytest

from corgnn.cli import main
from corgnn.datasets import DatasetNotFoundError, find_data_root


def test_train_gcn_cora_reaches_published_accuracy(tmp_path, capsys):
    """Full Kipf & Welling run (200 epochs) on the real Cora split."""
    out = tmp_path / "summary.json"
    assert main(["train", "--no-progress", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for key in ("test_acc", "val_acc", "epoch_ms", "schemes", "train_acc"):
        assert key in res
    assert res["dataset"] == "Cora" and res["model"] == "gcn"
    assert res["test_acc"] >= 0.79, res
    assert len(res["schemes"]) == 2 and all(s.startswith("transform-first") for s in res["schemes"])
    assert res["epoch_ms"] > 0
    assert "test" in capsys.readouterr().out


def test_train_citeseer_short(tmp_path):
    out = tmp_path / "s.json"
    assert main(["train", "--dataset", "CiteSeer", "--epochs", "60", "--no-progress", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["dataset"] == "CiteSeer" and res["test_acc"] >= 0.6


def test_train_forced_scheme_is_reported(tmp_path):
    out = tmp_path / "s.json"
    main(["train", "--epochs", "3", "--no-progress", "--scheme", "propagate-first+split+cache", "--json", str(out)])
    assert json.loads(out.read_text())["schemes"] == ["propagate-first+split+cache"] * 2


def test_missing_data_gives_clear_message(tmp_path, capsys):
    assert main(["train", "--root", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Cora not found" in err and "--root" in err and str(tmp_path) in err
    with pytest.raises(DatasetNotFoundError):
        find_data_root("Cora", tmp_path)
    with pytest.raises(ValueError, match="unknown Planetoid"):
        find_data_root("Nope")


def test_data_root_from_env(monkeypatch, tmp_path):
    real = find_data_root("Cora")  # default search finds ../shared/datasets
    monkeypatch.setenv("CORGNN_DATA", str(real.parents[1]))
    assert find_data_root("Cora") == real


def test_explain_sizes_and_dataset(capsys):
    assert main(["explain", "--n", "169343", "--q", "1335586", "--m", "128", "--k", "512"]) == 0
    out = capsys.readouterr().out
    assert "choice: propagate-first+split+cache" in out
    assert main(["explain", "--n", "169343", "--q", "1335586", "--m", "128", "--k", "16", "--input-grad"]) == 0
    assert "choice: transform-first+fused" in capsys.readouterr().out
    assert main(["explain", "--dataset", "Cora"]) == 0
    out = capsys.readouterr().out
    assert "n=2708" in out and out.count("choice:") >= 2
    assert main(["explain", "--n", "5"]) == 2
    assert "missing" in capsys.readouterr().err


def test_explain_shows_a_small_tie_run_composed_as_the_layers_run_it(capsys):
    """A mini-batch-sized layer at m = k: the layers' tie goes to the cached scheme,
    run as spmm + torch's linear; explain says so, and a large one neither."""
    import torch
    from torch_geometric.nn import GINConv as PygGINConv

    import corgnn

    assert main(["explain", "--n", "784", "--q", "4200", "--m", "64", "--k", "64", "--input-grad"]) == 0
    out = capsys.readouterr().out
    assert "choice: propagate-first+split+cache" in out and "runs as spmm(A', X) then torch's own linear" in out
    layer = corgnn.optimize(PygGINConv(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))))
    layer(torch.randn(784, 64, requires_grad=True), torch.randint(0, 784, (2, 3416)))
    assert layer.last_plan.scheme.name == "propagate-first+split+cache"
    assert main(["explain", "--n", "169343", "--q", "1335586", "--m", "64", "--k", "64", "--input-grad"]) == 0
    out = capsys.readouterr().out
    assert "choice: transform-first+fused" in out and "runs as" not in out


def test_unknown_model_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--model", "mlp"])
