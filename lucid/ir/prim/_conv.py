"""conv2d and its gradients, 2-D pooling and its gradients (NCHW)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    FLOAT,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _need,
    _register,
    _same_dtype,
)


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
        "conv.cpp: direct (stride 1); else linalg.cpp im2col + sgemm",
    )
)  # fmt: skip
_register(
    PrimOp(
        "conv2d_data_grad", ("grad", "weight"),
        {**_CONV_ATTRS, "input_shape": Attr("ints")}, _conv_data_grad_infer, _conv_data_grad_ref,
        "convolution", "conv.cpp: direct (stride 1); else sgemm + col2im",
    )
)  # fmt: skip
_register(
    PrimOp(
        "conv2d_weights_grad", ("x", "grad"),
        {**_CONV_ATTRS, "weight_shape": Attr("ints")}, _conv_weights_grad_infer,
        _conv_weights_grad_ref, "convolution", "conv.cpp: direct (stride 1); else im2col + sgemm",
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
    # The first maximum wins ties; a NaN always takes over, so the last NaN of a window wins.
    nan = np.isnan(windows)
    last_nan = windows.shape[0] - 1 - nan[::-1].argmax(axis=0)
    winner = np.where(nan.any(axis=0), last_nan, np.where(nan, -np.inf, windows).argmax(axis=0))
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
        "linalg.cpp: window max",
    )
)  # fmt: skip
_register(
    PrimOp(
        "max_pool2d_grad", ("grad", "x"), dict(_MAX_POOL_ATTRS), _max_pool_grad_infer,
        _max_pool_grad_ref, "pooling",
        "linalg.cpp: route to the window maximum (first of ties, last NaN)",
    )
)  # fmt: skip
_register(
    PrimOp(
        "avg_pool2d", ("x",), dict(_AVG_POOL_ATTRS), _avg_pool_infer, _avg_pool_ref, "pooling",
        "linalg.cpp: window mean",
    )
)  # fmt: skip
_register(
    PrimOp(
        "avg_pool2d_grad", ("grad",), {**_AVG_POOL_ATTRS, "input_shape": Attr("ints")},
        _avg_pool_grad_infer, _avg_pool_grad_ref, "pooling",
        "linalg.cpp: spread window share",
    )
)  # fmt: skip
