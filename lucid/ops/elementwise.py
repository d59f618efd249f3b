"""Elementwise ops: one registry entry each, sharing the broadcasting inference rule.

Ops that are naturally compositions (``rsqrt``, ``square``, ``tan``, ``addcmul``, ``lerp``) are
plain fronts over registry ops, so they need no kernel and no VJP rule of their own.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor, _tensor_from
from lucid.ops._front import inplace_method, tensor_method
from lucid.ops._registry import (
    ELEMENTWISE,
    GRAD_SINK,
    PROMOTE,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    broadcast_shapes,
    elementwise_infer,
    half_format_defaults,
    register,
    shape_of,
)

__all__ = [
    "abs",
    "absolute",
    "add",
    "addcdiv",
    "addcmul",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "ceil",
    "clamp",
    "clamp_max",
    "clamp_min",
    "clip",
    "clone",
    "logaddexp",
    "hypot",
    "cos",
    "div",
    "divide",
    "eq",
    "erf",
    "exp",
    "expm1",
    "floor",
    "floor_divide",
    "ge",
    "greater",
    "greater_equal",
    "gt",
    "isclose",
    "isfinite",
    "isinf",
    "isnan",
    "le",
    "lerp",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "lt",
    "maximum",
    "minimum",
    "mul",
    "multiply",
    "nan_to_num",
    "ne",
    "neg",
    "negative",
    "not_equal",
    "pow",
    "reciprocal",
    "remainder",
    "round",
    "rsqrt",
    "sigmoid",
    "sign",
    "sin",
    "sqrt",
    "square",
    "sub",
    "subtract",
    "tan",
    "tanh",
    "true_divide",
    "trunc",
    "where",
]

_EW = frozenset({ELEMENTWISE, PROMOTE, SYMBOLIC_BATCH_SAFE})
_EW_SINK = _EW | {GRAD_SINK}
_NUMBER = (bool, int, float, np.number, np.bool_)


def _quiet(kernel):
    """Kernels follow IEEE (x/0 = inf, log(-1) = nan) silently, as PyTorch does."""

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return kernel(*args, **kwargs)

    return run


def _binary(name, kernel, vjp, out=None, props=_EW, **kw):
    infer = elementwise_infer(out)
    return register(OpDef(name, ("x", "y"), infer, _quiet(kernel), vjp, props=props, **kw))


def _unary(name, kernel, vjp, out=None, props=_EW, **kw):
    infer = elementwise_infer(out)
    return register(OpDef(name, ("x",), infer, _quiet(kernel), vjp, props=props, **kw))


def _zero_grads(c, g):
    return tuple(apply("zeros_like", g) for _ in c.inputs)


def _mask(cond, like):
    """A comparison result as 0/1 in the gradient's dtype."""
    return cond.type(like.dtype)


# --- arithmetic
_binary("add", np.add, lambda c, g: (g, g), saves_inputs=False, saves_outputs=False)
_binary("sub", np.subtract, lambda c, g: (g, neg(g)), saves_inputs=False, saves_outputs=False)
_binary("mul", np.multiply, lambda c, g: (g * c.inputs[1], g * c.inputs[0]), saves_outputs=False)


def _div_vjp(c, g):
    gx = div(g, c.inputs[1])
    return gx, (neg(gx * c.outputs[0]) if c.needs_input_grad[1] else None)


_binary("div", np.true_divide, _div_vjp, out="float")


def _int_checked(kernel, name):
    def run(x, y):
        if x.dtype.kind in "iub" and y.dtype.kind in "iub" and np.any(y == 0):
            raise ZeroDivisionError(f"{name}: integer division by zero")
        return kernel(x, y)

    return run


def _trunc_divide(x, y):
    if x.dtype.kind in "iub" and y.dtype.kind in "iub":
        q = np.abs(x) // np.abs(y)
        return np.where((x < 0) != (y < 0), -q, q)
    return np.trunc(np.true_divide(x, y))


# Rounded division has a zero gradient almost everywhere, as in PyTorch.
_binary(
    "floor_divide",
    _int_checked(np.floor_divide, "floor_divide"),
    _zero_grads,
    saves_inputs=False,
    saves_outputs=False,
)
_binary(
    "trunc_divide",
    _int_checked(_trunc_divide, "div"),
    _zero_grads,
    saves_inputs=False,
    saves_outputs=False,
)


def _remainder_vjp(c, g):
    x, y = c.inputs
    gy = None
    if isinstance(y, Tensor) and c.needs_input_grad[1]:
        gy = neg(g * floor(div(x, y)))
    return g, gy


_binary("remainder", _int_checked(np.remainder, "remainder"), _remainder_vjp, saves_outputs=False)


def _log_of(x):
    return math.log(x) if isinstance(x, _NUMBER) else log(x)


def _pow_vjp(c, g):
    x, y = c.inputs
    gx = gy = None
    if c.needs_input_grad[0]:
        # d/dx x**y = y * x**(y-1); PyTorch defines it as 0 where y == 0 (even at x == 0).
        if isinstance(y, _NUMBER):
            gx = g * y * pow(x, y - 1) if y != 0 else apply("zeros_like", g)
        else:
            gx = where(eq(y, 0), 0.0, g * y * pow(x, y - 1))
    if c.needs_input_grad[1]:
        # d/dy x**y = x**y * log(x); 0 at x == 0 for y >= 0 (the limit), as PyTorch.
        at_zero = logical_and(eq(x, 0), ge(y, 0))
        gy = where(at_zero, 0.0, g * c.outputs[0] * _log_of(x))
    return gx, gy


_binary("pow", np.power, _pow_vjp)


def _maxmin_vjp(greater):
    def vjp(c, g):
        x, y = c.inputs
        # Ties split the gradient evenly between the operands, as PyTorch does.
        half = _mask(eq(x, y), g) * 0.5
        return g * (_mask(greater(x, y), g) + half), g * (_mask(greater(y, x), g) + half)

    return vjp


_binary("maximum", np.maximum, _maxmin_vjp(lambda a, b: gt(a, b)), saves_outputs=False)
_binary("minimum", np.minimum, _maxmin_vjp(lambda a, b: lt(a, b)), saves_outputs=False)

# --- unary math
_unary("neg", np.negative, lambda c, g: (neg(g),), saves_inputs=False, saves_outputs=False)
_unary("exp", np.exp, lambda c, g: (g * c.outputs[0],), out="float", saves_inputs=False)
_unary("log", np.log, lambda c, g: (div(g, c.inputs[0]),), out="float", saves_outputs=False)
_unary("log1p", np.log1p, lambda c, g: (div(g, c.inputs[0] + 1),), out="float", saves_outputs=False)
_unary("expm1", np.expm1, lambda c, g: (g * (c.outputs[0] + 1),), out="float", saves_inputs=False)
# sqrt'(0) = inf, as PyTorch.
_unary("sqrt", np.sqrt, lambda c, g: (div(g, c.outputs[0] * 2),), out="float", saves_inputs=False)
_unary(
    "reciprocal",
    lambda x: np.reciprocal(x.astype(np.result_type(x, np.float32), copy=False)),
    lambda c, g: (neg(g * c.outputs[0] * c.outputs[0]),),
    out="float",
    saves_inputs=False,
)
# abs'(0) = sign(0) = 0, as PyTorch.
_unary("abs", np.abs, lambda c, g: (g * sign(c.inputs[0]),), saves_outputs=False)
_unary("sign", np.sign, _zero_grads, saves_inputs=False, saves_outputs=False)
for _name, _kernel in (("floor", np.floor), ("ceil", np.ceil), ("trunc", np.trunc)):
    _unary(_name, _kernel, _zero_grads, saves_inputs=False, saves_outputs=False)
_unary(
    "round",
    lambda x, decimals: np.round(x, decimals),
    _zero_grads,
    attrs={"decimals": 0},
    saves_inputs=False,
    saves_outputs=False,
)
_unary("sin", np.sin, lambda c, g: (g * cos(c.inputs[0]),), out="float", saves_outputs=False)
_unary("cos", np.cos, lambda c, g: (neg(g * sin(c.inputs[0])),), out="float", saves_outputs=False)
_unary(
    "tanh",
    np.tanh,
    lambda c, g: (g * (1 - c.outputs[0] * c.outputs[0]),),
    out="float",
    saves_inputs=False,
)


def _sigmoid_kernel(x):
    x = x.astype(np.result_type(x, np.float32), copy=False)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_unary(
    "sigmoid",
    _sigmoid_kernel,
    lambda c, g: (g * c.outputs[0] * (1 - c.outputs[0]),),
    out="float",
    saves_inputs=False,
)

_erf_exact = np.frompyfunc(math.erf, 1, 1)
# Numerical Recipes' erfc fit: erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), |err| < 1.2e-7.
_ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
             -1.13520398, 1.48851587, -0.82215223, 0.17087277)  # fmt: skip


def _erf_kernel(x):
    if x.dtype == np.float64:
        return np.asarray(_erf_exact(x), dtype=np.float64)
    # Below float64 a vectorised approximation is as good as the output: the Taylor series near 0
    # (where relative accuracy matters), the erfc fit beyond.
    z = np.abs(x.astype(np.float64))
    z2 = z * z
    term, series = z.copy(), z.copy()
    for n in range(1, 10):
        term = term * -z2 / n
        series = series + term / (2 * n + 1)
    series *= 2 / math.sqrt(math.pi)
    t = 1 / (1 + 0.5 * z)
    poly = np.zeros_like(t)
    for coeff in reversed(_ERFC_FIT):
        poly = poly * t + coeff
    tail = 1 - t * np.exp(-z2 + poly)
    return np.sign(x) * np.where(z < 0.5, series, tail)


_unary(
    "erf",
    _erf_kernel,
    lambda c, g: (g * (2 / math.sqrt(math.pi)) * exp(neg(c.inputs[0] * c.inputs[0])),),
    out="float",
    saves_outputs=False,
)


def _nan_to_num_vjp(c, g):
    return (where(isfinite(c.inputs[0]), g, 0.0),)


_unary(
    "nan_to_num",
    lambda x, nan, posinf, neginf: np.nan_to_num(
        x, copy=True, nan=nan, posinf=posinf, neginf=neginf
    ),
    _nan_to_num_vjp,
    attrs={"nan": 0.0, "posinf": None, "neginf": None},
    saves_outputs=False,
    resolve_attrs=half_format_defaults(posinf="max", neginf="min"),
)

# --- clamp: the gradient passes where min <= x <= max (inclusive), as PyTorch.


def _clamp_vjp(c, g):
    x, lo, hi = c.inputs
    inside = logical_and(ge(x, lo), le(x, hi))
    gx = where(inside, g, 0.0)
    glo = where(logical_and(lt(x, lo), lt(lo, hi)), g, 0.0)
    ghi = where(logical_or(gt(x, hi), lt(hi, lo)), g, 0.0)
    return gx, glo, ghi


register(
    OpDef(
        "clamp",
        ("x", "min", "max"),
        elementwise_infer(),
        _quiet(lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi)),
        _clamp_vjp,
        props=_EW,
        saves_outputs=False,
    )
)
_binary(
    "clamp_min",
    np.maximum,
    lambda c, g: (
        where(ge(c.inputs[0], c.inputs[1]), g, 0.0),
        where(lt(c.inputs[0], c.inputs[1]), g, 0.0),
    ),
    saves_outputs=False,
)
_binary(
    "clamp_max",
    np.minimum,
    lambda c, g: (
        where(le(c.inputs[0], c.inputs[1]), g, 0.0),
        where(gt(c.inputs[0], c.inputs[1]), g, 0.0),
    ),
    saves_outputs=False,
)

# --- comparisons and predicates: bool outputs, no gradient
for _name, _kernel in (
    ("eq", np.equal),
    ("ne", np.not_equal),
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
):
    _binary(_name, _kernel, None, out="bool", props=_EW_SINK)
for _name, _kernel in (("isfinite", np.isfinite), ("isnan", np.isnan), ("isinf", np.isinf)):
    _unary(_name, _kernel, None, out="bool", props=_EW_SINK)

_LOGICAL = frozenset({ELEMENTWISE, GRAD_SINK, SYMBOLIC_BATCH_SAFE})
for _name, _kernel in (
    ("logical_and", np.logical_and),
    ("logical_or", np.logical_or),
    ("logical_xor", np.logical_xor),
):
    _binary(_name, _kernel, None, out="bool", props=_LOGICAL)
_unary("logical_not", np.logical_not, None, out="bool", props=_LOGICAL)


def _bitwise_infer(name):
    base = elementwise_infer()

    def infer(*xs):
        av = base(*xs)
        if av.dtype.is_floating_point:
            raise TypeError(f"{name}: only integer and bool tensors are supported, got {av.dtype}")
        return av

    return infer


for _name, _kernel in (
    ("bitwise_and", np.bitwise_and),
    ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor),
):
    register(OpDef(_name, ("x", "y"), _bitwise_infer(_name), _kernel, None, props=_EW_SINK))
register(
    OpDef("bitwise_not", ("x",), _bitwise_infer("bitwise_not"), np.invert, None, props=_EW_SINK)
)

# --- where: the condition routes the gradient


def _where_infer(cond, x, y):
    if getattr(cond, "dtype", None) is not _dtype.bool_:
        got = getattr(cond, "dtype", type(cond).__name__)
        raise TypeError(f"where: the condition must be a bool tensor, got {got}")
    shape = broadcast_shapes(shape_of(cond), shape_of(x), shape_of(y), op="where")
    return AVal(shape, _dtype.result_type(x, y))


def _where_vjp(c, g):
    cond = c.inputs[0]
    return None, where(cond, g, 0.0), where(cond, 0.0, g)


# Not PROMOTE: the condition must stay bool; the kernel's result is cast to the inferred dtype.
register(
    OpDef(
        "where",
        ("condition", "x", "y"),
        _where_infer,
        np.where,
        _where_vjp,
        props=frozenset({ELEMENTWISE, SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
    )
)

# --- overwrite: the value half of fill_ / copy_ / the in-place random fills


def _fill_infer(x, value):
    vshape = shape_of(value)
    if broadcast_shapes(tuple(x.shape), vshape, op="copy_") != tuple(x.shape):
        raise RuntimeError(f"copy_: source of shape {vshape} cannot be broadcast to {x.shape}")
    return AVal(tuple(x.shape), x.dtype)


def _fill_vjp(c, g):
    # The old value of x is overwritten: its gradient is zero (not None, as PyTorch).
    gx = apply("zeros_like", g) if c.needs_input_grad[0] else None
    return gx, (g if isinstance(c.inputs[1], Tensor) else None)


register(
    OpDef(
        "fill",
        ("x", "value"),
        _fill_infer,
        lambda x, value: np.broadcast_to(value, x.shape).astype(x.dtype),
        _fill_vjp,
        props=frozenset({ELEMENTWISE, SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
        doc="``value`` broadcast to ``x``'s shape in ``x``'s dtype; gradient flows to value only.",
    )
)

# --- fronts


def add(x, y, *, alpha=1) -> Tensor:
    """``x + alpha * y`` with broadcasting."""
    return apply("add", x, y if alpha == 1 else apply("mul", y, alpha))


def sub(x, y, *, alpha=1) -> Tensor:
    """``x - alpha * y`` with broadcasting."""
    return apply("sub", x, y if alpha == 1 else apply("mul", y, alpha))


def mul(x, y) -> Tensor:
    """``x * y`` with broadcasting."""
    return apply("mul", x, y)


def div(x, y, *, rounding_mode: str | None = None) -> Tensor:
    """``x / y``; integers divide to float unless ``rounding_mode`` is ``"trunc"``/``"floor"``."""
    if rounding_mode is None:
        return apply("div", x, y)
    if rounding_mode == "floor":
        return apply("floor_divide", x, y)
    if rounding_mode == "trunc":
        return apply("trunc_divide", x, y)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def floor_divide(x, y) -> Tensor:
    """``floor(x / y)``, in the promoted dtype (integers stay integers)."""
    return apply("floor_divide", x, y)


def remainder(x, y) -> Tensor:
    """Python-style modulus: the result has the sign of ``y``."""
    return apply("remainder", x, y)


def pow(x, exponent) -> Tensor:  # noqa: A001
    """``x ** exponent``; either side may be a Python scalar."""
    return apply("pow", x, exponent)


def maximum(x, y) -> Tensor:
    """Elementwise maximum (NaN propagates)."""
    return apply("maximum", x, y)


def minimum(x, y) -> Tensor:
    """Elementwise minimum (NaN propagates)."""
    return apply("minimum", x, y)


def _unary_front(name: str, doc: str):
    def front(x) -> Tensor:
        return apply(name, x)

    front.__name__ = front.__qualname__ = name
    front.__doc__ = doc
    return front


neg = _unary_front("neg", "``-x``.")
exp = _unary_front("exp", "``e ** x``.")
log = _unary_front("log", "Natural logarithm.")
log1p = _unary_front("log1p", "``log(1 + x)``, accurate for small x.")
expm1 = _unary_front("expm1", "``exp(x) - 1``, accurate for small x.")
sqrt = _unary_front("sqrt", "Square root.")
reciprocal = _unary_front("reciprocal", "``1 / x`` (integers give float).")
abs = _unary_front("abs", "Absolute value.")  # noqa: A001
sign = _unary_front("sign", "-1, 0 or 1.")
floor = _unary_front("floor", "Round down.")
ceil = _unary_front("ceil", "Round up.")
trunc = _unary_front("trunc", "Round toward zero.")
sin = _unary_front("sin", "Sine.")
cos = _unary_front("cos", "Cosine.")
tanh = _unary_front("tanh", "Hyperbolic tangent.")
sigmoid = _unary_front("sigmoid", "``1 / (1 + exp(-x))``, computed without overflow.")
erf = _unary_front("erf", "The Gauss error function.")
isfinite = _unary_front("isfinite", "True where x is neither inf nor NaN.")
isnan = _unary_front("isnan", "True where x is NaN.")
isinf = _unary_front("isinf", "True where x is +inf or -inf.")
logical_not = _unary_front("logical_not", "True where x is zero.")
bitwise_not = _unary_front("bitwise_not", "``~x`` on integer and bool tensors.")


def round(x, *, decimals: int = 0) -> Tensor:  # noqa: A001
    """Round half to even, as PyTorch."""
    return apply("round", x, decimals=decimals)


def rsqrt(x) -> Tensor:
    """``1 / sqrt(x)``."""
    return reciprocal(sqrt(x))


def square(x) -> Tensor:
    """``x * x`` (integers stay integers)."""
    return mul(x, x)


def tan(x) -> Tensor:
    """Tangent, as ``sin(x) / cos(x)``."""
    return div(sin(x), cos(x))


def nan_to_num(x, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None):
    """Replace NaN, +inf and -inf (default: 0 and the dtype's largest/smallest finite value)."""
    return apply("nan_to_num", x, nan=nan, posinf=posinf, neginf=neginf)


def clamp(x, min=None, max=None) -> Tensor:  # noqa: A002
    """Limit x to ``[min, max]``; either bound may be None or a tensor. ``min > max`` gives max."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of 'min' and 'max' must not be None")
    if max is None:
        return apply("clamp_min", x, min)
    if min is None:
        return apply("clamp_max", x, max)
    return apply("clamp", x, min, max)


def clamp_min(x, min) -> Tensor:  # noqa: A002
    """``max(x, min)`` with clamp's gradient."""
    return apply("clamp_min", x, min)


def clamp_max(x, max) -> Tensor:  # noqa: A002
    """``min(x, max)`` with clamp's gradient."""
    return apply("clamp_max", x, max)


def where(condition, input=None, other=None) -> Tensor:  # noqa: A002
    """``input`` where ``condition`` is True, else ``other`` (both broadcast)."""
    if input is None or other is None:
        raise TypeError("where(condition) with one argument is not supported; pass input and other")
    return apply("where", condition, input, other)


def _binary_front(name: str, doc: str):
    def front(x, y) -> Tensor:
        return apply(name, x, y)

    front.__name__ = front.__qualname__ = name
    front.__doc__ = doc
    return front


eq = _binary_front("eq", "``x == y``, elementwise.")
ne = _binary_front("ne", "``x != y``, elementwise.")
lt = _binary_front("lt", "``x < y``, elementwise.")
le = _binary_front("le", "``x <= y``, elementwise.")
gt = _binary_front("gt", "``x > y``, elementwise.")
ge = _binary_front("ge", "``x >= y``, elementwise.")
logical_and = _binary_front("logical_and", "True where both are nonzero.")
logical_or = _binary_front("logical_or", "True where either is nonzero.")
logical_xor = _binary_front("logical_xor", "True where exactly one is nonzero.")
bitwise_and = _binary_front("bitwise_and", "``x & y`` on integer and bool tensors.")
bitwise_or = _binary_front("bitwise_or", "``x | y`` on integer and bool tensors.")
bitwise_xor = _binary_front("bitwise_xor", "``x ^ y`` on integer and bool tensors.")


def addcmul(x, tensor1, tensor2, *, value=1) -> Tensor:
    """``x + value * tensor1 * tensor2``."""
    prod = mul(tensor1, tensor2)
    return add(x, prod if value == 1 else mul(prod, value))


def addcdiv(x, tensor1, tensor2, *, value=1) -> Tensor:
    """``x + value * tensor1 / tensor2``."""
    quot = div(tensor1, tensor2)
    return add(x, quot if value == 1 else mul(quot, value))


def lerp(start, end, weight) -> Tensor:
    """``start + weight * (end - start)``; weight is a scalar or a tensor."""
    return add(start, mul(weight, sub(end, start)))


def clone(x) -> Tensor:
    """A copy of ``x`` with its own storage; the gradient passes through unchanged."""
    return apply("cast", x, dtype=x.dtype)


def isclose(x, y, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """``|x - y| <= atol + rtol * |y|`` elementwise (equal infinities are close), as PyTorch."""
    error = abs(sub(x, y))
    within = logical_and(isfinite(error), le(error, add(mul(abs(y), rtol), atol)))
    close = logical_or(eq(x, y), within)
    if equal_nan:
        close = logical_or(close, logical_and(isnan(x), isnan(y)))
    return close


def _type_as(self: Tensor, other: Tensor) -> Tensor:
    """``self`` cast to ``other``'s dtype."""
    return self.type(other.dtype)


# PyTorch's aliases
true_divide = divide = div
multiply, subtract, negative, absolute, clip = mul, sub, neg, abs, clamp
greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne

# --- methods and operators
_METHODS = """
    add sub mul div true_divide floor_divide remainder pow maximum minimum neg exp log log1p expm1
    sqrt rsqrt reciprocal abs sign floor ceil trunc round sin cos tan tanh sigmoid erf square
    nan_to_num clamp clamp_min clamp_max isfinite isnan isinf isclose eq ne lt le gt ge logical_and
    logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor bitwise_not addcmul
    addcdiv lerp clone divide multiply subtract negative absolute clip greater greater_equal less
    less_equal not_equal
""".split()
for _name in _METHODS:
    setattr(Tensor, _name, globals()[_name])


@tensor_method("where")
def _where_method(self, condition, other) -> Tensor:
    return where(condition, self, other)


def _operand(other: Any) -> Any:
    if isinstance(other, (Tensor, *_NUMBER)):
        return other
    if isinstance(other, np.ndarray):
        return _tensor_from(other)
    return NotImplemented


def _operator(op: str, reflected: bool = False):
    def method(self, other):
        other = _operand(other)
        if other is NotImplemented:
            return NotImplemented
        return apply(op, other, self) if reflected else apply(op, self, other)

    method.__name__ = op
    return method


for _dunder, _op in (
    ("add", "add"),
    ("sub", "sub"),
    ("mul", "mul"),
    ("truediv", "div"),
    ("floordiv", "floor_divide"),
    ("mod", "remainder"),
    ("pow", "pow"),
    ("and", "bitwise_and"),
    ("or", "bitwise_or"),
    ("xor", "bitwise_xor"),
):
    setattr(Tensor, f"__{_dunder}__", _operator(_op))
    setattr(Tensor, f"__r{_dunder}__", _operator(_op, reflected=True))
for _dunder, _op in (
    ("eq", "eq"),
    ("ne", "ne"),
    ("lt", "lt"),
    ("le", "le"),
    ("gt", "gt"),
    ("ge", "ge"),
):
    setattr(Tensor, f"__{_dunder}__", _operator(_op))
Tensor.__neg__ = neg
Tensor.__abs__ = abs
Tensor.__invert__ = bitwise_not

# --- in place
_INPLACE = """
    add sub mul div true_divide floor_divide remainder pow neg exp log log1p expm1 sqrt rsqrt
    reciprocal abs sign floor ceil trunc round sin cos tan tanh sigmoid erf square nan_to_num
    clamp clamp_min clamp_max addcmul addcdiv lerp logical_and logical_or logical_xor logical_not
    bitwise_and bitwise_or bitwise_xor bitwise_not maximum minimum clip
""".split()
for _name in _INPLACE:
    inplace_method(_name + "_", globals()[_name])
for _dunder, _name in (
    ("add", "add_"),
    ("sub", "sub_"),
    ("mul", "mul_"),
    ("truediv", "div_"),
    ("floordiv", "floor_divide_"),
    ("mod", "remainder_"),
    ("pow", "pow_"),
    ("and", "bitwise_and_"),
    ("or", "bitwise_or_"),
    ("xor", "bitwise_xor_"),
):
    setattr(Tensor, f"__i{_dunder}__", getattr(Tensor, _name))


def _fill_value(value: Any) -> Any:
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(
                f"fill_ only supports a 0-d value tensor, got one of shape {tuple(value.shape)}"
            )
        return value
    if not isinstance(value, _NUMBER):
        raise TypeError(
            f"fill_: value must be a number or a 0-d tensor, not {type(value).__name__}"
        )
    return value


def _fill_(self: Tensor, value: Any) -> Tensor:
    """Fill with a scalar or a 0-d tensor (whose gradient then collects the sum)."""
    value = _fill_value(value)
    return self._apply_inplace(lambda a: apply("fill", a, value))


def _zero_(self: Tensor) -> Tensor:
    """Fill with zeros."""
    return self._apply_inplace(lambda a: apply("fill", a, 0))


def _copy_(self: Tensor, src: Any, non_blocking: bool = False) -> Tensor:
    """Copy ``src`` (broadcast, cast to self's dtype) into self; the gradient flows to src."""
    if not isinstance(src, (Tensor, *_NUMBER)):
        raise TypeError(f"copy_: src must be a Tensor, not {type(src).__name__}")
    return self._apply_inplace(lambda a: apply("fill", a, src))


Tensor.type_as = _type_as
Tensor.fill_ = _fill_
Tensor.zero_ = _zero_
Tensor.copy_ = _copy_

# --- structural helpers autograd needs


def _cast_kernel(x: np.ndarray, dtype) -> np.ndarray:
    # C order: a cast (and so clone and contiguous) of a transposed view is row-major. Beyond a
    # half format's range a value becomes inf, silently, as in PyTorch.
    with np.errstate(over="ignore"):
        return x.astype(dtype.numpy, order="C")


register(
    OpDef(
        "cast",
        ("x",),
        lambda x, dtype: elementwise_infer(dtype)(x),
        _cast_kernel,
        lambda c, g: (g.type(c.inputs[0].dtype) if c.inputs[0].dtype.is_floating_point else None,),
        attrs={"dtype": None},
        props=frozenset({ELEMENTWISE, SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
    )
)
register(
    OpDef(
        "detach",
        ("x",),
        elementwise_infer(),
        lambda x: x,
        None,
        props=frozenset({ELEMENTWISE, GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
    )
)


def _like_infer(x, dtype=None):
    return AVal(tuple(x.shape), dtype if dtype is not None else x.dtype)


def _like_kernel(fill):
    def kernel(x, dtype=None):
        return np.full(x.shape, fill, dtype=dtype.numpy if dtype is not None else x.dtype)

    return kernel


for _name, _value in (("zeros_like", 0), ("ones_like", 1)):
    register(
        OpDef(
            _name,
            ("x",),
            _like_infer,
            _like_kernel(_value),
            None,
            attrs={"dtype": None},
            props=frozenset({GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
        )
    )


def logaddexp(x, y) -> Tensor:
    """``log(exp(x) + exp(y))``, computed stably."""
    big = maximum(x, y)
    finite = isfinite(big)
    # max + log1p(exp(-|x - y|)); where both are -inf (or the max is +inf) the max is the answer.
    safe_gap = where(finite, abs(sub(x, y)), 0.0)
    return where(finite, add(big, log1p(exp(neg(safe_gap)))), big)


def hypot(x, y) -> Tensor:
    """``sqrt(x**2 + y**2)`` elementwise (gradient 0 where both are 0)."""
    squared = add(mul(x, x), mul(y, y))
    positive = gt(squared, 0)
    return where(positive, sqrt(where(positive, squared, 1.0)), 0.0)
