"""2-d resampling: ``upsample2d`` (modes nearest and bilinear, ``F.interpolate``) and its gradient
``upsample2d_backward``.

Both modes are separable: along each spatial dim an output position reads one (nearest) or two
(bilinear) input positions with fixed weights, which depend on the sizes only. ``axis_table``
computes them with PyTorch's formulas in PyTorch's arithmetic (float32 for float32 tensors,
float64 for float64), so eager, the lowering (constant-index gathers) and the gradient (the same
tables, scatter-added) share one definition. Width is interpolated first, then height, which is
PyTorch's order of operations for bilinear.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._registry import SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

__all__: list[str] = []  # the front is lucid.nn.functional.interpolate

MODES = ("nearest", "bilinear")


def axis_table(mode: str, n_in: int, n_out: int, scale: float | None, align_corners: bool, dt):
    """(index0, index1, weight0, weight1) per output position along one dim, as PyTorch's
    ``nearest_idx`` / ``compute_source_index_and_lambda`` compute them. For nearest, index1 and
    the weights are None (one read, unweighted)."""
    # Bilinear computes in the tensor's precision (PyTorch's opmath); nearest always in float32.
    f = np.float64 if dt == np.float64 and mode == "bilinear" else np.float32
    scale = scale if scale else None  # 0.0 means "not given", as PyTorch's scale > 0 test
    dst = np.arange(n_out)
    if mode == "nearest":
        if n_out == n_in:
            idx = dst
        elif n_out == 2 * n_in:
            idx = dst >> 1
        else:
            ratio = f(1.0 / scale) if scale is not None and scale > 0 else f(n_in) / f(n_out)
            idx = np.minimum(np.floor(dst.astype(f) * ratio).astype(np.int64), n_in - 1)
        return idx.astype(np.int64), None, None, None
    if n_out == n_in:
        ones = np.ones(n_out, f)
        return dst.astype(np.int64), dst.astype(np.int64), ones, np.zeros(n_out, f)
    if align_corners:
        ratio = f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
        src = ratio * dst.astype(f)
    else:
        ratio = f(1.0 / scale) if scale is not None and scale > 0 else f(n_in) / f(n_out)
        src = ratio * (dst.astype(f) + f(0.5)) - f(0.5)
        src = np.where(src < 0, f(0), src)
    idx0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam1 = np.clip(src - idx0.astype(f), f(0), f(1)).astype(f)
    idx1 = idx0 + (idx0 < n_in - 1)
    return idx0, idx1.astype(np.int64), (f(1) - lam1).astype(f), lam1


def _check(op: str, x_shape, output_size, mode: str, scales) -> None:
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected a 4-d input (N, C, H, W), got shape {tuple(x_shape)}")
    if mode not in MODES:
        raise ValueError(f"{op}: mode must be one of {MODES}, got {mode!r}")
    if len(output_size) != 2 or any(not isinstance(s, int) or s < 1 for s in output_size):
        raise ValueError(f"{op}: output size must be two positive ints, got {output_size!r}")
    if len(scales) != 2:
        raise ValueError(f"{op}: scales must be a pair (0.0: not given), got {scales!r}")


def _tables(x_shape, output_size, mode, align_corners, scales, dt):
    return [
        axis_table(mode, x_shape[2 + i], output_size[i], scales[i], align_corners, dt)
        for i in range(2)
    ]


def _resample_axis(x: np.ndarray, axis: int, table) -> np.ndarray:
    idx0, idx1, w0, w1 = table
    a = np.take(x, idx0, axis=axis)
    if w0 is None:
        return a
    shape = [1] * x.ndim
    shape[axis] = -1
    b = np.take(x, idx1, axis=axis)
    return a * w0.reshape(shape) + b * w1.reshape(shape)


def _scatter_axis(g: np.ndarray, axis: int, n_in: int, table) -> np.ndarray:
    idx0, idx1, w0, w1 = table
    shape = list(g.shape)
    shape[axis] = n_in
    out = np.zeros(shape, g.dtype)
    moved_out, moved_g = np.moveaxis(out, axis, 0), np.moveaxis(g, axis, 0)
    if w0 is None:
        np.add.at(moved_out, idx0, moved_g)
        return out
    wshape = [-1] + [1] * (g.ndim - 1)
    np.add.at(moved_out, idx0, moved_g * w0.reshape(wshape))
    np.add.at(moved_out, idx1, moved_g * w1.reshape(wshape))
    return out


# scales: the user's scale_factor per dim, 0.0 when not given (the coordinates then use in/out).
_ATTRS = {"output_size": None, "mode": "nearest", "align_corners": False, "scales": (0.0, 0.0)}


def _upsample_infer(x, output_size, mode, align_corners, scales):
    _check("upsample2d", x.shape, output_size, mode, scales)
    if not x.dtype.is_floating_point:
        raise TypeError(f"upsample2d: expected a floating point input, got {x.dtype}")
    return AVal((x.shape[0], x.shape[1], *output_size), x.dtype)


def _upsample_kernel(x, output_size, mode, align_corners, scales):
    th, tw = _tables(x.shape, output_size, mode, align_corners, scales, x.dtype)
    return _resample_axis(_resample_axis(x, 3, tw), 2, th).astype(x.dtype, copy=False)


def _upsample_vjp(c, g):
    x = c.inputs[0]
    return (apply("upsample2d_backward", g, input_size=tuple(x.shape[2:]), **c.attrs),)


register(
    OpDef(
        "upsample2d",
        ("x",),
        _upsample_infer,
        _upsample_kernel,
        _upsample_vjp,
        attrs=dict(_ATTRS),
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
        doc="Nearest or bilinear resampling of (N, C, H, W) to output_size (F.interpolate).",
    )
)


def _backward_infer(g, input_size, output_size, mode, align_corners, scales):
    _check("upsample2d_backward", g.shape, output_size, mode, scales)
    if tuple(g.shape[2:]) != tuple(output_size):
        raise ValueError(
            f"upsample2d_backward: grad shape {tuple(g.shape)} does not match the output size "
            f"{tuple(output_size)}"
        )
    return AVal((g.shape[0], g.shape[1], *input_size), g.dtype)


def _backward_kernel(g, input_size, output_size, mode, align_corners, scales):
    in_shape = (*g.shape[:2], *input_size)
    th, tw = _tables(in_shape, output_size, mode, align_corners, scales, g.dtype)
    return _scatter_axis(_scatter_axis(g, 2, input_size[0], th), 3, input_size[1], tw)


def _backward_vjp(c, gg):
    attrs = {k: v for k, v in c.attrs.items() if k != "input_size"}
    return (apply("upsample2d", gg, **attrs),)


register(
    OpDef(
        "upsample2d_backward",
        ("grad",),
        _backward_infer,
        _backward_kernel,
        _backward_vjp,
        attrs={"input_size": None, **_ATTRS},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
        doc="upsample2d's gradient: each output's gradient added back to the inputs it read.",
    )
)


# --- front


def _scale_pair(scale_factor: Any) -> tuple[float, float]:
    if isinstance(scale_factor, (int, float)) and not isinstance(scale_factor, bool):
        pair = (float(scale_factor),) * 2
    else:
        pair = tuple(float(s) for s in scale_factor)
    if len(pair) != 2 or any(not math.isfinite(s) or s <= 0 for s in pair):
        raise ValueError(
            f"interpolate: scale_factor must be a positive number or a pair of them, got "
            f"{scale_factor!r}"
        )
    return pair


def interpolate(
    input: Tensor,  # noqa: A002
    size: int | Sequence[int] | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Resample (N, C, H, W) input to ``size`` or by ``scale_factor`` (output size
    ``floor(in * scale_factor)``), with PyTorch's index formulas: nearest reads
    ``floor(dst * in / out)`` (or ``dst / scale_factor``), bilinear weighs the two neighbours of
    ``(dst + 0.5) * in / out - 0.5`` (``dst * (in - 1) / (out - 1)`` with ``align_corners``).
    A 3-d (N, C, L) input is resampled along L in nearest mode."""
    if not isinstance(input, Tensor):
        raise TypeError(f"interpolate: expected a Tensor, got {type(input).__name__}")
    if mode not in MODES:
        raise ValueError(
            f"interpolate: mode {mode!r} is not supported; Lucid has 'nearest' and 'bilinear'"
        )
    if antialias:
        raise ValueError("interpolate: antialias=True is not supported")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(
            "interpolate: align_corners can only be set with the interpolating modes "
            "(bilinear); leave it None for nearest"
        )
    one_d = input.ndim == 3 and mode == "nearest"
    if input.ndim != 4 and not one_d:
        raise ValueError(
            f"interpolate: mode {mode!r} expects a 4-d (N, C, H, W) input"
            + (" (or a 3-d one for nearest)" if mode == "nearest" else "")
            + f", got shape {tuple(input.shape)}"
        )
    x = input.reshape(input.shape[0], input.shape[1], 1, input.shape[2]) if one_d else input
    n_spatial = 1 if one_d else 2
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * n_spatial if isinstance(size, int) else tuple(size)
        if len(sizes) != n_spatial or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
        ):
            raise ValueError(
                f"interpolate: size must be a positive int or {n_spatial} of them, got {size!r}"
            )
        scales: tuple = (0.0,) * n_spatial
    else:
        if one_d and not isinstance(scale_factor, (int, float)):
            scale_factor = tuple(scale_factor)
            if len(scale_factor) != 1:
                raise ValueError(
                    f"interpolate: a 3-d input takes one scale factor, got {scale_factor!r}"
                )
            scale_factor = scale_factor[0]
        pair = _scale_pair(scale_factor)[:n_spatial]
        sizes = tuple(math.floor(float(n) * s) for n, s in zip(input.shape[2:], pair, strict=True))
        if any(s < 1 for s in sizes):
            raise ValueError(
                f"interpolate: scale_factor {scale_factor!r} gives an empty output {sizes} for "
                f"input {tuple(input.shape)}"
            )
        scales = (0.0,) * n_spatial if recompute_scale_factor else pair
    if one_d:
        sizes, scales = (1, *sizes), (0.0, *scales)
    out = apply(
        "upsample2d",
        x,
        output_size=tuple(int(s) for s in sizes),
        mode=mode,
        align_corners=bool(align_corners),
        scales=tuple(float(v) for v in scales),
    )
    return out.reshape(out.shape[0], out.shape[1], out.shape[3]) if one_d else out
