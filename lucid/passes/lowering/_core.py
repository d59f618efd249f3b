"""What every lowering rule is written with: prim values, the builder, the rule tables.

A rule lowers one ``lucid`` op. It is called as ``rule(b, *operands, **attrs)`` with the op's
operands in registry order (a variadic operand as a list) and its full attributes; each operand is
a ``PV`` (a prim value: SSA value, static shape, Lucid dtype) or a Python scalar (a weakly typed
``lucid.constant``). It emits prim ops through the builder ``b`` and returns one ``PV`` per result.
``b.outs`` holds the op's result avals (from the registry's inference), which a rule may read to
pick its compute dtype. The pass casts a result whose dtype differs from the registry's (as eager
dispatch casts a kernel's result) and refuses one whose shape differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lucid import _dtype
from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.prim.dialect import create_prim, prim_type
from lucid.ops._registry import AVal

__all__ = [
    "HALF_DTYPES",
    "P",
    "PV",
    "RULES",
    "UNSUPPORTED",
    "Builder",
    "LoweringUnsupported",
    "Operand",
    "is_scalar",
    "lower_dtype",
    "numpy_dtype",
    "prim_arg_type",
    "rule",
    "unsupported",
]

Rule = Callable[..., Any]
RULES: dict[str, Rule] = {}
UNSUPPORTED: dict[str, str] = {}  # op name -> why it has no lowering


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register a lowering rule for the lucid ops ``names``."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            assert n not in RULES and n not in UNSUPPORTED, n
            RULES[n] = fn
        return fn

    return deco


def unsupported(name: str, reason: str) -> None:
    """Mark lucid op ``name`` as having no lowering, with the reason users see."""
    assert name not in RULES and name not in UNSUPPORTED, name
    UNSUPPORTED[name] = reason


class LoweringUnsupported(Exception):
    """This op (with these operands and attributes) cannot become prim ops; ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


_TO_PRIM = {
    _dtype.float32: "f32",
    _dtype.float64: "f64",
    _dtype.float16: "f16",
    _dtype.bfloat16: "bf16",
    _dtype.int32: "i32",
    _dtype.int64: "i64",
    _dtype.bool_: "bool",
}
_FROM_PRIM = {v: k for k, v in _TO_PRIM.items()}
HALF_DTYPES = frozenset({_dtype.float16, _dtype.bfloat16})


def lower_dtype(dt: _dtype.dtype) -> str:
    """The prim dtype name of a Lucid dtype; others raise ``LoweringUnsupported``."""
    p = _TO_PRIM.get(dt)
    if p is None:
        raise LoweringUnsupported(
            f"dtype {dt.name} has no prim type (prim has float32, float64, float16, bfloat16, "
            "int32, int64, bool)"
        )
    return p


def numpy_dtype(dt: _dtype.dtype) -> np.dtype:
    """The numpy dtype prim stores Lucid dtype ``dt`` in (ml_dtypes' for bfloat16)."""
    return P.NUMPY_DTYPES[lower_dtype(dt)]


class PV:
    """A prim value: an SSA value with its static shape and Lucid dtype (so Lucid's promotion
    rules apply to it as to a tensor)."""

    __slots__ = ("ssa", "shape", "dtype")

    def __init__(self, ssa: x.SSAValue, shape: tuple[int, ...], dtype: _dtype.dtype):
        self.ssa = ssa
        self.shape = shape
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"PV({self.shape}, {self.dtype.name})"


Operand = PV | bool | int | float


def is_scalar(v: Any) -> bool:
    return isinstance(v, (bool, int, float))


class Builder:
    """Emits prim ops in front of the op being lowered (through ``insert``)."""

    def __init__(self, insert: Callable[[x.Operation], None]):
        self._insert = insert
        self.outs: tuple[AVal, ...] = ()
        # The op's results as the registry gives them: outs differs on half ops, whose rules
        # compute in float32 (dtype-dependent constants such as finfo follow the stored dtype).
        self.stored_outs: tuple[AVal, ...] = ()
        self.used: tuple[bool, ...] = ()  # per result of the op being lowered: is it read?
        self.op_name = ""
        self._consts: dict[tuple, PV] = {}
        # What a rule knows about a value it produced, for the rules of later ops that read it
        # (e.g. max_pool2d's indices: which input and window they came from). One function's
        # lowering shares one Builder.
        self.facts: dict[x.SSAValue, tuple] = {}
        self._widened: dict[x.SSAValue, PV] = {}  # half value -> its float32 cast, made once

    # --- raw emission
    def emit(self, name: str, operands: Sequence[PV], **attrs: Any) -> list[PV]:
        """Emit ``prim.<name>``; returns its results."""
        op = create_prim(name, [v.ssa for v in operands], attrs)
        self._insert(op)
        out = []
        for r in op.results:
            t = r.type
            dt = _FROM_PRIM[_prim_dtype_of(t)]
            out.append(PV(r, tuple(t.get_shape()), dt))
        return out

    def op(self, name: str, *operands: PV, **attrs: Any) -> PV:
        (out,) = self.emit(name, operands, **attrs)
        return out

    # --- values
    def const(self, value: Any, dtype: _dtype.dtype, shape: Sequence[int] | None = None) -> PV:
        """A ``prim.constant`` of ``value`` (a scalar, splatted to ``shape``, or an array)."""
        pdt = lower_dtype(dtype)
        arr = np.asarray(value)
        if shape is None:
            shape = arr.shape
        shape = tuple(int(d) for d in shape)
        if arr.size == 1:
            flat: tuple = (float(arr.reshape(-1)[0]),)
        else:
            flat = tuple(np.broadcast_to(arr, shape).astype(np.float64).reshape(-1).tolist())
        # Keyed by the exact bits, so -0.0 and 0.0 (equal as floats) stay apart.
        key = (np.asarray(flat, dtype=np.float64).tobytes(), pdt, shape)
        hit = self._consts.get(key)
        if hit is not None:
            return hit
        v = self.op("constant", shape=shape, dtype=pdt, value=flat)
        if len(self._consts) < 4096:
            self._consts[key] = v
        return v

    def arange_along(self, n: int, axis: int, rank: int, dtype: _dtype.dtype = _dtype.int64) -> PV:
        """0..n-1 along ``axis`` of a rank-``rank`` value (size 1 elsewhere): n constant entries
        that broadcast, instead of a constant of the full shape."""
        shape = [1] * rank
        shape[axis] = n
        return self.const(np.arange(n).reshape(shape), dtype, tuple(shape))

    def flat_iota(self, shape: Sequence[int]) -> PV:
        """The row-major flat position of every element of ``shape`` (int64), built from one
        range per dim."""
        shape = tuple(shape)
        rank = len(shape)
        if rank == 0:
            return self.const(0, _dtype.int64, ())
        out = None
        for d, n in enumerate(shape):
            stride = math.prod(shape[d + 1 :])
            term = self.arange_along(n, d, rank)
            if stride != 1:
                term = self.binary("mul", term, stride, _dtype.int64)
            out = term if out is None else self.op("add", out, term)
        return self.broadcast_to(out, shape)

    def cast(self, v: Operand, dtype: _dtype.dtype) -> PV:
        """``v`` as ``dtype`` (a scalar becomes a 0-d constant)."""
        if is_scalar(v):
            return self.const(v, dtype, ())
        if v.dtype is dtype:
            return v
        return self.op("cast", v, dtype=lower_dtype(dtype))

    def widen(self, v: PV) -> PV:
        """A half value as float32 (one cast per value, shared by every op that reads it);
        other values unchanged."""
        if v.dtype not in HALF_DTYPES:
            return v
        wide = self._widened.get(v.ssa)
        if wide is None:
            wide = self._widened[v.ssa] = self.cast(v, _dtype.float32)
        return wide

    def check_index(self, idx: PV, low: int, high: int, message: str) -> PV:
        """``idx`` after a run-time check that every value lies in ``[low, high)``; otherwise the
        run raises ``IndexError(message)`` with ``{}`` replaced by the first bad value. Rules
        route every value they read as an index through this, with the user op's own message."""
        if idx.size == 0:
            return idx
        return self.op("check_index", idx, low=int(low), high=int(high), message=message)

    def full(self, value: Any, shape: Sequence[int], dtype: _dtype.dtype) -> PV:
        return self.const(value, dtype, tuple(shape))

    # --- shape helpers (no-ops when nothing changes)
    def reshape(self, v: PV, shape: Sequence[int]) -> PV:
        shape = tuple(shape)
        return v if v.shape == shape else self.op("reshape", v, shape=shape)

    def transpose(self, v: PV, perm: Sequence[int]) -> PV:
        perm = tuple(perm)
        return v if perm == tuple(range(v.ndim)) else self.op("transpose", v, perm=perm)

    def broadcast_to(self, v: PV, shape: Sequence[int]) -> PV:
        shape = tuple(shape)
        return v if v.shape == shape else self.op("broadcast_to", v, shape=shape)

    def slice_axis(self, v: PV, axis: int, start: int, end: int, step: int = 1) -> PV:
        starts = [0] * v.ndim
        ends = list(v.shape)
        strides = [1] * v.ndim
        starts[axis], ends[axis], strides[axis] = start, end, step
        if start == 0 and end == v.shape[axis] and step == 1:
            return v
        return self.op("slice", v, starts=starts, ends=ends, strides=strides)

    def concat(self, vs: Sequence[PV], axis: int) -> PV:
        vs = [v for v in vs if v.shape[axis] != 0] or list(vs[:1])
        return vs[0] if len(vs) == 1 else self.op("concat", *vs, axis=axis)

    def reduce(self, name: str, v: PV, axes: Sequence[int], keepdims: bool = False) -> PV:
        axes = tuple(axes)
        if not axes:
            return v
        return self.op(name, v, axes=axes, keepdims=keepdims)

    # --- arithmetic on PVs or scalars, in an explicit dtype
    def binary(self, name: str, a: Operand, c: Operand, dtype: _dtype.dtype) -> PV:
        return self.op(name, self.cast(a, dtype), self.cast(c, dtype))

    def select(self, cond: PV, a: Operand, c: Operand, dtype: _dtype.dtype) -> PV:
        return self.op(
            "select", self.cast(cond, _dtype.bool_), self.cast(a, dtype), self.cast(c, dtype)
        )


def _prim_dtype_of(t: x.Attribute) -> str:
    from lucid.ir.prim.dialect import aval_of_type

    return aval_of_type(t).dtype


def prim_arg_type(shape: tuple, dt: _dtype.dtype) -> x.TensorType:
    return prim_type(shape, lower_dtype(dt))
