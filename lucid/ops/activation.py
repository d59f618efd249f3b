"""Activation ops: relu, hardtanh, leaky_relu, elu, gelu, softplus, softmax, log_softmax.

Each op's backward is either written with Lucid ops (softmax, log_softmax) or is a registry op of
its own (``threshold_backward``, ``gelu_backward``...) so a traced backward graph holds one op per
step. Backward ops that are linear in the incoming gradient get a VJP rule too (double backward).
"""

from __future__ import annotations

import math

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import tensor_method
from lucid.ops._registry import (
    ELEMENTWISE,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    normalize_dim,
    register,
    shape_of,
)

__all__ = ["relu", "softmax", "log_softmax"]

_EW = frozenset({ELEMENTWISE, SYMBOLIC_BATCH_SAFE})


def _float_infer(op: str):
    def infer(x, **_attrs) -> AVal:
        if not x.dtype.is_floating_point:
            raise TypeError(f"{op}: expected a floating point tensor, got {x.dtype}")
        return AVal(tuple(x.shape), x.dtype)

    return infer


def _same_infer(x, **_attrs) -> AVal:
    return AVal(tuple(x.shape), x.dtype)


def _grad_infer(g, *_rest, **_attrs) -> AVal:
    return AVal(tuple(g.shape), g.dtype)


# --- numerics shared with other families (gelu, losses)


# erf's series coefficients 1 / (2n+1)!!, highest power first for Horner's rule.
_ERF_SERIES = tuple(1.0 / math.prod(range(1, 2 * n + 2, 2)) for n in range(40))[::-1]
_ERF_SPLIT = 2.5


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorised error function (numpy has none), accurate to about 1e-15 in float64."""
    x = np.asarray(x)
    flat = x.astype(np.float64).reshape(-1)
    out = np.empty_like(flat)
    block = 8192  # the series loops stay in cache
    for i in range(0, flat.size, block):
        out[i : i + block] = _erf_block(flat[i : i + block])
    return out.reshape(x.shape).astype(x.dtype, copy=False)


def _erf_block(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    ax = np.abs(x)
    small = ax < _ERF_SPLIT
    # erf(x) = 2x/sqrt(pi) exp(-x^2) sum (2x^2)^n / (2n+1)!!: positive terms, no cancellation.
    xs = x[small]
    y = 2.0 * xs * xs
    total = np.full_like(xs, _ERF_SERIES[0])
    for c in _ERF_SERIES[1:]:
        total *= y
        total += c
    total *= xs * np.exp(-0.5 * y) * (2.0 / math.sqrt(math.pi))
    out[small] = total
    # erfc by its continued fraction, which converges fast for |x| >= 2.5.
    big = ~small
    if big.any():
        xb = np.minimum(ax[big], 27.0)
        frac = np.zeros_like(xb)
        for k in range(40, 0, -1):
            frac = (k / 2.0) / (xb + frac)
        erfc = np.exp(-xb * xb) / math.sqrt(math.pi) / (xb + frac)
        out[big] = np.sign(x[big]) * (1.0 - erfc)
    return out


# --- relu / hardtanh / leaky_relu / elu: piecewise-linear-ish, backward ops linear in g


# The gradient of these backward ops in ``x`` (a mask of x) is zero almost everywhere.
_STEP_IN_X = "piecewise constant in x: its gradient is zero almost everywhere"


def _threshold_backward_vjp(c, gg):
    return (apply("threshold_backward", gg, c.inputs[1], **c.attrs), None)


register(
    OpDef(
        "threshold_backward",
        ("grad", "x"),
        _grad_infer,
        lambda grad, x, threshold: np.where(x > threshold, grad, 0).astype(grad.dtype),
        _threshold_backward_vjp,
        attrs={"threshold": 0.0},
        props=_EW,
        saves_outputs=False,
        no_grad_operands={"x": _STEP_IN_X},
        doc="``grad`` where ``x > threshold``, else 0 (relu's backward, read from its output).",
    )
)

register(
    OpDef(
        "relu",
        ("x",),
        _same_infer,
        lambda x: np.maximum(x, 0).astype(x.dtype),
        lambda c, g: (apply("threshold_backward", g, c.outputs[0], threshold=0.0),),
        props=_EW,
        saves_inputs=False,
    )
)


register(
    OpDef(
        "hardtanh_backward",
        ("grad", "x"),
        _grad_infer,
        lambda grad, x, min_val, max_val: np.where((x > min_val) & (x < max_val), grad, 0).astype(
            grad.dtype
        ),
        lambda c, gg: (apply("hardtanh_backward", gg, c.inputs[1], **c.attrs), None),
        attrs={"min_val": -1.0, "max_val": 1.0},
        props=_EW,
        saves_outputs=False,
        no_grad_operands={"x": _STEP_IN_X},
    )
)

register(
    OpDef(
        "hardtanh",
        ("x",),
        _same_infer,
        lambda x, min_val, max_val: np.clip(x, min_val, max_val).astype(x.dtype),
        lambda c, g: (apply("hardtanh_backward", g, c.inputs[0], **c.attrs),),
        attrs={"min_val": -1.0, "max_val": 1.0},
        props=_EW,
        saves_outputs=False,
    )
)


register(
    OpDef(
        "leaky_relu_backward",
        ("grad", "x"),
        _grad_infer,
        lambda grad, x, negative_slope: np.where(x > 0, grad, grad * negative_slope).astype(
            grad.dtype
        ),
        lambda c, gg: (apply("leaky_relu_backward", gg, c.inputs[1], **c.attrs), None),
        attrs={"negative_slope": 0.01},
        props=_EW,
        saves_outputs=False,
        no_grad_operands={"x": _STEP_IN_X},
    )
)

register(
    OpDef(
        "leaky_relu",
        ("x",),
        _float_infer("leaky_relu"),
        lambda x, negative_slope: np.where(x > 0, x, x * negative_slope).astype(x.dtype),
        lambda c, g: (apply("leaky_relu_backward", g, c.inputs[0], **c.attrs),),
        attrs={"negative_slope": 0.01},
        props=_EW,
        saves_outputs=False,
    )
)


def _elu_backward_vjp(c, gg):
    g, x = c.inputs
    gx = gg * g
    # d/dx of g*alpha*exp(x) on x <= 0 is the same expression; on x > 0 it is 0.
    dx = apply("elu_backward", gx, x, **c.attrs) - apply("threshold_backward", gx, x)
    return (apply("elu_backward", gg, x, **c.attrs), dx)


register(
    OpDef(
        "elu_backward",
        ("grad", "x"),
        _grad_infer,
        lambda grad, x, alpha: np.where(
            x > 0, grad, grad * alpha * np.exp(np.minimum(x, 0))
        ).astype(grad.dtype),
        _elu_backward_vjp,
        attrs={"alpha": 1.0},
        props=_EW,
        saves_outputs=False,
    )
)

register(
    OpDef(
        "elu",
        ("x",),
        _float_infer("elu"),
        lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0))).astype(x.dtype),
        lambda c, g: (apply("elu_backward", g, c.inputs[0], **c.attrs),),
        attrs={"alpha": 1.0},
        props=_EW,
        saves_outputs=False,
    )
)


# --- gelu


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_kernel(x, approximate):
    _check_approximate(approximate)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
        return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def _gelu_backward_kernel(grad, x, approximate):
    _check_approximate(approximate)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
        t = np.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner
    else:
        cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        d = cdf + x * pdf
    return (grad * d).astype(grad.dtype)


def _gelu_second_derivative(x, approximate):
    """gelu''(x), in Lucid ops."""
    if approximate == "tanh":
        u1 = (x * x * (3 * 0.044715) + 1.0) * _SQRT_2_OVER_PI
        t = (x + x * x * x * 0.044715) * _SQRT_2_OVER_PI
        t = t.tanh()
        sech2 = 1.0 - t * t
        u2 = x * (6 * 0.044715 * _SQRT_2_OVER_PI)
        return sech2 * u1 + x * 0.5 * (sech2 * u2 - t * sech2 * u1 * u1 * 2.0)
    pdf = (x * x * -0.5).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return pdf * (2.0 - x * x)


def _gelu_backward_vjp(c, gg):
    g, x = c.inputs
    approximate = c.attrs["approximate"]
    return (
        apply("gelu_backward", gg, x, approximate=approximate),
        gg * g * _gelu_second_derivative(x, approximate),
    )


register(
    OpDef(
        "gelu_backward",
        ("grad", "x"),
        _grad_infer,
        _gelu_backward_kernel,
        _gelu_backward_vjp,
        attrs={"approximate": "none"},
        props=_EW,
        saves_outputs=False,
    )
)

register(
    OpDef(
        "gelu",
        ("x",),
        _float_infer("gelu"),
        _gelu_kernel,
        lambda c, g: (apply("gelu_backward", g, c.inputs[0], **c.attrs),),
        attrs={"approximate": "none"},
        props=_EW,
        saves_outputs=False,
    )
)


# --- softplus: log(1 + exp(beta x)) / beta, linear above the threshold


def _softplus_kernel(x, beta, threshold):
    bx = x * beta
    soft = np.logaddexp(0.0, bx) / beta
    return np.where(bx > threshold, x, soft).astype(x.dtype)


def _softplus_backward_kernel(grad, x, beta, threshold):
    bx = (x * beta).astype(np.float64)
    sig = 0.5 * (1.0 + np.tanh(0.5 * bx))  # overflow-free logistic
    return np.where(bx > threshold, grad, grad * sig).astype(grad.dtype)


def _softplus_backward_vjp(c, gg):
    import lucid

    g, x = c.inputs
    beta, threshold = c.attrs["beta"], c.attrs["threshold"]
    s = (x * beta).sigmoid()
    second = lucid.where(x * beta > threshold, 0.0, s * (1.0 - s) * beta)
    return apply("softplus_backward", gg, x, **c.attrs), gg * g * second


register(
    OpDef(
        "softplus_backward",
        ("grad", "x"),
        _grad_infer,
        _softplus_backward_kernel,
        _softplus_backward_vjp,
        attrs={"beta": 1.0, "threshold": 20.0},
        props=_EW,
        saves_outputs=False,
    )
)

register(
    OpDef(
        "softplus",
        ("x",),
        _float_infer("softplus"),
        _softplus_kernel,
        lambda c, g: (apply("softplus_backward", g, c.inputs[0], **c.attrs),),
        attrs={"beta": 1.0, "threshold": 20.0},
        props=_EW,
        saves_outputs=False,
    )
)


# --- softmax / log_softmax: VJP rules in Lucid ops, so they differentiate twice


def _softmax_infer(op: str):
    def infer(x, dim) -> AVal:
        if not x.dtype.is_floating_point:
            raise TypeError(f"{op}: expected a floating point tensor, got {x.dtype}")
        normalize_dim(dim, x.ndim, op)
        return AVal(tuple(x.shape), x.dtype)

    return infer


def _softmax_kernel(x, dim):
    if x.ndim == 0:
        return np.ones_like(x)
    if x.size == 0:  # np.max has no identity; an empty softmax is empty (PyTorch)
        return x.copy()
    e = np.exp(x - np.max(x, axis=dim, keepdims=True))
    return e / np.sum(e, axis=dim, keepdims=True)


def _log_softmax_kernel(x, dim):
    if x.ndim == 0:
        return np.zeros_like(x)
    if x.size == 0:
        return x.copy()
    shifted = x - np.max(x, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


def _softmax_vjp(c, g):
    y = c.outputs[0]
    dim = c.attrs["dim"] if y.ndim else None
    return (y * (g - (g * y).sum(dim, keepdim=True)),)


def _log_softmax_vjp(c, g):
    y = c.outputs[0]
    dim = c.attrs["dim"] if y.ndim else None
    return (g - y.exp() * g.sum(dim, keepdim=True),)


register(
    OpDef(
        "softmax",
        ("x",),
        _softmax_infer("softmax"),
        _softmax_kernel,
        _softmax_vjp,
        attrs={"dim": -1},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
    )
)

register(
    OpDef(
        "log_softmax",
        ("x",),
        _softmax_infer("log_softmax"),
        _log_softmax_kernel,
        _log_softmax_vjp,
        attrs={"dim": -1},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
    )
)


# --- fronts


def _softmax_dim(x: Tensor, dim: int | None, op: str) -> int:
    if dim is None:
        # torch's legacy implicit choice: dim 0 for 0-, 1- and 3-d inputs, else 1.
        return 0 if len(shape_of(x)) in (0, 1, 3) else 1
    return dim


def _softmax_input(x: Tensor, dtype) -> Tensor:
    return x if dtype is None else x.type(dtype)


@tensor_method()
def relu(x: Tensor) -> Tensor:
    """max(x, 0) elementwise."""
    return apply("relu", x)


@tensor_method()
def softmax(x: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim`` (computed stably)."""
    return apply("softmax", _softmax_input(x, dtype), dim=_softmax_dim(x, dim, "softmax"))


@tensor_method()
def log_softmax(x: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """log(softmax(x)) along ``dim``, computed without forming softmax."""
    return apply("log_softmax", _softmax_input(x, dtype), dim=_softmax_dim(x, dim, "log_softmax"))
