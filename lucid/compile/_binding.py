"""What keeps a compiled entry's bound tensors honest: module-structure checks and array layouts,
shared by ``lucid.compile`` and the training entry points.

Compiled entries bind parameters, buffers and optimizer state by object identity. Replacing one
(``model[2] = nn.Linear(16, 7)``, a new ``nn.Parameter``, ``load_state_dict(assign=True)``,
``bn.running_mean = t``) goes through a module's parameter/buffer/submodule table, which bumps
``STRUCTURE_VERSION``: a wrapper compares one int per call and, only when it moved, re-reads the
model's tensors (``Bound.changed``) and drops its entries if any of them is a different object.

Every cache key also carries the bound modules' training modes (``Bound.mode``): one bool when
all agree, else the top flag and the names in the other mode (``model.bn.eval()`` while the
model trains), so an executable traced in one combination is never served in another. It is
recomputed only when ``MODE_VERSION`` (bumped by any ``training`` assignment) moved.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from lucid._tensor import Tensor
from lucid.nn.modules.module import MODE_VERSION, STRUCTURE_VERSION, Module

__all__ = [
    "MODE_VERSION",
    "STRUCTURE_VERSION",
    "Bound",
    "ensure_c_layout",
    "mode_repr",
    "name_feeds",
    "owner_modules",
    "training_modes",
]


def owner_modules(target: Any) -> list[Module]:
    """The modules whose parameters and buffers a compiled ``target`` binds: the target itself,
    a bound method's module, or the modules a function reaches through its closure, its default
    arguments and the globals its code names, and likewise through the functions it calls that
    way (a few levels deep; ``functools.partial`` unwrapped)."""
    seen: dict[int, Module] = {}
    visited: set[int] = set()

    def add(obj: Any, depth: int) -> None:
        if isinstance(obj, Module):
            seen.setdefault(id(obj), obj)
        elif isinstance(obj, (types.FunctionType, types.MethodType)) or hasattr(obj, "func"):
            visit(obj, depth + 1)  # a helper function the target calls

    def visit(fn: Any, depth: int) -> None:
        if isinstance(fn, Module):
            seen.setdefault(id(fn), fn)
            return
        if depth > 3 or id(fn) in visited:
            return
        visited.add(id(fn))
        inner = getattr(fn, "func", None)  # functools.partial
        if inner is not None and hasattr(fn, "args"):
            visit(inner, depth + 1)
            for a in (*fn.args, *fn.keywords.values()):
                add(a, depth)
            return
        if isinstance(fn, types.MethodType):
            add(fn.__self__, depth)
            visit(fn.__func__, depth + 1)
            return
        code = getattr(fn, "__code__", None)
        if code is None:
            # A callable object: the modules among its attributes.
            if not isinstance(fn, type) and hasattr(fn, "__dict__"):
                for v in vars(fn).values():
                    add(v, depth)
            return
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                add(cell.cell_contents, depth)
            except ValueError:  # an empty cell
                pass
        for d in getattr(fn, "__defaults__", None) or ():
            add(d, depth)
        g = getattr(fn, "__globals__", {})
        for name in code.co_names:
            add(g.get(name), depth)

    visit(target, 0)
    return list(seen.values())


def _tensors_of(modules: Iterable[Module]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for m in modules:
        out.extend(m.named_parameters())
        out.extend(m.named_buffers())
    return out


_PLAIN = (bool, int, float, str, type(None))


def _attrs_of(modules: Iterable[Module]) -> list[tuple[Any, Any, Any]]:
    """Every submodule, by name and identity (one without tensors, an activation, swapped for
    another changes the graph as much as a replaced weight), with its hooks and its plain
    attributes (numbers, strings, None, tuples of them: a dropout rate, an eps, a user's
    temperature), which a trace bakes in."""
    out: list[tuple[Any, Any, Any]] = []
    for owner in modules:
        for name, m in owner.named_modules():
            d = m.__dict__
            for k, v in d.items():
                t = type(v)
                if k != "training" and (
                    t in _PLAIN or (t is tuple and all(type(e) in _PLAIN for e in v))
                ):
                    out.append((m, k, v))
            hooks = (
                *d.get("_forward_pre_hooks", {}).values(),
                *d.get("_forward_hooks", {}).values(),
            )
            out.append((m, ("hooks", name), hooks))
    return out


def _same_attrs(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x[0] is y[0] and x[1] == y[1] and (x[2] is y[2] or x[2] == y[2])
        for x, y in zip(a, b, strict=True)
    )


def training_modes(modules: list[Module]) -> bool | tuple[bool, tuple[str, ...]]:
    """The training modes of ``modules`` and all their submodules, compactly: the first
    module's flag when every module agrees (False for none), else ``(that flag, sorted names of
    the modules in the other mode)`` (names prefixed ``i:`` when there are several owners)."""
    if not modules:
        return False
    top = bool(modules[0].training)
    several = len(modules) > 1
    others = []
    for i, owner in enumerate(modules):
        for name, m in owner.named_modules():
            if bool(m.training) != top:
                others.append(f"{i}:{name}" if several else name)
    return (top, tuple(sorted(others))) if others else top


def mode_repr(mode: Any) -> str:
    """``training_modes``'s value for people: ``train``, ``eval`` or ``train (eval: bn)``."""
    if isinstance(mode, tuple):
        top, others = mode
        return f"{'train' if top else 'eval'} ({'eval' if top else 'train'}: {', '.join(others)})"
    return "train" if mode else "eval"


class Bound:
    """The parameters and buffers of the modules a wrapper binds, by identity, their submodules,
    hooks and plain attributes (``_attrs_of``), and the structure version they were read at.
    ``stale()`` is the per-call O(1) check. ``mode`` is ``training_modes(modules)`` as of
    ``mode_version`` (``modes()`` brings it up to date)."""

    __slots__ = ("attrs", "mode", "mode_version", "modules", "tensors", "version")

    def __init__(self, modules: list[Module]):
        self.modules = modules
        self.version = STRUCTURE_VERSION[0]
        self.tensors = _tensors_of(modules)
        self.attrs = _attrs_of(modules)
        self.mode_version = MODE_VERSION[0]
        self.mode = training_modes(modules)

    def modes(self) -> bool | tuple[bool, tuple[str, ...]]:
        """The bound modules' training modes (re-read only if a ``training`` flag was set)."""
        if self.mode_version != MODE_VERSION[0]:
            self.mode_version = MODE_VERSION[0]
            self.mode = training_modes(self.modules)
        return self.mode

    def stale(self) -> bool:
        return STRUCTURE_VERSION[0] != self.version

    def changed(self) -> bool:
        """Re-read after the structure version moved: True if any bound name now holds another
        object (or names came or went), or a plain attribute or hook changed. Either way the
        version is brought up to date."""
        self.version = STRUCTURE_VERSION[0]
        self.mode_version = -1  # submodules may have come or gone: re-read the modes too
        now, old = _tensors_of(self.modules), self.tensors
        attrs = _attrs_of(self.modules)
        moved = (
            len(now) != len(old)
            or any(a[0] != b[0] or a[1] is not b[1] for a, b in zip(now, old, strict=True))
            or not _same_attrs(attrs, self.attrs)
        )
        self.tensors, self.attrs = now, attrs
        return moved

    def settle(self) -> None:
        """After a compile: the attributes as its trace left them are the ones it baked in (a
        forward that sets an attribute does not make the next call recompile)."""
        self.attrs = _attrs_of(self.modules)

    def replaced(self, old_tensors: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The (name, tensor) pairs of ``old_tensors`` no longer held by the modules."""
        held = {id(t) for _, t in self.tensors}
        return [(n, t) for n, t in old_tensors if id(t) not in held]


def ensure_c_layout(tensors: Iterable[Any]) -> list[str]:
    """Re-lay out, in place of their ``_data``, every tensor whose array the runtimes do not take
    (not C-contiguous or not aligned, e.g. after ``w.data = w.t()``). The Tensor (Parameter)
    object stays the same, and so does every value; only the strides change, so later in-place
    updates land in the new array. Returns a description of what was re-laid out."""
    fixed: list[str] = []
    for t in tensors:
        if not isinstance(t, Tensor):
            continue
        a = t._data
        if a is None or (a.flags.c_contiguous and a.flags.aligned):
            continue
        t._data = np.array(a, order="C", copy=True)
        fixed.append(f"{tuple(a.shape)}")
    return fixed


_FEED_RE = re.compile(r"\bfeed (\d+)\b")


def name_feeds(message: str, roles: list[str]) -> str:
    """A runtime error about ``feed N`` rewritten to name the feed's role (``param:fc.weight``)."""

    def sub(m: re.Match) -> str:
        i = int(m.group(1))
        if 0 <= i < len(roles):
            role = roles[i]
            kind, _, name = role.partition(":")
            what = {
                "param": "parameter",
                "buffer": "buffer",
                "input": "input",
                "state": "optimizer state",
            }.get(kind)
            return f"{what} {name!r}" if what else f"feed {role!r}"
        return m.group(0)

    return _FEED_RE.sub(sub, message)
