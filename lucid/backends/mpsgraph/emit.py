"""The MPSGraph emitter: a legalized ``prim`` module -> builder calls, one per MPSGraph method.

Every prim op has one emission (``EMISSIONS`` in ``selectors.py`` lists the methods each may call;
a test holds the emitter to it). The emitter makes every decision: layouts and descriptor fields,
the reshape after a reduction (MPSGraph keeps reduced axes), index wrapping and range checks, the
composites for ops MPSGraph lacks, and ``-1`` for the dimensions that carry a symbolic batch
(``symbolic`` maps an SSA value to those dims; ``symbolic-safety`` computes it). Builders only
record or execute the calls (``program.RecordingBuilder``, ``reference.ReferenceBuilder``,
``native.NativeBuilder``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lucid.backends.mpsgraph import program as A
from lucid.backends.mpsgraph.selectors import HALF_DTYPES, MPS_DTYPES
from lucid.ir import prim as P
from lucid.ir import visits
from lucid.ir.prim._random import PHILOX_M, PHILOX_W

__all__ = ["HANDLED_OPS", "Builder", "EmitError", "Emitted", "Val", "emit_module", "emit_op"]


# The float types (prim's FLOAT, which names float64 too, and the half types), for the rules that
# depend on NaN.
_FLOATS = P.FLOAT | HALF_DTYPES


STAGE = "mpsgraph-emit"  # the visit counters' name for emitting and binding the program


class EmitError(ValueError):
    """The module cannot be emitted for MPSGraph (run mpsgraph-legalize first, or a bad op)."""


class Builder(Protocol):
    """What the emitter drives: placeholders and MPSGraph method calls by full selector."""

    def placeholder(self, dims: tuple[int, ...], prim_dtype: str, role: str) -> int: ...

    def call(self, selector: str, args: list[dict], n_results: int = 1) -> list[int]: ...


@dataclass(frozen=True)
class Val:
    """An emitted tensor: its id, its (trace-time) shape and dtype, and its symbolic dims."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    sym: frozenset[int] = frozenset()

    @property
    def rank(self) -> int:
        return len(self.shape)


_BIN = "WithPrimaryTensor:secondaryTensor:name:"


@dataclass
class _Ctx:
    b: Builder
    checks: list[int] = field(default_factory=list)
    # check tensor -> (the checked values' tensor, the user op's message with "{}" for the value)
    messages: dict[int, tuple[int, str]] = field(default_factory=dict)

    def call(self, selector: str, *args: dict) -> int:
        return self.b.call(selector, list(args))[0]

    def un(self, name: str, v: int) -> int:
        return self.call(f"{name}WithTensor:name:", A.tensor(v), A.NIL)

    def bin(self, name: str, a: int, b: int) -> int:
        return self.call(f"{name}{_BIN}", A.tensor(a), A.tensor(b), A.NIL)

    def const(self, value: float, dtype: str, rank: int = 0) -> int:
        """A scalar constant of shape (1,) * rank (broadcasts against any tensor of that rank;
        rank 0 is (1,), as every rank-0 value is)."""
        return self.call(
            "constantWithScalar:shape:dataType:",
            A.double(exact_scalar(value, dtype)),
            A.shape(mps_dims((1,) * rank)),
            A.dtype(dtype),
        )

    def select(self, cond: int, a: int, b: int) -> int:
        return self.call(
            "selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:",
            A.tensor(cond),
            A.tensor(a),
            A.tensor(b),
            A.NIL,
        )

    def cast(self, v: int, dtype: str) -> int:
        return self.call("castTensor:toType:name:", A.tensor(v), A.dtype(dtype), A.NIL)

    def reshape(self, v: int, dims: list[int] | tuple[int, ...]) -> int:
        return self.call(
            "reshapeTensor:withShape:name:", A.tensor(v), A.shape(mps_dims(dims)), A.NIL
        )

    def slice(self, v: int, starts: list[int], ends: list[int], strides: list[int]) -> int:
        return self.call(
            "sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
            A.tensor(v),
            A.ints(starts),
            A.ints(ends),
            A.ints(strides),
            A.integer(0),
            A.integer(0),
            A.integer(0),
            A.NIL,
        )


def exact_scalar(value: float, dtype: str) -> float:
    """``value`` rounded to the half type ``dtype`` (once, to nearest even, as prim's constants
    and eager's conversions), unchanged for other types. Whether MPSGraph turns a double scalar
    into a half by one rounding or through float (two) is undocumented; an exact one needs
    neither."""
    if dtype not in HALF_DTYPES:
        return value
    return float(P.to_half(np.asarray(value, np.float64), dtype).astype(np.float64))


def _widened(c: _Ctx, vals: list[Val], emit: Callable[[list[int]], int], out_dtype: str) -> int:
    """``emit`` on ``vals`` with half operands cast to Float32, its result cast back to
    ``out_dtype`` when that is a half type: for the calls that accumulate long sums, where Apple
    documents no accumulation type for half tensors (PyTorch's MPS backend widens Float16 to
    Float32 for its reductions: ReduceOps.mm, reduction_out_mps). Both casts are exact or one
    rounding; half operands of other calls stay half."""
    ids = [c.cast(v.id, "f32") if v.dtype in HALF_DTYPES else v.id for v in vals]
    out = emit(ids)
    return c.cast(out, out_dtype) if out_dtype in HALF_DTYPES else out


def mps_dims(dims: tuple[int, ...] | list[int]) -> list[int]:
    """A tensor shape as the program spells it: a rank-0 value is ``[1]``. Apple documents no
    empty ``MPSShape`` (only nil, unranked, and ``-1``), and PyTorch's MPS backend gives every 0-d
    tensor the shape ``@[@1]`` (``OperationUtils.mm``, ``getMPSShape``); the executable reshapes
    rank-0 feeds and results at the boundary."""
    return [int(d) for d in dims] or [1]


def dims_of(shape: tuple[int, ...], sym: frozenset[int]) -> list[int]:
    """The shape as MPSGraph sees it: ``-1`` for symbolic dims, ``[1]`` for rank 0."""
    return mps_dims([-1 if i in sym else d for i, d in enumerate(shape)])


# --- the op table ---------------------------------------------------------------------------------
# (context, operands, attributes, result avals, result symbolic dims) -> result tensor ids
_Handler = Callable[[_Ctx, list[Val], dict[str, Any], list[P.Aval], list[frozenset[int]]], list]
_HANDLERS: dict[str, _Handler] = {}


def _handles(*names: str) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        for n in names:
            _HANDLERS[n] = fn
        return fn

    return register


_UNARY = {
    "neg": "negative", "abs": "absolute", "square": "square",
    "exp": "exponent", "log": "logarithm", "sqrt": "squareRoot", "rsqrt": "reverseSquareRoot",
    "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
    "sigmoid": "sigmoid", "erf": "erf", "floor": "floor", "ceil": "ceil", "round": "rint",
    "logical_not": "not", "isnan": "isNaN", "isinf": "isInfinite", "isfinite": "isFinite",
}  # fmt: skip
_BINARY = {
    "add": "addition", "sub": "subtraction", "mul": "multiplication", "div": "division",
    "pow": "power", "atan2": "atan2", "eq": "equal", "ne": "notEqual", "lt": "lessThan",
    "le": "lessThanOrEqualTo", "gt": "greaterThan", "ge": "greaterThanOrEqualTo",
    "logical_and": "logicalAND", "logical_or": "logicalOR", "logical_xor": "logicalXOR",
}  # fmt: skip


def _make_unary(name: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        return [c.un(name, ins[0].id)]

    return emit


for _op, _name in _UNARY.items():
    _HANDLERS[_op] = _make_unary(_name)


def _make_binary(name: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        return [c.bin(name, ins[0].id, ins[1].id)]

    return emit


for _op, _name in _BINARY.items():
    _HANDLERS[_op] = _make_binary(_name)


@_handles("relu")
def _relu(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x = ins[0]
    zero = c.const(0.0, x.dtype, x.rank)
    if x.dtype in _FLOATS:  # Apple does not say what reLU does with NaN; prim keeps NaN
        return [c.bin("maximumWithNaNPropagation", x.id, zero)]
    # Integers: the plain maximum, not reLU, whose family has aborted with "kernel not found" on
    # integer types (PyTorch #84995; UnaryOps.mm).
    return [c.bin("maximum", x.id, zero)]


@_handles("sign")
def _sign(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x = ins[0]
    if x.dtype in _FLOATS:
        return [c.un("sign", x.id)]
    # PyTorch (UnaryOps.mm, sign_out_mps): "Sign op is not implemented in MPS as of MacOS13.0
    # beta, so simulate it using clamp"; for integers sign is exactly the clamp to [-1, 1].
    return [
        c.call(
            "clampWithTensor:minValueTensor:maxValueTensor:name:", A.tensor(x.id),
            A.tensor(c.const(-1, x.dtype, x.rank)), A.tensor(c.const(1, x.dtype, x.rank)), A.NIL,
        )
    ]  # fmt: skip


@_handles("expm1")
def _expm1(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x, dt, r = ins[0].id, ins[0].dtype, ins[0].rank
    t = c.un("tanh", c.bin("multiplication", x, c.const(0.5, dt, r)))
    small = c.bin(
        "division", c.bin("multiplication", t, c.const(2.0, dt, r)),
        c.bin("subtraction", c.const(1.0, dt, r), t),
    )  # fmt: skip
    big = c.bin("subtraction", c.un("exponent", x), c.const(1.0, dt, r))
    near_zero = c.bin("lessThan", c.un("absolute", x), c.const(0.5, dt, r))
    return [c.select(near_zero, small, big)]


@_handles("log1p")
def _log1p(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x, dt, r = ins[0].id, ins[0].dtype, ins[0].rank
    u = c.bin("addition", x, c.const(1.0, dt, r))
    ratio = c.bin(
        "division", c.bin("multiplication", c.un("logarithm", u), x),
        c.bin("subtraction", u, c.const(1.0, dt, r)),
    )  # fmt: skip
    at_inf = c.select(c.bin("equal", u, c.const(math.inf, dt, r)), u, ratio)
    return [c.select(c.bin("equal", u, c.const(1.0, dt, r)), x, at_inf)]


def _make_extremum(word: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        nan = "WithNaNPropagation" if ins[0].dtype in _FLOATS else ""
        return [c.bin(f"{word}{nan}", ins[0].id, ins[1].id)]

    return emit


_HANDLERS["maximum"] = _make_extremum("maximum")
_HANDLERS["minimum"] = _make_extremum("minimum")


# Float32 estimates of a quotient are scaled by this factor so that they never exceed it (see
# _int_floor_division), and the rounds that bring every int32 and int64 quotient down to one unit.
_ESTIMATE_SCALE = 1.0 - 2.0**-19
_ESTIMATE_ROUNDS = {"i32": 2, "i64": 4}
_INT_MIN = {"i32": -(2**31), "i64": -(2**63)}


def _int_floor_division(c: _Ctx, ins: list[Val], out_rank: int) -> tuple[int, int, int, int]:
    """(floor quotient, floor remainder, zero-divisor mask, zero) of integer a / b, exact over
    the whole int32 and int64 ranges, in the operands' own type, with no operation that wraps.

    Apple documents nothing about integer ``division``, and PyTorch divides integers through
    Float32 (BinaryOps.mm, div_mode_template), inexact above 2**24, so it is not used. The
    magnitudes are worked on as non-positive numbers, A = -|a| and B = -|b|, which cover
    -2**63 (resp. -2**31) where |a| would not fit. Each round takes an estimate
    e = floor(f32(R) / f32(B) * s) of the quotient t = R / B >= 0 of the remainder R (A at
    first) and moves e·B out of R, and -e into the non-positive quotient Q.

    Error bound: the two casts and the product by s are faithful (relative error below
    2**-23), the division is within 2.5 ulp (Metal's fast-math bound), so the Float32 value is
    t·(1 + d)·s with |d| < 5.6·2**-23. With s = 1 - 2**-19 = 1 - 16·2**-23 the value is below t,
    so 0 <= e <= floor(t): e·B and the next R = R - e·B lie in [R, 0] and Q stays in
    [-2**63, 0] (resp. [-2**31, 0]), so nothing overflows. It is also above t·(1 - 2**-18), so the
    next round's quotient t - e is below t·2**-18 + 1: from t <= 2**63, four rounds leave
    t < 2**45 + 1, 2**27 + 2, 2**9 + 2, then below 1.002 (int32: 2**13 + 1, then 1.04), and
    one exact step (R <= B: one more B out) ends with R in (B, 0].

    The signs then give floor semantics: with a and b of one sign the quotient is -Q, and
    INT_MIN // -1 (the only Q = INT_MIN of that kind) wraps to INT_MIN as numpy and eager
    Lucid do, by an explicit select; with opposite signs it is Q, one lower when R != 0. The
    remainder takes b's sign: R, or B - R with opposite signs and R != 0. A zero divisor
    divides by 1 (the caller masks the result)."""
    a, b, dt, r_ = ins[0].id, ins[1].id, ins[0].dtype, out_rank
    zero = c.const(0, dt, r_)
    one = c.const(1, dt, r_)
    is_zero = c.bin("equal", b, zero)
    b = c.select(is_zero, one, b)

    def non_positive_magnitude(v: int) -> int:  # min(v, 0) - max(v, 0) = -|v|, never wraps
        return c.bin("subtraction", c.bin("minimum", v, zero), c.bin("maximum", v, zero))

    rem, neg_b = non_positive_magnitude(a), non_positive_magnitude(b)
    neg_b_f32 = c.cast(neg_b, "f32")
    scale = c.const(_ESTIMATE_SCALE, "f32", r_)
    quo = zero
    for _ in range(_ESTIMATE_ROUNDS[dt]):
        ratio = c.bin("division", c.cast(rem, "f32"), neg_b_f32)
        est = c.cast(c.un("floor", c.bin("multiplication", ratio, scale)), dt)
        rem = c.bin("subtraction", rem, c.bin("multiplication", est, neg_b))
        quo = c.bin("subtraction", quo, est)
    # MPSGraph computes both sides of a select: a step is masked before it is taken, never
    # taken everywhere and selected after (rem - B and quo - 1 could wrap where unused).
    over = c.bin("lessThanOrEqualTo", rem, neg_b)
    rem = c.bin("subtraction", rem, c.select(over, neg_b, zero))
    quo = c.bin("subtraction", quo, c.select(over, one, zero))

    a_negative, b_negative = c.bin("lessThan", a, zero), c.bin("lessThan", b, zero)
    opposite = c.bin("logicalXOR", a_negative, b_negative)
    inexact = c.bin("notEqual", rem, zero)
    moved = c.bin("logicalAND", opposite, inexact)
    # -Q for one sign; Q = INT_MIN (INT_MIN // -1) is selected away before the negation.
    int_min = c.const(_INT_MIN[dt], dt, r_)  # a power of two: exact as the double
    wraps = c.bin("equal", quo, int_min)
    same_sign_q = c.select(wraps, int_min, c.bin("subtraction", zero, c.select(wraps, zero, quo)))
    opposite_q = c.bin("subtraction", quo, c.select(inexact, one, zero))
    q = c.select(opposite, opposite_q, same_sign_q)
    # The remainder's magnitude as a non-positive number (B - R lies in (B, 0) when R != 0),
    # then b's sign: R > B >= INT_MIN here, so its negation never wraps.
    neg_mod = c.select(moved, c.bin("subtraction", neg_b, rem), rem)
    r = c.select(b_negative, neg_mod, c.bin("subtraction", zero, neg_mod))
    return q, r, is_zero, zero


# Float32 fmod works in rounds that each take at most 2**24 multiples of y * 2**(23 j) out of the
# remainder: 12 rounds (j = 11 .. 0) cover every ratio of Float32 magnitudes (below 2**277: the
# first round's ratio is below 2**128 / 2**(253 - 149) = 2**24).
_FMOD_ROUND_BITS = 23
_FMOD_ROUNDS = 12
# Veltkamp's constant 2**12 + 1 splits a Float32 into two halves of at most 12 bits.
_VELTKAMP = 4097.0
# Divisors above this are scaled down by it inside a round, so no split or product overflows.
_FMOD_BIG = 2.0**64


def _two_product(c: _Ctx, q: int, y: int, veltkamp: int) -> tuple[int, int]:
    """(p, e) with p = fl(q * y) and p + e = q * y exactly (Dekker's product on Veltkamp splits:
    12-bit halves multiply exactly; every term is a multiple of the smallest subnormal, so
    gradual underflow loses nothing)."""

    def split(v: int) -> tuple[int, int]:
        t = c.bin("multiplication", v, veltkamp)
        hi = c.bin("subtraction", t, c.bin("subtraction", t, v))
        return hi, c.bin("subtraction", v, hi)

    (qh, ql), (yh, yl) = split(q), split(y)
    p = c.bin("multiplication", q, y)
    e = c.bin("subtraction", c.bin("multiplication", qh, yh), p)
    for u, v in ((qh, yl), (ql, yh), (ql, yl)):
        e = c.bin("addition", e, c.bin("multiplication", u, v))
    return p, e


def _fmod_round(c: _Ctx, rem: int, y: int, k: Mapping[float, int]) -> int:
    """fmod(rem, y) for 0 <= rem < y * 2**24 (y > 0, possibly +inf), exact.

    With q = floor(rem / y) from a faithful division, q is t = floor(rem / y) or t + 1 (rem / y
    >= t is not rounded below the representable t, nor above t + 1 <= 2**24; q has at most 24
    bits, so Veltkamp splits it into two 12-bit halves), so the
    true rem - q·y lies in [-y, y): a multiple of the operands' common grid no wider than y,
    hence representable. rem - p is exact by Sterbenz's lemma (p/2 <= rem <= 2p when q >= 1),
    so (rem - p) - e rounds the representable rem - q·y to itself, and adding y back once when
    it is negative is exact for the same reason. q = 0 keeps rem unchanged (also y = +inf).
    ``k`` maps each constant the round uses to its tensor."""
    zero = k[0.0]
    big = c.bin("greaterThan", y, k[_FMOD_BIG])
    down = c.select(big, k[1.0 / _FMOD_BIG], k[1.0])
    up = c.select(big, k[_FMOD_BIG], k[1.0])
    # Power-of-two scaling is exact here: a scaled y stays above 1, and a rem that q >= 1
    # uses is at least about y.
    rem_s, y_s = c.bin("multiplication", rem, down), c.bin("multiplication", y, down)
    q = c.un("floor", c.bin("division", rem_s, y_s))
    p, e = _two_product(c, q, y_s, k[_VELTKAMP])
    r = c.bin("subtraction", c.bin("subtraction", rem_s, p), e)
    r = c.select(c.bin("lessThan", r, zero), c.bin("addition", r, y_s), r)
    return c.select(c.bin("equal", q, zero), rem, c.bin("multiplication", r, up))


def _float_floor_division(c: _Ctx, ins: list[Val]) -> tuple[int, int]:
    """(floor quotient, floor remainder) of Float32 a / b, equal to eager Lucid's (numpy's
    npy_divmod): mod = fmod(a, b) exactly; div = (a - mod) / b, one lower (and mod + b) when mod
    is non-zero with a sign unlike b's; the quotient floor(div), rounded up when div exceeds it
    by more than 1/2; a zero mod takes b's sign, a zero div the sign of a / b; a zero divisor
    gives a / b and NaN. floor(a / b) alone is not that: 1.0 // 0.1 is 9 (fmod is 0.0999...).

    fmod of the magnitudes is reduced modulo y·2**(23 j) for j = 11 .. 0 (a multiple of y, so
    the final remainder is fmod(|a|, |b|)), each round exact (``_fmod_round``). Exactness rests
    on correctly rounded addition, subtraction and multiplication, a faithful division and
    gradual underflow, as the reference models them; Apple documents no accuracy for these."""
    a, b = ins[0].id, ins[1].id
    k = {
        v: c.const(v, "f32")
        for v in (0.0, 1.0, 0.5, _VELTKAMP, _FMOD_BIG, 1.0 / _FMOD_BIG, 2.0**_FMOD_ROUND_BITS)
    }
    zero = k[0.0]
    x, y = c.un("absolute", a), c.un("absolute", b)
    # y * 2**(23 j) for j = 0 .. 11, exact or +inf (an infinite one leaves its round a no-op;
    # the first finite one is above 2**105, so |a| / it stays below 2**23).
    scaled = [y]
    for _ in range(_FMOD_ROUNDS - 1):
        scaled.append(c.bin("multiplication", scaled[-1], k[2.0**_FMOD_ROUND_BITS]))
    mag = x
    for y_j in reversed(scaled):
        mag = _fmod_round(c, mag, y_j, k)
    fmod = c.select(c.bin("lessThan", a, zero), c.un("negative", mag), mag)
    b_is_zero = c.bin("equal", b, zero)
    defined = c.bin("logicalAND", c.un("isFinite", a), c.un("not", c.un("isNaN", b)))
    fmod = c.select(
        c.bin("logicalAND", defined, c.un("not", b_is_zero)), fmod, c.const(math.nan, "f32")
    )

    quotient = c.bin("division", a, b)
    div = c.bin("division", c.bin("subtraction", a, fmod), b)
    b_negative = c.bin("lessThan", b, zero)
    moved = c.bin(
        "logicalAND",
        c.bin("notEqual", fmod, zero),
        c.bin("logicalXOR", b_negative, c.bin("lessThan", fmod, zero)),
    )
    mod = c.select(moved, c.bin("addition", fmod, b), fmod)
    div = c.select(moved, c.bin("subtraction", div, k[1.0]), div)
    signed_zero = c.select(b_negative, c.const(-0.0, "f32"), zero)
    mod = c.select(c.bin("equal", mod, zero), signed_zero, mod)
    floor = c.un("floor", div)
    up = c.bin("greaterThan", c.bin("subtraction", div, floor), k[0.5])
    floor = c.select(up, c.bin("addition", floor, k[1.0]), floor)
    # A zero div is finite a over larger b: 0 * (a / b) is the zero with the quotient's sign.
    zero_div = c.bin("multiplication", zero, quotient)
    floor = c.select(c.bin("equal", div, zero), zero_div, floor)
    return c.select(b_is_zero, quotient, floor), mod


def _half_floor_division(c: _Ctx, ins: list[Val], part: int) -> int:
    """Part ``part`` (0: quotient, 1: remainder) of the exact Float32 divmod of half operands,
    rounded once to their type: eager's numpy and ml_dtypes compute half floor_divide and
    remainder in float and round the result, so this equals them bit for bit."""
    wide = [Val(c.cast(v.id, "f32"), v.shape, "f32") for v in ins]
    return c.cast(_float_floor_division(c, wide)[part], ins[0].dtype)


@_handles("floor_divide")
def _floor_divide(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    if ins[0].dtype in HALF_DTYPES:
        return [_half_floor_division(c, ins, 0)]
    if ins[0].dtype in _FLOATS:
        return [_float_floor_division(c, ins)[0]]
    q, _, is_zero, zero = _int_floor_division(c, ins, len(outs[0].shape))
    return [c.select(is_zero, zero, q)]


@_handles("remainder")
def _remainder(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    if ins[0].dtype in HALF_DTYPES:
        return [_half_floor_division(c, ins, 1)]
    if ins[0].dtype in _FLOATS:
        return [_float_floor_division(c, ins)[1]]
    _, r, is_zero, zero = _int_floor_division(c, ins, len(outs[0].shape))
    return [c.select(is_zero, zero, r)]


@_handles("select")
def _select(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [c.select(ins[0].id, ins[1].id, ins[2].id)]


# Largest float32 values below 2**31 and 2**63: the clamp bounds of a float -> int cast.
_INT_RANGE = {"i32": (-(2.0**31), 2147483520.0), "i64": (-(2.0**63), 9223371487098961920.0)}


@_handles("cast")
def _cast(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x, src, dst, r = ins[0].id, ins[0].dtype, attrs["dtype"], ins[0].rank
    if dst == "bool" and src != "bool":
        return [c.bin("notEqual", x, c.const(0, src, r))]
    if src in HALF_DTYPES and dst in P.INT:
        # The clamp bounds below are Float32 values (2**31 overflows Float16); a half value is
        # exact in Float32.
        return _cast(c, [Val(c.cast(x, "f32"), ins[0].shape, "f32")], attrs, outs, syms)
    if src in _FLOATS and dst in P.INT:
        lo, hi = _INT_RANGE[dst]
        t = c.call(
            "clampWithTensor:minValueTensor:maxValueTensor:name:",
            A.tensor(c.un("truncate", x)),
            A.tensor(c.const(lo, src, r)),
            A.tensor(c.const(hi, src, r)),
            A.NIL,
        )
        x = c.select(c.un("isNaN", x), c.const(0, src, r), t)
        # The clamp's upper bound is the largest float below 2**(bits-1); at or above that power
        # the result saturates to the integer maximum (written exactly, as data).
        info = np.iinfo(P.NUMPY_DTYPES[dst])
        ones = mps_dims((1,) * r)
        top = c.call(
            "constantWithData:shape:dataType:",
            A.constant(np.full(ones, info.max, P.NUMPY_DTYPES[dst]), dst),
            A.shape(ones),
            A.dtype(dst),
        )
        above = c.bin("greaterThanOrEqualTo", ins[0].id, c.const(float(info.max) + 1.0, src, r))
        return [c.select(above, top, c.cast(x, dst))]
    return [c.cast(x, dst)]


@_handles("normalize")
def _normalize(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    # Half operands are normalized in Float32: the epsilon is a float (below Float16's normal
    # range for the usual 1e-5), and norms are among the ops kept in float32 under mixed
    # precision (PyTorch's autocast float32 list).
    def emit(ids: list[int]) -> int:
        return c.call(
            "normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
            *(A.tensor(i) for i in ids),
            A.double(attrs["epsilon"]),
            A.NIL,
        )

    return [_widened(c, ins, emit, outs[0].dtype)]


def _matmul_core(c: _Ctx, ins: list[Val], attrs: dict[str, Any]) -> int:
    a, b = ins[0], ins[1]
    ids = []
    for v, flag in ((a, attrs["transpose_a"]), (b, attrs["transpose_b"])):
        vid = v.id
        if flag:
            vid = c.call(
                "transposeTensor:dimension:withDimension:name:",
                A.tensor(vid),
                A.integer(v.rank - 2),
                A.integer(v.rank - 1),
                A.NIL,
            )
        ids.append(vid)
    return c.call(
        "matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:",
        A.tensor(ids[0]),
        A.tensor(ids[1]),
        A.NIL,
    )


@_handles("matmul")
def _matmul(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [_matmul_core(c, ins, attrs)]


@_handles("matmul_accumulate")
def _matmul_accumulate(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    product = c.bin("multiplication", _matmul_core(c, ins, attrs), ins[3].id)
    return [c.bin("addition", ins[2].id, product)]


_REDUCTIONS = {
    "reduce_sum": "reductionSumWithTensor:axes:name:",
    "reduce_mean": "meanOfTensor:axes:name:",
    "reduce_prod": "reductionProductWithTensor:axes:name:",
    "variance": "varianceOfTensor:axes:name:",
    "reduce_max": "reductionMaximumWithTensor:axes:name:",
    "reduce_min": "reductionMinimumWithTensor:axes:name:",
}


def _finish_keepdims(c: _Ctx, v: int, keepdims: bool, out: P.Aval, sym: frozenset[int]) -> int:
    """MPSGraph keeps every reduced axis with size 1; drop them when the op does not."""
    return v if keepdims else c.reshape(v, dims_of(out.shape, sym))


def _make_reduction(op: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        x = ins[0]
        axes = P.normalize_axes(op, attrs["axes"], x.rank)
        if not axes:
            # Reducing over no axis is the identity; a variance over no axis is (x - x)**2.
            if op == "variance":
                return [c.bin("subtraction", x.id, x.id)]
            return [c.un("identity", x.id)]
        selector = _REDUCTIONS[op]
        if op in ("reduce_max", "reduce_min"):  # exact in any type: half stays half
            if x.dtype in _FLOATS:
                selector = selector.replace("imumWith", "imumPropagateNaNWith")
            r = c.call(selector, A.tensor(x.id), A.ints(sorted(axes)), A.NIL)
        else:  # sums, means, variances and products of halves accumulate in Float32
            r = _widened(
                c, [x], lambda ids: c.call(selector, A.tensor(ids[0]), A.ints(sorted(axes)), A.NIL),
                outs[0].dtype,
            )  # fmt: skip
        return [_finish_keepdims(c, r, attrs["keepdims"], outs[0], syms[0])]

    return emit


for _op in _REDUCTIONS:
    _HANDLERS[_op] = _make_reduction(_op)


def _first_true_along(c: _Ctx, mask: int, axis: int, rank: int) -> tuple[int, int]:
    """(whether any, the index of the first) true element of a Bool ``mask`` along ``axis``, as
    Bool and Int32 tensors keeping the axis: the count of leading false elements, which needs
    no tie rule from MPSGraph."""
    flags = c.cast(mask, "i32")
    axes = A.ints([axis])
    seen = c.call("cumulativeSumWithTensor:axis:exclusive:reverse:name:", A.tensor(flags),
                  A.integer(axis), A.boolean(False), A.boolean(False), A.NIL)  # fmt: skip
    leading = c.cast(c.bin("equal", seen, c.const(0, "i32", max(rank, 1))), "i32")
    first = c.call("reductionSumWithTensor:axes:name:", A.tensor(leading), axes, A.NIL)
    most = c.call("reductionMaximumWithTensor:axes:name:", A.tensor(flags), axes, A.NIL)
    return c.bin("greaterThan", most, c.const(0, "i32", max(rank, 1))), first


def _make_arg_reduction(word: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        x = ins[0]
        axis = P.normalize_axis("argmax", attrs["axis"], x.rank)
        r = c.call(f"reductionArg{word}WithTensor:axis:name:", A.tensor(x.id), A.integer(axis),
                   A.NIL)  # fmt: skip
        if x.dtype in _FLOATS:
            # MPSGraph's arg reductions skip NaN (PyTorch #130295: argmax of a row with a
            # NaN gives the largest finite value's index); prim says the first NaN wins.
            has_nan, first_nan = _first_true_along(c, c.un("isNaN", x.id), axis, x.rank)
            r = c.select(has_nan, first_nan, r)
        r = c.cast(r, outs[0].dtype)  # MPSGraph returns Int32 indices
        return [_finish_keepdims(c, r, attrs["keepdims"], outs[0], syms[0])]

    return emit


_HANDLERS["argmax"] = _make_arg_reduction("Maximum")
_HANDLERS["argmin"] = _make_arg_reduction("Minimum")


# The longest row argsort emits: its keys rank * n + position must fit Int32 (rank <= n).
ARGSORT_MAX_ROW = 46339


def _dense_rank(c: _Ctx, key: int, x: Val, axis: int) -> int:
    """Int32 ranks of ``key`` (Int32 or Float32, no NaN) along ``axis``: equal keys get equal
    ranks, ordered as the keys, 0 for the smallest. Needs only that argSort orders the keys (not
    how it orders ties): the runs of the sorted keys are numbered and scattered back."""
    n, r = x.shape[axis], x.rank
    zeros = c.call("constantWithScalar:shape:dataType:", A.double(0), A.shape(list(x.shape)),
                   A.dtype("i32"))  # fmt: skip
    if n == 1:
        return zeros
    order = c.call("argSortWithTensor:axis:descending:name:", A.tensor(key), A.integer(axis),
                   A.boolean(False), A.NIL)  # fmt: skip
    ordered = c.call("gatherAlongAxis:withUpdatesTensor:indicesTensor:name:", A.integer(axis),
                     A.tensor(key), A.tensor(order), A.NIL)  # fmt: skip
    # A run starts where a sorted key differs from the one before it; number the runs.
    ends, starts = list(x.shape), [0] * r
    ends[axis] = n - 1
    prev = c.slice(ordered, starts, ends, [1] * r)
    starts[axis], ends[axis] = 1, n
    new_run = c.cast(c.bin("notEqual", c.slice(ordered, starts, ends, [1] * r), prev), "i32")
    first = list(x.shape)
    first[axis] = 1
    zero = c.call("constantWithScalar:shape:dataType:", A.double(0), A.shape(first),
                  A.dtype("i32"))  # fmt: skip
    steps = c.call("concatTensors:dimension:name:", A.tensors([zero, new_run]), A.integer(axis),
                   A.NIL)  # fmt: skip
    run = c.call("cumulativeSumWithTensor:axis:exclusive:reverse:name:", A.tensor(steps),
                 A.integer(axis), A.boolean(False), A.boolean(False), A.NIL)  # fmt: skip
    return c.call(
        "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
        A.integer(axis), A.tensor(zeros), A.tensor(run), A.tensor(order),
        A.enum("MPSGraphScatterModeAdd"), A.NIL,
    )  # fmt: skip


def _int64_halves(c: _Ctx, x: int, rank: int) -> tuple[int, int]:
    """The high and low 32 bits of Int64 ``x`` as Int32 keys ordered as ``x`` is: the high half
    signed, the low half unsigned moved down by 2**31 (exact Int64 arithmetic, whichever shift
    MPSGraph's right shift is: the halves are masked first)."""
    mask = c.const(0xFFFFFFFF, "i64", rank)
    high = c.bin("bitwiseAND", c.bin("bitwiseRightShift", x, c.const(32, "i64", rank)), mask)
    negative = c.bin("greaterThanOrEqualTo", high, c.const(2**31, "i64", rank))
    high = c.select(negative, c.bin("subtraction", high, c.const(2**32, "i64", rank)), high)
    low = c.bin("subtraction", c.bin("bitwiseAND", x, mask), c.const(2**31, "i64", rank))
    return c.cast(high, "i32"), c.cast(low, "i32")


@_handles("argsort")
def _argsort(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    # argSortWithTensor is documented for Int32, Float16 and Float32 only (PyTorch's castToIHFTypes,
    # radar 104398441), returns zeros past 256 Int64 elements since macOS 15.4 (PyTorch issue
    # 155560), and documents neither stability nor where NaN goes. So only Int32 and Float32 keys
    # without NaN are sorted, and only through ranks: each key becomes rank * n + position, unique,
    # so the last argSort has no ties to order; NaN ranks above everything (prim: NaN largest).
    x = ins[0]
    if not x.rank:
        return [c.const(0, "i64")]
    axis = P.normalize_axis("argsort", attrs["axis"], x.rank)
    n, r = x.shape[axis], x.rank
    if x.sym:
        raise EmitError("prim.argsort under a symbolic batch; compile per shape")
    if n > ARGSORT_MAX_ROW:
        raise EmitError(
            f"prim.argsort of rows of {n} elements: the exact MPSGraph emission ranks keys as "
            f"Int32 and takes rows of at most {ARGSORT_MAX_ROW}"
        )
    if x.dtype == "i64":
        high, low = _int64_halves(c, x.id, r)
        pair = c.bin(
            "addition",
            c.bin("multiplication", _dense_rank(c, high, x, axis), c.const(n, "i32", r)),
            _dense_rank(c, low, x, axis),
        )
        rank = _dense_rank(c, pair, x, axis)
    elif x.dtype in _FLOATS:
        # Half keys are ranked as Float32 (exact): argSort documents Float16 but not BFloat16.
        xf = Val(c.cast(x.id, "f32"), x.shape, "f32") if x.dtype in HALF_DTYPES else x
        nan = c.un("isNaN", xf.id)
        finite = c.select(nan, c.const(math.inf, xf.dtype, r), xf.id)
        rank = c.select(nan, c.const(n, "i32", r), _dense_rank(c, finite, xf, axis))
    else:
        rank = _dense_rank(c, c.cast(x.id, "i32") if x.dtype == "bool" else x.id, x, axis)
    if attrs["descending"]:  # larger first; ties still in position order
        rank = c.bin("subtraction", c.const(n, "i32", r), rank)
    position = c.call("coordinateAlongAxis:withShape:name:", A.integer(axis),
                      A.shape(list(x.shape)), A.NIL)  # fmt: skip
    key = c.bin("addition", c.bin("multiplication", rank, c.const(n, "i32", r)), position)
    order = c.call("argSortWithTensor:axis:descending:name:", A.tensor(key), A.integer(axis),
                   A.boolean(False), A.NIL)  # fmt: skip
    return [c.cast(order, outs[0].dtype)]  # MPSGraph returns Int32 indices


@_handles("softmax")
def _softmax(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    axis = P.normalize_axis("softmax", attrs["axis"], ins[0].rank)

    def emit(ids: list[int]) -> int:
        return c.call("softMaxWithTensor:axis:name:", A.tensor(ids[0]), A.integer(axis), A.NIL)

    return [_widened(c, ins, emit, outs[0].dtype)]


@_handles("log_softmax")
def _log_softmax(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x = ins[0]
    axes = A.ints([P.normalize_axis("log_softmax", attrs["axis"], x.rank)])

    def emit(ids: list[int]) -> int:
        m = c.call("reductionMaximumWithTensor:axes:name:", A.tensor(ids[0]), axes, A.NIL)
        shifted = c.bin("subtraction", ids[0], m)
        total = c.call(
            "reductionSumWithTensor:axes:name:", A.tensor(c.un("exponent", shifted)), axes, A.NIL
        )
        return c.bin("subtraction", shifted, c.un("logarithm", total))

    return [_widened(c, ins, emit, outs[0].dtype)]


@_handles("cumsum")
def _cumsum(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    axis = P.normalize_axis("cumsum", attrs["axis"], ins[0].rank)

    def emit(ids: list[int]) -> int:
        return c.call(
            "cumulativeSumWithTensor:axis:exclusive:reverse:name:",
            A.tensor(ids[0]),
            A.integer(axis),
            A.boolean(attrs["exclusive"]),
            A.boolean(attrs["reverse"]),
            A.NIL,
        )

    return [_widened(c, ins, emit, outs[0].dtype)]


@_handles("reshape")
def _reshape(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [c.reshape(ins[0].id, dims_of(outs[0].shape, syms[0]))]


@_handles("transpose")
def _transpose(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    if not ins[0].rank:
        return [c.un("identity", ins[0].id)]
    perm = [p % ins[0].rank for p in attrs["perm"]]
    return [c.call("transposeTensor:permutation:name:", A.tensor(ins[0].id), A.ints(perm), A.NIL)]


@_handles("broadcast_to")
def _broadcast_to(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    dims = dims_of(outs[0].shape, syms[0])
    return [c.call("broadcastTensor:toShape:name:", A.tensor(ins[0].id), A.shape(dims), A.NIL)]


@_handles("slice")
def _slice(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x = ins[0]
    full = 0  # axes sliced whole: start/end masks, so a symbolic axis needs no bound
    for i, (s, e, st, d) in enumerate(
        zip(attrs["starts"], attrs["ends"], attrs["strides"], x.shape, strict=True)
    ):
        if s == 0 and e == d and st == 1:
            full |= 1 << i
        elif i in x.sym:
            raise EmitError(f"prim.slice cuts the symbolic axis {i}; compile per shape")
    return [
        c.call(
            "sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:",
            A.tensor(x.id),
            A.ints(attrs["starts"]),
            A.ints(attrs["ends"]),
            A.ints(attrs["strides"]),
            A.integer(full),
            A.integer(full),
            A.integer(0),
            A.NIL,
        )
    ]


@_handles("concat")
def _concat(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    axis = P.normalize_axis("concat", attrs["axis"], ins[0].rank)
    return [
        c.call(
            "concatTensors:dimension:name:", A.tensors([v.id for v in ins]), A.integer(axis),
            A.NIL,
        )
    ]  # fmt: skip


@_handles("pad")
def _pad(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    if not ins[0].rank:
        return [c.un("identity", ins[0].id)]
    return [
        c.call(
            "padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:",
            A.tensor(ins[0].id),
            A.enum("MPSGraphPaddingModeConstant"),
            A.shape(attrs["low"]),
            A.shape(attrs["high"]),
            A.double(exact_scalar(attrs["value"], ins[0].dtype)),
            A.NIL,
        )
    ]


def _checked_indices(c: _Ctx, idx: Val, bound: int) -> int:
    """Indices wrapped into [0, bound) and cast to Int32 (what MPSGraph's gathers take), with a
    check target that is true iff every index was in [-bound, bound)."""
    r = idx.rank
    lo = c.bin("greaterThanOrEqualTo", idx.id, c.const(-bound, idx.dtype, r))
    hi = c.bin("lessThan", idx.id, c.const(bound, idx.dtype, r))
    ok = c.bin("logicalAND", lo, hi)
    if r:
        ok = c.call("reductionAndWithTensor:axes:name:", A.tensor(ok), A.ints(range(r)), A.NIL)
    c.checks.append(ok)
    negative = c.bin("lessThan", idx.id, c.const(0, idx.dtype, r))
    wrapped = c.select(negative, c.bin("addition", idx.id, c.const(bound, idx.dtype, r)), idx.id)
    return c.cast(wrapped, "i32") if idx.dtype != "i32" else wrapped


@_handles("gather")
def _gather(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x, idx = ins
    axis = P.normalize_axis("gather", attrs["axis"], x.rank)
    i32 = _checked_indices(c, idx, x.shape[axis])
    out = c.call(
        "gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:",
        A.tensor(x.id), A.tensor(i32), A.integer(axis), A.integer(0), A.NIL,
    )  # fmt: skip
    # A rank-0 index is (1,) here, which leaves its axis in the result: drop it.
    return [c.reshape(out, dims_of(outs[0].shape, syms[0])) if not idx.rank else out]


@_handles("gather_along_axis")
def _gather_along_axis(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    x, idx = ins
    axis = P.normalize_axis("gather_along_axis", attrs["axis"], x.rank)
    i32 = _checked_indices(c, idx, x.shape[axis])
    return [
        c.call(
            "gatherAlongAxis:withUpdatesTensor:indicesTensor:name:",
            A.integer(axis), A.tensor(x.id), A.tensor(i32), A.NIL,
        )
    ]  # fmt: skip


@_handles("scatter_add")
def _scatter_add(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    data, idx, upd = ins
    axis = P.normalize_axis("scatter_add", attrs["axis"], data.rank)
    n = math.prod(idx.shape)
    # MPSGraph's axis scatter takes 1-D indices: flatten them, and the updates to match.
    flat = c.reshape(idx.id, [n])
    i32 = _checked_indices(c, Val(flat, (n,), idx.dtype), data.shape[axis])
    upd_shape = (*data.shape[:axis], n, *data.shape[axis + 1 :])
    upd_sym = frozenset(d if d < axis else d - idx.rank + 1 for d in upd.sym)
    u = c.reshape(upd.id, dims_of(upd_shape, upd_sym))

    def emit(ids: list[int]) -> int:
        return c.call(
            "scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:",
            A.tensor(ids[0]), A.tensor(ids[1]), A.tensor(i32), A.integer(axis),
            A.enum("MPSGraphScatterModeAdd"), A.NIL,
        )  # fmt: skip

    return [_widened(c, [data, Val(u, upd_shape, upd.dtype)], emit, outs[0].dtype)]


@_handles("scatter_add_along_axis")
def _scatter_add_along_axis(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    data, idx, upd = ins
    axis = P.normalize_axis("scatter_add_along_axis", attrs["axis"], data.rank)
    i32 = _checked_indices(c, idx, data.shape[axis])

    def emit(ids: list[int]) -> int:
        return c.call(
            "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
            A.integer(axis), A.tensor(ids[0]), A.tensor(ids[1]), A.tensor(i32),
            A.enum("MPSGraphScatterModeAdd"), A.NIL,
        )  # fmt: skip

    return [_widened(c, [data, upd], emit, outs[0].dtype)]


@_handles("check_index")
def _check_index(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    # The elementwise in-range mask is a check target (all true, or IndexError after the run and
    # before any write-back); the values are a target too, so the error names the first bad
    # value with the user op's message, as eager does. The values pass through (identity).
    idx = ins[0]
    r = idx.rank
    lo = c.bin("greaterThanOrEqualTo", idx.id, c.const(attrs["low"], idx.dtype, r))
    hi = c.bin("lessThan", idx.id, c.const(attrs["high"], idx.dtype, r))
    ok = c.bin("logicalAND", lo, hi)
    c.checks.append(ok)
    c.messages[ok] = (idx.id, attrs["message"])
    return [c.un("identity", idx.id)]


@_handles("one_hot")
def _one_hot(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    idx = ins[0]
    r, depth = idx.rank, attrs["depth"]
    inside = c.bin(
        "logicalAND",
        c.bin("greaterThanOrEqualTo", idx.id, c.const(0, idx.dtype, r)),
        c.bin("lessThan", idx.id, c.const(depth, idx.dtype, r)),
    )
    # Out-of-range indices become -1 before the Int32 cast, so 2**32 + 1 cannot wrap into range.
    safe = c.select(inside, idx.id, c.const(-1, idx.dtype, r))
    if idx.dtype != "i32":
        safe = c.cast(safe, "i32")
    axis = attrs["axis"] % (r + 1)
    out = c.call(
        "oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:",
        A.tensor(safe), A.integer(depth), A.integer(axis), A.dtype(outs[0].dtype),
        A.double(1.0), A.double(0.0), A.NIL,
    )  # fmt: skip
    # A rank-0 index is (1,) here, which adds an axis to the result: drop it.
    return [c.reshape(out, [depth]) if not r else out]


def conv_descriptor(attrs: dict[str, Any]) -> dict:
    """The ``MPSGraphConvolution2DOpDescriptor`` of prim conv attributes (X is width, Y height;
    prim padding is (top, bottom, left, right))."""
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    return A.descriptor(
        "MPSGraphConvolution2DOpDescriptor",
        {
            "strideInX": sw, "strideInY": sh, "dilationRateInX": dw, "dilationRateInY": dh,
            "groups": attrs["groups"], "paddingLeft": pl, "paddingRight": pr, "paddingTop": pt,
            "paddingBottom": pb, "paddingStyle": "MPSGraphPaddingStyleExplicit",
            "dataLayout": "MPSGraphTensorNamedDataLayoutNCHW",
            "weightsLayout": "MPSGraphTensorNamedDataLayoutOIHW",
        },
    )  # fmt: skip


def pool_descriptor(attrs: dict[str, Any]) -> dict:
    """The ``MPSGraphPooling2DOpDescriptor`` of prim pooling attributes."""
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = attrs["kernel"], attrs["strides"], attrs["padding"]
    dh, dw = attrs.get("dilation", (1, 1))
    fields = {
        "kernelWidth": kw, "kernelHeight": kh, "strideInX": sw, "strideInY": sh,
        "dilationRateInX": dw, "dilationRateInY": dh, "paddingLeft": pl, "paddingRight": pr,
        "paddingTop": pt, "paddingBottom": pb, "paddingStyle": "MPSGraphPaddingStyleExplicit",
        "dataLayout": "MPSGraphTensorNamedDataLayoutNCHW",
    }  # fmt: skip
    if "count_include_pad" in attrs:
        fields["includeZeroPadToAverage"] = attrs["count_include_pad"]
    return A.descriptor("MPSGraphPooling2DOpDescriptor", fields)


@_handles("conv2d")
def _conv2d(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [
        c.call(
            "convolution2DWithSourceTensor:weightsTensor:descriptor:name:",
            A.tensor(ins[0].id), A.tensor(ins[1].id), conv_descriptor(attrs), A.NIL,
        )
    ]  # fmt: skip


@_handles("conv2d_data_grad")
def _conv2d_data_grad(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [
        c.call(
            "convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:outputShape:"
            "forwardConvolutionDescriptor:name:",
            A.tensor(ins[0].id), A.tensor(ins[1].id), A.shape(dims_of(outs[0].shape, syms[0])),
            conv_descriptor(attrs), A.NIL,
        )
    ]  # fmt: skip


@_handles("conv2d_weights_grad")
def _conv2d_weights_grad(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    # MPSGraph's argument order: incoming gradient first, then the forward source.
    return [
        c.call(
            "convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:outputShape:"
            "forwardConvolutionDescriptor:name:",
            A.tensor(ins[1].id), A.tensor(ins[0].id), A.shape(outs[0].shape),
            conv_descriptor(attrs), A.NIL,
        )
    ]  # fmt: skip


def _make_pool(kind: str) -> _Handler:
    def emit(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
        return [
            c.call(
                f"{kind}Pooling2DWithSourceTensor:descriptor:name:",
                A.tensor(ins[0].id), pool_descriptor(attrs), A.NIL,
            )
        ]  # fmt: skip

    return emit


_HANDLERS["max_pool2d"] = _make_pool("max")
_HANDLERS["avg_pool2d"] = _make_pool("avg")


@_handles("max_pool2d_grad")
def _max_pool2d_grad(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    return [
        c.call(
            "maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",
            A.tensor(ins[0].id), A.tensor(ins[1].id), pool_descriptor(attrs), A.NIL,
        )
    ]  # fmt: skip


@_handles("avg_pool2d_grad")
def _avg_pool2d_grad(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    # The gradient method reads only its source tensor's shape: a zero constant of that shape.
    source = c.call(
        "constantWithScalar:shape:dataType:",
        A.double(0.0), A.shape(dims_of(outs[0].shape, syms[0])), A.dtype(outs[0].dtype),
    )  # fmt: skip
    return [
        c.call(
            "avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:",
            A.tensor(ins[0].id), A.tensor(source), pool_descriptor(attrs), A.NIL,
        )
    ]  # fmt: skip


@_handles("constant")
def _constant(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    out = outs[0]
    dims = A.shape(dims_of(out.shape, syms[0]))
    if len(attrs["value"]) == 1 or math.prod(out.shape) == 0:
        value = exact_scalar(attrs["value"][0] if attrs["value"] else 0.0, out.dtype)
        return [c.call("constantWithScalar:shape:dataType:", A.double(value), dims,
                       A.dtype(out.dtype))]  # fmt: skip
    values = np.asarray(attrs["value"], dtype=np.float64)
    if out.dtype in HALF_DTYPES:
        values = P.to_half(values, out.dtype)  # one rounding of each value, as prim's constant
    else:
        values = values.astype(P.NUMPY_DTYPES[out.dtype])
    return [
        c.call(
            "constantWithData:shape:dataType:",
            A.constant(values.reshape(mps_dims(out.shape)), out.dtype), dims,
            A.dtype(out.dtype),
        )
    ]  # fmt: skip


@_handles("fill")
def _fill(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    if outs[0].shape == ():
        return [c.un("identity", ins[0].id)]
    dims = A.shape(dims_of(outs[0].shape, syms[0]))
    return [c.call("broadcastTensor:toShape:name:", A.tensor(ins[0].id), dims, A.NIL)]


# A 32-bit Philox word as two Int32 tensors (high, low), each a 16-bit limb in [0, 2**16).
_Word = tuple[int, int]
_LIMB = 0xFFFF


class _Limbs:
    """32-bit unsigned arithmetic on 16-bit limbs held in Int32: every intermediate value stays
    below 2**28, so no operation wraps, and shifts act on non-negative values only (arithmetic
    and logical shifts agree). MPSGraph's Int64 multiplication wrap-around and Int64 bit
    operations are undocumented and have regressed across macOS releases (PyTorch #78848,
    #195595); Philox is defined on 32-bit words, so it needs none of them."""

    def __init__(self, c: _Ctx):
        self.c = c
        self._consts: dict[int, int] = {}

    def k(self, value: int) -> int:
        if value not in self._consts:
            self._consts[value] = self.c.const(value, "i32", 1)
        return self._consts[value]

    def band(self, v: int, mask: int) -> int:
        return self.c.bin("bitwiseAND", v, self.k(mask))

    def shr(self, v: int, bits: int) -> int:
        return self.c.bin("bitwiseRightShift", v, self.k(bits))

    def add(self, a: int, b: int) -> int:
        return self.c.bin("addition", a, b)

    def mul(self, a: int, b: int) -> int:
        return self.c.bin("multiplication", a, b)

    def xor(self, a: _Word, b: _Word) -> _Word:
        return self.c.bin("bitwiseXOR", a[0], b[0]), self.c.bin("bitwiseXOR", a[1], b[1])

    def normalize(self, limbs: list[int], top_fits: bool = False) -> list[int]:
        """Carries propagated: each limb back in [0, 2**16) (the top one's carry dropped, or
        with ``top_fits`` none to drop: the value is below 2**(16 * len(limbs)))."""
        out = []
        carry = None
        for i, limb in enumerate(limbs):
            v = limb if carry is None else self.add(limb, carry)
            if i + 1 < len(limbs):
                carry = self.shr(v, 16)
            out.append(v if top_fits and i + 1 == len(limbs) else self.band(v, _LIMB))
        return out

    def round_keys(self, key: _Word, bump: int, rounds: int) -> list[_Word]:
        """The key of each round, ``key + r * bump`` mod 2**32 for r < ``rounds``: one addition
        of the rounds' constants (as data) for all rounds at once, then a slice per round."""
        steps = [r * bump % 2**32 for r in range(rounds)]
        shape = [rounds]

        def data(values: list[int]) -> int:
            array = np.array(values, np.int32)
            return self.c.call("constantWithData:shape:dataType:", A.constant(array, "i32"),
                               A.shape(shape), A.dtype("i32"))  # fmt: skip

        low = self.add(key[1], data([v & _LIMB for v in steps]))
        high = self.add(key[0], data([v >> 16 for v in steps]))
        low, high = self.normalize([low, high])
        words = [key]
        for r in range(1, rounds):
            words.append((self.c.slice(high, [r], [r + 1], [1]),
                          self.c.slice(low, [r], [r + 1], [1])))  # fmt: skip
        return words

    def mulhilo(self, m: int, x: _Word) -> tuple[_Word, _Word]:
        """(high word, low word) of the 64-bit product of the constant ``m`` and ``x``: byte
        times limb partial products (below 2**24) summed into four 16-bit limbs. The products
        half a limb up (odd bytes) are summed per limb first (two below 2**25) and split once."""
        limbs: list[list[int]] = [[], [], [], []]
        half_up: list[list[int]] = [[], [], []]
        for j, part in enumerate((x[1], x[0])):  # x's low limb, then its high limb
            for i in range(4):
                byte = (m >> (8 * i)) & 0xFF
                if not byte:
                    continue
                t = self.mul(part, self.k(byte))  # at bit 8 * i + 16 * j
                (limbs if i % 2 == 0 else half_up)[i // 2 + j].append(t)
        for at, terms in enumerate(half_up):
            if not terms:
                continue
            t = terms[0]
            for more in terms[1:]:
                t = self.add(t, more)
            # Half a limb up: its low byte shifted into this limb, the rest into the next.
            limbs[at].append(self.mul(self.band(t, 0xFF), self.k(256)))
            limbs[at + 1].append(self.shr(t, 8))
        sums = []
        for terms in limbs:
            total = terms[0] if terms else self.k(0)
            for t in terms[1:]:
                total = self.add(total, t)
            sums.append(total)
        # The product of two 32-bit values is below 2**64: no carry out of the top limb.
        p0, p1, p2, p3 = self.normalize(sums, top_fits=True)
        return (p3, p2), (p1, p0)


def _state_words(c: _Ctx, state: int) -> tuple[_Word, _Word, _Word, _Word]:
    """(key low, key high, counter low, counter high) of an i64[2] (key, counter) state as
    16-bit limbs: each limb is shifted down and masked while still Int64 (two scalars; masking
    after the shift makes the shift's kind irrelevant), then cast to Int32 exactly."""
    words = []
    for lane in (0, 1):
        v = c.slice(state, [lane], [lane + 1], [1])
        limbs = []
        for shift in (0, 16, 32, 48):
            part = v if not shift else c.bin("bitwiseRightShift", v, c.const(shift, "i64", 1))
            limbs.append(c.cast(c.bin("bitwiseAND", part, c.const(_LIMB, "i64", 1)), "i32"))
        words += [(limbs[1], limbs[0]), (limbs[3], limbs[2])]
    return words[0], words[1], words[2], words[3]


def _philox_top24(c: _Ctx, state: int, count: int) -> int:
    """The top 24 bits (Int32) of ``count`` Philox-4x32-10 words of an i64[2] (key, counter)
    state, in the order of ``lucid.ir.prim.random_words``: word i is lane i % 4 of block i // 4."""
    z = _Limbs(c)
    key_lo, key_hi, counter_lo, counter_hi = _state_words(c, state)
    blocks = (count + 3) // 4
    block = c.call("coordinateAlongAxis:withShape:name:", A.integer(0), A.shape([blocks]), A.NIL)
    zero = z.k(0)
    x = [(z.shr(block, 16), z.band(block, _LIMB)), (zero, zero), counter_lo, counter_hi]
    keys = [z.round_keys(key_lo, PHILOX_W[0], 10), z.round_keys(key_hi, PHILOX_W[1], 10)]
    for k in zip(*keys, strict=True):
        hi0, lo0 = z.mulhilo(PHILOX_M[0], x[0])
        hi1, lo1 = z.mulhilo(PHILOX_M[1], x[2])
        x = [z.xor(z.xor(hi1, x[1]), k[0]), lo1, z.xor(z.xor(hi0, x[3]), k[1]), lo0]
    # word >> 8 = high * 2**8 + (low >> 8), below 2**24; lanes on the counter alone are (1,)
    # and broadcast against the blocks when added.
    top = [z.add(z.mul(high, z.k(256)), z.shr(low, 8)) for high, low in x]
    lanes = [c.bin("addition", lane, c.const(0, "i32", 1)) for lane in top]
    words = c.call("stackTensors:axis:name:", A.tensors(lanes), A.integer(1), A.NIL)
    return c.slice(c.reshape(words, [4 * blocks]), [0], [count], [1])


def _uniform01_f32(c: _Ctx, state: int, count: int) -> int:
    top24 = _philox_top24(c, state, count)
    return c.bin("multiplication", c.cast(top24, "f32"), c.const(2.0**-24, "f32"))


@_handles("random_uniform")
def _random_uniform(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    n = math.prod(outs[0].shape)
    u = _uniform01_f32(c, ins[0].id, n)
    scaled = c.bin("multiplication", u, c.const(attrs["high"] - attrs["low"], "f32"))
    shifted = c.bin("addition", scaled, c.const(attrs["low"], "f32"))
    return [c.reshape(_drawn_as(c, shifted, outs[0].dtype), outs[0].shape)]


def _drawn_as(c: _Ctx, draw: int, dtype: str) -> int:
    """A Float32 draw in the result's type: a half draw is the Float32 one rounded once, as
    eager draws in float32 and casts."""
    return c.cast(draw, dtype) if dtype != "f32" else draw


@_handles("random_normal")
def _random_normal(c: _Ctx, ins, attrs, outs, syms) -> list[int]:
    n = math.prod(outs[0].shape)
    pairs = (n + 1) // 2
    u = _uniform01_f32(c, ins[0].id, 2 * pairs)
    u0, u1 = c.slice(u, [0], [2 * pairs], [2]), c.slice(u, [1], [2 * pairs], [2])
    one_minus = c.bin("subtraction", c.const(1.0, "f32", 1), u0)
    radius = c.un(
        "squareRoot", c.bin("multiplication", c.const(-2.0, "f32", 1), c.un("logarithm", one_minus))
    )
    theta = c.bin("multiplication", c.const(2.0 * math.pi, "f32", 1), u1)
    z = c.call(
        "stackTensors:axis:name:",
        A.tensors([
            c.bin("multiplication", radius, c.un("cos", theta)),
            c.bin("multiplication", radius, c.un("sin", theta)),
        ]),
        A.integer(1), A.NIL,
    )  # fmt: skip
    z = c.slice(c.reshape(z, [2 * pairs]), [0], [n], [1])
    z = c.bin("multiplication", z, c.const(attrs["std"], "f32", 1))
    z = c.bin("addition", z, c.const(attrs["mean"], "f32", 1))
    return [c.reshape(_drawn_as(c, z, outs[0].dtype), outs[0].shape)]


# --- entry points ---------------------------------------------------------------------------------
def emit_op(
    builder: Builder,
    name: str,
    ins: list[Val],
    attrs: dict[str, Any],
    out_syms: list[frozenset[int]] | None = None,
    messages: dict[int, tuple[int, str]] | None = None,
) -> tuple[list[Val], list[int]]:
    """Emit prim op ``name`` on ``ins``: its result values and the check tensors it added
    (``messages`` receives, per check tensor with a message of its own, the checked values'
    tensor and the message)."""
    op = P.lookup(name)
    full = P.check_attrs(op, attrs)
    outs = P.infer(name, [P.Aval(v.shape, v.dtype) for v in ins], full)
    for v in [*ins, *outs]:
        dt = v.dtype
        if dt not in MPS_DTYPES:
            raise EmitError(
                f"prim.{name}: MPSGraph has no {dt} (run mpsgraph-legalize, which refuses it)"
            )
    syms = out_syms if out_syms is not None else [frozenset()] * len(outs)
    handler = _HANDLERS.get(name)
    if handler is None:  # a prim op added without its emission (a test walks PRIM_OPS)
        raise EmitError(f"prim.{name} has no MPSGraph emission yet")
    ctx = _Ctx(builder)
    ids = handler(ctx, list(ins), full, outs, syms)
    if messages is not None:
        messages.update(ctx.messages)
    return [
        Val(i, o.shape, o.dtype, s) for i, o, s in zip(ids, outs, syms, strict=True)
    ], ctx.checks


@dataclass
class Emitted:
    """The outcome of emitting a module: feeds, targets, in-place pairs, checks, roles."""

    feed_roles: list[str]
    result_roles: list[str]
    targets: list[int]
    inplace: list[tuple[int, int]]
    checks: list[int]  # indices into targets
    result_avals: list[P.Aval]
    # check target index -> (target index of the checked values, the message with "{}")
    check_messages: dict[int, tuple[int, str]] = field(default_factory=dict)


def emit_module(
    module: Any,
    builder: Builder,
    *,
    func_name: str = "forward",
    inplace_updates: bool = False,
    symbolic: Mapping[Any, frozenset[int]] | None = None,
) -> Emitted:
    """Emit ``@func_name`` of a legalized prim module into ``builder``.

    ``symbolic`` maps SSA values to their symbolic dims (from ``symbolic-safety``); with it,
    placeholders and shape arguments carry ``-1`` there. With ``inplace_updates``, a result with
    role ``update:R`` is written back into the feed with role ``R``.
    """
    from lucid.ir import _xdsl as x
    from lucid.ir.importer import feed_roles, forward_func, result_roles
    from lucid.ir.prim.dialect import PrimIROp, aval_of_type

    sym_of = symbolic or {}
    fn = forward_func(module, func_name)
    block = fn.body.blocks.first
    f_roles, r_roles = feed_roles(fn), result_roles(fn)
    env: dict[Any, Val] = {}
    for a, role in zip(block.args, f_roles, strict=True):
        aval = aval_of_type(a.type)
        s = frozenset(sym_of.get(a, frozenset()))
        env[a] = Val(builder.placeholder(tuple(dims_of(aval.shape, s)), aval.dtype, role),
                     aval.shape, aval.dtype, s)  # fmt: skip
    checks: list[int] = []
    messages: dict[int, tuple[int, str]] = {}
    returned: list[Val] | None = None
    for op in block.ops:
        visits.count(STAGE)
        if isinstance(op, PrimIROp):
            syms = [frozenset(sym_of.get(r, frozenset())) for r in op.results]
            try:
                vals, new_checks = emit_op(
                    builder,
                    op.PRIM.name,
                    [env[v] for v in op.operands],
                    op.given_attrs(),
                    syms,
                    messages,
                )
            except P.PrimError as e:
                raise EmitError(f"{op.name}: {e}") from None
            checks += new_checks
            for r, v in zip(op.results, vals, strict=True):
                env[r] = v
        elif isinstance(op, x.func.ReturnOp):
            returned = [env[v] for v in op.operands]
        else:
            raise EmitError(f"op {op.name} is not in the prim dialect; run lower-to-prim first")
    if returned is None:
        raise EmitError(f"@{func_name} has no func.return")
    targets = [v.id for v in returned]
    inplace: list[tuple[int, int]] = []
    if inplace_updates:
        by_role = {r: i for i, r in enumerate(f_roles)}
        for j, role in enumerate(r_roles):
            target = role[len("update:") :] if role.startswith("update:") else None
            if target in by_role:
                inplace.append((j, by_role[target]))
    n = len(targets)
    values = list(dict.fromkeys(v for v, _ in messages.values()))  # checked values, as targets
    position = {v: n + len(checks) + i for i, v in enumerate(values)}
    check_messages = {
        n + i: (position[messages[c][0]], messages[c][1])
        for i, c in enumerate(checks)
        if c in messages
    }
    return Emitted(
        f_roles,
        r_roles,
        targets + checks + values,
        inplace,
        list(range(n, n + len(checks))),
        [P.Aval(v.shape, v.dtype) for v in returned],
        check_messages,
    )


# The prim ops with an emission (a test holds it equal to PRIM_OPS and to EMISSIONS).
HANDLED_OPS = frozenset(_HANDLERS)
