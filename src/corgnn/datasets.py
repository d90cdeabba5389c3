"""Datasets: the real Planetoid graphs (Cora, CiteSeer) read in place from a data root.

Data root search (first hit wins), documented in the README:

1. the ``root`` argument (``corgnn train --root DIR``);
2. the environment variable ``$CORGNN_DATA``;
3. ``shared/datasets`` beside or inside the current directory and the corgnn source
   checkout: ``./shared/datasets``, ``../shared/datasets`` (a fresh clone here has
   the project's shared folder beside it), and the same relative to the repo root;
4. ``~/.cache/corgnn/datasets``.

A data root holds ``<Name>/raw/ind.<name>.*`` (Planetoid's raw files, as PyG and
Kipf & Welling ship them). Files are read with PyG's own reader
(``torch_geometric.io.read_planetoid_data``) and nothing is written under the root.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["PLANETOID", "TABLE5", "find_data_root", "load_planetoid", "synthetic", "DatasetNotFoundError"]

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
        name: a key of :data:`TABLE5` (case-insensitive; "arxiv" also accepted).
        seed: RNG seed (same seed, same graph).
        nodes, edges, features: override the Table 5 sizes (tests use small ones).

    Returns:
        ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y``, masks
        (train 20 per class, val 500, test 1000, or scaled for tiny graphs).
    """
    from torch_geometric.data import Data

    key = {k.lower(): k for k in TABLE5}
    key["arxiv"] = key["ogbn-arxiv"] = "OGB-Arxiv"
    if name.lower() not in key:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(TABLE5)}")
    spec = TABLE5[key[name.lower()]]
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
    data.name = f"{key[name.lower()]} (synthetic)"
    data.synthetic = True
    return data
