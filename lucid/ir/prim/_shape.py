"""Layout ops, gather/scatter and one_hot."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    INT,
    NUMERIC,
    NUMPY_DTYPES,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _need,
    _register,
    _same_dtype,
    broadcast,
    normalize_axis,
)


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
        lambda xs, at: [xs[0].reshape(at["shape"])], "shape", "shape.cpp: copy (alias-free)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "transpose", ("x",), {"perm": Attr("ints")}, _transpose_infer,
        lambda xs, at: [np.transpose(xs[0], at["perm"])], "shape", "shape.cpp: strided copy",
    )
)  # fmt: skip
_register(
    PrimOp(
        "broadcast_to", ("x",), {"shape": Attr("ints")}, _broadcast_to_infer,
        lambda xs, at: [np.broadcast_to(xs[0], at["shape"])], "shape",
        "shape.cpp: strided copy (stride 0)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "slice", ("x",), {"starts": Attr("ints"), "ends": Attr("ints"), "strides": Attr("ints")},
        _slice_infer, _slice_ref, "shape", "shape.cpp: strided copy",
    )
)  # fmt: skip
_register(
    PrimOp(
        "concat", ("xs",), {"axis": Attr("int")}, _concat_infer,
        lambda xs, at: [np.concatenate(xs, axis=at["axis"])], "shape",
        "shape.cpp: block copies", variadic=True,
    )
)  # fmt: skip
_register(
    PrimOp(
        "pad", ("x",), {"low": Attr("ints"), "high": Attr("ints"), "value": Attr("float", 0.0)},
        _pad_infer, _pad_ref, "shape",
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


for _name, _operands, _infer, _ref in (
    ("gather", ("x", "indices"), _gather_infer, _gather_ref),
    ("gather_along_axis", ("x", "indices"), _gather_along_axis_infer, _gather_along_axis_ref),
    ("scatter_add", ("data", "indices", "updates"), _scatter_add_infer, _scatter_add_ref),
    ("scatter_add_along_axis", ("data", "indices", "updates"), _scatter_along_axis_infer,
     _scatter_along_axis_ref),
):  # fmt: skip
    _register(
        PrimOp(
            _name, _operands, {"axis": Attr("int")}, _infer, _ref, "gather",
            "shape.cpp: index walk with range check (IndexError)",
        )
    )  # fmt: skip


# --- check_index: the user op's range check on values read as indices -------------------------
def _check_index_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    (idx,) = avals
    _index_check("check_index", idx)
    if attrs["low"] > attrs["high"]:
        raise _fail("check_index", f"empty range [{attrs['low']}, {attrs['high']})")
    return [idx]


def index_error_message(template: str, value: int) -> str:
    """The error of ``check_index``: its message with the first ``{}`` replaced by the value."""
    return template.replace("{}", str(value), 1)


def _check_index_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    idx = xs[0]
    bad = (idx < attrs["low"]) | (idx >= attrs["high"])
    if bad.any():
        raise IndexError(index_error_message(attrs["message"], int(idx[bad].flat[0])))
    return [idx.copy()]


_register(
    PrimOp(
        "check_index", ("indices",),
        {"low": Attr("int"), "high": Attr("int"), "message": Attr("str")},
        _check_index_infer, _check_index_ref, "gather",
        "shape.cpp: range check, then a copy (IndexError naming the user's op)",
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
        "shape.cpp: one_hot", props=frozenset({"GRAD_SINK"}),
    )
)  # fmt: skip
