"""No import cycles anywhere in ``grid_core``.

A cycle is what forced helpers split out of the controller to reach back into it, and what
turned imports into function-local "late" imports. The graph counts every import statement a
module contains (top level, inside functions, under ``TYPE_CHECKING``), each pointing at the
module it names, the way import-linter builds its graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grid_core

Graph = dict[str, set[str]]


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package, if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> Graph:
    """Module → the package modules it imports (itself excluded)."""
    modules = _modules(root)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.add(full if full in modules else _known(base, modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or ``None`` when the graph is acyclic."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_grid_core_has_no_import_cycles() -> None:
    graph = import_graph(Path(grid_core.__file__).parent)
    assert "grid_core.controller" in graph and len(graph) > 50  # it really walked the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in grid_core: " + " -> ".join(cycle or [])


def test_the_controller_parts_do_not_import_the_controller() -> None:
    graph = import_graph(Path(grid_core.__file__).parent)
    users = sorted(m for m, targets in graph.items() if "grid_core.controller" in targets)
    assert [m for m in users if m.startswith("grid_core.reconcile")] == []


def test_a_cycle_through_a_late_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
    )
    (pkg / "d.py").write_text("import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(pkg)) is None
