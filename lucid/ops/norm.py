"""Normalisation ops: layer_norm, batch_norm (batch statistics), rms_norm.

The VJP rules recompute the statistics with Lucid ops (a reduction or two) instead of saving them,
so they differentiate again. batch_norm also returns the batch mean and biased variance, which the
front uses, detached, for the running estimates.
group_norm and instance_norm are compositions over layer_norm (see ``lucid.nn.functional``).
An absent weight / bias is the scalar operand 1.0 / 0.0.
"""

from __future__ import annotations

import numpy as np

from lucid._dispatch import apply
from lucid.ops._registry import (
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    half_format_defaults,
    register,
)

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


def _row_stats(x, dims, n, eps):
    """(xhat, rstd) over ``dims``, recomputed with Lucid ops so the rules differentiate again."""
    centered = x - _mean(x, dims, n)
    rstd = (_mean(centered * centered, dims, n) + eps) ** -0.5
    return centered * rstd, rstd


def _layer_norm_vjp(c, g):
    x, weight, _ = c.inputs
    gx, gw, gb = apply(
        "layer_norm_backward", g, x, weight, **c.attrs
    )  # one op, so lowering emits it whole (a composite prim op) and backends run one kernel
    wanted = (True, _is_tensor(weight), _is_tensor(c.inputs[2]))
    return tuple(
        grad if need and keep else None
        for grad, need, keep in zip((gx, gw, gb), c.needs_input_grad, wanted, strict=True)
    )


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


# --- layer_norm_backward: (dx, dweight, dbias) of layer_norm, one op (see _layer_norm_vjp)


def _layer_norm_backward_infer(grad, x, weight, normalized_shape, eps):
    _normalized_dims("layer_norm_backward", x, normalized_shape)
    _check_affine("layer_norm_backward", normalized_shape, weight)
    if tuple(grad.shape) != tuple(x.shape):
        raise ValueError(
            f"layer_norm_backward: grad of shape {tuple(grad.shape)} does not match the input "
            f"shape {tuple(x.shape)}"
        )
    row = AVal(tuple(normalized_shape), x.dtype)
    return AVal(tuple(x.shape), x.dtype), row, row


def _layer_norm_backward_kernel(grad, x, weight, normalized_shape, eps):
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    # float64 inside: the row means of the gradient cancel, which float32 loses.
    dy, x64 = grad.astype(np.float64), x.astype(np.float64)
    centered = x64 - x64.mean(axis=dims, keepdims=True)
    rstd = 1.0 / np.sqrt((centered * centered).mean(axis=dims, keepdims=True) + eps)
    xhat = centered * rstd
    g = dy * weight if weight.ndim else dy
    dx = rstd * (
        g - g.mean(axis=dims, keepdims=True) - xhat * (g * xhat).mean(axis=dims, keepdims=True)
    )
    dweight, dbias = (dy * xhat).sum(axis=lead), dy.sum(axis=lead)
    return tuple(np.asarray(a, dtype=x.dtype) for a in (dx, dweight, dbias))


def _layer_norm_backward_vjp(c, a, b_weight, b_bias):
    """Second derivatives of layer norm. With g = dy * w, P(u) = u - mean(u) - xhat mean(u xhat)
    (symmetric) and dx = rstd P(g): d/d(dy) is w rstd P(a) + b_w xhat + b_b; d/dw is dy rstd P(a)
    (summed by autograd); d/dx is rstd P(G) - rstd^2 xhat [mean(a g) - mean(a) mean(g)
    - mean(a xhat) mean(g xhat)] with G = b_w dy - rstd (g mean(a xhat) + a mean(g xhat)), the
    last term from rstd's own dependence on x (d rstd / dx = -rstd^2 xhat / n)."""
    dy, x, weight = c.inputs
    shape = c.attrs["normalized_shape"]
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    n = _numel(shape)
    xhat, rstd = _row_stats(x, dims, n, c.attrs["eps"])
    affine = _is_tensor(weight)
    g = dy * weight if affine else dy
    pa = _normalize_grad(a, xhat, rstd, dims, n)
    gdy = gx = gw = None
    if c.needs_input_grad[0]:
        gdy = (pa * weight if affine else pa) + b_weight * xhat + b_bias
    if c.needs_input_grad[1]:
        a_xhat, g_xhat = _mean(a * xhat, dims, n), _mean(g * xhat, dims, n)
        big_g = b_weight * dy - rstd * (g * a_xhat + a * g_xhat)
        r = _mean(a * g, dims, n) - _mean(a, dims, n) * _mean(g, dims, n) - a_xhat * g_xhat
        gx = _normalize_grad(big_g, xhat, rstd, dims, n) - rstd * rstd * xhat * r
    if c.needs_input_grad[2] and affine:
        gw = dy * pa
    return gdy, gx, gw


register(
    OpDef(
        "layer_norm_backward",
        ("grad", "x", "weight"),
        _layer_norm_backward_infer,
        _layer_norm_backward_kernel,
        _layer_norm_backward_vjp,
        attrs={"normalized_shape": None, "eps": 1e-5},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        n_outputs=3,
        saves_outputs=False,
        doc="Gradients of layer_norm for the input, the weight and the bias (the last two "
        "summed over the leading dims), given the output's gradient.",
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
        resolve_attrs=half_format_defaults(eps="eps"),
        doc="x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps None means the "
        "dtype's machine epsilon.",
    )
)
