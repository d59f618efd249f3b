"""The ``prim`` op table: the living definition of Lucid's backend-neutral primitives.

Each prim op has one direct MPSGraph counterpart and one CPU kernel. This module is pure Python
(numpy only, no xDSL): for every op it gives the operands, the attributes with their kinds and
defaults, a shape/dtype rule over :class:`Aval` and the numpy reference semantics. The xDSL ``prim``
dialect, the ``lower-to-prim`` pass, the native validator and the MPSGraph numpy builder are
checked against this table.

Conventions shared by every op:

- dtypes are the strings ``f32 f64 i32 i64 bool``; operands of an op have exactly the dtypes its
  rule asks for (promotion happened before prim, through explicit ``cast``);
- shapes are static tuples; binary/select/normalize operands broadcast with numpy rules;
- axes may be negative and count from the end;
- integer division or remainder by zero gives 0 (never a trap), as numpy does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPES = ("f32", "f64", "i32", "i64", "bool")
FLOAT = frozenset({"f32", "f64"})
INT = frozenset({"i32", "i64"})
NUMERIC = FLOAT | INT
ANY = frozenset(DTYPES)
NUMPY_DTYPES = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in NUMPY_DTYPES.items()}


def dtype_of(array: np.ndarray) -> str:
    """The prim dtype name of a numpy array."""
    try:
        return _FROM_NUMPY[np.dtype(array.dtype)]
    except KeyError:
        raise TypeError(f"numpy dtype {array.dtype} has no prim dtype; expected {DTYPES}") from None


class PrimError(ValueError):
    """An operand or attribute does not fit a prim op's rule."""


@dataclass(frozen=True)
class Aval:
    """An abstract value: static shape and dtype."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)


REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """An attribute: kind is int, ints, float, floats, bool or dtype (a dtype name)."""

    kind: str
    default: Any = REQUIRED


@dataclass(frozen=True)
class PrimOp:
    """One prim op: everything about it in one record."""

    name: str
    operands: tuple[str, ...]
    attrs: dict[str, Attr]
    infer: Callable[[list[Aval], dict[str, Any]], list[Aval]]
    reference: Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]
    family: str
    mps: str
    macos: str
    cpu_kernel: str
    variadic: bool = False
    elementwise: bool = False
    props: frozenset[str] = field(default_factory=frozenset)


PRIM_OPS: dict[str, PrimOp] = {}


def _fail(op: str, message: str) -> PrimError:
    return PrimError(f"prim.{op}: {message}")


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise _fail(op, f"axis {axis} out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(op: str, axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    out = tuple(normalize_axis(op, a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise _fail(op, f"repeated axis in {tuple(axes)}")
    return out


def broadcast(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise _fail(op, f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def check_attrs(op: PrimOp, attrs: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and check every attribute's kind; unknown or missing ones raise."""
    unknown = set(attrs) - set(op.attrs)
    if unknown:
        raise _fail(op.name, f"unknown attribute(s) {sorted(unknown)}")
    full: dict[str, Any] = {}
    for name, spec in op.attrs.items():
        value = attrs.get(name, spec.default)
        if value is REQUIRED:
            raise _fail(op.name, f"missing attribute {name!r}")
        full[name] = _coerce_attr(op.name, name, spec.kind, value)
    return full


def _coerce_attr(op: str, name: str, kind: str, value: Any) -> Any:
    bad = _fail(op, f"attribute {name!r} must be {kind}, got {value!r}")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise bad
        return int(value)
    if kind == "bool":
        if not isinstance(value, bool | np.bool_):
            raise bad
        return bool(value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise bad
        return float(value)
    if kind == "ints":
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
        ):
            raise bad
        return tuple(int(v) for v in value)
    if kind == "floats":
        if not isinstance(value, list | tuple | np.ndarray):
            raise bad
        return tuple(float(v) for v in np.asarray(value, dtype=np.float64).ravel())
    if kind == "dtype":
        if value not in DTYPES:
            raise bad
        return value
    raise AssertionError(kind)


def infer(name: str, avals: Sequence[Aval], attrs: dict[str, Any]) -> list[Aval]:
    """Output avals of prim op ``name``; raises PrimError naming the problem."""
    op = lookup(name)
    if op.variadic:
        if len(avals) < 1:
            raise _fail(name, "needs at least one operand")
    elif len(avals) != len(op.operands):
        raise _fail(name, f"takes {len(op.operands)} operand(s), got {len(avals)}")
    return op.infer(list(avals), check_attrs(op, attrs))


def evaluate(name: str, arrays: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Run the numpy reference of ``name`` and check its outputs against the rule."""
    op = lookup(name)
    full = check_attrs(op, attrs)
    avals = infer(name, [Aval(tuple(a.shape), dtype_of(a)) for a in arrays], full)
    outs = op.reference([np.asarray(a) for a in arrays], full)
    result = []
    for aval, out in zip(avals, outs, strict=True):
        out = np.asarray(out)
        assert out.shape == aval.shape, (name, out.shape, aval.shape)
        result.append(np.array(out, dtype=NUMPY_DTYPES[aval.dtype], order="C"))
    return result


def lookup(name: str) -> PrimOp:
    try:
        return PRIM_OPS[name]
    except KeyError:
        raise PrimError(f"unknown prim op {name!r}") from None


def _register(op: PrimOp) -> None:
    assert op.name not in PRIM_OPS, op.name
    PRIM_OPS[op.name] = op


def _need(op: str, aval: Aval, allowed: frozenset[str], what: str = "operand") -> None:
    if aval.dtype not in allowed:
        raise _fail(
            op, f"{what} dtype {aval.dtype} not supported; expected one of {sorted(allowed)}"
        )


def _same_dtype(op: str, avals: Sequence[Aval]) -> str:
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1:
        raise _fail(op, f"operands must share one dtype, got {[a.dtype for a in avals]}")
    return dtypes.pop()


def _erf(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x, dtype=np.float64).ravel()
    return np.array([math.erf(v) for v in flat], dtype=np.float64).reshape(np.shape(x))


def _floor_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if a.dtype.kind == "i":
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.floor_divide(a, safe)).astype(a.dtype)
        return np.floor_divide(a, b)


def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if a.dtype.kind == "i":
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.remainder(a, safe)).astype(a.dtype)
        return np.remainder(a, b)


def _sign(x: np.ndarray) -> np.ndarray:
    return np.sign(x)


# --- elementwise ------------------------------------------------------------------------------
# name -> (allowed input dtypes, output dtype or None for "same", numpy function, MPSGraph method)
UNARY: dict[str, tuple[frozenset[str], str | None, Callable[[np.ndarray], np.ndarray], str]] = {
    "neg": (NUMERIC, None, np.negative, "negativeWithTensor:name:"),
    "abs": (NUMERIC, None, np.abs, "absoluteWithTensor:name:"),
    "sign": (NUMERIC, None, _sign, "signWithTensor:name:"),
    "square": (NUMERIC, None, np.square, "squareWithTensor:name:"),
    "relu": (NUMERIC, None, lambda x: np.maximum(x, np.zeros((), x.dtype)), "reLUWithTensor:name:"),
    "exp": (FLOAT, None, np.exp, "exponentWithTensor:name:"),
    "expm1": (FLOAT, None, np.expm1, "exponentWithTensor:name: + subtraction (composite)"),
    "log": (FLOAT, None, np.log, "logarithmWithTensor:name:"),
    "log1p": (FLOAT, None, np.log1p, "logarithmWithTensor:name: of 1+x (composite)"),
    "sqrt": (FLOAT, None, np.sqrt, "squareRootWithTensor:name:"),
    "rsqrt": (FLOAT, None, lambda x: 1 / np.sqrt(x), "reverseSquareRootWithTensor:name:"),
    "reciprocal": (FLOAT, None, np.reciprocal, "reciprocalWithTensor:name:"),
    "sin": (FLOAT, None, np.sin, "sinWithTensor:name:"),
    "cos": (FLOAT, None, np.cos, "cosWithTensor:name:"),
    "tan": (FLOAT, None, np.tan, "tanWithTensor:name:"),
    "tanh": (FLOAT, None, np.tanh, "tanhWithTensor:name:"),
    "sigmoid": (FLOAT, None, lambda x: 1 / (1 + np.exp(-x)), "sigmoidWithTensor:name:"),
    "erf": (FLOAT, None, _erf, "erfWithTensor:name:"),
    "floor": (FLOAT, None, np.floor, "floorWithTensor:name:"),
    "ceil": (FLOAT, None, np.ceil, "ceilWithTensor:name:"),
    "round": (FLOAT, None, np.rint, "rintWithTensor:name:"),
    "logical_not": (frozenset({"bool"}), None, np.logical_not, "notWithTensor:name:"),
    "isnan": (FLOAT, "bool", np.isnan, "isNaNWithTensor:name:"),
    "isinf": (FLOAT, "bool", np.isinf, "isInfiniteWithTensor:name:"),
    "isfinite": (FLOAT, "bool", np.isfinite, "isFiniteWithTensor:name:"),
}

BINARY: dict[str, tuple[frozenset[str], str | None, Callable[..., np.ndarray], str]] = {
    "add": (NUMERIC, None, np.add, "additionWithPrimaryTensor:secondaryTensor:name:"),
    "sub": (NUMERIC, None, np.subtract, "subtractionWithPrimaryTensor:secondaryTensor:name:"),
    "mul": (NUMERIC, None, np.multiply, "multiplicationWithPrimaryTensor:secondaryTensor:name:"),
    "div": (FLOAT, None, np.divide, "divisionWithPrimaryTensor:secondaryTensor:name:"),
    "pow": (FLOAT, None, np.power, "powerWithPrimaryTensor:secondaryTensor:name:"),
    "atan2": (FLOAT, None, np.arctan2, "atan2WithPrimaryTensor:secondaryTensor:name:"),
    "maximum": (NUMERIC, None, np.maximum, "maximumWithPrimaryTensor:secondaryTensor:name:"),
    "minimum": (NUMERIC, None, np.minimum, "minimumWithPrimaryTensor:secondaryTensor:name:"),
    "floor_divide": (
        NUMERIC,
        None,
        _floor_divide,
        "floorDivisionWithPrimaryTensor:secondaryTensor:name:",
    ),
    "remainder": (NUMERIC, None, _remainder, "moduloWithPrimaryTensor:secondaryTensor:name:"),
    "eq": (ANY, "bool", np.equal, "equalWithPrimaryTensor:secondaryTensor:name:"),
    "ne": (ANY, "bool", np.not_equal, "notEqualWithPrimaryTensor:secondaryTensor:name:"),
    "lt": (ANY, "bool", np.less, "lessThanWithPrimaryTensor:secondaryTensor:name:"),
    "le": (ANY, "bool", np.less_equal, "lessThanOrEqualToWithPrimaryTensor:secondaryTensor:name:"),
    "gt": (ANY, "bool", np.greater, "greaterThanWithPrimaryTensor:secondaryTensor:name:"),
    "ge": (
        ANY,
        "bool",
        np.greater_equal,
        "greaterThanOrEqualToWithPrimaryTensor:secondaryTensor:name:",
    ),
    "logical_and": (
        frozenset({"bool"}),
        None,
        np.logical_and,
        "logicalANDWithPrimaryTensor:secondaryTensor:name:",
    ),
    "logical_or": (
        frozenset({"bool"}),
        None,
        np.logical_or,
        "logicalORWithPrimaryTensor:secondaryTensor:name:",
    ),
    "logical_xor": (
        frozenset({"bool"}),
        None,
        np.logical_xor,
        "logicalXORWithPrimaryTensor:secondaryTensor:name:",
    ),
}


def _unary_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    allowed, out_dtype, _, _ = UNARY[name]

    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], allowed)
        return [Aval(avals[0].shape, out_dtype or avals[0].dtype)]

    return rule


def _unary_ref(name: str) -> Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    fn = UNARY[name][2]

    def ref(arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(fn(arrays[0])).astype(arrays[0].dtype, copy=False)]

    return ref


def _binary_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    allowed, out_dtype, _, _ = BINARY[name]

    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        dtype = _same_dtype(name, avals)
        _need(name, avals[0], allowed)
        return [Aval(broadcast(name, avals[0].shape, avals[1].shape), out_dtype or dtype)]

    return rule


def _binary_ref(name: str) -> Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    fn = BINARY[name][2]

    def ref(arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(fn(arrays[0], arrays[1]))]

    return ref


for _name, (_allowed, _out, _fn, _mps) in UNARY.items():
    _register(
        PrimOp(
            _name, ("x",), {}, _unary_infer(_name), _unary_ref(_name), "unary", _mps, "12.0",
            "elementwise.cpp: unary", elementwise=True,
        )
    )  # fmt: skip
for _name, (_allowed, _out, _fn, _mps) in BINARY.items():
    _register(
        PrimOp(
            _name, ("a", "b"), {}, _binary_infer(_name), _binary_ref(_name), "binary", _mps,
            "12.0", "elementwise.cpp: binary", elementwise=True,
        )
    )  # fmt: skip


def _select_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    _need("select", avals[0], frozenset({"bool"}), "condition")
    dtype = _same_dtype("select", avals[1:])
    return [Aval(broadcast("select", *(a.shape for a in avals)), dtype)]


_register(
    PrimOp(
        "select", ("cond", "a", "b"), {}, _select_infer,
        lambda xs, at: [np.where(xs[0], xs[1], xs[2])], "select",
        "selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:", "12.0",
        "elementwise.cpp: select", elementwise=True,
    )
)  # fmt: skip


def _cast_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, target = xs[0], NUMPY_DTYPES[attrs["dtype"]]
    if x.dtype.kind == "f" and target.kind == "i":
        # Float to int truncates toward zero; NaN gives 0 and out-of-range values saturate.
        info = np.iinfo(target)
        with np.errstate(invalid="ignore"):
            t = np.trunc(np.nan_to_num(x, nan=0.0))
            t = np.clip(t, info.min, info.max)
        out = np.where(t >= info.max, info.max, t.astype(np.float64)).astype(np.int64)
        return [out.astype(target)]
    with np.errstate(all="ignore"):
        return [x.astype(target)]


_register(
    PrimOp(
        "cast", ("x",), {"dtype": Attr("dtype")},
        lambda avals, attrs: [Aval(avals[0].shape, attrs["dtype"])], _cast_ref, "cast",
        "castTensor:toType:name:", "12.0", "elementwise.cpp: cast", elementwise=True,
    )
)  # fmt: skip


def _normalize_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dtype = _same_dtype("normalize", avals)
    _need("normalize", avals[0], FLOAT)
    return [Aval(broadcast("normalize", *(a.shape for a in avals)), dtype)]


def _normalize_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, mean, var, gamma, beta = xs
    return [(x - mean) / np.sqrt(var + x.dtype.type(attrs["epsilon"])) * gamma + beta]


_register(
    PrimOp(
        "normalize", ("x", "mean", "variance", "gamma", "beta"), {"epsilon": Attr("float", 1e-5)},
        _normalize_infer, _normalize_ref, "normalization",
        "normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
        "12.0", "elementwise.cpp: normalize", elementwise=True,
    )
)  # fmt: skip

ELEMENTWISE_OPS = frozenset(name for name, op in PRIM_OPS.items() if op.elementwise)


# --- matmul -------------------------------------------------------------------------------------
def _matmul_dims(avals: list[Aval], attrs: dict[str, Any]) -> tuple[int, int, int, tuple]:
    a, b = avals
    if a.ndim < 2 or b.ndim < 2:
        raise _fail("matmul", f"operands need rank >= 2, got shapes {a.shape} and {b.shape}")
    m, ka = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    kb, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if ka != kb:
        raise _fail("matmul", f"contraction sizes differ: {a.shape} @ {b.shape} (K {ka} vs {kb})")
    return m, n, ka, broadcast("matmul", a.shape[:-2], b.shape[:-2])


def _matmul_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dtype = _same_dtype("matmul", avals)
    _need("matmul", avals[0], NUMERIC)
    m, n, _, batch = _matmul_dims(avals, attrs)
    return [Aval((*batch, m, n), dtype)]


def _matmul_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = xs
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    if a.dtype.kind == "f":
        return [np.matmul(a.astype(np.float64), b.astype(np.float64))]
    return [np.matmul(a, b)]


_register(
    PrimOp(
        "matmul", ("a", "b"),
        {"transpose_a": Attr("bool", False), "transpose_b": Attr("bool", False)},
        _matmul_infer, _matmul_ref, "linalg",
        "matrixMultiplicationWithPrimaryTensor:secondaryTensor:name: (+ transposeTensor)",
        "12.0", "linalg.cpp: sgemm/dgemm per batch",
    )
)  # fmt: skip


# --- reductions ----------------------------------------------------------------------------------
def _reduce_shape(op: str, aval: Aval, axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    axes = normalize_axes(op, axes, aval.ndim)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(aval.shape))
    return tuple(d for i, d in enumerate(aval.shape) if i not in axes)


REDUCTIONS = {
    "reduce_sum": (NUMERIC, np.sum, "reductionSumWithTensor:axes:name:"),
    "reduce_mean": (FLOAT, np.mean, "meanOfTensor:axes:name:"),
    "reduce_max": (NUMERIC, np.max, "reductionMaximumWithTensor:axes:name:"),
    "reduce_min": (NUMERIC, np.min, "reductionMinimumWithTensor:axes:name:"),
    "reduce_prod": (NUMERIC, np.prod, "reductionProductWithTensor:axes:name:"),
    "variance": (FLOAT, np.var, "varianceOfTensor:axes:name:"),
}


def _reduce_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], REDUCTIONS[name][0])
        shape = _reduce_shape(name, avals[0], attrs["axes"], attrs["keepdims"])
        if name in ("reduce_max", "reduce_min"):
            reduced = normalize_axes(name, attrs["axes"], avals[0].ndim)
            if any(avals[0].shape[a] == 0 for a in reduced):
                raise _fail(name, f"cannot reduce an empty axis of shape {avals[0].shape}")
        return [Aval(shape, avals[0].dtype)]

    return rule


def _reduce_ref(name: str) -> Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    fn = REDUCTIONS[name][1]

    def ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = xs[0]
        axes = normalize_axes(name, attrs["axes"], x.ndim)
        acc = np.float64 if x.dtype.kind == "f" else np.int64
        with np.errstate(all="ignore"):
            if name in ("reduce_max", "reduce_min"):
                out = fn(x, axis=axes, keepdims=attrs["keepdims"])
            else:
                out = fn(x.astype(acc), axis=axes, keepdims=attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype)]

    return ref


for _name, (_allowed, _fn, _mps) in REDUCTIONS.items():
    _register(
        PrimOp(
            _name, ("x",), {"axes": Attr("ints"), "keepdims": Attr("bool", False)},
            _reduce_infer(_name), _reduce_ref(_name), "reduction", _mps, "12.0",
            "reduce.cpp: strided accumulate (f64 accumulators for floats)",
        )
    )  # fmt: skip


def _arg_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], NUMERIC)
        axis = normalize_axis(name, attrs["axis"], avals[0].ndim)
        if avals[0].ndim and avals[0].shape[axis] == 0:
            raise _fail(name, f"cannot reduce an empty axis of shape {avals[0].shape}")
        return [Aval(_reduce_shape(name, avals[0], (axis,), attrs["keepdims"]), "i64")]

    return rule


def _arg_ref(fn: Callable[..., np.ndarray]) -> Callable[..., list[np.ndarray]]:
    def ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = xs[0]
        if x.ndim == 0:
            return [np.zeros((), np.int64)]
        return [fn(x, axis=attrs["axis"], keepdims=attrs["keepdims"])]

    return ref


for _name, _fn, _mps in (
    ("argmax", np.argmax, "reductionArgMaximumWithTensor:axis:name:"),
    ("argmin", np.argmin, "reductionArgMinimumWithTensor:axis:name:"),
):
    _register(
        PrimOp(
            _name, ("x",), {"axis": Attr("int"), "keepdims": Attr("bool", False)},
            _arg_infer(_name), _arg_ref(_fn), "reduction", _mps, "12.0",
            "reduce.cpp: arg reduce (first occurrence, NaN wins)", props=frozenset({"GRAD_SINK"}),
        )
    )  # fmt: skip


def _axis_rows_infer(name: str, allowed: frozenset[str]) -> Callable[..., list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], allowed)
        normalize_axis(name, attrs["axis"], avals[0].ndim)
        return [avals[0]]

    return rule


def _softmax_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0].astype(np.float64)
    z = x - x.max(axis=attrs["axis"], keepdims=True)
    e = np.exp(z)
    return [e / e.sum(axis=attrs["axis"], keepdims=True)]


def _log_softmax_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0].astype(np.float64)
    z = x - x.max(axis=attrs["axis"], keepdims=True)
    return [z - np.log(np.exp(z).sum(axis=attrs["axis"], keepdims=True))]


def _cumsum_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0]
    if x.ndim == 0:
        return [np.zeros_like(x) if attrs["exclusive"] else x.copy()]
    axis = attrs["axis"]
    acc = np.float64 if x.dtype.kind == "f" else np.int64
    y = np.flip(x, axis) if attrs["reverse"] else x
    c = np.cumsum(y.astype(acc), axis=axis)
    if attrs["exclusive"]:
        c = c - y.astype(acc)
    if attrs["reverse"]:
        c = np.flip(c, axis)
    return [c.astype(x.dtype)]


for _name, _ref, _mps, _allowed, _kernel in (
    ("softmax", _softmax_ref, "softMaxWithTensor:axis:name:", FLOAT, "reduce.cpp: row softmax"),
    (
        "log_softmax", _log_softmax_ref,
        "softMaxWithTensor:axis:name: + logarithmWithTensor:name: (or reduction + subtraction)",
        FLOAT, "reduce.cpp: row log-softmax",
    ),
):  # fmt: skip
    _register(
        PrimOp(
            _name, ("x",), {"axis": Attr("int")}, _axis_rows_infer(_name, _allowed), _ref,
            "softmax", _mps, "12.0", _kernel,
        )
    )  # fmt: skip
_register(
    PrimOp(
        "cumsum", ("x",),
        {"axis": Attr("int"), "exclusive": Attr("bool", False), "reverse": Attr("bool", False)},
        _axis_rows_infer("cumsum", NUMERIC), _cumsum_ref, "reduction",
        "cumulativeSumWithTensor:axis:exclusive:reverse:name:", "13.0",
        "reduce.cpp: running sum along an axis",
    )
)  # fmt: skip


# --- shape ----------------------------------------------------------------------------------------
def _reshape_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    shape = attrs["shape"]
    if any(d < 0 for d in shape) or math.prod(shape) != math.prod(avals[0].shape):
        raise _fail("reshape", f"cannot reshape {avals[0].shape} to {shape}")
    return [Aval(shape, avals[0].dtype)]


def _transpose_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    perm = attrs["perm"]
    if sorted(perm) != list(range(avals[0].ndim)):
        raise _fail("transpose", f"perm {perm} is not a permutation of rank {avals[0].ndim}")
    return [Aval(tuple(avals[0].shape[p] for p in perm), avals[0].dtype)]


def _broadcast_to_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    shape = attrs["shape"]
    if len(shape) < avals[0].ndim or broadcast("broadcast_to", avals[0].shape, shape) != shape:
        raise _fail("broadcast_to", f"cannot broadcast {avals[0].shape} to {shape}")
    return [Aval(shape, avals[0].dtype)]


def _slice_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x = avals[0]
    starts, ends, strides = attrs["starts"], attrs["ends"], attrs["strides"]
    if not len(starts) == len(ends) == len(strides) == x.ndim:
        raise _fail("slice", f"starts/ends/strides need {x.ndim} entries each")
    shape = []
    for axis, (s, e, st, d) in enumerate(zip(starts, ends, strides, x.shape, strict=True)):
        if st < 1 or not 0 <= s <= e <= d:
            raise _fail("slice", f"axis {axis}: need 0 <= start <= end <= {d} and stride >= 1")
        shape.append((e - s + st - 1) // st)
    return [Aval(tuple(shape), x.dtype)]


def _slice_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    index = tuple(
        slice(s, e, st)
        for s, e, st in zip(attrs["starts"], attrs["ends"], attrs["strides"], strict=True)
    )
    return [xs[0][index]]


def _concat_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dtype = _same_dtype("concat", avals)
    first = avals[0]
    if first.ndim == 0:
        raise _fail("concat", "operands need rank >= 1")
    axis = normalize_axis("concat", attrs["axis"], first.ndim)
    for a in avals[1:]:
        if a.ndim != first.ndim or any(
            d != e for i, (d, e) in enumerate(zip(a.shape, first.shape, strict=True)) if i != axis
        ):
            raise _fail("concat", f"shapes {first.shape} and {a.shape} differ off axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return [Aval(tuple(shape), dtype)]


def _pad_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x, lo, hi = avals[0], attrs["low"], attrs["high"]
    if len(lo) != x.ndim or len(hi) != x.ndim or min((*lo, *hi), default=0) < 0:
        raise _fail("pad", f"low/high need {x.ndim} non-negative entries, got {lo} and {hi}")
    return [Aval(tuple(d + a + b for d, a, b in zip(x.shape, lo, hi, strict=True)), x.dtype)]


def _pad_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0]
    widths = list(zip(attrs["low"], attrs["high"], strict=True))
    return [np.pad(x, widths, constant_values=np.array(attrs["value"]).astype(x.dtype))]


_register(
    PrimOp(
        "reshape", ("x",), {"shape": Attr("ints")}, _reshape_infer,
        lambda xs, at: [xs[0].reshape(at["shape"])], "shape",
        "reshapeTensor:withShape:name:", "12.0", "shape.cpp: copy (alias-free)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "transpose", ("x",), {"perm": Attr("ints")}, _transpose_infer,
        lambda xs, at: [np.transpose(xs[0], at["perm"])], "shape",
        "transposeTensor:permutation:name:", "13.0", "shape.cpp: strided copy",
    )
)  # fmt: skip
_register(
    PrimOp(
        "broadcast_to", ("x",), {"shape": Attr("ints")}, _broadcast_to_infer,
        lambda xs, at: [np.broadcast_to(xs[0], at["shape"])], "shape",
        "broadcastTensor:toShape:name:", "12.0", "shape.cpp: strided copy (stride 0)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "slice", ("x",), {"starts": Attr("ints"), "ends": Attr("ints"), "strides": Attr("ints")},
        _slice_infer, _slice_ref, "shape",
        "sliceTensor:starts:ends:strides:name:", "12.0", "shape.cpp: strided copy",
    )
)  # fmt: skip
_register(
    PrimOp(
        "concat", ("xs",), {"axis": Attr("int")}, _concat_infer,
        lambda xs, at: [np.concatenate(xs, axis=at["axis"])], "shape",
        "concatTensors:dimension:name:", "12.0", "shape.cpp: block copies", variadic=True,
    )
)  # fmt: skip
_register(
    PrimOp(
        "pad", ("x",), {"low": Attr("ints"), "high": Attr("ints"), "value": Attr("float", 0.0)},
        _pad_infer, _pad_ref, "shape",
        "padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:", "12.0",
        "shape.cpp: fill + strided copy",
    )
)  # fmt: skip


# --- gather / scatter -----------------------------------------------------------------------------
def _index_check(op: str, idx: Aval) -> None:
    _need(op, idx, INT, "index")


def _gather_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x, idx = avals
    _index_check("gather", idx)
    axis = normalize_axis("gather", attrs["axis"], x.ndim)
    if x.ndim == 0:
        raise _fail("gather", "source needs rank >= 1")
    return [Aval((*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]), x.dtype)]


def _along_axis_check(op: str, x: Aval, idx: Aval, axis: int) -> int:
    _index_check(op, idx)
    if x.ndim == 0 or idx.ndim != x.ndim:
        raise _fail(op, f"index rank {idx.ndim} must equal source rank {x.ndim} (>= 1)")
    axis = normalize_axis(op, axis, x.ndim)
    for i, (d, e) in enumerate(zip(x.shape, idx.shape, strict=True)):
        if i != axis and d != e:
            raise _fail(op, f"index shape {idx.shape} must match {x.shape} off axis {axis}")
    return axis


def _gather_along_axis_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x, idx = avals
    _along_axis_check("gather_along_axis", x, idx, attrs["axis"])
    return [Aval(idx.shape, x.dtype)]


def _scatter_along_axis_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    data, idx, updates = avals
    _need("scatter_add_along_axis", data, NUMERIC)
    _same_dtype("scatter_add_along_axis", [data, updates])
    _along_axis_check("scatter_add_along_axis", data, idx, attrs["axis"])
    if updates.shape != idx.shape:
        raise _fail("scatter_add_along_axis", f"updates {updates.shape} != indices {idx.shape}")
    return [data]


def _scatter_add_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    data, idx, updates = avals
    _need("scatter_add", data, NUMERIC)
    _same_dtype("scatter_add", [data, updates])
    (gathered,) = _gather_infer([data, idx], attrs)
    if updates.shape != gathered.shape:
        raise _fail("scatter_add", f"updates shape {updates.shape} must be {gathered.shape}")
    return [data]


def _wrap_index(op: str, idx: np.ndarray, size: int) -> np.ndarray:
    if np.any((idx < -size) | (idx >= size)):
        raise IndexError(f"prim.{op}: index out of range for axis of size {size}")
    return np.where(idx < 0, idx + size, idx)


def _gather_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, idx = xs
    axis = attrs["axis"] % x.ndim
    return [np.take(x, _wrap_index("gather", idx, x.shape[axis]), axis=axis)]


def _gather_along_axis_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, idx = xs
    axis = attrs["axis"] % x.ndim
    return [np.take_along_axis(x, _wrap_index("gather_along_axis", idx, x.shape[axis]), axis)]


def _scatter_along_axis_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    data, idx, updates = xs
    axis = attrs["axis"] % data.ndim
    idx = _wrap_index("scatter_add_along_axis", idx, data.shape[axis])
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    out = data.copy()
    np.add.at(out, tuple(grid), updates)
    return [out]


def _scatter_add_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    data, idx, updates = xs
    axis = attrs["axis"] % data.ndim
    idx = _wrap_index("scatter_add", idx, data.shape[axis])
    out = np.moveaxis(data.copy(), axis, 0)
    moved = np.moveaxis(
        updates.reshape(*data.shape[:axis], idx.size, *data.shape[axis + 1 :]), axis, 0
    )
    np.add.at(out, idx.ravel(), moved)
    return [np.ascontiguousarray(np.moveaxis(out, 0, axis))]


for _name, _operands, _infer, _ref, _mps in (
    ("gather", ("x", "indices"), _gather_infer, _gather_ref,
     "gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:"),
    ("gather_along_axis", ("x", "indices"), _gather_along_axis_infer, _gather_along_axis_ref,
     "gatherAlongAxis:withUpdatesTensor:indicesTensor:name:"),
    ("scatter_add", ("data", "indices", "updates"), _scatter_add_infer, _scatter_add_ref,
     "scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name: (mode Add)"),
    ("scatter_add_along_axis", ("data", "indices", "updates"), _scatter_along_axis_infer,
     _scatter_along_axis_ref,
     "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name: (mode Add)"),
):  # fmt: skip
    _register(
        PrimOp(
            _name, _operands, {"axis": Attr("int")}, _infer, _ref, "gather", _mps,
            "12.3" if "AlongAxis" in _mps else "12.0",
            "shape.cpp: index walk with range check (IndexError)",
        )
    )  # fmt: skip


def _one_hot_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    idx = avals[0]
    _index_check("one_hot", idx)
    if attrs["depth"] < 0:
        raise _fail("one_hot", f"depth must be >= 0, got {attrs['depth']}")
    axis = attrs["axis"]
    if not -(idx.ndim + 1) <= axis <= idx.ndim:
        raise _fail("one_hot", f"axis {axis} out of range for rank {idx.ndim} + 1")
    axis %= idx.ndim + 1
    return [Aval((*idx.shape[:axis], attrs["depth"], *idx.shape[axis:]), attrs["dtype"])]


def _one_hot_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    idx = xs[0]
    depth = attrs["depth"]
    # Out-of-range indices give an all-zero row (MPSGraph and TensorFlow semantics).
    hot = (idx[..., None] == np.arange(depth)).astype(NUMPY_DTYPES[attrs["dtype"]])
    axis = attrs["axis"] % (idx.ndim + 1)
    return [np.moveaxis(hot, -1, axis)]


_register(
    PrimOp(
        "one_hot", ("indices",),
        {"depth": Attr("int"), "axis": Attr("int", -1), "dtype": Attr("dtype", "f32")},
        _one_hot_infer, _one_hot_ref, "gather",
        "oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:", "12.0",
        "shape.cpp: one_hot", props=frozenset({"GRAD_SINK"}),
    )
)  # fmt: skip


# --- convolution and pooling ----------------------------------------------------------------------
def _window(
    op: str, size: int, k: int, stride: int, dilation: int, lo: int, hi: int, axis: str
) -> int:
    span = dilation * (k - 1) + 1
    extent = size + lo + hi - span
    if extent < 0:
        raise _fail(op, f"window {span} larger than padded {axis} size {size + lo + hi}")
    return extent // stride + 1


def _conv_params(op: str, attrs: dict[str, Any]) -> None:
    if len(attrs["strides"]) != 2 or min(attrs["strides"]) < 1:
        raise _fail(op, f"strides must be 2 positive ints, got {attrs['strides']}")
    if len(attrs["dilation"]) != 2 or min(attrs["dilation"]) < 1:
        raise _fail(op, f"dilation must be 2 positive ints, got {attrs['dilation']}")
    if len(attrs["padding"]) != 4 or min(attrs["padding"]) < 0:
        raise _fail(op, f"padding must be 4 non-negative ints, got {attrs['padding']}")
    if attrs.get("groups", 1) < 1:
        raise _fail(op, f"groups must be >= 1, got {attrs['groups']}")


def conv_output_shape(
    op: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any]
) -> tuple[int, ...]:
    """NCHW output shape of conv2d; raises PrimError when x and w do not fit."""
    _conv_params(op, attrs)
    if len(x) != 4 or len(w) != 4:
        raise _fail(op, f"input and weight need rank 4 (NCHW, OIHW), got {x} and {w}")
    groups = attrs["groups"]
    n, c, h, wd = x
    o, cg, kh, kw = w
    if c != cg * groups or o % groups:
        raise _fail(op, f"channels do not fit groups={groups}: input {x}, weight {w}")
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    return (
        n,
        o,
        _window(op, h, kh, sh, dh, pt, pb, "height"),
        _window(op, wd, kw, sw, dw, pl, pr, "width"),
    )


_CONV_ATTRS = {
    "strides": Attr("ints", (1, 1)),
    "dilation": Attr("ints", (1, 1)),
    "padding": Attr("ints", (0, 0, 0, 0)),
    "groups": Attr("int", 1),
}


def _conv_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dtype = _same_dtype("conv2d", avals)
    _need("conv2d", avals[0], FLOAT)
    return [Aval(conv_output_shape("conv2d", avals[0].shape, avals[1].shape, attrs), dtype)]


def _conv_data_grad_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dy, w = avals
    dtype = _same_dtype("conv2d_data_grad", avals)
    _need("conv2d_data_grad", dy, FLOAT)
    x_shape = attrs["input_shape"]
    expect = conv_output_shape("conv2d_data_grad", x_shape, w.shape, attrs)
    if dy.shape != expect:
        raise _fail("conv2d_data_grad", f"gradient shape {dy.shape} must be {expect}")
    return [Aval(x_shape, dtype)]


def _conv_weights_grad_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x, dy = avals
    dtype = _same_dtype("conv2d_weights_grad", avals)
    _need("conv2d_weights_grad", x, FLOAT)
    w_shape = attrs["weight_shape"]
    expect = conv_output_shape("conv2d_weights_grad", x.shape, w_shape, attrs)
    if dy.shape != expect:
        raise _fail("conv2d_weights_grad", f"gradient shape {dy.shape} must be {expect}")
    return [Aval(w_shape, dtype)]


def _padded(x: np.ndarray, pads: Sequence[int], value: float = 0.0) -> np.ndarray:
    pt, pb, pl, pr = pads
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)


def _taps(attrs: dict[str, Any], kh: int, kw: int, ho: int, wo: int):
    """(i, j, row slice, col slice) of each kernel tap into the padded input."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs.get("dilation", (1, 1))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            yield i, j, rows, cols


def _conv_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w = (a.astype(np.float64) for a in xs)
    n, o, ho, wo = conv_output_shape("conv2d", x.shape, w.shape, attrs)
    g = attrs["groups"]
    xp = _padded(x, attrs["padding"])
    xp = xp.reshape(n, g, x.shape[1] // g, *xp.shape[2:])
    wg = w.reshape(g, o // g, *w.shape[1:])
    out = np.zeros((n, g, o // g, ho, wo))
    for i, j, rows, cols in _taps(attrs, w.shape[2], w.shape[3], ho, wo):
        out += np.einsum("ngchw,goc->ngohw", xp[:, :, :, rows, cols], wg[:, :, :, i, j])
    return [out.reshape(n, o, ho, wo)]


def _conv_data_grad_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    dy, w = (a.astype(np.float64) for a in xs)
    n, c, h, wd = attrs["input_shape"]
    g = attrs["groups"]
    _, o, ho, wo = dy.shape
    pt, pb, pl, pr = attrs["padding"]
    dxp = np.zeros((n, g, c // g, h + pt + pb, wd + pl + pr))
    dyg = dy.reshape(n, g, o // g, ho, wo)
    wg = w.reshape(g, o // g, *w.shape[1:])
    for i, j, rows, cols in _taps(attrs, w.shape[2], w.shape[3], ho, wo):
        dxp[:, :, :, rows, cols] += np.einsum("ngohw,goc->ngchw", dyg, wg[:, :, :, i, j])
    return [dxp[:, :, :, pt : pt + h, pl : pl + wd].reshape(n, c, h, wd)]


def _conv_weights_grad_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, dy = (a.astype(np.float64) for a in xs)
    o, cg, kh, kw = attrs["weight_shape"]
    g = attrs["groups"]
    n, _, ho, wo = dy.shape
    xp = _padded(x, attrs["padding"])
    xp = xp.reshape(n, g, cg, *xp.shape[2:])
    dyg = dy.reshape(n, g, o // g, ho, wo)
    dw = np.zeros((g, o // g, cg, kh, kw))
    for i, j, rows, cols in _taps(attrs, kh, kw, ho, wo):
        dw[:, :, :, i, j] = np.einsum("ngohw,ngchw->goc", dyg, xp[:, :, :, rows, cols])
    return [dw.reshape(o, cg, kh, kw)]


_register(
    PrimOp(
        "conv2d", ("x", "weight"), dict(_CONV_ATTRS), _conv_infer, _conv_ref, "convolution",
        "convolution2DWithSourceTensor:weightsTensor:descriptor:name:", "12.0",
        "linalg.cpp: im2col + sgemm per (image, group)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "conv2d_data_grad", ("grad", "weight"),
        {**_CONV_ATTRS, "input_shape": Attr("ints")}, _conv_data_grad_infer, _conv_data_grad_ref,
        "convolution",
        "convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:outputShape:"
        "forwardConvolutionDescriptor:name:", "12.0", "linalg.cpp: sgemm + col2im",
    )
)  # fmt: skip
_register(
    PrimOp(
        "conv2d_weights_grad", ("x", "grad"),
        {**_CONV_ATTRS, "weight_shape": Attr("ints")}, _conv_weights_grad_infer,
        _conv_weights_grad_ref, "convolution",
        "convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:outputShape:"
        "forwardConvolutionDescriptor:name:", "12.0", "linalg.cpp: im2col + sgemm",
    )
)  # fmt: skip


def _pool_params(op: str, attrs: dict[str, Any]) -> None:
    if len(attrs["kernel"]) != 2 or min(attrs["kernel"]) < 1:
        raise _fail(op, f"kernel must be 2 positive ints, got {attrs['kernel']}")
    _conv_params(op, {"dilation": (1, 1), **attrs})


def pool_output_shape(op: str, x: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    """NCHW output shape of a 2-D pooling window over ``x``."""
    _pool_params(op, attrs)
    if len(x) != 4:
        raise _fail(op, f"input needs rank 4 (NCHW), got {x}")
    (kh, kw), (sh, sw) = attrs["kernel"], attrs["strides"]
    (dh, dw), (pt, pb, pl, pr) = attrs.get("dilation", (1, 1)), attrs["padding"]
    return (
        x[0],
        x[1],
        _window(op, x[2], kh, sh, dh, pt, pb, "height"),
        _window(op, x[3], kw, sw, dw, pl, pr, "width"),
    )


_POOL_ATTRS = {
    "kernel": Attr("ints"),
    "strides": Attr("ints"),
    "padding": Attr("ints", (0, 0, 0, 0)),
}
_MAX_POOL_ATTRS = {**_POOL_ATTRS, "dilation": Attr("ints", (1, 1))}
_AVG_POOL_ATTRS = {**_POOL_ATTRS, "count_include_pad": Attr("bool", True)}


def _max_pool_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    _need("max_pool2d", avals[0], FLOAT)
    return [Aval(pool_output_shape("max_pool2d", avals[0].shape, attrs), avals[0].dtype)]


def _avg_pool_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    _need("avg_pool2d", avals[0], FLOAT)
    return [Aval(pool_output_shape("avg_pool2d", avals[0].shape, attrs), avals[0].dtype)]


def _max_pool_grad_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dy, x = avals
    _same_dtype("max_pool2d_grad", avals)
    _need("max_pool2d_grad", x, FLOAT)
    expect = pool_output_shape("max_pool2d_grad", x.shape, attrs)
    if dy.shape != expect:
        raise _fail("max_pool2d_grad", f"gradient shape {dy.shape} must be {expect}")
    return [x]


def _avg_pool_grad_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dy = avals[0]
    _need("avg_pool2d_grad", dy, FLOAT)
    expect = pool_output_shape("avg_pool2d_grad", attrs["input_shape"], attrs)
    if dy.shape != expect:
        raise _fail("avg_pool2d_grad", f"gradient shape {dy.shape} must be {expect}")
    return [Aval(attrs["input_shape"], dy.dtype)]


def _max_pool_windows(x: np.ndarray, attrs: dict[str, Any]):
    n, c, ho, wo = pool_output_shape("max_pool2d", x.shape, attrs)
    xp = _padded(x.astype(np.float64), attrs["padding"], -np.inf)
    kh, kw = attrs["kernel"]
    # taps in row-major window order: the first maximum wins ties, as in PyTorch.
    return np.stack([xp[:, :, r, c_] for _, _, r, c_ in _taps(attrs, kh, kw, ho, wo)])


def _max_pool_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [_max_pool_windows(xs[0], attrs).max(axis=0)]


def _max_pool_grad_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    dy, x = xs
    windows = _max_pool_windows(x, attrs)
    winner = windows.argmax(axis=0)
    n, c, h, w = x.shape
    pt, pb, pl, pr = attrs["padding"]
    kh, kw = attrs["kernel"]
    dxp = np.zeros((n, c, h + pt + pb, w + pl + pr))
    ho, wo = dy.shape[2:]
    for t, (_, _, rows, cols) in enumerate(_taps(attrs, kh, kw, ho, wo)):
        dxp[:, :, rows, cols] += np.where(winner == t, dy, 0.0)
    return [dxp[:, :, pt : pt + h, pl : pl + w]]


def _avg_divisor(x_shape: Sequence[int], attrs: dict[str, Any], ho: int, wo: int) -> np.ndarray:
    kh, kw = attrs["kernel"]
    if attrs["count_include_pad"]:
        return np.full((ho, wo), float(kh * kw))
    ones = _padded(np.ones((1, 1, *x_shape[2:])), attrs["padding"])
    count = sum(ones[0, 0, r, c] for _, _, r, c in _taps(attrs, kh, kw, ho, wo))
    return np.maximum(count, 1.0)


def _avg_pool_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0]
    n, c, ho, wo = pool_output_shape("avg_pool2d", x.shape, attrs)
    xp = _padded(x.astype(np.float64), attrs["padding"])
    kh, kw = attrs["kernel"]
    total = sum(xp[:, :, r, c_] for _, _, r, c_ in _taps(attrs, kh, kw, ho, wo))
    return [total / _avg_divisor(x.shape, attrs, ho, wo)]


def _avg_pool_grad_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    dy = xs[0].astype(np.float64)
    n, c, h, w = attrs["input_shape"]
    pt, pb, pl, pr = attrs["padding"]
    kh, kw = attrs["kernel"]
    ho, wo = dy.shape[2:]
    share = dy / _avg_divisor(attrs["input_shape"], attrs, ho, wo)
    dxp = np.zeros((n, c, h + pt + pb, w + pl + pr))
    for _, _, rows, cols in _taps(attrs, kh, kw, ho, wo):
        dxp[:, :, rows, cols] += share
    return [dxp[:, :, pt : pt + h, pl : pl + w]]


_register(
    PrimOp(
        "max_pool2d", ("x",), dict(_MAX_POOL_ATTRS), _max_pool_infer, _max_pool_ref, "pooling",
        "maxPooling2DWithSourceTensor:descriptor:name:", "12.0", "linalg.cpp: window max",
    )
)  # fmt: skip
_register(
    PrimOp(
        "max_pool2d_grad", ("grad", "x"), dict(_MAX_POOL_ATTRS), _max_pool_grad_infer,
        _max_pool_grad_ref, "pooling",
        "maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:", "12.0",
        "linalg.cpp: route to first window maximum",
    )
)  # fmt: skip
_register(
    PrimOp(
        "avg_pool2d", ("x",), dict(_AVG_POOL_ATTRS), _avg_pool_infer, _avg_pool_ref, "pooling",
        "avgPooling2DWithSourceTensor:descriptor:name:", "12.0", "linalg.cpp: window mean",
    )
)  # fmt: skip
_register(
    PrimOp(
        "avg_pool2d_grad", ("grad",), {**_AVG_POOL_ATTRS, "input_shape": Attr("ints")},
        _avg_pool_grad_infer, _avg_pool_grad_ref, "pooling",
        "avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:", "12.0",
        "linalg.cpp: spread window share",
    )
)  # fmt: skip


# --- factories and randomness -------------------------------------------------------------------
def _constant_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    shape = attrs["shape"]
    if any(d < 0 for d in shape):
        raise _fail("constant", f"negative dimension in shape {shape}")
    if len(attrs["value"]) not in (1, math.prod(shape)):
        raise _fail("constant", f"value needs 1 or {math.prod(shape)} entries")
    return [Aval(shape, attrs["dtype"])]


def _constant_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    values = np.array(attrs["value"], dtype=np.float64)
    dtype = NUMPY_DTYPES[attrs["dtype"]]
    return [
        np.broadcast_to(values.astype(dtype), math.prod(attrs["shape"])).reshape(attrs["shape"])
    ]


def _fill_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    if avals[0].shape != ():
        raise _fail("fill", f"value must be a scalar (shape ()), got {avals[0].shape}")
    if any(d < 0 for d in attrs["shape"]):
        raise _fail("fill", f"negative dimension in shape {attrs['shape']}")
    return [Aval(attrs["shape"], avals[0].dtype)]


_register(
    PrimOp(
        "constant", (), {"shape": Attr("ints"), "dtype": Attr("dtype"), "value": Attr("floats")},
        _constant_infer, _constant_ref, "factory",
        "constantWithScalar:shape:dataType: / constantWithData:shape:dataType:", "12.0",
        "runtime.cpp: materialised once at compile time", props=frozenset({"GRAD_SINK"}),
    )
)  # fmt: skip
_register(
    PrimOp(
        "fill", ("value",), {"shape": Attr("ints")}, _fill_infer,
        lambda xs, at: [np.full(at["shape"], xs[0])], "factory",
        "broadcastTensor:toShape:name: of a scalar", "12.0", "shape.cpp: broadcast copy",
    )
)  # fmt: skip

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox4x32(counter_lo: np.ndarray, key: int, counter_hi: int) -> np.ndarray:
    """Philox-4x32-10 on counters (lo64, hi64) under a 64-bit key; returns uint32 [n, 4]."""
    mask = np.uint64(0xFFFFFFFF)
    lo = counter_lo.astype(np.uint64)
    c = [lo & mask, lo >> np.uint64(32)]
    c += [np.full_like(lo, counter_hi & 0xFFFFFFFF), np.full_like(lo, counter_hi >> 32)]
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [
            ((p1 >> np.uint64(32)) ^ c[1] ^ k0) & mask,
            p1 & mask,
            ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & mask,
            p0 & mask,
        ]
        k0 = (k0 + np.uint64(PHILOX_W[0])) & mask
        k1 = (k1 + np.uint64(PHILOX_W[1])) & mask
    return np.stack(c, axis=-1).astype(np.uint32)


def random_words(state: np.ndarray, count: int) -> np.ndarray:
    """``count`` uint32 words from an int64[2] (key, counter) state: block i//4, lane i%4."""
    key, counter = (int(v) & 0xFFFFFFFFFFFFFFFF for v in np.asarray(state).reshape(2))
    blocks = (count + 3) // 4
    return philox4x32(np.arange(blocks, dtype=np.uint64), key, counter).ravel()[:count]


def _uniform01(state: np.ndarray, n: int, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return (random_words(state, n) >> np.uint32(8)).astype(np.float64) * 2.0**-24
    w = random_words(state, 2 * n).astype(np.uint64).reshape(n, 2)
    return ((w[:, 0] << np.uint64(21)) ^ (w[:, 1] >> np.uint64(11))).astype(np.float64) * 2.0**-53


def _random_uniform_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    n = math.prod(attrs["shape"])
    u = _uniform01(xs[0], n, attrs["dtype"])
    out = attrs["low"] + (attrs["high"] - attrs["low"]) * u
    return [out.reshape(attrs["shape"])]


def _random_normal_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    n = math.prod(attrs["shape"])
    pairs = (n + 1) // 2
    u = _uniform01(xs[0], 2 * pairs, attrs["dtype"]).reshape(pairs, 2)
    radius = np.sqrt(-2.0 * np.log(1.0 - u[:, 0]))
    theta = 2.0 * np.pi * u[:, 1]
    z = np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=-1).ravel()[:n]
    return [(attrs["mean"] + attrs["std"] * z).reshape(attrs["shape"])]


def _random_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        if avals[0].shape != (2,) or avals[0].dtype != "i64":
            raise _fail(name, f"state must be i64[2] (key, counter), got {avals[0]}")
        if attrs["dtype"] not in FLOAT:
            raise _fail(name, f"dtype must be f32 or f64, got {attrs['dtype']}")
        if any(d < 0 for d in attrs["shape"]):
            raise _fail(name, f"negative dimension in shape {attrs['shape']}")
        return [Aval(attrs["shape"], attrs["dtype"])]

    return rule


_register(
    PrimOp(
        "random_uniform", ("state",),
        {"shape": Attr("ints"), "dtype": Attr("dtype", "f32"), "low": Attr("float", 0.0),
         "high": Attr("float", 1.0)},
        _random_infer("random_uniform"), _random_uniform_ref, "random",
        "randomUniformTensorWithShape:stateTensor:name: (state adapted to MPSGraph's int32[7])",
        "12.3", "shape.cpp: Philox-4x32-10", props=frozenset({"RANDOM", "GRAD_SINK"}),
    )
)  # fmt: skip
_register(
    PrimOp(
        "random_normal", ("state",),
        {"shape": Attr("ints"), "dtype": Attr("dtype", "f32"), "mean": Attr("float", 0.0),
         "std": Attr("float", 1.0)},
        _random_infer("random_normal"), _random_normal_ref, "random",
        "randomTensorWithShape:descriptor:stateTensor:name: (normal descriptor)", "12.3",
        "shape.cpp: Philox-4x32-10 + Box-Muller", props=frozenset({"RANDOM", "GRAD_SINK"}),
    )
)  # fmt: skip


__all__ = [
    "ANY",
    "Attr",
    "Aval",
    "DTYPES",
    "ELEMENTWISE_OPS",
    "FLOAT",
    "INT",
    "NUMERIC",
    "NUMPY_DTYPES",
    "PRIM_OPS",
    "PrimError",
    "PrimOp",
    "dtype_of",
    "evaluate",
    "infer",
    "lookup",
]


_FAMILY_ORDER = (
    "unary", "binary", "select", "cast", "normalization", "linalg", "reduction", "softmax",
    "shape", "gather", "convolution", "pooling", "factory", "random",
)  # fmt: skip


def markdown_table() -> str:
    """The prim op table as markdown (docs/prim.md embeds it; a test keeps the two equal)."""

    def attrs_of(op: PrimOp) -> str:
        parts = []
        for name, spec in op.attrs.items():
            default = "" if spec.default is REQUIRED else f"={spec.default}"
            parts.append(f"{name}: {spec.kind}{default}")
        return ", ".join(parts)

    lines = [
        "| prim op | operands | attributes | MPSGraph method | min macOS | CPU kernel |",
        "|---|---|---|---|---|---|",
    ]
    ops = sorted(PRIM_OPS.values(), key=lambda o: (_FAMILY_ORDER.index(o.family), o.name))
    for op in ops:
        operands = ", ".join(op.operands) + ("..." if op.variadic else "")
        lines.append(
            f"| `{op.name}` | {operands} | {attrs_of(op)} | `{op.mps}` | {op.macos} "
            f"| {op.cpu_kernel} |"
        )
    return "\n".join(lines) + "\n"
