"""Loaders for the real formats of Table 5's datasets, on small files written here,
and the real-or-synthetic choice of ``load_dataset``."""

from __future__ import annotations

import gzip
import json
import pickle

import numpy as np
import pytest
import torch

from corgnn.datasets import (
    TABLE5,
    DatasetNotFoundError,
    canonical_name,
    load_dataset,
    load_flickr,
    load_ogb_arxiv,
    load_planetoid,
)

# a small directed graph: 6 nodes, node 5 isolated
EDGES = np.array([[0, 1], [1, 0], [1, 2], [2, 3], [3, 1], [4, 0]], dtype=np.int64)
N = 6


def _write_flickr(root, n=N, edges=EDGES, folder="Flickr"):
    import scipy.sparse as sp

    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    adj = sp.csr_matrix((np.ones(len(edges), dtype=np.float32), (edges[:, 0], edges[:, 1])), shape=(n, n))
    np.savez(raw / "adj_full.npz", data=adj.data, indices=adj.indices, indptr=adj.indptr, shape=adj.shape)
    feats = np.arange(n * 3, dtype=np.float64).reshape(n, 3)
    np.save(raw / "feats.npy", feats)
    (raw / "class_map.json").write_text(json.dumps({str(i): i % 2 for i in range(n)}))
    (raw / "role.json").write_text(json.dumps({"tr": [0, 1, 2], "va": [3], "te": [4, 5]}))
    return feats


def _gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def _write_arxiv(root, folder="ogbn_arxiv", n=N, edges=EDGES, labels=None):
    d = root / folder
    _gz(d / "raw" / "edge.csv.gz", [f"{s},{t}" for s, t in edges])
    feats = np.round(np.random.default_rng(0).normal(size=(n, 4)), 4).astype(np.float32)
    _gz(d / "raw" / "node-feat.csv.gz", [",".join(f"{v:.4f}" for v in row) for row in feats])
    labels = list(range(n)) if labels is None else labels
    _gz(d / "raw" / "node-label.csv.gz", [str(v % 3) for v in labels])
    for split, ids in (("train", [0, 1]), ("valid", [2, 3]), ("test", [4, 5])):
        _gz(d / "split" / "time" / f"{split}.csv.gz", [str(i) for i in ids])
    return feats


def test_canonical_names():
    assert canonical_name("cora") == "Cora"
    assert canonical_name("ogbn-arxiv") == canonical_name("ARXIV") == canonical_name("ogbn_arxiv") == "OGB-Arxiv"
    assert canonical_name("PubMed (synthetic)") == "PubMed"
    with pytest.raises(ValueError, match="unknown dataset 'reddit'"):
        canonical_name("reddit")
    with pytest.raises(TypeError):
        canonical_name(3)


def test_flickr_raw_files(tmp_path):
    feats = _write_flickr(tmp_path)
    data = load_flickr(tmp_path)
    assert data.name == "Flickr" and data.synthetic is False
    assert data.x.dtype == torch.float32 and torch.equal(data.x, torch.from_numpy(feats).float())
    got = sorted(map(tuple, data.edge_index.t().tolist()))
    assert got == sorted(map(tuple, EDGES.tolist()))
    assert data.y.tolist() == [i % 2 for i in range(N)]
    assert data.train_mask.nonzero().view(-1).tolist() == [0, 1, 2]
    assert data.val_mask.nonzero().view(-1).tolist() == [3]
    assert data.test_mask.nonzero().view(-1).tolist() == [4, 5]
    # load_dataset prefers the real files
    real = load_dataset("flickr", root=tmp_path)
    assert real.synthetic is False and real.name == "Flickr"


def test_flickr_edges_out_of_range(tmp_path):
    _write_flickr(tmp_path, n=N)
    # features for fewer nodes than the adjacency has
    np.save(tmp_path / "Flickr" / "raw" / "feats.npy", np.zeros((N - 2, 3)))
    (tmp_path / "Flickr" / "raw" / "class_map.json").write_text(json.dumps({str(i): 0 for i in range(N - 2)}))
    (tmp_path / "Flickr" / "raw" / "role.json").write_text(json.dumps({"tr": [0], "va": [1], "te": [2]}))
    with pytest.raises(ValueError, match="outside"):
        load_flickr(tmp_path)


@pytest.mark.parametrize("folder", ["ogbn_arxiv", "ogbn-arxiv", "OGB-Arxiv"])
def test_ogb_arxiv_raw_csvs(tmp_path, folder):
    feats = _write_arxiv(tmp_path, folder)
    data = load_ogb_arxiv(tmp_path)
    assert data.name == "OGB-Arxiv" and data.synthetic is False
    assert torch.allclose(data.x, torch.from_numpy(feats), atol=1e-6)
    assert torch.equal(data.edge_index, torch.from_numpy(EDGES.T.copy()))  # directed, as stored
    assert data.y.tolist() == [i % 3 for i in range(N)]
    assert data.train_mask.sum() == 2 and data.val_mask[2] and data.test_mask[5]
    assert load_dataset("arxiv", root=tmp_path).synthetic is False


def test_ogb_arxiv_inconsistent_files(tmp_path):
    _write_arxiv(tmp_path, labels=list(range(N - 1)))
    with pytest.raises(ValueError, match="node-label.csv.gz has 5 rows"):
        load_ogb_arxiv(tmp_path)
    bad = tmp_path / "bad"
    _write_arxiv(bad, edges=np.array([[0, 9]]))
    with pytest.raises(ValueError, match="outside"):
        load_ogb_arxiv(bad)


def test_missing_files_say_where_to_look(tmp_path):
    _write_arxiv(tmp_path)
    (tmp_path / "ogbn_arxiv" / "split" / "time" / "test.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError) as e:
        load_ogb_arxiv(tmp_path)
    assert "split/time/test.csv.gz" in str(e.value) and str(tmp_path / "ogbn_arxiv") in str(e.value)
    with pytest.raises(DatasetNotFoundError, match="Flickr not found"):
        load_flickr(tmp_path)
    with pytest.raises(DatasetNotFoundError):
        load_dataset("flickr", root=tmp_path, allow_synthetic=False)


def _write_planetoid(root, name="pubmed", n_train=4, n_test=6, n_extra=500, m=5, c=3):
    """Planetoid's 'ind' files: allx/ally the first n_train + n_extra nodes (x/y the
    labelled n_train of them), tx/ty the test nodes, graph a dict of neighbour lists."""
    raw = root / {"pubmed": "PubMed"}[name] / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    n_all = n_train + n_extra
    allx = rng.random((n_all, m)).astype(np.float32)
    tx = rng.random((n_test, m)).astype(np.float32)
    ally = np.eye(c)[rng.integers(0, c, n_all)]
    ty = np.eye(c)[rng.integers(0, c, n_test)]
    n = n_all + n_test
    graph = {i: [(i + 1) % n, (i + 7) % n] for i in range(n)}
    items = {"x": allx[:n_train], "tx": tx, "allx": allx, "y": ally[:n_train], "ty": ty, "ally": ally, "graph": graph}
    for k, v in items.items():
        with open(raw / f"ind.{name}.{k}", "wb") as f:
            pickle.dump(v, f)
    (raw / f"ind.{name}.test.index").write_text("\n".join(str(i) for i in range(n_all, n)) + "\n")
    return n


def test_pubmed_planetoid_raw_files(tmp_path):
    n = _write_planetoid(tmp_path)
    data = load_planetoid("PubMed", tmp_path)
    assert data.num_nodes == n and data.x.shape == (n, 5)
    real = load_dataset("pubmed", root=tmp_path)
    assert real.synthetic is False and real.name == "PubMed"


def test_load_dataset_falls_back_to_a_labelled_stand_in(tmp_path):
    data = load_dataset("PubMed", root=tmp_path, seed=3)
    spec = TABLE5["PubMed"]
    assert data.synthetic is True and data.name == "PubMed (synthetic)"
    assert data.x.shape == (spec["nodes"], spec["features"]) and data.edge_index.size(1) == spec["edges"]
    again = load_dataset("pubmed", root=tmp_path, seed=3)
    assert torch.equal(again.edge_index, data.edge_index)  # seeded
