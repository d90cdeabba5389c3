"""The shape of the house: imports flow one way (no cycle anywhere in corgnn, imports
inside functions included), no private (leading underscore) name crosses a module
boundary, backends sit at the bottom of corgnn.sparse, one training loop, and every
layer optimize() converts is registered by its own class.

Imports are read with ``ast`` (nothing is imported), module level and inside
functions alike; importing ``a.b.c`` counts as importing ``a`` and ``a.b`` too
(Python runs their ``__init__``), except the importer's own enclosing packages
(already running when it runs).
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def module_files(root: Path, package: str) -> dict:
    """Module name -> file of every module under ``root/package``."""
    out = {}
    for f in (root / package).rglob("*.py"):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def import_graph(root: Path, package: str) -> dict:
    """Module -> set of modules of ``package`` it imports (anywhere in its code), with
    the packages enclosing each imported module but not those enclosing the importer."""
    mods = module_files(root, package)
    graph = {}
    for name, f in mods.items():
        is_pkg = f.name == "__init__.py"
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    mod = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    mod = node.module
                targets.add(mod)
                targets.update(f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods)
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        edges = set()
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):  # a.b.c runs a and a.b first
                p = ".".join(parts[:i])
                if p in mods and p not in own:
                    edges.add(p)
        graph[name] = edges
    return graph


def private_imports(root: Path, package: str) -> list[str]:
    """``"<module> imports <_name> from <module>"`` for every ``from X import _name`` of
    a module of ``package`` from another of its modules."""
    mods = module_files(root, package)
    bad = []
    for name, f in mods.items():
        base = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom):
                mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module
                if mod and mod.split(".")[0] == package and mod != name:
                    bad += [f"{name} imports {a.name} from {mod}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.sub.b"]]
    # a package __init__ importing a module that imports back into the package's module
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import pkg.sub.b\n")
    (pkg / "sub" / "__init__.py").write_text("from ..c import x\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.c", "pkg.sub", "pkg.sub.b"]]


def test_checker_sees_a_private_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_hidden = 1\n")
    (pkg / "b.py").write_text("def f():\n    from .a import _hidden\n")
    assert private_imports(tmp_path, "pkg") == ["pkg.b imports _hidden from pkg.a"]


def test_no_import_cycle_anywhere_in_corgnn():
    graph = import_graph(SRC, "corgnn")
    assert "corgnn.training.loop" in graph and "corgnn.sparse.backends.numba_cpu" in graph
    assert cycles(graph) == [], "import cycles"


def test_no_private_name_imported_across_modules():
    assert private_imports(SRC, "corgnn") == []


def test_backends_import_only_the_bottom_layer_of_corgnn_sparse():
    graph = import_graph(SRC, "corgnn")
    allowed = {"corgnn.sparse", "corgnn.sparse.rng", "corgnn.sparse.formats"}
    for mod, targets in graph.items():
        if mod.startswith("corgnn.sparse.backends"):
            bad = {t for t in targets if not t.startswith("corgnn.sparse.backends") and t not in allowed}
            assert not bad, f"{mod} imports {sorted(bad)}"


def test_one_training_loop():
    """Single-process, mini-batch and partitioned training all run corgnn.training.loop.fit."""
    graph = import_graph(SRC, "corgnn")
    for mod in ("corgnn.training.single", "corgnn.training.distributed"):
        assert "corgnn.training.loop" in graph[mod]
    assert not any(m.startswith("corgnn.training") for m in graph["corgnn.distributed.train"])


def test_every_pyg_layer_optimize_converts_is_registered_by_its_corgnn_class():
    import torch_geometric.nn as pyg
    from torch_geometric.nn import MessagePassing

    from corgnn.nn.base import CorgnnConv

    table = CorgnnConv.conversions()
    assert set(table) == {"GCNConv", "GATConv", "SAGEConv", "GraphConv", "GINConv", "SGConv", "APPNP", "GATv2Conv", "TransformerConv"}
    for name, cls in table.items():
        assert issubclass(cls, CorgnnConv) and cls.PYG_NAME == name and hasattr(pyg, name)
        assert cls.__module__.startswith("corgnn.nn.")
        assert issubclass(cls, MessagePassing)  # (so PyG's set_masks / trim_to_layer find them)
