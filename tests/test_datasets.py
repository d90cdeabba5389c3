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
    DATASET_ORDER,
    DATASETS,
    SBM_NAME,
    STANDINS,
    TABLE5,
    DatasetNotFoundError,
    canonical_name,
    load_dataset,
    load_flickr,
    load_ogb_arxiv,
    load_planetoid,
    load_pubmed_graph,
    sbm_graph,
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
    assert canonical_name("PubMed (real graph, synthetic features)") == "PubMed"
    assert canonical_name("Cora (synthetic, tiny)") == "Cora"
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


def test_synthetic_only_stand_in_random_20k(tmp_path):
    """Issue 25's 20k-node 200k-edge graph: a stand-in only, never looked up on disk,
    ordered by size among Table 5's datasets (which it does not join)."""
    assert canonical_name("random-20k") == "Random-20k" and "Random-20k" not in DATASETS
    assert set(DATASET_ORDER) == set(TABLE5) | set(STANDINS)
    assert DATASET_ORDER.index("PubMed") < DATASET_ORDER.index("Random-20k") < DATASET_ORDER.index("Flickr")
    data = load_dataset("Random-20k", root=tmp_path, seed=1)
    assert data.name == "Random-20k (synthetic)" and data.synthetic is True
    assert data.x.shape == (20000, 128) and data.edge_index.size(1) == 200000 and int(data.y.max()) == 7
    assert torch.equal(load_dataset("Random-20k", seed=1).edge_index, data.edge_index)  # seeded
    with pytest.raises(DatasetNotFoundError, match="stand-in only"):
        load_dataset("Random-20k", allow_synthetic=False)


# ------------------------------------------------------------ PubMed's real graph (LINQS)

# paper ids as they appear: 30 cites 10, 10 cites 30 (a duplicate once symmetrised),
# 20 cites 20 (a self-citation, dropped), 40 cites 10; 50 cites 60
LINQS_LINES = ["1\tpaper:30\t|\tpaper:10", "2\tpaper:10\t|\tpaper:30", "3\tpaper:20\t|\tpaper:20", "4\tpaper:40\t|\tpaper:10", "5\tpaper:50\t|\tpaper:60"]


def _write_linqs(root, lines=LINQS_LINES):
    d = root / "PubMed-graph"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "Pubmed-Diabetes.DIRECTED.cites.tab"
    path.write_text("DIRECTED\tcites\nNO_FEATURES\n" + "".join(line + "\n" for line in lines))
    return path


def test_pubmed_graph_from_a_linqs_file(tmp_path):
    _write_linqs(tmp_path)
    data = load_pubmed_graph(tmp_path, seed=1)
    assert data.paper_ids == ["30", "10", "20", "40", "50", "60"]  # order of first appearance
    n = 6
    assert data.num_nodes == n
    # 30-10, 40-10, 50-60 in both directions; the self-citation and the duplicate gone
    expected = {(0, 1), (1, 0), (3, 1), (1, 3), (4, 5), (5, 4)}
    assert set(map(tuple, data.edge_index.t().tolist())) == expected and data.edge_index.size(1) == len(expected)
    assert data.x.shape == (n, 500) and data.x.dtype == torch.float32 and bool((data.x >= 0).all())
    assert data.y.dtype == torch.int64 and 0 <= int(data.y.min()) and int(data.y.max()) < 3
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert int(masks.sum(0).max()) <= 1 and bool(data.train_mask.any())  # disjoint, a training node
    assert data.name == "PubMed (real graph, synthetic features)" and data.synthetic is True and data.real_graph is True
    again, other = load_pubmed_graph(tmp_path, seed=1), load_pubmed_graph(tmp_path, seed=2)
    assert torch.equal(again.x, data.x) and torch.equal(again.y, data.y) and not torch.equal(other.x, data.x)


@pytest.mark.parametrize("bad", ["6\tpaper:1\tpaper:2", "6\tpaper:1\t|\t2", "6\tpaper:1\t/\tpaper:2", "6 paper:1 | paper:2"])
def test_pubmed_graph_malformed_line_names_file_and_line(tmp_path, bad):
    path = _write_linqs(tmp_path, LINQS_LINES[:2] + [bad])
    with pytest.raises(ValueError) as e:
        load_pubmed_graph(tmp_path)
    assert str(path) in str(e.value) and "line 5" in str(e.value)


def test_load_dataset_pubmed_planetoid_then_real_graph_then_stand_in(tmp_path):
    assert load_dataset("PubMed", root=tmp_path).name == "PubMed (synthetic)"
    _write_linqs(tmp_path)
    data = load_dataset("PubMed", root=tmp_path, seed=1)
    assert data.name == "PubMed (real graph, synthetic features)" and data.num_nodes == 6
    assert torch.equal(data.x, load_pubmed_graph(tmp_path, seed=1).x)  # the seed is passed on
    with pytest.raises(DatasetNotFoundError):  # features and labels are synthetic
        load_dataset("PubMed", root=tmp_path, allow_synthetic=False)
    _write_planetoid(tmp_path)
    assert load_dataset("PubMed", root=tmp_path).name == "PubMed"


def test_real_pubmed_graph_is_table5s():
    try:
        data = load_pubmed_graph()
    except DatasetNotFoundError as e:
        pytest.skip(f"PubMed's LINQS file is not under any data root: {str(e).splitlines()[0]}")
    spec = TABLE5["PubMed"]
    assert data.num_nodes == spec["nodes"] == 19717 and data.edge_index.size(1) == spec["edges"] == 88648
    assert abs(float((data.x != 0).float().mean()) - 0.1) < 0.01


# ------------------------------------------------------------ stochastic block model


def test_sbm_graph_has_shuffled_community_structure():
    data = sbm_graph(3000, 30000, block_sizes=(100, 400), p_in=0.9, features=4, classes=5, seed=3)
    n, ei, block = data.num_nodes, data.edge_index, data.block
    assert n == 3000 and data.x.shape == (n, 4) and data.name == SBM_NAME == "SBM (synthetic, community structure)"
    assert data.synthetic is True and data.real_graph is False
    assert 0.95 * 30000 < ei.size(1) <= 30000 and int((ei[0] == ei[1]).sum()) == 0
    assert set(map(tuple, ei.t().tolist())) == set(map(tuple, ei.flip(0).t().tolist()))  # symmetric
    sizes = torch.bincount(block)
    assert int(sizes.min()) >= 100 and int(sizes.max()) <= 400 + 100 and int(sizes.sum()) == n
    inside = float((block[ei[0]] == block[ei[1]]).float().mean())
    assert 0.87 < inside < 0.93
    # the ids do not give the blocks away: consecutive ids share a block about as often
    # as random pairs (sum of (b / n)^2, ~0.1 here), not ~always as before shuffling
    assert float((block[1:] == block[:-1]).float().mean()) < 0.25
    assert torch.equal(data.y, block % 5)
    again = sbm_graph(3000, 30000, block_sizes=(100, 400), p_in=0.9, features=4, classes=5, seed=3)
    assert torch.equal(again.edge_index, ei) and not torch.equal(sbm_graph(3000, 30000, block_sizes=(100, 400), features=4, seed=4).edge_index, ei)


@pytest.mark.parametrize(
    "kw, arg",
    [(dict(nodes=1), "nodes"), (dict(edges=-2), "edges"), (dict(block_sizes=(1, 5)), "block_sizes"), (dict(block_sizes=(50, 10)), "block_sizes"), (dict(p_in=1.5), "p_in"), (dict(features=0), "features")],
)
def test_sbm_graph_bad_arguments(kw, arg):
    with pytest.raises(ValueError, match=arg):
        sbm_graph(**{"nodes": 100, "edges": 400, "block_sizes": (10, 20), **kw})
