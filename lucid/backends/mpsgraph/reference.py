"""The reference builder: numpy, implementing each selector with MPSGraph's documented semantics.

It records the program like the recording builder and runs it by interpreting every call with the
rules of Apple's documentation (cited per rule in docs/backend-mpsgraph.md), not Lucid's:
reductions keep the reduced axes; arithmetic broadcasts right-aligned; integer division truncates
toward zero; convolution and pooling read their descriptors' X (width) / Y (height) fields and
explicit padding with NCHW data and OIHW weights; ``includeZeroPadToAverage`` defaults to NO;
argmax returns Int32; ``-1`` dims are resolved from the feeds at run time.

Half precision (Float16, BFloat16) is modelled as Apple's GPUs compute it: every call on half
tensors rounds its result to the half format once (an elementwise op computes in Float32, exact
for the inputs, and rounds: for + - * / and sqrt that is the correctly rounded half result), and
matrix multiplication, convolution and pooling accumulate in Float32 and round once. The calls
that accumulate a long sum (reductions, softmax, cumulative sums, normalization, scatter-add) are
refused on half tensors: Apple documents no accumulation type for them, so the emitter widens
their operands to Float32 itself, and a recording that forgot to is caught here.

Two kinds of failure mirror MPSGraph:

- :class:`MPSGraphAbort`: what makes MPSGraph abort the process (uncatchably): materializing a
  constant (or a broadcast, coordinate or reshape target) that carries a symbolic ``-1`` axis, and
  operand shapes that do not fit (e.g. a trace-time batch constant meeting another batch).
- :class:`UndefinedBehavior`: a call whose result Apple leaves undefined (integer division by zero,
  a float -> int cast of NaN or out of range). The emitter must never produce one, so the reference
  refuses instead of inventing a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from lucid.backends.mpsgraph import program as A
from lucid.ir import prim as P

__all__ = [
    "WIDENED_SELECTORS",
    "MPSGraphAbort",
    "ReferenceBuilder",
    "UndefinedBehavior",
    "is_float",
    "run_program",
]


class MPSGraphAbort(RuntimeError):
    """What would abort the process inside MPSGraph (raised here instead)."""


class UndefinedBehavior(ArithmeticError):
    """A call whose result MPSGraph leaves undefined."""


class ReferenceBuilder(A.RecordingBuilder):
    """Records the program; :meth:`run` executes it with numpy (MPSGraph semantics)."""

    def run(self, program: dict, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        return run_program(program, feeds)


def _arg(a: dict) -> Any:
    kind = next(k for k in a if k in A.ARG_KINDS)
    if kind == "double":
        return A.decode_double(a)
    if kind == "constant":
        return A.decode_constant(a)
    if kind == "dtype":
        return A.numpy_dtype(a["dtype"])
    if kind == "nil":
        return None
    if kind == "descriptor":
        return a
    return a[kind]


# Integer arithmetic whose overflow Apple does not document (MPSGraph's Int64 arithmetic has
# regressed across releases: PyTorch #78848, #195595).
_WRAPPING = {
    f"{name}WithPrimaryTensor:secondaryTensor:name:": fn
    for name, fn in (("addition", np.add), ("subtraction", np.subtract),
                     ("multiplication", np.multiply))
}  # fmt: skip


def _check_no_wrap(sel: str, args: list, out: Any) -> None:
    a, b = args[0], args[1]
    if a.dtype.kind != "i":
        return
    exact = _WRAPPING[sel](a.astype(object), b.astype(object))
    if np.any(np.asarray(exact != np.asarray(out).astype(object))):
        raise UndefinedBehavior(f"{sel} overflows {a.dtype} (wrap-around is undocumented)")


def _check_cast_fits(x: np.ndarray, out: np.ndarray) -> None:
    # An integer narrowed to a type that cannot hold it (Int64 -> Int32 overflow) is a case the
    # self-check calibrates on the device; Apple documents no wrap-around for it.
    if x.dtype.kind == "i" and out.dtype.kind == "i" and out.dtype.itemsize < x.dtype.itemsize:
        info = np.iinfo(out.dtype)
        if np.any((x < info.min) | (x > info.max)):
            raise UndefinedBehavior(f"cast of {x.dtype} to {out.dtype} overflows")


def run_program(
    program: dict,
    feeds: Sequence[np.ndarray],
    *,
    validated: bool = False,
    exact_integers: bool = False,
) -> list[np.ndarray]:
    """Run a recorded program on ``feeds`` (numpy arrays in placeholder order); ``validated``
    skips re-checking a program already checked by ``program.validate``. ``exact_integers``
    refuses integer addition, subtraction and multiplication that wrap, and integer casts to a
    narrower type that cannot hold the value (``UndefinedBehavior``):
    for emissions that must not rely on wrap-around (the Philox stream); a user's own integer
    arithmetic wraps as prim defines it."""
    if not validated:
        A.validate(program)
    phs = program["placeholders"]
    if len(feeds) != len(phs):
        raise ValueError(f"the program takes {len(phs)} feeds, got {len(feeds)}")
    env: dict[int, np.ndarray] = {}
    for i, (ph, f) in enumerate(zip(phs, feeds, strict=True)):
        _ranked(ph["shape"], f"placeholder {ph['id']}")
        arr = np.asarray(f)
        want = A.numpy_dtype(ph["dtype"])
        if arr.dtype != want:
            raise TypeError(f"feed {i} ({ph['role']}) has dtype {arr.dtype}, expected {want}")
        if len(arr.shape) != len(ph["shape"]) or any(
            d != -1 and d != n for d, n in zip(ph["shape"], arr.shape, strict=True)
        ):
            raise ValueError(
                f"feed {i} ({ph['role']}) has shape {arr.shape}, expected {ph['shape']}"
            )
        env[ph["id"]] = arr
    with np.errstate(all="ignore"):
        for call in program["calls"]:
            sel = call["selector"]
            args = []
            for a in call["args"]:
                if "tensor" in a:
                    args.append(env[a["tensor"]])
                elif "tensors" in a:
                    args.append([env[t] for t in a["tensors"]])
                else:
                    args.append(_arg(a))
            impl = _IMPL.get(sel)
            if impl is None:  # a selector added to the table without its semantics here
                raise A.ProgramError(f"the reference builder does not implement {sel}")
            try:
                out = _run_call(sel, impl, args)
                if exact_integers and sel in _WRAPPING:
                    _check_no_wrap(sel, args, out)
                if exact_integers and sel == "castTensor:toType:name:":
                    _check_cast_fits(args[0], out)
            except (MPSGraphAbort, UndefinedBehavior):
                raise
            except (ValueError, IndexError) as e:
                raise MPSGraphAbort(f"{sel}: {e}") from e
            outs = out if isinstance(out, list) else [out]
            for r, o in zip(call["results"], outs, strict=True):
                env[r] = np.asarray(o, order="C")  # (ascontiguousarray would make 0-d 1-d)
    return [env[t] for t in program["targets"]]


# --- half precision ------------------------------------------------------------------------------
_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_FLOATS = (np.dtype(np.float32), *_HALF)

# The calls that accumulate long sums: Apple documents no accumulation type for half tensors, and
# PyTorch's MPS backend casts Float16 input to Float32 before reductionSum, reductionProduct and
# meanOfTensor (ReduceOps.mm, reduction_out_mps), so the emitter widens their operands itself
# (emit.py, _widened) and the reference refuses them on half tensors.
WIDENED_SELECTORS = frozenset({
    "reductionSumWithTensor:axes:name:", "reductionProductWithTensor:axes:name:",
    "meanOfTensor:axes:name:", "varianceOfTensor:axes:name:", "softMaxWithTensor:axis:name:",
    "cumulativeSumWithTensor:axis:exclusive:reverse:name:",
    "normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:",
    "scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:",
    "scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:",
})  # fmt: skip
# Calls whose result type is an argument (the cast and the constants): they handle halves
# themselves instead of through the Float32 model.
_OWN_HALF_RULE = frozenset({"castTensor:toType:name:", "constantWithData:shape:dataType:"})


def is_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is one of MPSGraph's float types (BFloat16 is not numpy kind "f")."""
    return dt in _FLOATS


def _half_of(args: list) -> np.dtype | None:
    for a in args:
        for x in a if isinstance(a, list) else [a]:
            if isinstance(x, np.ndarray) and x.dtype in _HALF:
                return x.dtype
    return None


def _widen(a: Any) -> Any:
    if isinstance(a, list):
        return [_widen(x) for x in a]
    if isinstance(a, np.ndarray) and a.dtype in _HALF:
        return a.astype(np.float32)
    return a


def _run_call(sel: str, impl: Callable[..., Any], args: list) -> Any:
    """One call; on half tensors, computed in Float32 (exact for the inputs) and rounded once to
    the half format: per op for elementwise calls, after a Float32 accumulation for matrix
    multiplication, convolution and pooling."""
    half = _half_of(args)
    if half is None or sel in _OWN_HALF_RULE:
        return impl(*args)
    if sel in WIDENED_SELECTORS:
        raise UndefinedBehavior(
            f"{sel} on {half}: Apple documents no accumulation type for half tensors (the "
            "emitter widens its operands to Float32)"
        )
    out = impl(*_widen(args))

    def narrow(o: Any) -> Any:
        o = np.asarray(o)
        return o.astype(half) if o.dtype == np.float32 else o

    return [narrow(o) for o in out] if isinstance(out, list) else narrow(out)


# --- the semantics of each selector ------------------------------------------------------------
_IMPL: dict[str, Callable[..., Any]] = {}


def _impl(selector: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _IMPL[selector] = fn
        return fn

    return register


def _ranked(dims: list[int], what: str) -> list[int]:
    # Apple documents no empty MPSShape (nil is unranked, -1 a dynamic dim) and PyTorch never
    # makes one (OperationUtils.mm, getMPSShape maps 0-d to @[@1]): the emitter spells rank 0 as
    # [1], and the reference refuses @[] so an emission that relies on it fails on Linux.
    if len(dims) == 0:
        raise MPSGraphAbort(f"{what}: an empty shape @[] (rank 0) is undocumented; use [1]")
    return dims


def _static(dims: list[int], what: str) -> tuple[int, ...]:
    _ranked(dims, what)
    if any(d == -1 for d in dims):
        raise MPSGraphAbort(f"{what} materializes a shape {dims} that carries a symbolic axis")
    return tuple(dims)


@_impl("constantWithScalar:shape:dataType:")
def _constant_scalar(value: float, dims: list[int], dt: np.dtype) -> np.ndarray:
    shape = _static(dims, "constantWithScalar:shape:dataType:")
    return np.full(shape, _scalar_as(value, dt), dtype=dt)


def _scalar_as(value: float, dt: np.dtype) -> Any:
    if dt == np.bool_:
        return value != 0
    if dt in _HALF and not math.isnan(value) and float(np.asarray(value).astype(dt)) != value:
        # Whether MPSGraph rounds the double once or through float is undocumented: the emitter
        # writes half constants already rounded (emit.py, _Ctx.const).
        raise UndefinedBehavior(f"scalar {value!r} is not exactly a {dt}")
    if dt.kind == "i":
        info = np.iinfo(dt)
        if math.isnan(value) or not info.min <= value <= info.max:
            raise UndefinedBehavior(f"scalar {value} does not fit {dt}")
        return int(value)
    return value


@_impl("constantWithData:shape:dataType:")
def _constant_data(data: np.ndarray, dims: list[int], dt: np.dtype) -> np.ndarray:
    shape = _static(dims, "constantWithData:shape:dataType:")
    if data.size != math.prod(shape) or data.dtype != dt:
        raise MPSGraphAbort(f"constant data {data.shape} {data.dtype} vs shape {shape} {dt}")
    return data.reshape(shape)


@_impl("coordinateAlongAxis:withShape:name:")
def _coordinate(axis: int, dims: list[int], _name: None) -> np.ndarray:
    shape = _static(dims, "coordinateAlongAxis:withShape:name:")
    return np.indices(shape, dtype=np.int32)[axis % len(shape)]


def _erf(x: np.ndarray) -> np.ndarray:
    return P._elementwise._erf(x)


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": np.array,
    "negative": np.negative,
    "absolute": np.abs,
    "sign": np.sign,
    "square": np.square,
    "exponent": np.exp,
    "logarithm": np.log,
    "squareRoot": np.sqrt,
    "reverseSquareRoot": lambda x: np.reciprocal(np.sqrt(x)),
    "reciprocal": np.reciprocal,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "sigmoid": lambda x: np.reciprocal(np.exp(-x) + np.ones((), x.dtype)),
    "erf": _erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "rint": np.rint,  # ties to even
    "not": np.logical_not,
    "isNaN": np.isnan,
    "isInfinite": np.isinf,
    "isFinite": np.isfinite,
    "truncate": np.trunc,
}


# signWithTensor on Int64 is "not implemented in MPS" (PyTorch UnaryOps.mm, sign_out_mps, which
# clamps instead), and the unary family has aborted with "kernel not found" on integer types
# (PyTorch #84995): the reference refuses sign on integers (reLU is not emitted at all).
_FLOAT_ONLY_UNARY = {"sign"}


def _make_unary(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, _name: None) -> np.ndarray:
        if name in _FLOAT_ONLY_UNARY and not is_float(x.dtype):
            raise MPSGraphAbort(f"{name}WithTensor on {x.dtype}: no integer kernel")
        out = np.asarray(fn(x))
        return out if out.dtype == np.bool_ else out.astype(x.dtype, copy=False)

    return run


for _name, _fn in _UNARY.items():
    _IMPL[f"{_name}WithTensor:name:"] = _make_unary(_name, _fn)


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Apple documents nothing about integer division; PyTorch divides integers through Float32
    # (BinaryOps.mm, div_mode_template), inexact above 2**24. The reference does the same (the
    # Float32 quotient truncated, saturated to the type), so an emission relying on exact
    # integer division fails here.
    if np.any(b == 0):
        raise UndefinedBehavior("integer division by zero")
    q = np.trunc(a.astype(np.float32) / b.astype(np.float32)).astype(np.float64)
    info = np.iinfo(a.dtype)
    q = np.clip(q, float(info.min), float(info.max))
    return np.where(q >= float(info.max), info.max, q.astype(a.dtype)).astype(a.dtype)


def _division(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _int_divide(a, b) if a.dtype.kind == "i" else np.divide(a, b)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "addition": np.add,
    "subtraction": np.subtract,
    "multiplication": np.multiply,
    "division": _division,
    "power": np.power,
    "atan2": np.arctan2,
    # Apple does not say what the plain variants do with NaN; the reference ignores NaN (fmax), so
    # an emission that needed propagation is caught by the tests.
    "maximum": lambda a, b: np.fmax(a, b) if is_float(a.dtype) else np.maximum(a, b),
    "minimum": lambda a, b: np.fmin(a, b) if is_float(a.dtype) else np.minimum(a, b),
    "maximumWithNaNPropagation": np.maximum,
    "minimumWithNaNPropagation": np.minimum,
    "equal": np.equal,
    "notEqual": np.not_equal,
    "lessThan": np.less,
    "lessThanOrEqualTo": np.less_equal,
    "greaterThan": np.greater,
    "greaterThanOrEqualTo": np.greater_equal,
    "logicalAND": np.logical_and,
    "logicalOR": np.logical_or,
    "logicalXOR": np.logical_xor,
    "bitwiseAND": np.bitwise_and,
    "bitwiseXOR": np.bitwise_xor,
    "bitwiseRightShift": np.right_shift,  # arithmetic on signed types
}


def _same_dtype(sel: str, *xs: np.ndarray) -> None:
    if len({x.dtype for x in xs}) != 1:
        raise MPSGraphAbort(f"{sel}: operand dtypes differ: {[str(x.dtype) for x in xs]}")


def _make_binary(name: str, fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray, _name: None) -> np.ndarray:
        _same_dtype(name, a, b)
        np.broadcast_shapes(a.shape, b.shape)  # right-aligned, as numpy
        out = np.asarray(fn(a, b))
        return out if out.dtype == np.bool_ else out.astype(a.dtype, copy=False)

    return run


for _name, _fn in _BINARY.items():
    _IMPL[f"{_name}WithPrimaryTensor:secondaryTensor:name:"] = _make_binary(_name, _fn)


@_impl("selectWithPredicateTensor:truePredicateTensor:falsePredicateTensor:name:")
def _select(pred: np.ndarray, a: np.ndarray, b: np.ndarray, _name: None) -> np.ndarray:
    _same_dtype("select", a, b)
    if pred.dtype != np.bool_:
        raise MPSGraphAbort(f"select: the predicate must be Bool, got {pred.dtype}")
    return np.where(pred, a, b)


@_impl("clampWithTensor:minValueTensor:maxValueTensor:name:")
def _clamp(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, _name: None) -> np.ndarray:
    _same_dtype("clamp", x, lo, hi)
    return np.minimum(np.maximum(x, lo), hi).astype(x.dtype)


@_impl("castTensor:toType:name:")
def _cast(x: np.ndarray, dt: np.dtype, _name: None) -> np.ndarray:
    # Float -> float casts round to nearest even (numpy's and ml_dtypes' conversions; a Float16
    # or BFloat16 value is exact in Float32, so the result is the one rounding of the value).
    # Integers reach a half type through Float32 (a GPU converts through float; Apple documents
    # no direct conversion): for BFloat16 and |x| > 2**24 that may round twice, one unit apart.
    x = _widen(x)
    if dt in _HALF and x.dtype.kind in "iub":
        x = x.astype(np.float32)
    if dt == np.bool_:
        return x != 0
    if is_float(x.dtype) and dt.kind == "i":
        info = np.iinfo(dt)
        bad = np.isnan(x) | (x < info.min) | (x >= float(info.max) + 1)
        if np.any(bad):
            raise UndefinedBehavior(f"cast of {x[bad].ravel()[:3]} to {dt} is undefined")
        return np.trunc(x).astype(dt)
    return x.astype(dt)  # integer narrowing wraps (two's complement)


@_impl("normalizationWithTensor:meanTensor:varianceTensor:gammaTensor:betaTensor:epsilon:name:")
def _normalization(x, mean, var, gamma, beta, eps: float, _name: None) -> np.ndarray:
    _same_dtype("normalization", x, mean, var, gamma, beta)
    eps32 = np.float32(eps)  # the epsilon parameter is a float
    return ((x - mean) / np.sqrt(var + eps32) * gamma + beta).astype(x.dtype)


@_impl("matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:")
def _matmul(a: np.ndarray, b: np.ndarray, _name: None) -> np.ndarray:
    _same_dtype("matrixMultiplication", a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise MPSGraphAbort(f"matrixMultiplication needs rank >= 2, got {a.shape} and {b.shape}")
    return np.matmul(a, b)


@_impl("transposeTensor:dimension:withDimension:name:")
def _swap(x: np.ndarray, d0: int, d1: int, _name: None) -> np.ndarray:
    return np.swapaxes(x, d0, d1)


@_impl("transposeTensor:permutation:name:")
def _permute(x: np.ndarray, perm: list[int], _name: None) -> np.ndarray:
    return np.transpose(x, perm)


def _make_reduction(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, axes: list[int], _name: None) -> np.ndarray:
        out = fn(x, axis=tuple(axes), keepdims=True)  # MPSGraph keeps reduced axes (size 1)
        return np.asarray(out).astype(x.dtype, copy=False)

    return run


for _sel, _fn in {
    "reductionSumWithTensor:axes:name:": np.sum,
    "reductionProductWithTensor:axes:name:": np.prod,
    "reductionMaximumWithTensor:axes:name:": lambda x, **k: np.fmax.reduce(x, **k),
    "reductionMinimumWithTensor:axes:name:": lambda x, **k: np.fmin.reduce(x, **k),
    "reductionMaximumPropagateNaNWithTensor:axes:name:": np.max,
    "reductionMinimumPropagateNaNWithTensor:axes:name:": np.min,
    "reductionAndWithTensor:axes:name:": np.all,
    "meanOfTensor:axes:name:": np.mean,
    "varianceOfTensor:axes:name:": np.var,  # population variance
}.items():
    _IMPL[_sel] = _make_reduction(_fn)


# MPSGraph's arg reductions skip NaN: PyTorch #130295 (argmax of [.., nan at 5, ..] is 3 on
# MPS, 5 on the CPU), fixed in PyTorch by a NaN mask and a select (PR 187039). The reference
# skips NaN likewise (an all-NaN row gives 0), so an emission relying on NaN winning fails here.
@_impl("reductionArgMaximumWithTensor:axis:name:")
def _argmax(x: np.ndarray, axis: int, _name: None) -> np.ndarray:
    if is_float(x.dtype):
        x = np.where(np.isnan(x), -np.inf, x)
    return np.argmax(x, axis=axis, keepdims=True).astype(np.int32)


@_impl("reductionArgMinimumWithTensor:axis:name:")
def _argmin(x: np.ndarray, axis: int, _name: None) -> np.ndarray:
    if is_float(x.dtype):
        x = np.where(np.isnan(x), np.inf, x)
    return np.argmin(x, axis=axis, keepdims=True).astype(np.int32)


@_impl("argSortWithTensor:axis:descending:name:")
def _argsort(x: np.ndarray, axis: int, descending: bool, _name: None) -> np.ndarray:
    # Documented for Int32, Float16 and Float32 (PyTorch OperationUtils.mm castToIHFTypes, radar
    # 104398441); on Int64 it returns zeros or garbage past 256 elements since macOS 15.4 (PyTorch
    # #155560, confirmed by Apple). Stability and NaN placement are undocumented (PyTorch
    # #86750, #116567). The reference refuses the first two and orders ties last position
    # first (a legal unstable order), so an emission relying on any of it fails here.
    if x.dtype not in (np.int32, np.float32):
        raise UndefinedBehavior(f"argSortWithTensor on {x.dtype} (documented: Int32, Float32)")
    if is_float(x.dtype) and np.isnan(x).any():
        raise UndefinedBehavior("argSortWithTensor: where NaN sorts is undocumented")
    flipped = np.flip(x, axis)
    order = np.argsort(-flipped if descending else flipped, axis=axis, kind="stable")
    return ((x.shape[axis] - 1) - order).astype(np.int32)


@_impl("softMaxWithTensor:axis:name:")
def _softmax(x: np.ndarray, axis: int, _name: None) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


@_impl("cumulativeSumWithTensor:axis:exclusive:reverse:name:")
def _cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, _name: None) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        out = out - y
    return np.flip(out, axis) if reverse else out


@_impl("reshapeTensor:withShape:name:")
def _reshape(x: np.ndarray, dims: list[int], _name: None) -> np.ndarray:
    _ranked(dims, "reshapeTensor:withShape:name:")
    if dims.count(-1) > 1:
        raise MPSGraphAbort(f"reshape to {dims}: at most one -1 can be inferred")
    return x.reshape(dims)


@_impl("broadcastTensor:toShape:name:")
def _broadcast(x: np.ndarray, dims: list[int], _name: None) -> np.ndarray:
    return np.broadcast_to(x, _static(dims, "broadcastTensor:toShape:name:")).copy()


@_impl("sliceTensor:starts:ends:strides:startMask:endMask:squeezeMask:name:")
def _slice(x, starts, ends, strides, start_mask, end_mask, squeeze_mask, _name) -> np.ndarray:
    if squeeze_mask:
        raise MPSGraphAbort("the reference implements squeezeMask 0 only")
    index = []
    for i, d in enumerate(x.shape):
        s = 0 if start_mask >> i & 1 else starts[i]
        e = d if end_mask >> i & 1 else ends[i]
        if strides[i] <= 0:
            raise MPSGraphAbort(f"slice stride {strides[i]} on axis {i}")
        index.append(slice(s, e, strides[i]))
    return x[tuple(index)]


@_impl("concatTensors:dimension:name:")
def _concat(xs: list[np.ndarray], axis: int, _name: None) -> np.ndarray:
    _same_dtype("concat", *xs)
    return np.concatenate(xs, axis=axis)


@_impl("stackTensors:axis:name:")
def _stack(xs: list[np.ndarray], axis: int, _name: None) -> np.ndarray:
    _same_dtype("stack", *xs)
    return np.stack(xs, axis=axis)


@_impl("padTensor:withPaddingMode:leftPadding:rightPadding:constantValue:name:")
def _pad(x, mode: str, left: list[int], right: list[int], value: float, _name) -> np.ndarray:
    if mode != "MPSGraphPaddingModeConstant":
        raise MPSGraphAbort(f"the reference implements constant padding only, not {mode}")
    return np.pad(
        x, list(zip(left, right, strict=True)), constant_values=_scalar_as(value, x.dtype)
    )


def _indices(idx: np.ndarray) -> np.ndarray:
    if idx.dtype.kind != "i":
        raise MPSGraphAbort(f"indices must be an integer tensor, got {idx.dtype}")
    return idx


# Out-of-range indices are unspecified in Apple's documentation; the reference clamps them (the
# emitter adds a range check whose failure makes the run raise IndexError anyway).
@_impl("gatherWithUpdatesTensor:indicesTensor:axis:batchDimensions:name:")
def _gather(x: np.ndarray, idx: np.ndarray, axis: int, batch: int, _name: None) -> np.ndarray:
    if batch:
        raise MPSGraphAbort("the reference implements batchDimensions 0 only")
    return np.take(x, _indices(idx), axis=axis, mode="clip")


@_impl("gatherAlongAxis:withUpdatesTensor:indicesTensor:name:")
def _gather_along(axis: int, x: np.ndarray, idx: np.ndarray, _name: None) -> np.ndarray:
    idx = np.clip(_indices(idx), 0, x.shape[axis] - 1)
    return np.take_along_axis(x, idx, axis=axis)


@_impl("scatterWithDataTensor:updatesTensor:indicesTensor:axis:mode:name:")
def _scatter(data, updates, idx, axis: int, mode: str, _name) -> np.ndarray:
    if mode != "MPSGraphScatterModeAdd" or _indices(idx).ndim != 1:
        raise MPSGraphAbort(f"the reference implements Add with 1-D indices, got {mode}")
    _same_dtype("scatter", data, updates)
    out = data.copy()
    idx = np.clip(idx, 0, data.shape[axis] - 1)
    np.add.at(out, (slice(None),) * axis + (idx,), updates)
    return out


@_impl("scatterAlongAxis:withDataTensor:updatesTensor:indicesTensor:mode:name:")
def _scatter_along(axis: int, data, updates, idx, mode: str, _name) -> np.ndarray:
    if mode != "MPSGraphScatterModeAdd":
        raise MPSGraphAbort(f"the reference implements Add only, got {mode}")
    _same_dtype("scatterAlongAxis", data, updates)
    out = data.copy()
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = np.clip(_indices(idx), 0, data.shape[axis] - 1)
    np.add.at(out, tuple(grid), updates)
    return out


@_impl("oneHotWithIndicesTensor:depth:axis:dataType:onValue:offValue:name:")
def _one_hot(idx, depth: int, axis: int, dt: np.dtype, on: float, off: float, _name) -> np.ndarray:
    hot = _indices(idx)[..., None] == np.arange(depth)  # outside [0, depth): all off
    out = np.where(hot, _scalar_as(on, dt), _scalar_as(off, dt)).astype(dt)
    return np.moveaxis(out, -1, axis)


def _check_layouts(fields: dict, weights: bool) -> None:
    if fields["dataLayout"] != "MPSGraphTensorNamedDataLayoutNCHW" or (
        weights and fields["weightsLayout"] != "MPSGraphTensorNamedDataLayoutOIHW"
    ):
        raise MPSGraphAbort("the reference implements NCHW data and OIHW weights only")
    if fields["paddingStyle"] != "MPSGraphPaddingStyleExplicit":
        raise MPSGraphAbort("the reference implements MPSGraphPaddingStyleExplicit only")


def _conv_attrs(desc: dict) -> dict[str, Any]:
    """Descriptor fields as (height, width) pairs: X is the width axis, Y the height axis."""
    f = desc["fields"]
    _check_layouts(f, weights=True)
    return {
        "strides": (f["strideInY"], f["strideInX"]),
        "dilation": (f["dilationRateInY"], f["dilationRateInX"]),
        "padding": (f["paddingTop"], f["paddingBottom"], f["paddingLeft"], f["paddingRight"]),
        "groups": f["groups"],
    }


def _pool_attrs(desc: dict, *, dilation: bool) -> dict[str, Any]:
    f = desc["fields"]
    _check_layouts(f, weights=False)
    if f.get("ceilMode", False):
        raise MPSGraphAbort("the reference implements ceilMode NO only")
    attrs: dict[str, Any] = {
        "kernel": (f["kernelHeight"], f["kernelWidth"]),
        "strides": (f["strideInY"], f["strideInX"]),
        "padding": (f["paddingTop"], f["paddingBottom"], f["paddingLeft"], f["paddingRight"]),
    }
    if dilation:
        attrs["dilation"] = (f["dilationRateInY"], f["dilationRateInX"])
    elif (f["dilationRateInY"], f["dilationRateInX"]) != (1, 1):
        raise MPSGraphAbort("the reference implements undilated average pooling only")
    return attrs


def _nchw(op: str, *xs: np.ndarray) -> None:
    if any(x.ndim != 4 for x in xs):
        raise MPSGraphAbort(f"{op}: NCHW tensors must be rank 4, got {[x.shape for x in xs]}")
    _same_dtype(op, *xs)


@_impl("convolution2DWithSourceTensor:weightsTensor:descriptor:name:")
def _conv2d(x, w, desc, _name) -> np.ndarray:
    _nchw("convolution2D", x, w)
    return P.evaluate("conv2d", [x, w], _conv_attrs(desc))[0]


@_impl(
    "convolution2DDataGradientWithIncomingGradientTensor:weightsTensor:outputShape:"
    "forwardConvolutionDescriptor:name:"
)
def _conv2d_data_grad(grad, w, dims, desc, _name) -> np.ndarray:
    _nchw("convolution2DDataGradient", grad, w)
    shape = [grad.shape[0] if d == -1 else d for d in dims]  # -1: resolved from the gradient
    attrs = {**_conv_attrs(desc), "input_shape": tuple(shape)}
    return P.evaluate("conv2d_data_grad", [grad, w], attrs)[0]


@_impl(
    "convolution2DWeightsGradientWithIncomingGradientTensor:sourceTensor:outputShape:"
    "forwardConvolutionDescriptor:name:"
)
def _conv2d_weights_grad(grad, x, dims, desc, _name) -> np.ndarray:
    _nchw("convolution2DWeightsGradient", grad, x)
    attrs = {**_conv_attrs(desc), "weight_shape": tuple(_static(dims, "weights gradient"))}
    return P.evaluate("conv2d_weights_grad", [x, grad], attrs)[0]


@_impl("maxPooling2DWithSourceTensor:descriptor:name:")
def _max_pool(x, desc, _name) -> np.ndarray:
    _nchw("maxPooling2D", x)
    return P.evaluate("max_pool2d", [x], _pool_attrs(desc, dilation=True))[0]


@_impl("maxPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:")
def _max_pool_grad(grad, x, desc, _name) -> np.ndarray:
    _nchw("maxPooling2DGradient", grad, x)
    return P.evaluate("max_pool2d_grad", [grad, x], _pool_attrs(desc, dilation=True))[0]


def _avg_attrs(desc: dict) -> dict[str, Any]:
    attrs = _pool_attrs(desc, dilation=False)
    attrs["count_include_pad"] = bool(desc["fields"].get("includeZeroPadToAverage", False))
    return attrs


@_impl("avgPooling2DWithSourceTensor:descriptor:name:")
def _avg_pool(x, desc, _name) -> np.ndarray:
    _nchw("avgPooling2D", x)
    return P.evaluate("avg_pool2d", [x], _avg_attrs(desc))[0]


@_impl("avgPooling2DGradientWithGradientTensor:sourceTensor:descriptor:name:")
def _avg_pool_grad(grad, x, desc, _name) -> np.ndarray:
    _nchw("avgPooling2DGradient", grad, x)
    attrs = {**_avg_attrs(desc), "input_shape": tuple(x.shape)}
    return P.evaluate("avg_pool2d_grad", [grad], attrs)[0]


# The selectors the reference implements (a test holds it equal to the selector table, the
# placeholders aside).
IMPLEMENTED_SELECTORS = frozenset(_IMPL)
