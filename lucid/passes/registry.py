"""The pass registry: pass name -> ``ModulePass`` class, loaded lazily.

Built-in passes are listed here by module; ``register_pass`` adds one from Python; installed
packages add theirs through the ``lucid.passes`` entry-point group, e.g. in pyproject.toml::

    [project.entry-points."lucid.passes"]
    my-pass = "my_package.passes:MyPass"
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from lucid.ir import _xdsl as x

__all__ = ["ENTRY_POINT_GROUP", "available_passes", "get_pass", "pass_loader", "register_pass"]

ENTRY_POINT_GROUP = "lucid.passes"

_BUILTIN = {
    "canonicalize": "lucid.passes.canonicalize:Canonicalize",
    "cse": "lucid.passes.cse:CSE",
    "dce": "lucid.passes.dce:DCE",
    "lower-to-prim": "lucid.passes.lower_to_prim:LowerToPrim",
    "prim-simplify": "lucid.passes.prim_simplify:PrimSimplify",
    "narrow-half": "lucid.passes.prim_simplify:NarrowHalf",
    "vjp": "lucid.passes.vjp:VJP",
    "ghost-grads": "lucid.passes.ghost_grads:GhostGrads",
    "grad-allreduce": "lucid.passes.grad_allreduce:GradAllReduce",
    "optimizer-fusion": "lucid.passes.optimizer_fusion:OptimizerFusion",
    "shape-specialize": "lucid.passes.shape_specialize:ShapeSpecialize",
    "partition": "lucid.passes.partition:Partition",
}

_PASSES: dict[str, Callable[[], type[x.ModulePass]]] = {}
_entry_points_loaded = False


def _lazy(target: str) -> Callable[[], type[x.ModulePass]]:
    module, _, attr = target.partition(":")
    return lambda: getattr(importlib.import_module(module), attr)


for _name, _target in _BUILTIN.items():
    _PASSES[_name] = _lazy(_target)


def register_pass(cls: type[x.ModulePass]) -> type[x.ModulePass]:
    """Add a pass (a ``ModulePass`` subclass with a ``name``); usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, x.ModulePass)):
        raise TypeError(f"register_pass expects a ModulePass subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"pass class {cls.__name__} has no 'name'")
    existing = _PASSES.get(name)
    if existing is not None and existing() is not cls:
        raise ValueError(f"a pass named {name!r} is already registered")
    _PASSES[name] = lambda: cls
    return cls


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    # Imported here: importlib.metadata costs a process's first compile ~8 ms, and a compile
    # of built-in passes never scans the entry points.
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _PASSES:
            continue  # a built-in or explicitly registered pass wins

        def load(ep=ep) -> type[x.ModulePass]:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, x.ModulePass)):
                raise TypeError(
                    f"entry point {ep.name} = {ep.value!r} of group {ENTRY_POINT_GROUP!r} "
                    "is not a ModulePass subclass"
                )
            return cls

        _PASSES[ep.name] = load


def pass_loader(name: str) -> Callable[[], type[x.ModulePass]] | None:
    """The loader of pass ``name`` (None if unknown). The installed packages' entry points are
    read only for a name that is not built in or registered (those win over entry points
    anyway): reading them scans every installed distribution, on a process's first compile."""
    loader = _PASSES.get(name)
    if loader is None:
        _load_entry_points()  # once per process
        loader = _PASSES.get(name)
    return loader


def available_passes() -> dict[str, Callable[[], type[x.ModulePass]]]:
    """Every known pass, name -> loader (built-ins, registered ones, entry points)."""
    _load_entry_points()
    return dict(_PASSES)


def get_pass(name: str) -> type[x.ModulePass]:
    """The pass class called ``name``; an unknown name is a ValueError listing the known ones."""
    passes = available_passes()
    if name not in passes:
        raise ValueError(f"unknown pass {name!r}; available passes: {', '.join(sorted(passes))}")
    return passes[name]()
