"""Module attributes imported on first use (PEP 562): what a module re-exports but its common
path does not need stays out of the import that path pays for."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_attributes(module_name: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``homes[name]`` (a module path) on the first use of
    ``name``, takes its attribute of that name and keeps it in the module.

    Example: ``__getattr__ = lazy_attributes(__name__, {"Program": "lucid.backends.cpu.program"})``
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__
