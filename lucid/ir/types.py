"""Lucid values in IR terms: dtypes as element types, shapes as ``tensor<...>`` types, and op
attributes (ints, floats, bools, None, strings, dtypes, tuples of those) as typed properties.

Every conversion here is lossless and has an inverse: ``attr_to_ir``/``attr_from_ir``,
``dtype_to_ir``/``dtype_from_ir``, ``tensor_type``/``shape_of_type``.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np

from lucid import _dtype
from lucid.ir import _xdsl as x
from lucid.ops._registry import AVal

_DTYPE_TO_IR = {
    _dtype.bool_: x.i1,
    _dtype.int8: x.i8,
    _dtype.int16: x.i16,
    _dtype.int32: x.i32,
    _dtype.int64: x.i64,
    _dtype.uint8: x.ui8,
    _dtype.float16: x.f16,
    _dtype.float32: x.f32,
    _dtype.float64: x.f64,
    _dtype.bfloat16: x.bf16,
}
_IR_TO_DTYPE = {v: k for k, v in _DTYPE_TO_IR.items()}


def dtype_to_ir(dt: _dtype.dtype) -> x.Attribute:
    return _DTYPE_TO_IR[dt]


def dtype_from_ir(t: x.Attribute) -> _dtype.dtype:
    try:
        return _IR_TO_DTYPE[t]
    except KeyError:
        raise ValueError(f"element type {t} has no Lucid dtype") from None


V = TypeVar("V")


class BoundedCache(Generic[V]):
    """A memo of at most ``limit`` entries; the least recently used goes first. The type caches
    below are this: a process compiling thousands of shapes keeps the types of the last few
    hundred (a few hundred kB), and the types a model uses on every compile stay cached while
    one-off shapes pass through."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int) -> None:
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self.limit = limit

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The entry of ``key``, made by ``make()`` (and kept) on a miss."""
        entries = self._entries
        value = entries.get(key)
        if value is not None:
            entries.move_to_end(key)
            return value
        value = entries[key] = make()
        if len(entries) > self.limit:
            entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


# A transformer stack's compile meets a few dozen distinct types; 128 covers several models'
# worth, at about 1 kB each (an xDSL type is a heavy object).
_TYPE_CACHE_LIMIT = 128
_TYPE_CACHE: BoundedCache[x.TensorType] = BoundedCache(_TYPE_CACHE_LIMIT)


def tensor_type(shape: tuple, dt: _dtype.dtype) -> x.TensorType:
    """``tensor<...>`` of a Lucid shape (None for a symbolic dim) and dtype; cached, because the
    importer asks for the same few types over and over."""
    return _TYPE_CACHE.get(
        (shape, dt),
        lambda: x.TensorType(
            _DTYPE_TO_IR[dt], [x.DYNAMIC_INDEX if d is None else d for d in shape]
        ),
    )


_AVAL_CACHE: BoundedCache[tuple[x.Attribute, AVal]] = BoundedCache(2 * _TYPE_CACHE_LIMIT)


def aval_of_type(t: x.Attribute) -> AVal:
    """The AVal of a tensor type. Cached by object identity (the importer reuses type objects,
    and hashing an xDSL attribute costs more than the conversion)."""
    # The entry holds t, so its id is not reused while cached; a different type object that
    # got the id of one evicted earlier misses the identity check and replaces the entry.
    held, av = _AVAL_CACHE.get(id(t), lambda: (t, AVal(shape_of_type(t), dtype_of_type(t))))
    if held is not t:
        av = AVal(shape_of_type(t), dtype_of_type(t))
    return av


def shape_of_type(t: x.Attribute) -> tuple:
    if not isinstance(t, x.TensorType):
        raise ValueError(f"expected a tensor type, got {t}")
    return tuple(None if d == x.DYNAMIC_INDEX else d for d in t.get_shape())


def dtype_of_type(t: x.Attribute) -> _dtype.dtype:
    if not isinstance(t, x.TensorType):
        raise ValueError(f"expected a tensor type, got {t}")
    return dtype_from_ir(t.element_type)


# --- attributes

# Attributes are immutable values, so equal ones are shared instead of built again for every op:
# building an xDSL attribute verifies it (several microseconds), and an unrolled or deep model
# repeats the same few hundred shapes, dims and indices thousands of times.
_ATTR_CACHE_LIMIT = 1024
_ATTR_CACHE: BoundedCache[x.Attribute] = BoundedCache(_ATTR_CACHE_LIMIT)
_UNIT = x.UnitAttr()
_TRUE, _FALSE = x.BoolAttr.from_bool(True), x.BoolAttr.from_bool(False)


def int_attr(v: int) -> x.IntegerAttr:
    """The (shared) ``i64`` attribute of the Python int ``v``."""
    return _ATTR_CACHE.get(("int", v), lambda: x.IntegerAttr(v, x.i64))


def ints_attr(values: tuple[int, ...]) -> x.DenseArrayBase:
    """The (shared) ``array<i64: ...>`` attribute of a tuple of Python ints."""
    return _ATTR_CACHE.get(("ints", values), lambda: x.DenseArrayBase.from_list(x.i64, values))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def attr_to_ir(v: Any) -> x.Attribute | None:
    """A Python attribute value as an xDSL attribute; None maps to None (the property is left
    out, and an absent property reads back as None)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return _TRUE if v else _FALSE
    if _is_int(v):
        return int_attr(v)
    if isinstance(v, float):
        # Keyed by the bits: 0.0 and -0.0 (equal floats) are different attributes.
        return _ATTR_CACHE.get(("float", struct.pack("<d", v)), lambda: x.FloatAttr(v, x.f64))
    if isinstance(v, str):
        return x.StringAttr(v)
    if isinstance(v, _dtype.dtype):
        return _DTYPE_TO_IR[v]
    if isinstance(v, (tuple, list)):
        if all(_is_int(e) for e in v):
            return ints_attr(tuple(v))
        # Float tuples stay an ArrayAttr of f64 attributes: xDSL 0.75 prints some values of an
        # array<f64: ...> (e.g. 1000001.0) in a hex form its own parser rejects.
        return x.ArrayAttr([_UNIT if e is None else attr_to_ir(e) for e in v])
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return attr_to_ir(v.item())  # a numpy scalar attribute is its Python value
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no IR form")


# Array attributes read back often (every lowered op reads its shapes and axes) and are shared
# objects (``ints_attr``): their values are memoized by identity, as ``aval_of_type`` does.
_ARRAY_VALUES: BoundedCache[tuple[x.Attribute, tuple]] = BoundedCache(_ATTR_CACHE_LIMIT)


def attr_from_ir(a: x.Attribute) -> Any:
    """The inverse of ``attr_to_ir``."""
    if isinstance(a, (x.DenseArrayBase, x.ArrayAttr)):
        held, value = _ARRAY_VALUES.get(id(a), lambda: (a, _attr_from_ir(a)))
        return value if held is a else _attr_from_ir(a)
    return _attr_from_ir(a)


def _attr_from_ir(a: x.Attribute) -> Any:
    if isinstance(a, x.IntegerAttr):
        if a.type == x.i1:
            return bool(a.value.data)
        return int(a.value.data)
    if isinstance(a, x.FloatAttr):
        return float(a.value.data)
    if isinstance(a, x.StringAttr):
        return a.data
    if isinstance(a, x.BytesAttr):  # the parser reads a string with escapes as bytes
        return a.data.decode("utf-8")
    if isinstance(a, x.DenseArrayBase):
        return tuple(a.get_values())
    if isinstance(a, x.ArrayAttr):
        return tuple(None if isinstance(e, x.UnitAttr) else attr_from_ir(e) for e in a.data)
    if isinstance(a, x.UnitAttr):
        return None
    if a in _IR_TO_DTYPE:
        return _IR_TO_DTYPE[a]
    raise ValueError(f"attribute {a} has no Lucid value")
