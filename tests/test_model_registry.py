"""The one model registry (corgnn.nn.models.MODELS / build_model) behind corgnn train,
corgnn explain --model and the benchmarks' corgnn variants."""

import pytest
import torch

from corgnn.nn.models import MODELS, build_model
from corgnn.training import MODEL_DEFAULTS, TrainConfig
from corgnn.training.distributed import check_distributed


def _graph(n=30, q=120):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, n, (2, q), generator=g), n


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_registered_model_builds_and_runs(name):
    ei, n = _graph()
    net = build_model(name, 5, 3)
    out = net(torch.randn(n, 5), ei)
    assert out.shape == (n, 3)
    spec = MODELS[name]
    assert MODEL_DEFAULTS[name] == spec.defaults()
    cfg = TrainConfig(model=name).resolved()
    assert (cfg.hidden, cfg.dropout, cfg.lr, cfg.weight_decay, cfg.epochs) == (spec.hidden, spec.dropout, spec.lr, spec.weight_decay, spec.epochs)
    if spec.distributed:
        assert check_distributed(TrainConfig(model=name)).model == name
    else:
        with pytest.raises(ValueError, match="distributed training runs the gcn and gat models"):
            check_distributed(TrainConfig(model=name))


def test_options_reach_the_model():
    gat = build_model("gat", 5, 3, hidden=4, dropout=0.0, heads=2, out_heads=3, scheme="edge_weights")
    assert gat.conv1.heads == 2 and gat.conv2.heads == 3 and gat.dropout == 0.0
    gcn = build_model("gcn", 5, 3)
    assert gcn.dropout == MODELS["gcn"].dropout and gcn.conv1.out_channels == MODELS["gcn"].hidden
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("mlp", 5, 3)


def test_bench_corgnn_variants_use_the_registry(monkeypatch):
    from corgnn.bench import baselines
    from corgnn.nn import models

    built = []
    real = models.build_model
    monkeypatch.setattr(models, "build_model", lambda name, *a, **kw: built.append((name, kw)) or real(name, *a, **kw))
    ei, n = _graph()
    g = baselines.GraphData("tiny", True, torch.randn(n, 5), ei, 3)
    for model in ("gcn", "gat"):
        mod, _ = baselines.build("corgnn", model, g, 4)
        assert mod(torch.randn(n, 5), ei).shape[0] == n
    assert [b[0] for b in built] == ["gcn", "gat"] and built[1][1]["out_heads"] == baselines.GAT_HEADS
    assert all(kw["dropout"] == 0.0 for _, kw in built)
