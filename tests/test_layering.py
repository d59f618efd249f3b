"""The import direction of docs/architecture.md ("Layers"), checked on the
source: every ``import`` and ``from ... import`` statement of every module under ``lucid/``,
including imports inside functions. Imports only point down:
eager core -> trace -> ir -> passes -> backends -> compile."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

LUCID = Path(__file__).resolve().parents[1] / "lucid"

# Which layers each layer may import (besides itself). "native" is lucid._native(_loader).
ALLOWED = {
    "core": {"native"},
    "native": {"core"},
    "trace": {"core"},
    "ir": {"core", "trace", "xdsl"},
    "passes": {"core", "trace", "ir"},
    "backends": {"core", "trace", "ir", "passes", "native"},
    "tools": {"core", "trace", "ir", "passes", "backends", "native"},
    "compile": {"core", "trace", "ir", "passes", "backends"},  # backends only by name
}

# Known exceptions as (layer or "layer:path", module prefix), each with its reason. None today:
# keep it that way by moving code to the layer it belongs to rather than adding one.
EXCEPTIONS: set[tuple[str, str]] = set()


def _layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "xdsl":
        return "xdsl"
    if parts[0] != "lucid":
        return None
    if len(parts) == 1:
        return "core"
    if parts[1] in ("trace", "ir", "passes", "backends", "compile", "tools"):
        return parts[1]
    if parts[1] in ("_native", "_native_loader"):
        return "native"
    return "core"


def _layer_of_file(path: Path) -> str:
    rel = path.relative_to(LUCID.parent)
    parts = rel.parts
    if len(parts) > 2 and parts[1] in ("trace", "ir", "passes", "backends", "compile", "tools"):
        return parts[1]
    if parts[1] == "_native_loader.py":
        return "native"
    return "core"


@functools.cache  # each file parsed once per run, whichever test asks first
def _statements(path: Path) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """Per import statement of ``path``: its line and the absolute modules it may load (``from
    a import b`` gives ``a.b``, since ``b`` may be a submodule, else ``a``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, (a.name,)) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, tuple(f"{node.module}.{a.name}" for a in node.names)))
    return tuple(out)


def _imports(path: Path) -> list[tuple[str, int]]:
    return [(name, line) for line, names in _statements(path) for name in names]


def _exempt(src: str, rel: str, name: str) -> bool:
    return any(
        s in (src, f"{src}:{rel}") and (name == e or name.startswith(e + "."))
        for s, e in EXCEPTIONS
    )


def _violations() -> list[str]:
    found = []
    for path in sorted(LUCID.rglob("*.py")):
        src = _layer_of_file(path)
        rel = str(path.relative_to(LUCID.parent))
        for line, names in _statements(path):
            for name in names:
                dst = _layer_of_module(name)
                if dst is None or dst == src or dst in ALLOWED[src] or _exempt(src, rel, name):
                    continue
                found.append(f"{rel}:{line}: {src} imports {name} ({dst})")
    return found


def test_imports_point_down():
    assert _violations() == []


def test_nothing_below_the_user_api_imports_lucid_compile():
    for layer in ("trace", "ir", "passes", "backends"):
        for path in (LUCID / layer).rglob("*.py"):
            for name, line in _imports(path):
                assert not (name == "lucid.compile" or name.startswith("lucid.compile.")), (
                    f"{path}:{line} imports {name}"
                )


def test_xdsl_is_imported_only_through_the_adapter():
    for path in LUCID.rglob("*.py"):
        for name, line in _imports(path):
            if name == "xdsl" or name.startswith("xdsl."):
                assert path == LUCID / "ir" / "_xdsl.py", f"{path}:{line} imports {name}"


def test_the_checker_sees_violations(tmp_path):
    # The walk finds imports inside functions and from-imports of submodules.
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from lucid import compile\n    import xdsl.ir\n")
    names = {n for n, _ in _imports(f)}
    assert {"lucid.compile", "xdsl.ir"} <= names
    assert _layer_of_module("lucid.compile.signature") == "compile"
    assert _layer_of_file(LUCID / "passes" / "_graph.py") == "passes"
    assert _layer_of_file(LUCID / "trace" / "_tracing.py") == "trace"
