"""Helpers the op modules use to declare fronts: Tensor methods and operator overloads."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lucid._state import state
from lucid._tensor import Tensor


def tensor_method(*names: str) -> Callable:
    """Decorator: also expose the front function as ``Tensor.<name>`` for every name given."""

    def deco(fn: Callable) -> Callable:
        for n in names or (fn.__name__,):
            setattr(Tensor, n, fn)
        return fn

    return deco


def inplace_method(name: str, fn: Callable) -> None:
    """``Tensor.<name>_``: the in-place form of an out-of-place front."""

    def method(self: Tensor, *args, **kwargs) -> Tensor:
        return self._apply_inplace(fn, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"In-place form of ``{fn.__name__}``."
    setattr(Tensor, name, method)


def alias_version(out: Tensor, x: Tensor) -> Tensor:
    """A result that aliases ``x``'s memory shares its version counter, so an in-place write
    through either is seen by the autograd nodes that saved the other (torch's view rule)."""
    a, b = out._data, x._data
    if a is not None and b is not None and a.base is not None and np.may_share_memory(a, b):
        out._version = x._version
    elif a is None and state.tracer is not None:
        state.tracer.record_view(out, x)
    return out
