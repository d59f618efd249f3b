"""The CPU backend's modules form no import circle (function-level imports included) and none
grows past the size a reader can hold (the old ``kernel_fusion.py`` was 1,135 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import lucid.backends.cpu as cpu_package

ROOT = Path(cpu_package.__file__).parent
PACKAGE = "lucid.backends.cpu"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The backend's modules ``path`` imports anywhere in its body (``from P import m`` counts
    as importing ``P.m`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found & known


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_cycle_finder_sees_a_circle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles_in_the_cpu_backend():
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph) or [])


def test_no_cpu_backend_file_is_too_long():
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
