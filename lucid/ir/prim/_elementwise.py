"""Elementwise prim ops: unary, binary (broadcasting), select, cast, normalize."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    ANY,
    FLOAT,
    HALF,
    NUMERIC,
    NUMPY_DTYPES,
    PRIM_OPS,
    Attr,
    Aval,
    PrimOp,
    _need,
    _register,
    _same_dtype,
    broadcast,
)
from lucid.ir.prim._half import to_half, widen_half


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
# name -> (allowed input dtypes, output dtype or None for "same", numpy function)
UNARY: dict[str, tuple[frozenset[str], str | None, Callable[[np.ndarray], np.ndarray]]] = {
    "neg": (NUMERIC, None, np.negative),
    "abs": (NUMERIC, None, np.abs),
    "sign": (NUMERIC, None, _sign),
    "square": (NUMERIC, None, np.square),
    "relu": (NUMERIC, None, lambda x: np.maximum(x, np.zeros((), x.dtype))),
    "exp": (FLOAT, None, np.exp),
    "expm1": (FLOAT, None, np.expm1),
    "log": (FLOAT, None, np.log),
    "log1p": (FLOAT, None, np.log1p),
    "sqrt": (FLOAT, None, np.sqrt),
    "rsqrt": (FLOAT, None, lambda x: 1 / np.sqrt(x)),
    "reciprocal": (FLOAT, None, np.reciprocal),
    "sin": (FLOAT, None, np.sin),
    "cos": (FLOAT, None, np.cos),
    "tan": (FLOAT, None, np.tan),
    "tanh": (FLOAT, None, np.tanh),
    "sigmoid": (FLOAT, None, lambda x: 1 / (1 + np.exp(-x))),
    "erf": (FLOAT, None, _erf),
    "floor": (FLOAT, None, np.floor),
    "ceil": (FLOAT, None, np.ceil),
    "round": (FLOAT, None, np.rint),
    "logical_not": (frozenset({"bool"}), None, np.logical_not),
    "isnan": (FLOAT, "bool", np.isnan),
    "isinf": (FLOAT, "bool", np.isinf),
    "isfinite": (FLOAT, "bool", np.isfinite),
}

BINARY: dict[str, tuple[frozenset[str], str | None, Callable[..., np.ndarray]]] = {
    "add": (NUMERIC, None, np.add),
    "sub": (NUMERIC, None, np.subtract),
    "mul": (NUMERIC, None, np.multiply),
    "div": (FLOAT, None, np.divide),
    "pow": (FLOAT, None, np.power),
    "atan2": (FLOAT, None, np.arctan2),
    "maximum": (NUMERIC, None, np.maximum),
    "minimum": (NUMERIC, None, np.minimum),
    "floor_divide": (
        NUMERIC,
        None,
        _floor_divide,
    ),
    "remainder": (NUMERIC, None, _remainder),
    "eq": (ANY, "bool", np.equal),
    "ne": (ANY, "bool", np.not_equal),
    "lt": (ANY, "bool", np.less),
    "le": (ANY, "bool", np.less_equal),
    "gt": (ANY, "bool", np.greater),
    "ge": (
        ANY,
        "bool",
        np.greater_equal,
    ),
    "logical_and": (
        frozenset({"bool"}),
        None,
        np.logical_and,
    ),
    "logical_or": (
        frozenset({"bool"}),
        None,
        np.logical_or,
    ),
    "logical_xor": (
        frozenset({"bool"}),
        None,
        np.logical_xor,
    ),
}


def _unary_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    allowed, out_dtype, _ = UNARY[name]

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
    allowed, out_dtype, _ = BINARY[name]

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


for _name in UNARY:
    _register(
        PrimOp(
            _name, ("x",), {}, _unary_infer(_name), _unary_ref(_name), "unary",
            "elementwise.cpp: unary", elementwise=True,
        )
    )  # fmt: skip
for _name in BINARY:
    _register(
        PrimOp(
            _name, ("a", "b"), {}, _binary_infer(_name), _binary_ref(_name), "binary",
            "elementwise.cpp: binary", elementwise=True,
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
        "elementwise.cpp: select", elementwise=True,
    )
)  # fmt: skip


def _cast_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    # Half aware: to half rounds once from the exact source value; from half to a float widens
    # exactly (numpy's and ml_dtypes' own conversion, NaN payloads included), to an int or bool
    # it goes through the exact float32 value.
    if attrs["dtype"] in HALF:
        return [to_half(xs[0], attrs["dtype"])]
    x, target = xs[0], NUMPY_DTYPES[attrs["dtype"]]
    if target.kind != "f":
        x = widen_half(x)
    if x.dtype.kind == "f" and target.kind == "i":
        # Float to int truncates toward zero; NaN gives 0 and out-of-range values saturate.
        info = np.iinfo(target)
        with np.errstate(invalid="ignore"):  # a signalling NaN flags its conversion
            t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
        # Compared in float64, where int64's max rounds up to 2**63: ``>=`` catches exactly the
        # values that do not fit. The saturated ends are written as integers (a float 2**63
        # converted to int64 would wrap to INT64_MIN).
        high, low = t >= float(info.max), t <= float(info.min)
        inside = np.where(high | low, 0.0, t).astype(np.int64)
        out = np.where(high, np.int64(info.max), np.where(low, np.int64(info.min), inside))
        return [np.asarray(out).astype(target)]
    with np.errstate(all="ignore"):
        return [x.astype(target)]


_register(
    PrimOp(
        "cast", ("x",), {"dtype": Attr("dtype")},
        lambda avals, attrs: [Aval(avals[0].shape, attrs["dtype"])], _cast_ref, "cast",
        "elementwise.cpp: cast", elementwise=True, props=frozenset({"HALF_AWARE"}),
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
        "elementwise.cpp: normalize", elementwise=True,
    )
)  # fmt: skip

ELEMENTWISE_OPS = frozenset(name for name, op in PRIM_OPS.items() if op.elementwise)
