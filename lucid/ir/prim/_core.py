"""Types, attribute checking, shared shape helpers and the registry of prim ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lucid._dtype import BFloat16Table
from lucid.ir.prim._half import HALF, HALF_NUMPY, to_half, widen_half

DTYPES = ("f32", "f64", "f16", "bf16", "i32", "i64", "bool")
FLOAT = frozenset({"f32", "f64"}) | HALF
INT = frozenset({"i32", "i64"})
NUMERIC = FLOAT | INT
ANY = frozenset(DTYPES)
NUMPY_DTYPES = BFloat16Table(  # bf16's (ml_dtypes') is looked up on first use
    {
        "f32": np.dtype(np.float32),
        "f64": np.dtype(np.float64),
        **HALF_NUMPY,
        "i32": np.dtype(np.int32),
        "i64": np.dtype(np.int64),
        "bool": np.dtype(np.bool_),
    },
    name="bf16",
)
_FROM_NUMPY = BFloat16Table({v: k for k, v in NUMPY_DTYPES.items()}, value="bf16")


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
    """An attribute: kind is int, ints, float, floats, bool, dtype (a dtype name) or str."""

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
    # The native kernel's source file; how MPSGraph runs the op its backend states itself.
    cpu_kernel: str
    variadic: bool = False
    elementwise: bool = False
    props: frozenset[str] = field(default_factory=frozenset)


PRIM_OPS: dict[str, PrimOp] = {}
# Ops that carry their decomposition into PRIM_OPS (``composite.py``); lookup finds both.
COMPOSITE_OPS: dict[str, PrimOp] = {}


def _fail(op: str, message: str) -> PrimError:
    return PrimError(f"prim.{op}: {message}")


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):  # a 0-d value has axis 0 (or -1), as in torch
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
    def bad() -> PrimError:
        # Built only on failure: the repr of a constant's value costs as much as the value.
        return _fail(op, f"attribute {name!r} must be {kind}, got {value!r}")

    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise bad()
        return int(value)
    if kind == "bool":
        if not isinstance(value, bool | np.bool_):
            raise bad()
        return bool(value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise bad()
        return float(value)
    if kind == "ints":
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
        ):
            raise bad()
        return tuple(int(v) for v in value)
    if kind == "floats":
        if not isinstance(value, list | tuple | np.ndarray):
            raise bad()
        return tuple(float(v) for v in np.asarray(value, dtype=np.float64).ravel())
    if kind == "dtype":
        if value not in DTYPES:
            raise bad()
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise bad()
        return value
    raise AssertionError(kind)


def infer(name: str, avals: Sequence[Aval], attrs: dict[str, Any]) -> list[Aval]:
    """Output avals of prim op ``name``; raises PrimError naming the problem."""
    op = lookup(name)
    return infer_checked(op, avals, check_attrs(op, attrs))


def infer_checked(op: PrimOp, avals: Sequence[Aval], full: dict[str, Any]) -> list[Aval]:
    """``infer`` for attributes ``check_attrs`` already returned (``full``): not checked again."""
    if op.variadic:
        if len(avals) < 1:
            raise _fail(op.name, "needs at least one operand")
    elif len(avals) != len(op.operands):
        raise _fail(op.name, f"takes {len(op.operands)} operand(s), got {len(avals)}")
    return op.infer(list(avals), full)


def evaluate(name: str, arrays: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """Run the numpy reference of ``name`` and check its outputs against the rule.

    Half precision: unless the op is ``HALF_AWARE``, an op on half values is its float32 op
    followed by a cast: the reference runs on half operands widened to float32 (a half ``dtype``
    attribute reads as f32), each half result is its float32 result rounded once to the storage
    type (``lucid.ir.prim._half``)."""
    op = lookup(name)
    full = check_attrs(op, attrs)
    in_avals = [Aval(tuple(a.shape), dtype_of(a)) for a in arrays]
    avals = infer(name, in_avals, full)
    arrays = [np.asarray(a) for a in arrays]
    aware = "HALF_AWARE" in op.props
    if not aware and any(a.dtype in HALF for a in (*in_avals, *avals)):
        arrays = [widen_half(a) for a in arrays]
        full = {
            k: "f32" if op.attrs[k].kind == "dtype" and v in HALF else v for k, v in full.items()
        }
    outs = op.reference(arrays, full)
    result = []
    for aval, out in zip(avals, outs, strict=True):
        out = np.asarray(out)
        assert out.shape == aval.shape, (name, out.shape, aval.shape)
        if aval.dtype in HALF:
            out = to_half(out if aware else out.astype(np.float32), aval.dtype)
        result.append(np.array(out, dtype=NUMPY_DTYPES[aval.dtype], order="C"))
    return result


def lookup(name: str) -> PrimOp:
    op = PRIM_OPS.get(name) or COMPOSITE_OPS.get(name)
    if op is None:
        raise PrimError(f"unknown prim op {name!r}")
    return op


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
