"""Numpy semantics of the CPU-only instructions that ``fuse-kernels`` writes (``gemm``,
``layer_norm``, ``attention``, ``attention_grad``, ``gelu``, ``gelu_grad``, ``layer_norm_grad``,
``conv2d_bias``, ``max_pool2d_relu_grad``): :meth:`Program.interpret` runs them, and the native
kernels are tested against them. Prim ops' own semantics live in the prim table."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lucid.ir import prim as prim_ops

SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


def _gemm_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    # A gemm reading or writing half values computes in float32 and rounds its output once
    # (after rounding the product to ``round_product``, when given, before the activation).
    out_dtype = attrs.get("dtype")
    if out_dtype is not None or any(prim_ops.dtype_of(x) in prim_ops.HALF for x in args):
        args = [prim_ops.widen_half(x) for x in args]
        out = _gemm_reference(args, {k: v for k, v in attrs.items() if k != "dtype"})
        return out if out_dtype in (None, "f32") else prim_ops.to_half(out, out_dtype)
    a, b = args[0], args[1]
    for i, name in ((0, "a_view"), (1, "b_view")):
        if name in attrs:  # [B, L, W] -> [B, H, L, D]
            heads, dim, col0 = attrs[name]
            x = args[i][..., col0 : col0 + heads * dim]
            x = x.reshape(*x.shape[:2], heads, dim).transpose(0, 2, 1, 3)
            a, b = (x, b) if i == 0 else (a, x)
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    out = np.matmul(a, b) * a.dtype.type(attrs["alpha"])
    for extra in args[2:]:  # a bias row, an addend of the output's shape
        out = out + extra
    if "round_product" in attrs:
        out = prim_ops.widen_half(prim_ops.to_half(out, attrs["round_product"]))
    if attrs.get("activation") == "relu":
        out = np.maximum(out, out.dtype.type(0))
    elif attrs.get("activation") == "gelu":
        out = gelu_reference([out], {})
    if "c_view" in attrs:  # [B, H, L, D] -> [B, L, H*D]
        out = out.transpose(0, 2, 1, 3)
        out = out.reshape(*out.shape[:2], -1)
    return out


def _layer_norm_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    x, gamma, beta = args
    mean64 = x.mean(axis=-1, keepdims=True, dtype=np.float64)
    # Squares in float64, as the kernel: (3.6e19)^2 overflows float32.
    var = ((x - mean64) ** 2).mean(axis=-1, keepdims=True).astype(x.dtype)
    mean = mean64.astype(x.dtype)
    return (x - mean) / np.sqrt(var + x.dtype.type(attrs["epsilon"])) * gamma + beta


def _heads(x: np.ndarray, view) -> np.ndarray:
    """[B, L, W] read through view [H, D, col0] as [B, H, L, D]; a dense operand as it is."""
    if view is None:
        return x
    heads, dim, col0 = view
    x = x[..., col0 : col0 + heads * dim]
    return x.reshape(*x.shape[:2], heads, dim).transpose(0, 2, 1, 3)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(output, weights): the weights are the optional second output."""
    q, k, v = (
        _heads(x, attrs.get(n)) for x, n in zip(args, ("q_view", "k_view", "v_view"), strict=True)
    )
    alpha = q.dtype.type(attrs["alpha"])
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * alpha
    if attrs.get("causal"):  # query i sees keys j <= i (top-left aligned)
        keep = np.tril(np.ones(scores.shape[-2:], dtype=bool))
        scores = np.where(keep, scores, q.dtype.type(-np.inf))
    probs = _softmax_rows(scores)
    out = probs @ v
    if "out_view" in attrs:  # [B, H, L, Dv] -> [B, L, H*Dv]
        out = out.transpose(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
    return out, probs


def _attention_grad_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv); with ``grad_cols`` one [B, L, W] array holding them side by side."""
    d_out, q, k, v, p = args
    d_o = _heads(d_out, attrs.get("d_out_view"))
    q, k, v = (_heads(a, attrs.get(f"{n}_view")) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    alpha = q.dtype.type(attrs["alpha"])
    dp = d_o @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    grads = (ds @ k * alpha, np.swapaxes(ds, -1, -2) @ q * alpha, np.swapaxes(p, -1, -2) @ d_o)
    if "grad_cols" not in attrs:
        return grads
    out = np.empty((*grads[0].shape[:1], grads[0].shape[2], attrs["grad_width"][0]), q.dtype)
    for col0, grad in zip(attrs["grad_cols"], grads, strict=True):
        merged = grad.transpose(0, 2, 1, 3).reshape(*out.shape[:2], -1)
        out[..., col0 : col0 + merged.shape[2]] = merged
    return (out,)


def gelu_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    (x,) = args
    return x * _gelu_cdf(x)


def _gelu_cdf(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    (erf,) = prim_ops.evaluate("erf", [x * t(SQRT_HALF)], {})
    return ((erf + t(1)) * t(0.5)).astype(x.dtype)


def _gelu_grad_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, ...]:
    dy, x = args
    t = x.dtype.type
    pdf = np.exp(x * x * t(-0.5)) * t(INV_SQRT_2PI)
    dx = dy * (_gelu_cdf(x) + x * pdf)
    return dx, _sum_rows(dx)


def _sum_rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]).sum(axis=0, dtype=np.float64).astype(a.dtype)


def _layer_norm_grad_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, ...]:
    dy, x, gamma = (a.astype(np.float64) for a in args)
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + attrs["epsilon"])
    xhat = (x - mean) * rstd
    g = dy * gamma
    dx = rstd * (
        g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)
    )
    dt = args[1].dtype
    return tuple(v.astype(dt) for v in (dx, _sum_rows(dy * xhat), _sum_rows(dy), _sum_rows(dx)))


def _conv2d_bias_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    # conv2d_bias(x, w, bias[, scale[, residual]]) = relu?(conv * scale + bias + residual).
    x, w, bias, *rest = args
    conv_attrs = {k: v for k, v in attrs.items() if k != "relu"}
    (out,) = prim_ops.evaluate("conv2d", [x, w], conv_attrs)
    if rest:
        out = out * rest[0].reshape(1, -1, 1, 1)
    out = out + bias.reshape(1, -1, 1, 1)
    if len(rest) > 1:
        out = out + rest[1]
    return np.where(out < 0, out.dtype.type(0), out) if attrs["relu"] else out


def _max_pool2d_relu_grad_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    (grad,) = prim_ops.evaluate("max_pool2d_grad", args, attrs)
    return np.where(args[1] > 0, grad, grad.dtype.type(0))


# A reference of a multi-output kernel returns a tuple: its first len(outputs) entries are used.
CPU_ONLY_REFERENCES: dict[str, Callable[[list[np.ndarray], dict], np.ndarray | tuple]] = {
    "gemm": _gemm_reference,
    "layer_norm": _layer_norm_reference,
    "attention": _attention_reference,
    "attention_grad": _attention_grad_reference,
    "gelu": gelu_reference,
    "gelu_grad": _gelu_grad_reference,
    "layer_norm_grad": _layer_norm_grad_reference,
    "conv2d_bias": _conv2d_bias_reference,
    "max_pool2d_relu_grad": _max_pool2d_relu_grad_reference,
}

__all__ = ["CPU_ONLY_REFERENCES", "INV_SQRT_2PI", "SQRT_HALF", "gelu_reference"]
