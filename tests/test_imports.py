"""Issue 22 item 3: corgnn.sparse has no import cycle (imports inside functions
included) and no module imports another's private (leading underscore) name.

Reads the sources with ``ast`` (nothing is imported), so it sees every import
statement wherever it sits.
"""

import ast
from pathlib import Path

import pytest

import corgnn.sparse

PACKAGE = "corgnn.sparse"
ROOT = Path(corgnn.sparse.__file__).parent


def modules() -> dict[str, Path]:
    """Module name -> source file, for every module of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PACKAGE, *parts])] = path
    return out


def _resolve(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """``(imported module, [names imported from it])`` for every import statement of
    ``module``, at any depth, restricted to modules of the package."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.append((a.name, []))
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, is_pkg, node.level, node.module) if node.level else (node.module or "")
            if not (src == PACKAGE or src.startswith(PACKAGE + ".")):
                continue
            plain = []
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in known:  # "from . import library": the submodule itself
                    found.append((sub, []))
                else:
                    plain.append(a.name)
            if plain and src in known:
                found.append((src, plain))
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for m, path in mods.items():
        for target, names in imports(m, path, known):
            if target != m:
                edges[m].add(target)
            private += [f"{m}: from {target} import {n}" for n in names if n.startswith("_") and target != m]
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), plus self-loops."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_checker_sees_cycles_and_private_imports(tmp_path):
    # the checker itself can fail: a made-up two-module cycle and a private import
    e = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(e) == [["a", "b"]]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .formats import _hidden, CSR\n    from . import ops\n")
    found = imports("corgnn.sparse.m", src, {"corgnn.sparse.formats", "corgnn.sparse.ops"})
    assert ("corgnn.sparse.formats", ["_hidden", "CSR"]) in found and ("corgnn.sparse.ops", []) in found


def test_no_import_cycle_within_corgnn_sparse():
    edges, _ = graph()
    assert cycles(edges) == [], "import cycles within corgnn.sparse"


def test_backends_import_only_the_bottom_layer():
    edges, _ = graph()
    allowed_outside = {"corgnn.sparse.rng", "corgnn.sparse.formats"}
    for m, targets in edges.items():
        if m.startswith("corgnn.sparse.backends"):
            bad = {t for t in targets if not t.startswith("corgnn.sparse.backends") and t not in allowed_outside}
            assert not bad, f"{m} imports {sorted(bad)}"


def test_no_private_name_imported_across_modules():
    _, private = graph()
    assert private == []


@pytest.mark.parametrize("name", ["dispatch", "library", "ops", "attention", "registry"])
def test_modules_found(name):
    assert f"{PACKAGE}.{name}" in modules()
