"""Normalisation ops: layer_norm, batch_norm (batch statistics), rms_norm.

The VJP rules recompute the statistics with Lucid ops (a reduction or two) instead of saving them,
so they differentiate again. batch_norm also returns the batch mean and biased variance, which the
front uses, detached, for the running estimates.
group_norm and instance_norm are compositions over layer_norm (see ``lucid.nn.functional``).
An absent weight / bias is the scalar operand 1.0 / 0.0.
"""

from __future__ import annotations

import numpy as np

from lucid.ops._registry import SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

__all__: list[str] = []


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check_affine(op: str, shape: tuple, weight, bias=None) -> None:
    for name, t in (("weight", weight), ("bias", bias)):
        if _is_tensor(t) and tuple(t.shape) != tuple(shape):
            raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _mean(t, dims, n: int):
    return t.sum(dims, keepdim=True) * (1.0 / n)


def _normalized_dims(op: str, x, normalized_shape) -> tuple[int, ...]:
    k = len(normalized_shape)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point input, got {x.dtype}")
    if k == 0 or tuple(x.shape[x.ndim - k :]) != tuple(normalized_shape) or k > x.ndim:
        raise ValueError(
            f"{op}: normalized_shape {tuple(normalized_shape)} does not match the trailing dims "
            f"of the input shape {tuple(x.shape)}"
        )
    return tuple(range(x.ndim - k, x.ndim))


def _numel(shape) -> int:
    return int(np.prod(shape)) if len(shape) else 1


# --- layer_norm


def _layer_norm_infer(x, weight, bias, normalized_shape, eps):
    _normalized_dims("layer_norm", x, normalized_shape)
    _check_affine("layer_norm", normalized_shape, weight, bias)
    return AVal(tuple(x.shape), x.dtype)


def _layer_norm_kernel(x, weight, bias, normalized_shape, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    y = centered / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + eps)
    if weight.ndim:
        y *= weight
    if bias.ndim:
        y += bias
    return y


def _normalize_grad(g, xhat, rstd, dims, n):
    """d/dx of xhat = (x - mean) * rstd, given the gradient at xhat."""
    return rstd * (g - _mean(g, dims, n) - xhat * _mean(g * xhat, dims, n))


def _layer_norm_vjp(c, g):
    x, weight, bias = c.inputs
    dims = tuple(range(x.ndim - len(c.attrs["normalized_shape"]), x.ndim))
    n = _numel(c.attrs["normalized_shape"])
    # statistics are recomputed with Lucid ops, so the rule differentiates again
    centered = x - _mean(x, dims, n)
    rstd = (_mean(centered * centered, dims, n) + c.attrs["eps"]) ** -0.5
    xhat = centered * rstd
    gx = gw = gb = None
    if c.needs_input_grad[0]:
        gx = _normalize_grad(g * weight if _is_tensor(weight) else g, xhat, rstd, dims, n)
    if c.needs_input_grad[1] and _is_tensor(weight):
        gw = g * xhat  # autograd sums the broadcast dims away
    if c.needs_input_grad[2] and _is_tensor(bias):
        gb = g
    return gx, gw, gb


register(
    OpDef(
        "layer_norm",
        ("x", "weight", "bias"),
        _layer_norm_infer,
        _layer_norm_kernel,
        _layer_norm_vjp,
        attrs={"normalized_shape": None, "eps": 1e-5},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="Normalise over the trailing ``normalized_shape`` dims (biased variance), then "
        "scale and shift.",
    )
)


# --- batch_norm with batch statistics: outputs (y, mean, biased var), statistics of shape (C,)


def _bn_axes(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim))


def _batch_norm_infer(x, weight, bias, eps):
    if not x.dtype.is_floating_point:
        raise TypeError(f"batch_norm: expected a floating point input, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(
            f"batch_norm: expected an input of at least 2 dims (N, C, ...), got {x.shape}"
        )
    c = x.shape[1]
    _check_affine("batch_norm", (c,), weight, bias)
    return AVal(tuple(x.shape), x.dtype), AVal((c,), x.dtype), AVal((c,), x.dtype)


def _batch_norm_kernel(x, weight, bias, eps):
    axes = _bn_axes(x.ndim)
    stat_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    y = centered / np.sqrt(var + eps)
    if weight.ndim:
        y *= weight.reshape(stat_shape)
    if bias.ndim:
        y += bias.reshape(stat_shape)
    return y, mean.reshape(-1), var.reshape(-1)


def _batch_norm_vjp(c, g, _g_mean, _g_var):
    # The statistics outputs only feed the running estimates, detached: no gradient flows back
    # from them. They are recomputed here with Lucid ops so the rule differentiates again.
    x, weight, bias = c.inputs
    stat_shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    dims = _bn_axes(x.ndim)
    n = _numel(x.shape) // x.shape[1]
    centered = x - _mean(x, dims, n)
    rstd = (_mean(centered * centered, dims, n) + c.attrs["eps"]) ** -0.5
    xhat = centered * rstd
    gx = gw = gb = None
    if c.needs_input_grad[0]:
        gxh = g * weight.reshape(stat_shape) if _is_tensor(weight) else g
        gx = _normalize_grad(gxh, xhat, rstd, dims, n)
    if c.needs_input_grad[1] and _is_tensor(weight):
        gw = (g * xhat).sum(dims)
    if c.needs_input_grad[2] and _is_tensor(bias):
        gb = g.sum(dims)
    return gx, gw, gb


register(
    OpDef(
        "batch_norm",
        ("x", "weight", "bias"),
        _batch_norm_infer,
        _batch_norm_kernel,
        _batch_norm_vjp,
        attrs={"eps": 1e-5},
        n_outputs=3,
        saves_outputs=False,
        doc="Batch normalisation with the batch's statistics over all dims but 1; also returns "
        "the batch mean and biased variance per channel (the caller updates running stats).",
    )
)


# --- rms_norm


def _rms_norm_infer(x, weight, normalized_shape, eps):
    _normalized_dims("rms_norm", x, normalized_shape)
    _check_affine("rms_norm", normalized_shape, weight)
    return AVal(tuple(x.shape), x.dtype)


def _rms_eps(eps, dtype) -> float:
    return float(np.finfo(dtype).eps) if eps is None else eps


def _rms_norm_kernel(x, weight, normalized_shape, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + _rms_eps(eps, x.dtype))
    if weight.ndim:
        y *= weight
    return y


def _rms_norm_vjp(c, g):
    x, weight = c.inputs
    dims = tuple(range(x.ndim - len(c.attrs["normalized_shape"]), x.ndim))
    n = _numel(c.attrs["normalized_shape"])
    rstd = (_mean(x * x, dims, n) + _rms_eps(c.attrs["eps"], x.dtype.numpy)) ** -0.5
    gx = gw = None
    if c.needs_input_grad[0]:
        gxh = g * weight if _is_tensor(weight) else g
        gx = rstd * (gxh - x * (rstd * rstd) * _mean(gxh * x, dims, n))
    if c.needs_input_grad[1] and _is_tensor(weight):
        gw = g * x * rstd
    return gx, gw


register(
    OpDef(
        "rms_norm",
        ("x", "weight"),
        _rms_norm_infer,
        _rms_norm_kernel,
        _rms_norm_vjp,
        attrs={"normalized_shape": None, "eps": None},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps None means the "
        "dtype's machine epsilon.",
    )
)
