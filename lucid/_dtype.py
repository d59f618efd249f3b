"""Lucid dtypes and PyTorch-style type promotion."""

from __future__ import annotations

import builtins
import sys
from typing import Any

import numpy as np


class dtype:  # noqa: N801  (PyTorch spells dtypes in lower case)
    """A tensor element type. ``lucid.float32.numpy`` is the numpy dtype behind it."""

    __slots__ = ("name", "numpy", "category", "itemsize")

    def __init__(self, name: str, np_dtype: Any, category: int, itemsize: int | None = None):
        self.name = name
        self.category = category  # 0 bool, 1 integer, 2 floating
        if np_dtype is None:  # resolved on first read of ``numpy`` (``__getattr__``)
            self.itemsize = itemsize
        else:
            self.numpy = np.dtype(np_dtype)
            self.itemsize = self.numpy.itemsize

    def __getattr__(self, attr: str) -> Any:
        # Reached only for an unset slot: bfloat16's ``numpy`` before its first use. Once set,
        # the slot is read directly, so the hot paths pay nothing for the laziness.
        if attr == "numpy" and self is bfloat16:
            return _load_bfloat16()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

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
# ml_dtypes is imported when that dtype is first needed (``_load_bfloat16``): its start-up
# registers hundreds of ufunc loops (0.5-0.8 s with numpy 2.4), which ``import lucid`` should
# not pay for a float32 model.
bfloat16 = dtype("bfloat16", None, 2, itemsize=2)

half, float, double, long, int, short = float16, float32, float64, int64, int32, int16  # noqa: A001

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, float32, float64, bfloat16)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME.update({"bool_": bool_, "half": half, "float": float32, "double": double, "long": long})


def _load_bfloat16() -> np.dtype:
    """bfloat16's numpy dtype, importing ml_dtypes the first time; it then joins ``_BY_NUMPY``
    and ``HALF_NUMPY``."""
    import ml_dtypes

    np_dtype = np.dtype(ml_dtypes.bfloat16)
    _BY_NUMPY.setdefault(np_dtype, bfloat16)
    HALF_NUMPY.add(np_dtype)
    bfloat16.numpy = np_dtype
    return np_dtype


class BFloat16Table(dict):
    """A dict that gets bfloat16's entry when that entry is first looked up, so that building it
    does not import ml_dtypes: with ``name``, ``name`` -> bfloat16's numpy dtype; with
    ``value``, bfloat16's numpy dtype -> ``value``. Looking up anything else never imports it
    (a numpy dtype named bfloat16 exists only once ml_dtypes is imported)."""

    def __init__(self, entries: Any = (), *, name: str | None = None, value: Any = None):
        super().__init__(entries)
        self._name = name
        self._value = value

    def _bfloat16_entry(self, key: Any) -> tuple[Any, Any] | None:
        if self._name is not None:
            if isinstance(key, str) and key == self._name:
                return key, bfloat16.numpy
        elif (
            getattr(key, "name", None) == "bfloat16"
            and "ml_dtypes" in sys.modules
            and key == bfloat16.numpy
        ):
            return key, self._value
        return None

    def __missing__(self, key: Any) -> Any:
        entry = self._bfloat16_entry(key)
        if entry is None:
            raise KeyError(key)
        self[entry[0]] = entry[1]
        return entry[1]

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._bfloat16_entry(key) is not None


_BY_NUMPY = BFloat16Table(((d.numpy, d) for d in ALL_DTYPES if d is not bfloat16), value=bfloat16)
# The 16-bit floating formats: stored in 16 bits, computed in float32 and rounded once per op.
HALF_DTYPES = (float16, bfloat16)
# Their numpy dtypes: a set that bfloat16's joins when resolved. A bfloat16 array reaches the
# kernels only through a Lucid tensor, whose creation or ``dtype`` already resolved it.
HALF_NUMPY = {float16.numpy}
if "ml_dtypes" in sys.modules:  # already paid for: resolve now
    _load_bfloat16()

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
        if dt is bfloat16:
            import ml_dtypes  # numpy's finfo does not know bfloat16

            info = ml_dtypes.finfo(dt.numpy)
        else:
            info = np.finfo(dt.numpy)
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
