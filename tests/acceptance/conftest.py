"""Loads the scripts of ``examples/`` as modules, as written (Lucid) or with every ``lucid``
renamed ``torch`` (the PyTorch original they were ported from)."""

import re
import sys
import types
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_source(name: str, framework: str = "lucid") -> str:
    """The text of ``examples/<name>.py``; for ``framework="torch"`` every word ``lucid`` is
    renamed ``torch``, and nothing else changes."""
    source = (EXAMPLES / f"{name}.py").read_text()
    if framework == "torch":
        return re.sub(r"\blucid\b", "torch", source)
    if framework != "lucid":
        raise ValueError(f"framework must be 'lucid' or 'torch', got {framework!r}")
    return source


def _load(name: str, framework: str = "lucid") -> types.ModuleType:
    if framework == "torch":
        pytest.importorskip("torch")
    module_name = f"lucid_example_{name}_{framework}"
    module = types.ModuleType(module_name)
    module.__file__ = str(EXAMPLES / f"{name}.py")
    sys.modules[module_name] = module  # dataclasses look their module up while decorating
    code = compile(example_source(name, framework), f"{module.__file__} [{framework}]", "exec")
    exec(code, module.__dict__)
    return module


@pytest.fixture(scope="session")
def load_example():
    """``load_example(name, framework)``: the example script as a fresh module."""
    return _load
