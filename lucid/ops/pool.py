"""2-d pooling: max_pool2d (values and argmax indices), avg_pool2d, adaptive_avg_pool2d.

Each op's backward is a registry op of its own. The average pools are linear maps, so their
backward ops have the forward op as VJP rule (double backward); max-pool's backward is a scatter
of the gradient to the argmax positions, whose own VJP is a gather at the same positions.
1-d pooling is 2-d pooling over a height of 1 (see ``lucid.nn.functional``).
"""

from __future__ import annotations

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid.ops._registry import SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

_SAFE = frozenset({SYMBOLIC_BATCH_SAFE})

__all__: list[str] = []


def _pool_out_size(op, size, k, s, p, d, ceil_mode) -> int:
    eff = d * (k - 1) + 1
    num = size + 2 * p - eff
    if ceil_mode:
        out = -(-num // s) + 1
        # the last window must start inside the input or its left padding
        if (out - 1) * s >= size + p:
            out -= 1
    else:
        out = num // s + 1
    if out < 1:
        raise ValueError(
            f"{op}: input size {size} (padding {p}) is too small for a window of {eff}; "
            "the output would be empty"
        )
    return out


def _geometry(op, shape, kernel_size, stride, padding, dilation, ceil_mode):
    if len(shape) != 4:
        raise ValueError(f"{op}: expected a 4-d input (N, C, H, W), got shape {tuple(shape)}")
    for name, v, lo in (("kernel_size", kernel_size, 1), ("stride", stride, 1)):
        if min(v) < lo:
            raise ValueError(f"{op}: {name} must be positive, got {v}")
    if min(dilation) < 1:
        raise ValueError(f"{op}: dilation must be positive, got {dilation}")
    for k, p in zip(kernel_size, padding, strict=True):
        if p < 0 or p > k // 2:
            raise ValueError(
                f"{op}: padding should be at most half of the kernel size, got padding={padding}, "
                f"kernel_size={kernel_size}"
            )
    h, w = shape[2:]
    ho = _pool_out_size(op, h, kernel_size[0], stride[0], padding[0], dilation[0], ceil_mode)
    wo = _pool_out_size(op, w, kernel_size[1], stride[1], padding[1], dilation[1], ceil_mode)
    return ho, wo


def _windows(x, kernel_size, stride, padding, dilation, out_hw, fill):
    """(N, C, Ho, Wo, kh, kw) view of ``x`` padded with ``fill`` (extra on the right for ceil)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = (
        kernel_size,
        stride,
        padding,
        dilation,
        out_hw,
    )
    h, w = x.shape[2:]
    need_h = (ho - 1) * sh + dh * (kh - 1) + 1
    need_w = (wo - 1) * sw + dw * (kw - 1) + 1
    extra_h, extra_w = max(need_h - h - ph, 0), max(need_w - w - pw, 0)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, extra_h), (pw, extra_w)), constant_values=fill)
    s_n, s_c, s_h, s_w = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp,
        shape=(*xp.shape[:2], ho, wo, kh, kw),
        strides=(s_n, s_c, s_h * sh, s_w * sw, s_h * dh, s_w * dw),
        writeable=False,
    )


_POOL_ATTRS = {
    "kernel_size": (1, 1),
    "stride": (1, 1),
    "padding": (0, 0),
    "dilation": (1, 1),
    "ceil_mode": False,
}


# --- max_pool2d


def _max_infer(x, kernel_size, stride, padding, dilation, ceil_mode):
    ho, wo = _geometry("max_pool2d", x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    shape = (*x.shape[:2], ho, wo)
    return AVal(shape, x.dtype), AVal(shape, _dtype.int64)


def _max_kernel(x, kernel_size, stride, padding, dilation, ceil_mode):
    out_hw = _geometry("max_pool2d", x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win = _windows(x, kernel_size, stride, padding, dilation, out_hw, fill)
    kh, kw = kernel_size
    # One pass per window offset over output-sized arrays: no (..., kh*kw) copy. The first
    # maximum wins, and any NaN replaces the running maximum (torch's CPU rule).
    values = win[..., 0, 0].copy()
    arg = np.zeros(values.shape, dtype=np.int64)
    for a in range(kh):
        for b in range(kw):
            if a == 0 and b == 0:
                continue
            v = win[..., a, b]
            better = v > values
            if x.dtype.kind == "f":
                better |= np.isnan(v)
            np.copyto(values, v, where=better)
            arg[better] = a * kw + b
    ho, wo = out_hw
    rows = np.arange(ho)[:, None] * stride[0] - padding[0] + (arg // kw) * dilation[0]
    cols = np.arange(wo)[None, :] * stride[1] - padding[1] + (arg % kw) * dilation[1]
    return values, rows * x.shape[3] + cols


def _max_vjp(c, g, _g_indices):
    x = c.inputs[0]
    return (apply("max_pool2d_backward", g, c.outputs[1], input_shape=tuple(x.shape)),)


register(
    OpDef(
        "max_pool2d",
        ("x",),
        _max_infer,
        _max_kernel,
        _max_vjp,
        attrs=dict(_POOL_ATTRS),
        props=_SAFE,
        n_outputs=2,
        saves_inputs=False,
        doc="Max over windows; the second output is each maximum's flat index into H*W.",
    )
)


def _max_backward_infer(grad, indices, input_shape):
    if tuple(grad.shape) != tuple(indices.shape):
        raise ValueError(
            f"max_pool2d_backward: grad {tuple(grad.shape)} and indices {tuple(indices.shape)} "
            "differ in shape"
        )
    return AVal(tuple(input_shape), grad.dtype)


def _max_backward_kernel(grad, indices, input_shape):
    n, c, h, w = input_shape
    base = (np.arange(n * c, dtype=np.int64) * (h * w)).reshape(n, c, 1, 1)
    flat = np.bincount(
        (indices + base).reshape(-1), weights=grad.reshape(-1), minlength=n * c * h * w
    )
    return flat.reshape(input_shape).astype(grad.dtype)


def _max_backward_vjp(c, gg):
    grad, indices = c.inputs
    n, ch = grad.shape[:2]
    picked = gg.reshape(n, ch, -1).gather(2, indices.reshape(n, ch, -1))
    return picked.reshape(*grad.shape), None


register(
    OpDef(
        "max_pool2d_backward",
        ("grad", "indices"),
        _max_backward_infer,
        _max_backward_kernel,
        _max_backward_vjp,
        attrs={"input_shape": None},
        saves_outputs=False,
        doc="Scatter-add of the pooled gradient to the argmax positions.",
    )
)


# --- avg_pool2d


def _avg_geometry(x_shape, kernel_size, stride, padding, ceil_mode):
    return _geometry("avg_pool2d", x_shape, kernel_size, stride, padding, (1, 1), ceil_mode)


def _avg_divisor(x_shape, kernel_size, stride, padding, out_hw, count_include_pad, divisor):
    """(Ho, Wo) divisors, as torch: windows clipped to the padded input (or to the input)."""
    if divisor:
        return np.full(out_hw, float(divisor))
    factors = []
    for size, k, s, p, o in zip(x_shape[2:], kernel_size, stride, padding, out_hw, strict=True):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            factors.append(end - start)
        else:
            factors.append(np.minimum(end, size) - np.maximum(start, 0))
    return np.outer(factors[0], factors[1]).astype(np.float64)


def _avg_infer(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    if not x.dtype.is_floating_point:
        raise TypeError(f"avg_pool2d: expected a floating point input, got {x.dtype}")
    ho, wo = _avg_geometry(x.shape, kernel_size, stride, padding, ceil_mode)
    return AVal((*x.shape[:2], ho, wo), x.dtype)


def _avg_kernel(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    out_hw = _avg_geometry(x.shape, kernel_size, stride, padding, ceil_mode)
    win = _windows(x, kernel_size, stride, padding, (1, 1), out_hw, 0)
    div = _avg_divisor(
        x.shape, kernel_size, stride, padding, out_hw, count_include_pad, divisor_override
    )
    return (win.sum(axis=(4, 5)) / div).astype(x.dtype)


def _avg_backward_kernel(
    grad, input_shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    ho, wo = _avg_geometry(input_shape, kernel_size, stride, padding, ceil_mode)
    div = _avg_divisor(
        input_shape, kernel_size, stride, padding, (ho, wo), count_include_pad, divisor_override
    )
    g = grad / div
    (kh, kw), (sh, sw), (ph, pw) = kernel_size, stride, padding
    n, c, h, w = input_shape
    hp = max(h + 2 * ph, (ho - 1) * sh + kh)
    wp = max(w + 2 * pw, (wo - 1) * sw + kw)
    dxp = np.zeros((n, c, hp, wp), dtype=np.result_type(grad.dtype, np.float32))
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw] += g
    return dxp[:, :, ph : ph + h, pw : pw + w].astype(grad.dtype)


_AVG_ATTRS = {
    "kernel_size": (1, 1),
    "stride": (1, 1),
    "padding": (0, 0),
    "ceil_mode": False,
    "count_include_pad": True,
    "divisor_override": None,
}

register(
    OpDef(
        "avg_pool2d",
        ("x",),
        _avg_infer,
        _avg_kernel,
        lambda c, g: (
            apply("avg_pool2d_backward", g, input_shape=tuple(c.inputs[0].shape), **c.attrs),
        ),
        attrs=dict(_AVG_ATTRS),
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)
register(
    OpDef(
        "avg_pool2d_backward",
        ("grad",),
        lambda grad, input_shape, **_: AVal(tuple(input_shape), grad.dtype),
        _avg_backward_kernel,
        lambda c, gg: (
            apply("avg_pool2d", gg, **{k: v for k, v in c.attrs.items() if k != "input_shape"}),
        ),
        attrs={"input_shape": None, **_AVG_ATTRS},
        saves_inputs=False,
        saves_outputs=False,
        doc="avg_pool2d's gradient: each output's gradient spread evenly over its window.",
    )
)


# --- adaptive_avg_pool2d: y = A_h x A_w^T with averaging matrices


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(out, size) matrix averaging the windows [floor(i*size/out), ceil((i+1)*size/out))."""
    m = np.zeros((out, size))
    for i in range(out):
        start = (i * size) // out
        end = -(-((i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _adaptive_check(shape, output_size):
    if len(shape) != 4:
        raise ValueError(
            f"adaptive_avg_pool2d: expected a 4-d input (N, C, H, W), got shape {tuple(shape)}"
        )
    if len(output_size) != 2 or min(output_size) < 1:
        raise ValueError(
            f"adaptive_avg_pool2d: output_size must be 2 positive ints, got {output_size}"
        )


def _adaptive_infer(x, output_size):
    _adaptive_check(x.shape, output_size)
    if not x.dtype.is_floating_point:
        raise TypeError(f"adaptive_avg_pool2d: expected a floating point input, got {x.dtype}")
    return AVal((*x.shape[:2], *output_size), x.dtype)


def _adaptive_kernel(x, output_size):
    _adaptive_check(x.shape, output_size)
    a_h = _adaptive_matrix(x.shape[2], output_size[0]).astype(x.dtype)
    a_w = _adaptive_matrix(x.shape[3], output_size[1]).astype(x.dtype)
    return np.matmul(np.matmul(a_h, x), a_w.T)


def _adaptive_backward_kernel(grad, input_shape, output_size):
    a_h = _adaptive_matrix(input_shape[2], output_size[0]).astype(grad.dtype)
    a_w = _adaptive_matrix(input_shape[3], output_size[1]).astype(grad.dtype)
    return np.matmul(np.matmul(a_h.T, grad), a_w)


register(
    OpDef(
        "adaptive_avg_pool2d",
        ("x",),
        _adaptive_infer,
        _adaptive_kernel,
        lambda c, g: (
            apply(
                "adaptive_avg_pool2d_backward",
                g,
                input_shape=tuple(c.inputs[0].shape),
                output_size=c.attrs["output_size"],
            ),
        ),
        attrs={"output_size": (1, 1)},
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)
register(
    OpDef(
        "adaptive_avg_pool2d_backward",
        ("grad",),
        lambda grad, input_shape, output_size: AVal(tuple(input_shape), grad.dtype),
        _adaptive_backward_kernel,
        lambda c, gg: (apply("adaptive_avg_pool2d", gg, output_size=c.attrs["output_size"]),),
        attrs={"input_shape": None, "output_size": (1, 1)},
        saves_inputs=False,
        saves_outputs=False,
    )
)
