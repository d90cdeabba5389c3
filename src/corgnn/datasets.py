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

__all__ = ["PLANETOID", "find_data_root", "load_planetoid", "DatasetNotFoundError"]

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


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
