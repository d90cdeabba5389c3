"""``corgnn bench spmm`` on tiny graphs: the rows it measures and the files it writes."""

from __future__ import annotations

import json

import pytest
import torch

from corgnn.bench.spmm import FORMATS, bench_graph, format_table
from corgnn.datasets import synthetic
from corgnn.graph import Graph


def test_bench_graph_rows_on_tiny_synthetic_graph():
    data = synthetic("Cora", nodes=120, edges=500)
    g = Graph(data.edge_index, num_nodes=data.num_nodes)
    rows = bench_graph(data.name, g, features=(8,), repeats=1, bandwidth=10e9)
    assert len(rows) == 2 * (2 + len(FORMATS))  # (torch.sparse, pyg, formats) x (spmm, sddmm)
    for r in rows:
        assert r.dataset == "Cora (synthetic)" and r.f == 8 and r.nnz == g.gcn_adjacency().nnz
        assert r.median_ms > 0 and r.model_bytes > 0 and r.vs_torch > 0 and r.vs_pyg > 0
        assert abs(r.frac_stream - r.gbps / 10.0) < 1e-9
        if r.impl in FORMATS:
            assert r.max_abs_err < 1e-4
    table = format_table(rows)
    assert "hybrid" in table and "vs PyG" in table


def test_bench_cli_writes_csv_and_json(tmp_path, capsys):
    from corgnn.cli import main

    args = ["bench", "spmm", "--datasets", "Cora", "--f", "8", "--repeats", "1", "--formats", "csr,ell", "--ops", "spmm", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "Cora (real)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "spmm.json").read_text())
    assert doc["meta"]["stream_GBps"] > 0
    assert [r["impl"] for r in doc["rows"]] == ["torch.sparse", "pyg", "csr", "ell"]
    assert (tmp_path / "spmm.csv").read_text().startswith("dataset,")


def test_bench_cli_backend_and_device_options(tmp_path, capsys):
    from corgnn.cli import main

    args = ["bench", "spmm", "--datasets", "Cora", "--f", "4", "--repeats", "1", "--formats", "csr", "--ops", "spmm", "--backend", "torch", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "backend torch" in capsys.readouterr().out
    meta = json.loads((tmp_path / "spmm.json").read_text())["meta"]
    assert meta["backend"] == "torch" and meta["device"] == "cpu"
    assert main(args[:-2] + ["--backend", "nope"]) == 2  # a user error: message, no traceback
    assert "unknown backend 'nope'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(args[:-4] + ["--device", "cuda"]) == 2
        assert "--device cuda: no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_graph_on_cuda():
    data = synthetic("Cora", nodes=120, edges=500)
    g = Graph(data.edge_index.cuda(), num_nodes=data.num_nodes)
    rows = bench_graph(data.name, g, features=(8,), repeats=1)
    assert all(r.max_abs_err < 1e-4 for r in rows if r.impl in FORMATS)


def test_datasets_pubmed_real_graph_and_sbm(tmp_path, monkeypatch, capsys):
    """PubMed is its real graph when the LINQS file is found (labelled so); "sbm" selects
    the community-structured graph (shrunk here: the real one is OGB-Arxiv's size)."""
    import corgnn.datasets
    from corgnn.bench import spmm as bench
    from corgnn.cli import main

    assert bench.dataset_name("sbm") == "SBM" and bench.dataset_name("pubmed") == "PubMed"
    assert "SBM" in bench.DATASETS and "SBM" not in bench.QUICK["datasets"]
    with pytest.raises(ValueError, match="'SBM'"):
        bench.dataset_name("reddit")
    d = tmp_path / "PubMed-graph"
    d.mkdir()
    (d / "Pubmed-Diabetes.DIRECTED.cites.tab").write_text("DIRECTED\tcites\nNO_FEATURES\n1\tpaper:7\t|\tpaper:8\n2\tpaper:8\t|\tpaper:9\n")
    label, g = bench._load("PubMed", tmp_path)
    assert label == "PubMed (real graph, synthetic features)" and g.num_nodes == 3
    assert bench._load("PubMed", tmp_path / "empty")[0] == "PubMed (synthetic)"
    small = corgnn.datasets.sbm_graph(300, 1200, block_sizes=(20, 60))
    monkeypatch.setattr(corgnn.datasets, "sbm_graph", lambda: small)
    args = ["bench", "spmm", "--datasets", "sbm", "--f", "4", "--repeats", "1", "--formats", "csr", "--ops", "spmm", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    assert "SBM (synthetic, community structure): n=300" in capsys.readouterr().out
