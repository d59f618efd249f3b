"""Lucid dtypes and PyTorch-style type promotion."""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np


class dtype:  # noqa: N801  (PyTorch spells dtypes in lower case)
    """A tensor element type. ``lucid.float32.numpy`` is the numpy dtype behind it."""

    __slots__ = ("name", "numpy", "category", "itemsize")

    def __init__(self, name: str, np_dtype: Any, category: int):
        self.name = name
        self.numpy = np.dtype(np_dtype) if np_dtype is not None else None
        self.category = category  # 0 bool, 1 integer, 2 floating
        self.itemsize = self.numpy.itemsize if self.numpy is not None else 2

    @property
    def is_floating_point(self) -> bool:
        return self.category == 2

    def __repr__(self) -> str:
        return f"lucid.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))


bool_ = dtype("bool", np.bool_, 0)
int8 = dtype("int8", np.int8, 1)
int16 = dtype("int16", np.int16, 1)
int32 = dtype("int32", np.int32, 1)
int64 = dtype("int64", np.int64, 1)
uint8 = dtype("uint8", np.uint8, 1)
float16 = dtype("float16", np.float16, 2)
float32 = dtype("float32", np.float32, 2)
float64 = dtype("float64", np.float64, 2)
# numpy has no bfloat16: the name exists so code can mention it, and using it raises TypeError.
bfloat16 = dtype("bfloat16", None, 2)

half, float, double, long, int, short = float16, float32, float64, int64, int32, int16  # noqa: A001

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, float32, float64, bfloat16)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({"bool_": bool_, "half": half, "float": float32, "double": double, "long": long})
_BY_NUMPY = {d.numpy: d for d in ALL_DTYPES if d.numpy is not None}

default_float = float32
default_int = int64


def from_name(name: str) -> dtype:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"unknown dtype {name!r}; expected one of {sorted(_BY_NAME)}") from None


def from_numpy(np_dtype: Any) -> dtype:
    """The Lucid dtype of a numpy dtype; float64 arrays stay float64 (as torch.from_numpy)."""
    try:
        return _BY_NUMPY[np.dtype(np_dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"numpy dtype {np_dtype!r} has no Lucid equivalent") from None


def canonical(d: Any) -> dtype:
    """Accept a lucid dtype, a name, a numpy dtype or a Python type and return a Lucid dtype."""
    if isinstance(d, dtype):
        if d.numpy is None:
            raise TypeError(f"{d!r} is not supported: numpy has no {d.name} type")
        return d
    if isinstance(d, str):
        return canonical(from_name(d))
    if d is builtins_bool:
        return bool_
    if d is builtins_int:
        return default_int
    if d is builtins_float:
        return default_float
    try:
        return from_numpy(d)
    except TypeError:
        raise TypeError(f"unknown dtype {d!r}") from None


builtins_bool, builtins_int, builtins_float = builtins.bool, builtins.int, builtins.float


def _higher(a: dtype, b: dtype) -> dtype:
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 1 and {a, b} & {uint8} and {a, b} - {uint8}:
        # torch: uint8 with a signed type promotes to the next signed type that holds both.
        other = b if a is uint8 else a
        return int16 if other is int8 else other
    return a if a.itemsize >= b.itemsize else b


def scalar_category(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)):
        return 0
    if isinstance(value, (builtins_int, np.integer)):
        return 1
    return 2


def result_type(*operands: Any) -> dtype:
    """PyTorch's promotion: tensors with dims > 0-d tensors > Python scalars, by category.

    ``operands`` are objects with a ``dtype`` and ``ndim`` (tensors, avals) or Python scalars.
    A lower-priority operand only matters when its category (bool < int < float) is higher.
    """
    dim_t = zero_t = None
    scalar_cat = -1
    for x in operands:
        d = getattr(x, "dtype", None)
        if isinstance(d, dtype):
            if x.ndim > 0:
                dim_t = d if dim_t is None else _higher(dim_t, d)
            else:
                zero_t = d if zero_t is None else _higher(zero_t, d)
        else:
            scalar_cat = max(scalar_cat, scalar_category(x))
    out = dim_t
    if zero_t is not None:
        out = zero_t if out is None or zero_t.category > out.category else out
    if scalar_cat >= 0:
        if out is None:
            out = (bool_, default_int, default_float)[scalar_cat]
        elif scalar_cat > out.category:
            out = default_float if scalar_cat == 2 else default_int
    if out is None:
        raise TypeError("result_type needs at least one operand")
    return out
