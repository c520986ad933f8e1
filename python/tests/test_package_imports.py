"""The package's modules import one another without a circle: every import
counts, at the top, inside a function or under TYPE_CHECKING, so that each
module can be read (and loaded) after the ones it names.

Run as a script, it lists the circles it finds:
``python python/tests/test_package_imports.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "dynamo_ctx"


def _modules(package: Path) -> Dict[str, Path]:
    """Dotted name -> file, for the package's Python modules and its
    extension modules (known by their stubs)."""
    mods: Dict[str, Path] = {}
    for path in package.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods.setdefault(".".join(parts), path)
    return mods


def _targets(name: str, is_package: bool, node: ast.AST, mods: Dict[str, Path]) -> Set[str]:
    """The package's modules an import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        found = {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        found = {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names}
    else:
        return set()
    out = set()
    for t in found:
        while t and t not in mods:  # `import a.b.c` names a.b.c's nearest module
            t = t.rpartition(".")[0]
        if t and t != name:
            out.add(t)
    return out


def import_graph(package: Path = PACKAGE) -> Dict[str, Set[str]]:
    """Each module -> the package's modules it imports anywhere in its file."""
    mods = _modules(package)
    graph: Dict[str, Set[str]] = {}
    for name, path in mods.items():
        is_package = path.stem == "__init__"
        tree = ast.parse(path.read_text("utf-8"))
        graph[name] = set().union(*(_targets(name, is_package, n, mods) for n in ast.walk(tree)))
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert "dynamo_ctx._lib" in graph and "dynamo_ctx._native" in graph
    assert circles(graph) == []


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def main() -> int:
    graph = import_graph()
    groups = circles(graph)
    for group in groups:
        print("circle:", ", ".join(group))
        for name in group:
            print(f"    {name} -> {', '.join(sorted(graph[name] & set(group)))}")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
