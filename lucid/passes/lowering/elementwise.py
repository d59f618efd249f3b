"""Lowering rules of the elementwise family: arithmetic, math, comparisons, logic, casts, fills.

Promotion follows eager dispatch: a PROMOTE op computes in ``result_type`` of its operands (Python
scalars are weak), so operands are cast to that dtype (scalars become 0-d constants of it); the
pass then casts the result to the registry's result dtype. Ops that compute in floating point
(``exp``, ``div`` of integers, ...) compute in their float result dtype.
"""

from __future__ import annotations

import numpy as np

from lucid import _dtype
from lucid._dtype import result_type
from lucid.passes.lowering._core import (
    PV,
    Builder,
    LoweringUnsupported,
    numpy_dtype,
    rule,
    unsupported,
)

_NUMERIC_ONLY = {
    "add", "sub", "mul", "maximum", "minimum", "floor_divide", "remainder", "neg", "abs", "sign",
    "square", "relu",
}  # fmt: skip


def _compute(prim: str, *xs) -> _dtype.dtype:
    ct = result_type(*xs)
    # prim's arithmetic takes no bool: compute in int64, whose results cast back to bool exactly
    # as numpy's bool arithmetic (or for add/max, and for mul/min).
    if ct is _dtype.bool_ and prim in _NUMERIC_ONLY:
        return _dtype.int64
    return ct


def _binary(prim: str):
    def lower(b: Builder, a, c):
        return b.binary(prim, a, c, _compute(prim, a, c))

    return lower


for _name, _prim in (
    ("add", "add"), ("sub", "sub"), ("mul", "mul"), ("maximum", "maximum"),
    ("minimum", "minimum"), ("clamp_min", "maximum"), ("clamp_max", "minimum"),
    ("floor_divide", "floor_divide"), ("remainder", "remainder"),
    ("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"),
):  # fmt: skip
    rule(_name)(_binary(_prim))


@rule("div")
def _div(b: Builder, a, c):
    return b.binary("div", a, c, b.outs[0].dtype)


@rule("trunc_divide")
def _trunc_divide(b: Builder, a, c):
    ct = _compute("floor_divide", a, c)
    if ct.is_floating_point:
        return _trunc(b, b.binary("div", a, c, ct))
    q = b.op("floor_divide", b.op("abs", b.cast(a, ct)), b.op("abs", b.cast(c, ct)))
    signs_differ = b.op("ne", b.binary("lt", a, 0, ct), b.binary("lt", c, 0, ct))
    return b.op("select", signs_differ, b.op("neg", q), q)


@rule("pow")
def _pow(b: Builder, a, c):
    ct = result_type(a, c)
    if ct.is_floating_point:
        return b.binary("pow", a, c, ct)
    # Integer powers through float64 are exact while the result fits 2**53; round, then cast.
    return b.op("round", b.binary("pow", a, c, _dtype.float64))


def _float_unary(prim: str):
    def lower(b: Builder, v):
        return b.op(prim, b.cast(v, b.outs[0].dtype))

    return lower


for _name in (
    "exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "sigmoid", "erf", "reciprocal",
):  # fmt: skip
    rule(_name)(_float_unary(_name))


def _numeric_unary(prim: str):
    def lower(b: Builder, v):
        return b.op(prim, b.cast(v, _compute(prim, v)))

    return lower


for _name in ("neg", "abs", "sign"):
    rule(_name)(_numeric_unary(_name))


def _trunc(b: Builder, v: PV) -> PV:
    return b.op("select", b.binary("lt", v, 0, v.dtype), b.op("ceil", v), b.op("floor", v))


def _float_or_identity(prim: str):
    def lower(b: Builder, v):
        if not v.dtype.is_floating_point:
            return v  # floor/ceil/trunc of an integer is itself
        return _trunc(b, v) if prim == "trunc" else b.op(prim, v)

    return lower


for _name in ("floor", "ceil", "trunc"):
    rule(_name)(_float_or_identity(_name))


@rule("round")
def _round(b: Builder, v, decimals):
    if not v.dtype.is_floating_point:
        if decimals >= 0:
            return v
        raise LoweringUnsupported("round of an integer tensor to negative decimals")
    if decimals == 0:
        return b.op("round", v)
    # numpy's algorithm: scale, round half to even, unscale.
    scale = 10.0**decimals if decimals >= 0 else 10.0 ** (-decimals)
    if decimals >= 0:
        return b.binary("div", b.op("round", b.binary("mul", v, scale, v.dtype)), scale, v.dtype)
    return b.binary("mul", b.op("round", b.binary("div", v, scale, v.dtype)), scale, v.dtype)


def _classify(prim: str, int_answer: bool):
    def lower(b: Builder, v):
        if v.dtype.is_floating_point:
            return b.op(prim, v)
        return b.full(int_answer, v.shape, _dtype.bool_)

    return lower


rule("isnan")(_classify("isnan", False))
rule("isinf")(_classify("isinf", False))
rule("isfinite")(_classify("isfinite", True))


def _truth(b: Builder, v) -> PV:
    """numpy truthiness as a bool tensor."""
    if isinstance(v, PV) and v.dtype is not _dtype.bool_:
        return b.binary("ne", v, 0, v.dtype)
    return b.cast(v, _dtype.bool_)


for _name in ("logical_and", "logical_or", "logical_xor"):

    def _logical(b: Builder, a, c, _p=_name):
        return b.op(_p, _truth(b, a), _truth(b, c))

    rule(_name)(_logical)


@rule("logical_not")
def _logical_not(b: Builder, v):
    return b.op("logical_not", _truth(b, v))


def _bits(b: Builder, v: PV, nbits: int) -> list[PV]:
    """The two's-complement bits of an integer tensor, lowest first, as 0/1 of its dtype
    (floor division by 2 is an arithmetic shift; the remainder of -1 is 1)."""
    bits = []
    for _ in range(nbits):
        bits.append(b.binary("remainder", v, 2, v.dtype))
        v = b.binary("floor_divide", v, 2, v.dtype)
    return bits


def _from_bits(b: Builder, bits: list[PV], dt: _dtype.dtype) -> PV:
    n = len(bits)
    out = None
    for k, bit in enumerate(bits):
        weight = -(2 ** (n - 1)) if k == n - 1 else 2**k  # the top bit carries the sign
        term = b.binary("mul", bit, weight, dt)
        out = term if out is None else b.op("add", out, term)
    return out


_BIT_COMBINE = {
    "and": lambda b, x, y, dt: b.op("mul", x, y),
    "or": lambda b, x, y, dt: b.op("sub", b.op("add", x, y), b.op("mul", x, y)),
    "xor": lambda b, x, y, dt: b.binary("remainder", b.op("add", x, y), 2, dt),
}


def _bitwise(kind: str):
    def lower(b: Builder, x, y):
        dt = result_type(x, y)
        if dt is _dtype.bool_:
            return b.op(f"logical_{kind}", b.cast(x, dt), b.cast(y, dt))
        # Integers bit by bit: prim has no bitwise ops, but exact integer arithmetic.
        nbits = dt.itemsize * 8
        xs, ys = _bits(b, b.cast(x, dt), nbits), _bits(b, b.cast(y, dt), nbits)
        return _from_bits(
            b, [_BIT_COMBINE[kind](b, p, q, dt) for p, q in zip(xs, ys, strict=True)], dt
        )

    return lower


rule("bitwise_and")(_bitwise("and"))
rule("bitwise_or")(_bitwise("or"))
rule("bitwise_xor")(_bitwise("xor"))


@rule("bitwise_not")
def _bitwise_not(b: Builder, v):
    if v.dtype is _dtype.bool_:
        return b.op("logical_not", v)
    return b.binary("sub", b.op("neg", v), 1, v.dtype)  # two's complement: ~x == -x - 1


@rule("clamp")
def _clamp(b: Builder, v, lo, hi):
    ct = _compute("maximum", v, lo, hi)
    return b.op("minimum", b.op("maximum", b.cast(v, ct), b.cast(lo, ct)), b.cast(hi, ct))


@rule("where")
def _where(b: Builder, cond, a, c):
    out = b.outs[0].dtype
    return b.select(_truth(b, cond), a, c, out)


@rule("fill")
def _fill(b: Builder, v, value):
    return b.broadcast_to(b.cast(value, v.dtype), v.shape)


@rule("cast")
def _cast(b: Builder, v, dtype):
    return b.cast(v, _dtype.canonical(dtype))


@rule("detach")
def _detach(b: Builder, v):
    return v


@rule("nan_to_num")
def _nan_to_num(b: Builder, v, nan, posinf, neginf):
    if not v.dtype.is_floating_point:
        return v
    stored = numpy_dtype(b.stored_outs[0].dtype)  # float16's max, not float32's
    if stored.kind == "f":
        info = np.finfo(stored)
    else:  # bfloat16: numpy's finfo does not know it (ml_dtypes is slow to import: only here)
        import ml_dtypes

        info = ml_dtypes.finfo(stored)
    hi = float(info.max) if posinf is None else posinf
    lo = float(info.min) if neginf is None else neginf
    dt = v.dtype
    out = b.select(b.op("isnan", v), nan, v, dt)
    is_inf = b.op("isinf", v)
    pos = b.op("logical_and", is_inf, b.binary("gt", v, 0, dt))
    neg = b.op("logical_and", is_inf, b.binary("lt", v, 0, dt))
    return b.select(neg, lo, b.select(pos, hi, out, dt), dt)


def _like(value):
    def lower(b: Builder, v, dtype=None, **_attrs):
        out = b.outs[0]
        return b.full(value, out.shape, out.dtype)

    return lower


rule("zeros_like")(_like(0))
rule("ones_like")(_like(1))


@rule("full_like")
def _full_like(b: Builder, v, fill_value, dtype):
    out = b.outs[0]
    return b.full(fill_value, out.shape, out.dtype)


@rule("relu")
def _relu(b: Builder, v):
    return b.op("relu", b.cast(v, _compute("relu", v)))


__all__: list[str] = []
_ = unsupported  # every elementwise op has a rule
