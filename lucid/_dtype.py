"""Lucid dtypes and PyTorch-style type promotion."""

from __future__ import annotations

import builtins
from typing import Any

import ml_dtypes
import numpy as np


class dtype:  # noqa: N801  (PyTorch spells dtypes in lower case)
    """A tensor element type. ``lucid.float32.numpy`` is the numpy dtype behind it."""

    __slots__ = ("name", "numpy", "category", "itemsize")

    def __init__(self, name: str, np_dtype: Any, category: int):
        self.name = name
        self.numpy = np.dtype(np_dtype)
        self.category = category  # 0 bool, 1 integer, 2 floating
        self.itemsize = self.numpy.itemsize

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
# numpy has no bfloat16 of its own: ml_dtypes provides the numpy dtype (round to nearest even).
bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16, 2)

half, float, double, long, int, short = float16, float32, float64, int64, int32, int16  # noqa: A001

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, float32, float64, bfloat16)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({"bool_": bool_, "half": half, "float": float32, "double": double, "long": long})
_BY_NUMPY = {d.numpy: d for d in ALL_DTYPES}
# The 16-bit floating formats: stored in 16 bits, computed in float32 and rounded once per op.
HALF_DTYPES = (float16, bfloat16)
HALF_NUMPY = frozenset(d.numpy for d in HALF_DTYPES)

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
    if {a, b} == {float16, bfloat16}:
        # Neither holds the other (more mantissa vs more exponent): torch gives float32.
        return float32
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


def set_default_dtype(d: Any) -> None:
    """The floating dtype of Python floats, ``lucid.tensor([1.0])`` and new parameters.

    As PyTorch: float32 (the default), float64, float16 or bfloat16.
    """
    global default_float
    dt = canonical(d)
    if not dt.is_floating_point:
        raise TypeError(
            f"set_default_dtype: only floating-point types can be the default type, not {dt}"
        )
    default_float = dt


def get_default_dtype() -> dtype:
    """The current default floating dtype (``lucid.float32`` unless changed)."""
    return default_float


class finfo:  # noqa: N801  (torch.finfo)
    """Machine limits of a floating dtype, with ``torch.finfo``'s fields (Python floats)."""

    __slots__ = ("dtype", "bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution")

    def __init__(self, type: Any = None):  # noqa: A002  (torch's argument name)
        dt = default_float if type is None else canonical(type)
        if not dt.is_floating_point:
            raise TypeError(f"finfo: {dt} is not a floating-point dtype (use numpy's iinfo)")
        info = ml_dtypes.finfo(dt.numpy)
        self.dtype = dt.name
        self.bits = builtins.int(info.bits)
        self.eps = builtins.float(info.eps)
        self.max = builtins.float(info.max)
        self.min = builtins.float(info.min)
        self.tiny = builtins.float(info.smallest_normal)
        self.smallest_normal = self.tiny
        # 10**-digits as a double, as torch (numpy's is rounded to the format itself)
        self.resolution = 10.0 ** -builtins.int(info.precision)

    def __repr__(self) -> str:
        return (
            f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
            f"eps={self.eps:g}, smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, "
            f"dtype={self.dtype})"
        )
