"""Flattening a model's return value into tensors and rebuilding the same structure, and the
access paths of tensors inside argument containers (``args[i][k]...``).

Supported containers: tuple, list, dict, namedtuple and dataclass; any other leaf that is not a
Tensor is kept as it is (a constant of the structure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lucid._tensor import Tensor

Rebuild = Callable[[list], Any]


def flatten(obj: Any, leaves: list[Tensor]) -> Rebuild:
    """Append the tensors of ``obj`` to ``leaves``; return a function of the new leaves that
    rebuilds ``obj``'s structure around them."""
    if isinstance(obj, Tensor):
        i = len(leaves)
        leaves.append(obj)
        return lambda vals: vals[i]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        parts = [flatten(e, leaves) for e in obj]
        cls = type(obj)
        return lambda vals: cls(*(p(vals) for p in parts))
    if isinstance(obj, (tuple, list)):
        parts = [flatten(e, leaves) for e in obj]
        cls = type(obj)
        if cls in (tuple, list):
            return lambda vals: cls(p(vals) for p in parts)
        return lambda vals: cls([p(vals) for p in parts])
    if isinstance(obj, dict):
        keys = list(obj)
        parts = [flatten(obj[k], leaves) for k in keys]
        cls = type(obj)
        return lambda vals: cls(zip(keys, (p(vals) for p in parts), strict=True))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [f.name for f in dataclasses.fields(obj) if f.init]
        parts = [flatten(getattr(obj, f), leaves) for f in fields]
        cls = type(obj)
        return lambda vals: cls(**{f: p(vals) for f, p in zip(fields, parts, strict=True)})
    return lambda vals: obj


def _tensor_paths(obj: Any, path: tuple, out: list[tuple]) -> None:
    """Append the access path (``args[i][k]...``) of every tensor in ``obj``, depth first."""
    if isinstance(obj, Tensor):
        out.append(path)
    elif isinstance(obj, (tuple, list)):
        for i, e in enumerate(obj):
            _tensor_paths(e, (*path, i), out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensor_paths(v, (*path, k), out)


def _at(args: Any, path: tuple) -> Any:
    for k in path:
        args = args[k]
    return args


def _replace_tensors(obj: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``obj`` with every tensor ``t`` replaced by ``fn(t)`` (same containers, same order)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [_replace_tensors(e, fn) for e in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return type(obj)([_replace_tensors(e, fn) for e in obj])
    if isinstance(obj, dict):
        return type(obj)((k, _replace_tensors(v, fn)) for k, v in obj.items())
    return obj
