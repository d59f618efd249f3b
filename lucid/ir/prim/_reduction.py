"""Reductions, arg reductions, softmax, cumsum."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    FLOAT,
    NUMERIC,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _need,
    _register,
    normalize_axes,
    normalize_axis,
)


# --- reductions ----------------------------------------------------------------------------------
def _reduce_shape(op: str, aval: Aval, axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    axes = normalize_axes(op, axes, aval.ndim)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(aval.shape))
    return tuple(d for i, d in enumerate(aval.shape) if i not in axes)


REDUCTIONS = {
    "reduce_sum": (NUMERIC, np.sum),
    "reduce_mean": (FLOAT, np.mean),
    "reduce_max": (NUMERIC, np.max),
    "reduce_min": (NUMERIC, np.min),
    "reduce_prod": (NUMERIC, np.prod),
    "variance": (FLOAT, np.var),
}


def _reduce_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], REDUCTIONS[name][0])
        shape = _reduce_shape(name, avals[0], attrs["axes"], attrs["keepdims"])
        if name in ("reduce_max", "reduce_min"):
            reduced = normalize_axes(name, attrs["axes"], avals[0].ndim)
            if any(avals[0].shape[a] == 0 for a in reduced if avals[0].ndim):
                raise _fail(name, f"cannot reduce an empty axis of shape {avals[0].shape}")
        return [Aval(shape, avals[0].dtype)]

    return rule


def _reduce_ref(name: str) -> Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    fn = REDUCTIONS[name][1]

    def ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = xs[0]
        # Reducing a 0-d value over its axis 0 leaves it (numpy has no axis to name).
        axes = normalize_axes(name, attrs["axes"], x.ndim) if x.ndim else ()
        acc = np.float64 if x.dtype.kind == "f" else np.int64
        with np.errstate(all="ignore"):
            if name in ("reduce_max", "reduce_min"):
                out = fn(x, axis=axes, keepdims=attrs["keepdims"])
            else:
                out = fn(x.astype(acc), axis=axes, keepdims=attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype)]

    return ref


for _name in REDUCTIONS:
    _register(
        PrimOp(
            _name, ("x",), {"axes": Attr("ints"), "keepdims": Attr("bool", False)},
            _reduce_infer(_name), _reduce_ref(_name), "reduction",
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


for _name, _fn in (
    ("argmax", np.argmax),
    ("argmin", np.argmin),
):
    _register(
        PrimOp(
            _name, ("x",), {"axis": Attr("int"), "keepdims": Attr("bool", False)},
            _arg_infer(_name), _arg_ref(_fn), "reduction",
            "reduce.cpp: arg reduce (first occurrence, NaN wins)", props=frozenset({"GRAD_SINK"}),
        )
    )  # fmt: skip


def _argsort_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    x = avals[0]
    normalize_axis("argsort", attrs["axis"], x.ndim)
    return [Aval(x.shape, "i64")]


def _argsort_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0]
    if x.ndim == 0:
        return [np.zeros((), np.int64)]
    axis = attrs["axis"] % x.ndim
    if not attrs["descending"]:
        return [np.argsort(x, axis=axis, kind="stable")]
    # Descending with ties in position order: an ascending sort of the reversed row, read back
    # to front (numpy puts NaN last ascending, so it comes first descending).
    rev = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return [(x.shape[axis] - 1) - np.flip(rev, axis)]


_register(
    PrimOp(
        "argsort", ("x",), {"axis": Attr("int", -1), "descending": Attr("bool", False)},
        _argsort_infer, _argsort_ref, "reduction",
        "shape.cpp: stable sort per row (NaN largest)", props=frozenset({"GRAD_SINK"}),
    )
)  # fmt: skip


def _axis_rows_infer(name: str, allowed: frozenset[str]) -> Callable[..., list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        _need(name, avals[0], allowed)
        normalize_axis(name, attrs["axis"], avals[0].ndim)
        return [avals[0]]

    return rule


def _row_max(x: np.ndarray, axis: int) -> np.ndarray:
    # initial=-inf: a softmax over an empty axis is empty, not an error (numpy's max has no
    # identity); it changes nothing for a non-empty row.
    return x.max(axis=axis, keepdims=True, initial=-np.inf)


def _softmax_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0].astype(np.float64)
    z = x - _row_max(x, attrs["axis"])
    e = np.exp(z)
    return [e / e.sum(axis=attrs["axis"], keepdims=True)]


def _log_softmax_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0].astype(np.float64)
    z = x - _row_max(x, attrs["axis"])
    return [z - np.log(np.exp(z).sum(axis=attrs["axis"], keepdims=True))]


def _cumsum_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = xs[0]
    if x.ndim == 0:
        return [np.zeros_like(x) if attrs["exclusive"] else x.copy()]
    axis = attrs["axis"]
    acc = np.float64 if x.dtype.kind == "f" else np.int64
    y = np.flip(x, axis) if attrs["reverse"] else x
    c = np.cumsum(y.astype(acc), axis=axis)
    if attrs["exclusive"]:  # the sums before each element (c - y made inf - inf a NaN)
        c = np.roll(c, 1, axis=axis)
        np.moveaxis(c, axis, 0)[:1] = 0
    if attrs["reverse"]:
        c = np.flip(c, axis)
    return [c.astype(x.dtype)]


for _name, _ref, _allowed, _kernel in (
    ("softmax", _softmax_ref, FLOAT, "reduce.cpp: row softmax"),
    (
        "log_softmax", _log_softmax_ref,
        FLOAT, "reduce.cpp: row log-softmax",
    ),
):  # fmt: skip
    _register(
        PrimOp(
            _name, ("x",), {"axis": Attr("int")}, _axis_rows_infer(_name, _allowed), _ref,
            "softmax", _kernel,
        )
    )  # fmt: skip
_register(
    PrimOp(
        "cumsum", ("x",),
        {"axis": Attr("int"), "exclusive": Attr("bool", False), "reverse": Attr("bool", False)},
        _axis_rows_infer("cumsum", NUMERIC), _cumsum_ref, "reduction",
        "reduce.cpp: running sum along an axis",
    )
)  # fmt: skip
