"""Datasets: the paper's five graphs (Table 5), real when their files are found under a
data root, otherwise seeded synthetic stand-ins of the same shape.

* :func:`load_dataset` (what the benchmarks use): real data when present, else
  :func:`synthetic`; ``data.synthetic`` says which.
* :func:`load_pubmed_graph`: PubMed's real citation graph (LINQS file) with seeded
  synthetic features and labels, what :func:`load_dataset` gives for PubMed when
  Planetoid's raw files are absent;
* :func:`sbm_graph`: a seeded stochastic block model of OGB-Arxiv's size (a graph
  with community structure for kernel benchmarks; not one of Table 5's datasets);
* :data:`STANDINS`: synthetic-only benchmark graphs beside Table 5's (``Random-20k``,
  issue 25's 20k-node 200k-edge goal shape); :func:`load_dataset` and
  :func:`synthetic` take their names too;
* :func:`load_planetoid` (Cora, CiteSeer, PubMed: Planetoid raw files),
  :func:`load_flickr` (GraphSAINT/PyG raw files), :func:`load_ogb_arxiv` (OGB's raw
  CSVs): real data only, :class:`DatasetNotFoundError` otherwise.

Data root search (first hit wins), documented in the README:

1. the ``root`` argument (``corgnn train --root DIR``);
2. the environment variable ``$CORGNN_DATA``;
3. ``shared/datasets`` beside or inside the current directory and the corgnn source
   checkout: ``./shared/datasets``, ``../shared/datasets`` (a fresh clone here has
   the project's shared folder beside it), and the same relative to the repo root;
4. ``~/.cache/corgnn/datasets``.

A data root holds, per dataset (nothing is ever written under it):

* ``<Name>/raw/ind.<name>.*`` for Cora, CiteSeer, PubMed (Planetoid's raw files, as PyG
  and Kipf & Welling ship them), read with PyG's ``read_planetoid_data``;
* ``Flickr/raw/{adj_full.npz, feats.npy, class_map.json, role.json}`` (the files PyG's
  ``torch_geometric.datasets.Flickr`` downloads), read by that class's own ``process``;
* ``PubMed-graph/Pubmed-Diabetes.DIRECTED.cites.tab`` (the LINQS Pubmed-Diabetes
  citation list: 2 header lines, then ``id<TAB>paper:A<TAB>|<TAB>paper:B``, A cites
  B), read by :func:`load_pubmed_graph`;
* ``ogbn_arxiv/{raw/edge.csv.gz, raw/node-feat.csv.gz, raw/node-label.csv.gz,
  split/time/{train,valid,test}.csv.gz}`` (OGB's download layout; the folder may also
  be called ``ogbn-arxiv``, ``OGB-Arxiv`` or ``arxiv``), read with gzip + NumPy.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

__all__ = [
    "PLANETOID",
    "TABLE5",
    "DATASETS",
    "STANDINS",
    "DATASET_ORDER",
    "find_data_root",
    "load_planetoid",
    "load_flickr",
    "load_ogb_arxiv",
    "load_pubmed_graph",
    "read_linqs_cites",
    "sbm_graph",
    "SBM_NAME",
    "load_dataset",
    "canonical_name",
    "synthetic",
    "DatasetNotFoundError",
]

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


# Paper Table 5 shapes (nodes, directed edges, features, classes) and the max degree
# the synthetic stand-ins aim for (Cora 168 and Arxiv 436 as the paper's appendix
# states; the others in the hundreds, like the real graphs' hubs).
TABLE5 = {
    "Cora": dict(nodes=2708, edges=10556, features=1433, classes=7, max_degree=168),
    "CiteSeer": dict(nodes=3327, edges=9104, features=3703, classes=6, max_degree=99),
    "PubMed": dict(nodes=19717, edges=88648, features=500, classes=3, max_degree=171),
    "Flickr": dict(nodes=89250, edges=899756, features=500, classes=7, max_degree=500),
    "OGB-Arxiv": dict(nodes=169343, edges=1166243, features=128, classes=40, max_degree=436),
}


STANDINS = {
    # issue 25's goal shape for the attention layers (a 2-layer 8-head model's step on
    # a 20k-node 200k-edge graph); 128 features and 8 classes as the script
    "Random-20k": dict(nodes=20000, edges=200000, features=128, classes=8, max_degree=200),
}
"""Synthetic-only benchmark graphs beside Table 5's: name -> shape (the keys of
:data:`TABLE5`). No real files exist; :func:`load_dataset` always returns the seeded
:func:`synthetic` graph (named ``"<Name> (synthetic)"``)."""

_SHAPES = {**TABLE5, **STANDINS}

DATASET_ORDER = ("Cora", "CiteSeer", "PubMed", "Random-20k", "Flickr", "OGB-Arxiv")
"""Every dataset name, smallest graph first (the order of benchmark tables and plots)."""


class DatasetNotFoundError(FileNotFoundError):
    """The dataset's files are not under any searched data root."""


def _candidate_roots(root) -> list[Path]:
    if root is not None:
        return [Path(root)]
    out = []
    env = os.environ.get("CORGNN_DATA")
    if env:
        out.append(Path(env))
    repo = Path(__file__).resolve().parents[2]  # src/corgnn/datasets.py -> checkout root
    for base in (Path.cwd(), repo):
        out += [base / "shared" / "datasets", base.parent / "shared" / "datasets"]
    out.append(Path.home() / ".cache" / "corgnn" / "datasets")
    seen, uniq = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


def _planetoid_raw(root: Path, name: str) -> Path | None:
    key = name.lower()
    raw = root / PLANETOID[key] / "raw"
    if all((raw / f"ind.{key}.{f}").is_file() for f in _PLANETOID_FILES):
        return raw
    return None


def find_data_root(name: str, root=None) -> Path:
    """Directory holding ``name``'s raw files, following the documented search.

    Raises:
        ValueError: unknown dataset name.
        DatasetNotFoundError: files not found; the message lists every place looked
            and says where to put them.
    """
    key = name.lower()
    if key not in PLANETOID:
        raise ValueError(f"unknown Planetoid dataset {name!r}; choose one of {sorted(PLANETOID.values())}")
    tried = _candidate_roots(root)
    for r in tried:
        raw = _planetoid_raw(r, key)
        if raw is not None:
            return raw
    where = "\n  ".join(str(p / PLANETOID[key] / "raw") for p in tried)
    raise DatasetNotFoundError(
        f"{PLANETOID[key]} not found. Looked for ind.{key}.{{{','.join(_PLANETOID_FILES)}}} in:\n  {where}\n"
        f"Put the Planetoid raw files in <root>/{PLANETOID[key]}/raw/ and pass --root <root> "
        f"(or set CORGNN_DATA=<root>)."
    )


def load_planetoid(name: str = "Cora", root=None):
    """Load a Planetoid dataset (public Yang et al. split) as a PyG ``Data``.

    Returns:
        ``torch_geometric.data.Data`` with ``x (n, m) float32``, ``edge_index (2, q)
        int64``, ``y (n,) int64``, boolean ``train_mask``/``val_mask``/``test_mask``
        and ``name``.
    """
    from torch_geometric.io import read_planetoid_data

    raw = find_data_root(name, root)
    key = name.lower()
    data = read_planetoid_data(str(raw), key)
    data.name = PLANETOID[key]
    data.x = data.x.to(torch.float32).contiguous()
    return data


def synthetic(name: str, seed: int = 0, *, nodes: int | None = None, edges: int | None = None, features: int | None = None):
    """Seeded synthetic stand-in with Table 5's shape and a skewed degree distribution.

    Chung-Lu style: node weights follow a Pareto law (exponent ~2.1, like citation
    graphs), scaled so the largest expected degree is the dataset's ``max_degree``;
    both endpoints of each of the ``edges`` directed edges are drawn in proportion to
    the weights (self-loops redirected). Features are standard normal, labels
    uniform. The result is labelled ``synthetic=True`` and ``name="<Name> (synthetic)"``.

    Args:
        name: a key of :data:`TABLE5` or :data:`STANDINS` (case-insensitive; "arxiv"
            also accepted).
        seed: RNG seed (same seed, same graph).
        nodes, edges, features: override the Table 5 sizes (tests use small ones).

    Returns:
        ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y``, masks
        (train 20 per class, val 500, test 1000, or scaled for tiny graphs).
    """
    from torch_geometric.data import Data

    canon = canonical_name(name)
    spec = _SHAPES[canon]
    n = nodes or spec["nodes"]
    q = edges or spec["edges"]
    m = features or spec["features"]
    c = spec["classes"]
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64).clamp_min(1e-12)
    w = u.pow(-1.0 / 1.1)  # Pareto tail, degree exponent ~2.1
    target_max = min(spec["max_degree"], max(n - 1, 1))
    # expected in-degree of node i is q * w_i / sum(w); cap so the top hub is ~max_degree
    for _ in range(20):
        w = w.clamp_max(target_max * w.sum() / q)
    p = (w / w.sum()).float()
    src = torch.multinomial(p, q, replacement=True, generator=gen)
    dst = torch.multinomial(p, q, replacement=True, generator=gen)
    loop = src == dst
    dst[loop] = (dst[loop] + 1) % n
    x = torch.randn(n, m, generator=gen)
    y = torch.randint(0, c, (n,), generator=gen)
    perm = torch.randperm(n, generator=gen)
    n_train = min(20 * c, n // 3)
    n_val = min(500, n // 3)
    n_test = min(1000, n - n_train - n_val)
    masks = []
    start = 0
    for size in (n_train, n_val, n_test):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[perm[start : start + size]] = True
        masks.append(mask)
        start += size
    data = Data(x=x, edge_index=torch.stack([src, dst]), y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    data.name = f"{canon} (synthetic)"
    data.synthetic = True
    return data


# ---------------------------------------------------------------------------------
# Any of Table 5's datasets: real formats when present, synthetic stand-ins otherwise

DATASETS = tuple(TABLE5)
"""Canonical names of the paper's datasets, in Table 5's order."""

_ALIASES = {
    "arxiv": "OGB-Arxiv",
    "ogbn-arxiv": "OGB-Arxiv",
    "ogbn_arxiv": "OGB-Arxiv",
    "ogb_arxiv": "OGB-Arxiv",
    "ogb-arxiv": "OGB-Arxiv",
}

# folder names tried under each data root, and the files that must all be there
_FLICKR_FOLDERS = ("Flickr", "flickr")
_FLICKR_FILES = ("raw/adj_full.npz", "raw/feats.npy", "raw/class_map.json", "raw/role.json")
_ARXIV_FOLDERS = ("ogbn_arxiv", "ogbn-arxiv", "OGB-Arxiv", "arxiv")
_ARXIV_FILES = (
    "raw/edge.csv.gz",
    "raw/node-feat.csv.gz",
    "raw/node-label.csv.gz",
    "split/time/train.csv.gz",
    "split/time/valid.csv.gz",
    "split/time/test.csv.gz",
)


def canonical_name(name: str) -> str:
    """Table 5's spelling of a dataset name (case-insensitive; ``arxiv``,
    ``ogbn-arxiv``, ``ogbn_arxiv`` mean ``OGB-Arxiv``; a parenthesised suffix such
    as `` (synthetic)`` or `` (real graph, synthetic features)`` is ignored).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    if key.endswith(")") and " (" in key:  # a reported name: "PubMed (synthetic)", "Cora (synthetic, tiny)"
        key = key[: key.index(" (")]
    table = {k.lower(): k for k in _SHAPES} | _ALIASES
    if key not in table:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(_SHAPES)} (aliases: {sorted(_ALIASES)})")
    return table[key]


def _find_dataset_dir(label: str, folders: tuple[str, ...], files: tuple[str, ...], root) -> Path:
    """First ``<root>/<folder>`` (over the searched roots and ``folders``) holding all ``files``.

    Raises:
        DatasetNotFoundError: listing every directory looked in and what to put there.
    """
    tried = []
    for r in _candidate_roots(root):
        for folder in folders:
            d = r / folder
            tried.append(d)
            if all((d / f).is_file() for f in files):
                return d
    where = "\n  ".join(map(str, tried))
    raise DatasetNotFoundError(
        f"{label} not found. Looked for {', '.join(files)} in:\n  {where}\n"
        f"Put the files in <root>/{folders[0]}/ and pass the root (or set CORGNN_DATA=<root>)."
    )


def _mask(n: int, index: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[index] = True
    return mask


def load_flickr(root=None):
    """Load Flickr (Zeng et al., GraphSAINT) from PyG's raw files.

    Reads ``<root>/Flickr/raw/{adj_full.npz, feats.npy, class_map.json, role.json}``
    with ``torch_geometric.datasets.Flickr.process`` itself (PyG's reading logic,
    run on the files in place: its ``save`` is intercepted, nothing is written).
    ``adj_full.npz`` is a SciPy CSR matrix whose row ``i`` lists ``i``'s neighbours;
    PyG turns entry ``(i, j)`` into edge ``i -> j`` (the matrix is symmetric).

    Returns:
        ``Data`` with ``x (n, 500) float32``, ``edge_index (2, q) int64``, ``y (n,)
        int64``, ``train_mask``/``val_mask``/``test_mask`` from ``role.json``'s
        ``tr``/``va``/``te``, ``name="Flickr"``, ``synthetic=False``.

    Raises:
        DatasetNotFoundError: the four files are not under any searched data root.
        ValueError: the files are inconsistent (edges out of range, labels missing).
    """
    from types import SimpleNamespace

    from torch_geometric.datasets import Flickr

    d = _find_dataset_dir("Flickr", _FLICKR_FOLDERS, _FLICKR_FILES, root)
    out: list = []
    shim = SimpleNamespace(raw_dir=str(d / "raw"), pre_transform=None, processed_paths=[None], save=lambda data_list, path: out.extend(data_list))
    Flickr.process(shim)  # PyG's own reader; `save` collects the Data instead of writing
    data = out[0]
    _check_loaded("Flickr", data)
    data.x = data.x.to(torch.float32).contiguous()
    data.name, data.synthetic, data.source = "Flickr", False, str(d)
    return data


def _read_csv_gz(path: Path, dtype, columns: int | None = None):
    """A gzip-compressed CSV of numbers (no header) as a 2-D NumPy array."""
    import gzip

    import numpy as np

    with gzip.open(path, "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    if arr.size == 0 and columns is not None:
        arr = arr.reshape(0, columns)
    return arr


def load_ogb_arxiv(root=None):
    """Load ogbn-arxiv (Hu et al., OGB) from OGB's raw CSVs, without the ``ogb`` package.

    Reads ``<root>/ogbn_arxiv/raw/{edge,node-feat,node-label}.csv.gz`` and the time
    split ``split/time/{train,valid,test}.csv.gz`` (one node id per line), as
    ``ogb.io.read_csv_graph_raw`` does. Edges are kept as OGB stores them: directed,
    citing -> cited, 1,166,243 of them (Table 5's count); apply
    ``torch_geometric.transforms.ToUndirected`` for the symmetrised graph.

    Returns:
        ``Data`` with ``x (n, 128) float32``, ``edge_index (2, q) int64``, ``y (n,)
        int64``, ``train_mask``/``val_mask``/``test_mask``, ``name="OGB-Arxiv"``,
        ``synthetic=False``.

    Raises:
        DatasetNotFoundError: the files are not under any searched data root.
        ValueError: the files are inconsistent (edges out of range, label count).
    """
    import numpy as np
    from torch_geometric.data import Data

    d = _find_dataset_dir("OGB-Arxiv", _ARXIV_FOLDERS, _ARXIV_FILES, root)
    edges = _read_csv_gz(d / "raw" / "edge.csv.gz", np.int64, 2)
    x = _read_csv_gz(d / "raw" / "node-feat.csv.gz", np.float32)
    y = _read_csv_gz(d / "raw" / "node-label.csv.gz", np.int64, 1)
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"OGB-Arxiv at {d}: node-label.csv.gz has {y.shape[0]} rows but node-feat.csv.gz has {n}")
    if edges.shape[1] != 2:
        raise ValueError(f"OGB-Arxiv at {d}: edge.csv.gz must have 2 columns (source, target), got {edges.shape[1]}")
    masks = {}
    for split, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        idx = torch.from_numpy(_read_csv_gz(d / "split" / "time" / f"{split}.csv.gz", np.int64, 1).reshape(-1))
        if idx.numel() and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"OGB-Arxiv at {d}: split/time/{split}.csv.gz has node ids outside [0, {n})")
        masks[key] = _mask(n, idx)
    data = Data(x=torch.from_numpy(x).contiguous(), edge_index=torch.from_numpy(edges.T.copy()), y=torch.from_numpy(y.reshape(-1)), **masks)
    _check_loaded("OGB-Arxiv", data)
    data.name, data.synthetic, data.source = "OGB-Arxiv", False, str(d)
    return data


# ---------------------------------------------------------------------------------
# PubMed's real citation graph (LINQS), with seeded synthetic features and labels

_PUBMED_GRAPH_FOLDERS = ("PubMed-graph",)
_PUBMED_GRAPH_FILE = "Pubmed-Diabetes.DIRECTED.cites.tab"
PUBMED_GRAPH_NAME = "PubMed (real graph, synthetic features)"


def read_linqs_cites(path) -> tuple[torch.Tensor, list[str]]:
    """Read a LINQS citation list (``Pubmed-Diabetes.DIRECTED.cites.tab``).

    Format: two header lines (``DIRECTED<TAB>cites``, ``NO_FEATURES``), then one
    citation per line, ``id<TAB>paper:A<TAB>|<TAB>paper:B`` meaning A cites B. Blank
    lines are skipped.

    Args:
        path: the ``.tab`` file.

    Returns:
        ``(edge_index, ids)``: ``edge_index (2, c) int64``, one column per line,
        citing -> cited, as in the file (not symmetrised, self-citations kept); node
        ``i`` is paper ``ids[i]`` (the ``paper:`` number, a ``str``), numbered in
        order of first appearance (A before B on each line).

    Raises:
        ValueError: a malformed line (the message names the file and the line
            number) or fewer than the two header lines.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise ValueError(f"{path}: a LINQS citation file starts with 2 header lines; found {len(lines)} line(s)")
    ids: dict[str, int] = {}
    src, dst = [], []
    for lineno, line in enumerate(lines[2:], start=3):
        if not line.strip():
            continue
        parts = line.rstrip("\r").split("\t")
        ok = len(parts) == 4 and parts[2] == "|" and all(p.startswith("paper:") and len(p) > 6 for p in (parts[1], parts[3]))
        if not ok:
            raise ValueError(f"{path}: line {lineno}: expected 'id<TAB>paper:A<TAB>|<TAB>paper:B', got {line[:120]!r}")
        src.append(ids.setdefault(parts[1][6:], len(ids)))
        dst.append(ids.setdefault(parts[3][6:], len(ids)))
    return torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1), list(ids)


def _tfidf_like(n: int, m: int, density: float, gen: torch.Generator) -> torch.Tensor:
    """Seeded ``(n, m) float32`` non-negative TF-IDF-like features, about ``density``
    non-zero: column ``j`` occurs in a row with its own document frequency ``df_j``
    (uniform on ``(0, 2 density]``, so rare and common words), and an occurrence's
    value is ``tf * log(1 / df_j)`` with ``tf`` uniform on ``[0, 1)``."""
    df = (torch.rand(m, generator=gen) * (2 * density)).clamp(1e-3, 0.999)
    idf = torch.log(1.0 / df)
    present = torch.rand(n, m, generator=gen) < df
    return (torch.rand(n, m, generator=gen) * idf * present).to(torch.float32)


def _planetoid_masks(y: torch.Tensor, num_classes: int, gen: torch.Generator, per_class: int = 20, val: int = 500, test: int = 1000):
    """Planetoid-like ``(train, val, test)`` boolean masks over ``y``'s nodes:
    ``per_class`` random training nodes of each class (at most a third of the class,
    at least one, for tiny graphs), then ``val`` and ``test`` random nodes among the
    rest (at most half of the rest for ``val``)."""
    n = y.numel()
    perm = torch.randperm(n, generator=gen)
    yp = y[perm]
    train = torch.zeros(n, dtype=torch.bool)
    for c in range(num_classes):
        members = perm[yp == c]
        if members.numel():
            train[members[: min(per_class, max(1, members.numel() // 3))]] = True
    rest = perm[~train[perm]]
    n_val = min(val, rest.numel() // 2)
    n_test = min(test, rest.numel() - n_val)
    return train, _mask(n, rest[:n_val]), _mask(n, rest[n_val : n_val + n_test])


def load_pubmed_graph(root=None, *, seed: int = 0):
    """PubMed's real citation graph with seeded synthetic features and labels.

    Reads ``<root>/PubMed-graph/Pubmed-Diabetes.DIRECTED.cites.tab`` (the LINQS
    Pubmed-Diabetes release, the source of Planetoid's PubMed; see
    :func:`read_linqs_cites`) from the searched data roots (module docstring). Paper
    ids are numbered 0..n-1 **in order of first appearance** in the file (citing
    paper before cited paper on each line). The citations are symmetrised, the
    self-citations dropped and duplicates merged (``coalesce``): on the real file
    this gives exactly Table 5's PubMed, 19,717 nodes and 88,648 directed pairs.

    The real features and labels are not available offline, so they are seeded
    synthetic ones of PubMed's shape: 500 TF-IDF-like columns, about 10 % non-zero
    (see ``_tfidf_like``), and 3 classes of uniform random labels; masks are
    Planetoid-like (20 training nodes per class, 500 validation, 1000 test). Use it
    where the graph is what matters (kernel and step-time benchmarks), never for
    accuracy.

    Args:
        root: data root to search instead of the default list.
        seed: seed of the features, labels and masks (a local generator).

    Returns:
        ``Data`` with ``x (n, 500) float32`` (non-negative), ``edge_index (2, q)
        int64`` (symmetric, sorted, no self-loops), ``y (n,) int64`` in ``[0, 3)``,
        boolean ``train_mask``/``val_mask``/``test_mask``, ``name = "PubMed (real
        graph, synthetic features)"``, ``synthetic = True`` (the features are not
        real), ``real_graph = True``, ``paper_ids`` (list of ``n`` str: node ``i`` is
        paper ``paper_ids[i]``) and ``source`` (the file read).

    Raises:
        DatasetNotFoundError: the file is not under any searched data root.
        ValueError: a malformed line (naming the file and line).
    """
    from torch_geometric.data import Data
    from torch_geometric.utils import coalesce, remove_self_loops

    d = _find_dataset_dir("PubMed's real graph", _PUBMED_GRAPH_FOLDERS, (_PUBMED_GRAPH_FILE,), root)
    path = d / _PUBMED_GRAPH_FILE
    cites, ids = read_linqs_cites(path)
    n = len(ids)
    ei, _ = remove_self_loops(torch.cat([cites, cites.flip(0)], dim=1))
    ei = coalesce(ei, num_nodes=n)
    spec = TABLE5["PubMed"]
    gen = torch.Generator().manual_seed(seed)
    x = _tfidf_like(n, spec["features"], 0.1, gen)
    y = torch.randint(0, spec["classes"], (n,), generator=gen)
    train, val, test = _planetoid_masks(y, spec["classes"], gen)
    data = Data(x=x, edge_index=ei, y=y, train_mask=train, val_mask=val, test_mask=test)
    data.name, data.synthetic, data.real_graph = PUBMED_GRAPH_NAME, True, True
    data.paper_ids, data.source = ids, str(path)
    return data


# ---------------------------------------------------------------------------------
# A graph with community structure: stochastic block model of OGB-Arxiv's size

SBM_NAME = "SBM (synthetic, community structure)"


def _block_sizes(nodes: int, lo: int, hi: int, gen: torch.Generator) -> torch.Tensor:
    """Log-uniform block sizes in ``[lo, hi]`` summing to ``nodes`` (a last block
    smaller than ``lo`` is merged into the one before it)."""
    sizes: list[int] = []
    total = 0
    while total < nodes:
        b = int(round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * float(torch.rand((), generator=gen)))))
        b = min(b, nodes - total)
        sizes.append(b)
        total += b
    if len(sizes) > 1 and sizes[-1] < lo:
        last = sizes.pop()
        sizes[-1] += last
    return torch.tensor(sizes, dtype=torch.int64)


def sbm_graph(
    nodes: int = TABLE5["OGB-Arxiv"]["nodes"],
    edges: int = TABLE5["OGB-Arxiv"]["edges"],
    *,
    block_sizes: tuple[int, int] = (200, 3000),
    p_in: float = 0.9,
    features: int = TABLE5["OGB-Arxiv"]["features"],
    classes: int = TABLE5["OGB-Arxiv"]["classes"],
    seed: int = 0,
):
    """Seeded stochastic block model (SBM): a graph with community structure.

    Random graphs (the Table 5 stand-ins of :func:`synthetic`) have no locality for a
    reordering to recover; this one has: ``nodes`` are split into blocks of
    log-uniform random size in ``block_sizes`` (a few hundred to a few thousand
    nodes by default), a fraction ``p_in`` of the edges join two nodes of the same
    block, and the node ids are then randomly shuffled, so the communities are there
    to recover but not given by the ids. Defaults: OGB-Arxiv's size (169,343 nodes,
    about 1.17 M directed pairs, 128 features, 40 classes).

    Sampling (the SBM with uniform densities inside blocks and uniform between
    them): ``edges // 2`` undirected edges, of which ``round(p_in * edges / 2)``
    inside blocks, each in a block drawn with probability proportional to its
    number of node pairs ``b (b - 1) / 2``, with two distinct uniform endpoints in
    it; the rest with uniform endpoints in two different blocks. Both directions
    are kept (symmetric ``edge_index``), duplicates merged, so the count is
    ``edges`` less the repeated draws (0.2 % at the default size; more in small,
    dense blocks).

    NOTE: ``torch_geometric.utils.stochastic_blockmodel_graph`` does not scale to
    this size: it builds every node pair (``torch.combinations`` of n nodes, 1.4e10
    pairs, about 230 GB of int64 indices, plus a probability per pair) and draws a
    Bernoulli for each. Drawing the per-block edge counts and then uniform endpoints
    samples the same model in O(edges) time and memory (at the default size, about
    0.2 GB of peak memory and 2 s on a shared 2-core machine, features included).

    Args:
        nodes: node count (>= 2).
        edges: directed pairs wanted (>= 0; both directions of each undirected edge
            count).
        block_sizes: ``(smallest, largest)`` block size, ``2 <= smallest <= largest``.
        p_in: fraction of the edges inside blocks, in ``[0, 1]``.
        features: columns of the standard-normal features ``x`` (>= 1).
        classes: labels are the block index modulo ``classes`` (>= 1).
        seed: RNG seed (a local generator; same seed, same graph).

    Returns:
        ``Data`` with ``x (nodes, features) float32``, ``edge_index (2, q) int64``
        (symmetric, sorted, no self-loops, ``q`` about ``edges``), ``y (nodes,)
        int64``, ``block (nodes,) int64`` (each node's block), Planetoid-like
        masks, ``name = "SBM (synthetic, community structure)"``, ``synthetic =
        True``, ``real_graph = False``.

    Raises:
        ValueError: an argument out of range (named in the message).
    """
    from torch_geometric.data import Data
    from torch_geometric.utils import coalesce

    for arg, v, lo in (("nodes", nodes, 2), ("edges", edges, 0), ("features", features, 1), ("classes", classes, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"sbm_graph: {arg} must be an int >= {lo}, got {v!r}")
    if len(block_sizes) != 2 or not all(isinstance(b, int) for b in block_sizes) or not 2 <= block_sizes[0] <= block_sizes[1]:
        raise ValueError(f"sbm_graph: block_sizes must be (smallest, largest) ints with 2 <= smallest <= largest, got {block_sizes!r}")
    if not 0.0 <= p_in <= 1.0:
        raise ValueError(f"sbm_graph: p_in must be in [0, 1], got {p_in!r}")
    gen = torch.Generator().manual_seed(seed)
    sizes = _block_sizes(nodes, *block_sizes, gen)
    starts = torch.cumsum(sizes, 0) - sizes
    block = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    undirected = edges // 2
    e_in = round(p_in * undirected) if sizes.numel() > 1 else undirected
    # inside blocks: block by pair count, then two distinct uniform endpoints
    blk = torch.multinomial((sizes * (sizes - 1)).to(torch.float64), e_in, replacement=True, generator=gen) if e_in else sizes[:0]
    b, s0 = sizes[blk], starts[blk]
    off = (torch.rand(e_in, generator=gen, dtype=torch.float64) * b).long()
    step = 1 + (torch.rand(e_in, generator=gen, dtype=torch.float64) * (b - 1)).long()
    u_in, v_in = s0 + off, s0 + (off + step) % b
    # between blocks: uniform endpoints, a pair in one block redrawn (rare: ~sum b^2 / n^2)
    e_out = undirected - e_in
    u_out = torch.randint(0, nodes, (e_out,), generator=gen)
    v_out = torch.randint(0, nodes, (e_out,), generator=gen)
    same = block[u_out] == block[v_out]
    while bool(same.any()):  # rejection sampling: uniform over the pairs in different blocks
        k = int(same.sum())
        u_out[same] = torch.randint(0, nodes, (k,), generator=gen)
        v_out[same] = torch.randint(0, nodes, (k,), generator=gen)
        same = block[u_out] == block[v_out]
    perm = torch.randperm(nodes, generator=gen)  # new id of node i is perm[i]
    u, v = perm[torch.cat([u_in, u_out])], perm[torch.cat([v_in, v_out])]
    ei = coalesce(torch.stack([torch.cat([u, v]), torch.cat([v, u])]), num_nodes=nodes)
    new_block = torch.empty_like(block)
    new_block[perm] = block
    y = new_block % classes
    x = torch.randn(nodes, features, generator=gen)
    train, val, test = _planetoid_masks(y, classes, gen)
    data = Data(x=x, edge_index=ei, y=y, block=new_block, train_mask=train, val_mask=val, test_mask=test)
    data.name, data.synthetic, data.real_graph = SBM_NAME, True, False
    return data


def _check_loaded(label: str, data) -> None:
    n = data.x.size(0)
    ei = data.edge_index
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ValueError(f"{label}: edge_index has node ids outside [0, {n}) (features have {n} rows)")
    if data.y.size(0) != n:
        raise ValueError(f"{label}: {data.y.size(0)} labels for {n} nodes")


def load_dataset(name: str, root=None, seed: int = 0, *, allow_synthetic: bool = True):
    """One of Table 5's datasets: the real one when its files are found, else a stand-in
    (always the stand-in for the synthetic-only :data:`STANDINS`).

    Real formats searched (see the module docstring for the data-root search):
    Planetoid raw files for Cora, CiteSeer and PubMed (:func:`load_planetoid`),
    PyG's Flickr raw files (:func:`load_flickr`), OGB's raw CSVs for OGB-Arxiv
    (:func:`load_ogb_arxiv`). For PubMed without Planetoid's files, its real
    citation graph with synthetic features (:func:`load_pubmed_graph`) when the
    LINQS file is found. When none is found the seeded :func:`synthetic` stand-in
    with the Table 5 shape is returned.

    Args:
        name: dataset name (see :func:`canonical_name`).
        root: data root to search instead of the default list.
        seed: seed of the synthetic stand-in and of the synthetic features of
            PubMed's real graph (ignored for real data).
        allow_synthetic: False raises :class:`DatasetNotFoundError` instead of
            returning anything with synthetic parts (a stand-in, or PubMed's real
            graph with its synthetic features and labels).

    Returns:
        ``Data`` with ``x``, ``edge_index``, ``y``, masks, ``name`` (``"<Name>"``,
        ``"PubMed (real graph, synthetic features)"`` or ``"<Name> (synthetic)"``)
        and ``synthetic`` (True unless features and labels are real).

    Raises:
        ValueError: unknown name.
        DatasetNotFoundError: no real files and ``allow_synthetic=False``.
    """
    canon = canonical_name(name)
    if canon in STANDINS:
        if not allow_synthetic:
            raise DatasetNotFoundError(f"{canon} is a synthetic stand-in only (corgnn.datasets.STANDINS); it has no real files")
        return synthetic(canon, seed)
    try:
        if canon in ("Cora", "CiteSeer", "PubMed"):
            data = load_planetoid(canon, root)
            data.synthetic = False
        elif canon == "Flickr":
            data = load_flickr(root)
        else:
            data = load_ogb_arxiv(root)
    except DatasetNotFoundError:
        if not allow_synthetic:
            raise
        if canon == "PubMed":
            try:
                return load_pubmed_graph(root, seed=seed)
            except DatasetNotFoundError:
                pass
        return synthetic(canon, seed)
    return data
