"""Helpers shared by the layer modules: parameter creation and PyTorch's argument forms."""

from __future__ import annotations

import collections.abc
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._tensor import Tensor, device
from lucid.nn.parameter import Parameter


def factory_dtype(dev: Any, dtype: Any) -> _dtype.dtype:
    """The floating dtype a layer creates its parameters in (``device`` is validated)."""
    if dev is not None:
        device(dev)
    dt = _dtype.default_float if dtype is None else _dtype.canonical(dtype)
    if not dt.is_floating_point:
        raise TypeError(f"layer parameters must have a floating point dtype, got {dt}")
    return dt


def empty_parameter(shape: tuple, dt: _dtype.dtype) -> Parameter:
    """A Parameter of ``shape`` whose values ``reset_parameters`` fills in."""
    return Parameter(Tensor._wrap(np.zeros(shape, dtype=dt.numpy)))


def optional_parameter(shape: tuple, dt: _dtype.dtype, enabled: Any) -> Parameter | None:
    """``empty_parameter(shape, dt)``, or None (to register as a placeholder) when switched off."""
    return empty_parameter(shape, dt) if enabled else None


def buffer(values: Any, dt: _dtype.dtype) -> Tensor:
    return Tensor._wrap(np.array(values, dtype=dt.numpy))


def ntuple(x: Any, n: int, name: str = "argument") -> tuple:
    """``2 -> (2, 2)``; a sequence of length ``n`` is kept (as torch's ``_pair``)."""
    if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
        t = tuple(x)
        if len(t) != n:
            raise ValueError(f"{name} must be an int or a sequence of {n} ints, got {x!r}")
        return t
    return (x,) * n


def check_positive_int(value: Any, name: str, cls: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{cls}: {name} must be a positive integer, got {value!r}")
