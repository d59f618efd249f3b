"""Layers with weights: ``linear`` and 2-d convolution (1-d convolution is a view of it).

``conv2d`` runs as im2col + one batched matmul per call. Its input and weight gradients are
registry ops of their own (``conv2d_input_grad``, ``conv2d_weight_grad``) so a traced backward pass
holds them as units; being bilinear, each has a VJP rule made of the other two (double backward).
An absent bias is the scalar operand 0.0, so every op has a fixed operand list.

``conv_transpose2d`` is conv2d's input gradient seen as a layer (weight (C_in, C_out/groups, kh,
kw)): its kernel, VJP rule and lowering are ``conv2d_input_grad``'s, conv2d and
conv2d_weight_grad, with PyTorch's ``output_padding`` taken from the bottom/right padding (or, when
it exceeds the padding, appended as zero rows/columns no input reaches).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._registry import SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

__all__ = ["conv1d", "conv2d", "conv_transpose2d"]


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check_float_pair(op: str, x, w) -> None:
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point input, got {x.dtype}")
    if x.dtype is not w.dtype:
        raise TypeError(f"{op}: input dtype {x.dtype} and weight dtype {w.dtype} differ")


def _check_bias(op: str, bias, n_out: int) -> None:
    if _is_tensor(bias) and tuple(bias.shape) != (n_out,):
        raise ValueError(f"{op}: bias must have shape ({n_out},), got {tuple(bias.shape)}")


# --- linear: y = x @ weight.T + bias


def _linear_infer(x, weight, bias) -> AVal:
    _check_float_pair("linear", x, weight)
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-d (out, in), got shape {tuple(weight.shape)}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: input's last dim {tuple(x.shape)[-1:]} does not match weight's in-features "
            f"{weight.shape[1]} (input {tuple(x.shape)}, weight {tuple(weight.shape)})"
        )
    _check_bias("linear", bias, weight.shape[0])
    return AVal((*x.shape[:-1], weight.shape[0]), x.dtype)


def _linear_kernel(x, weight, bias):
    y = np.matmul(x, weight.T)
    if bias.ndim:
        y += bias
    return y


def _linear_vjp(c, g):
    x, weight, bias = c.inputs
    need_x, need_w, need_b = c.needs_input_grad
    n_out = weight.shape[0]
    gx = gw = gb = None
    if need_x:
        gx = g.matmul(weight)
    if need_w:
        g2 = g.reshape(-1, n_out)
        gw = g2.transpose(0, 1).matmul(x.reshape(-1, weight.shape[1]))
    if need_b and isinstance(bias, Tensor):
        gb = g.reshape(-1, n_out).sum(0)
    return gx, gw, gb


register(
    OpDef(
        "linear",
        ("x", "weight", "bias"),
        _linear_infer,
        _linear_kernel,
        _linear_vjp,
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="``x @ weight.T + bias``; weight is (out_features, in_features).",
    )
)


# --- conv2d


def _pair(v, name: str, op: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")
    return t


def _out_size(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


def _conv_geometry(op: str, x_shape, w_shape, stride, padding, dilation, groups):
    """Checks the shapes and returns (N, C, H, W), (O, Cg, kh, kw), (Ho, Wo)."""
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected a 4-d input (N, C, H, W), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"{op}: expected a 4-d weight (O, C/groups, kh, kw), got {tuple(w_shape)}")
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    if c != cg * groups:
        raise ValueError(
            f"{op}: input has {c} channels but weight expects {cg * groups} "
            f"(weight.shape[1]={cg} x groups={groups})"
        )
    if o % groups:
        raise ValueError(f"{op}: out_channels {o} is not divisible by groups={groups}")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(
            f"{op}: stride and dilation must be >= 1 and padding >= 0, got stride={stride}, "
            f"padding={padding}, dilation={dilation}"
        )
    pt, pb, pl, pr = padding
    ho = _out_size(h, kh, stride[0], pt + pb, dilation[0])
    wo = _out_size(w, kw, stride[1], pl + pr, dilation[1])
    if ho < 1 or wo < 1:
        raise ValueError(
            f"{op}: the (padded) input {(h + pt + pb, w + pl + pr)} is smaller than the dilated "
            f"kernel {(dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)}"
        )
    return (n, c, h, w), (o, cg, kh, kw), (ho, wo)


def _columns(x, kh, kw, stride, padding, dilation, ho, wo, groups):
    """im2col, channels last: (G, N*Ho*Wo, kh*kw*Cg) patches of the padded input.

    The input goes to NHWC first so that the big copy below reads runs of contiguous channels.
    """
    pt, pb, pl, pr = padding
    xt = x.transpose(0, 2, 3, 1)
    xt = np.pad(xt, ((0, 0), (pt, pb), (pl, pr), (0, 0))) if any(padding) else xt.copy()
    n, c = x.shape[:2]
    s_n, s_h, s_w, s_c = xt.strides
    windows = np.lib.stride_tricks.as_strided(
        xt,
        shape=(n, ho, wo, kh, kw, c),
        strides=(s_n, s_h * stride[0], s_w * stride[1], s_h * dilation[0], s_w * dilation[1], s_c),
        writeable=False,
    )
    if groups == 1:
        return windows.reshape(1, n * ho * wo, kh * kw * c)
    cg = c // groups
    windows = windows.reshape(n, ho, wo, kh, kw, groups, cg).transpose(5, 0, 1, 2, 3, 4, 6)
    return windows.reshape(groups, n * ho * wo, kh * kw * cg)


def _weight_matrix(weight, groups):
    """(O, Cg, kh, kw) -> (G, kh*kw*Cg, O/G), rows ordered as the columns of ``_columns``."""
    o, cg, kh, kw = weight.shape
    w = weight.reshape(groups, o // groups, cg, kh, kw).transpose(0, 3, 4, 2, 1)
    return w.reshape(groups, kh * kw * cg, o // groups)


def _grad_rows(g, groups):
    """(N, O, Ho, Wo) -> (G, N*Ho*Wo, O/G)."""
    n, o, ho, wo = g.shape
    rows = g.transpose(0, 2, 3, 1).reshape(n, ho, wo, groups, o // groups)
    return rows.transpose(3, 0, 1, 2, 4).reshape(groups, n * ho * wo, o // groups)


def _grouped_matmul(a, b):
    """Per-group 2-d matmuls (BLAS), (G, M, K) @ (G, K, N) -> (G, M, N)."""
    return np.stack([np.matmul(a[i], b[i]) for i in range(a.shape[0])])


def _conv2d_infer(x, weight, bias, stride, padding, dilation, groups) -> AVal:
    _check_float_pair("conv2d", x, weight)
    (n, *_), (o, *_), (ho, wo) = _conv_geometry(
        "conv2d", x.shape, weight.shape, stride, padding, dilation, groups
    )
    _check_bias("conv2d", bias, o)
    return AVal((n, o, ho, wo), x.dtype)


def _conv2d_kernel(x, weight, bias, stride, padding, dilation, groups):
    (n, *_), (o, _, kh, kw), (ho, wo) = _conv_geometry(
        "conv2d", x.shape, weight.shape, stride, padding, dilation, groups
    )
    cols = _columns(x, kh, kw, stride, padding, dilation, ho, wo, groups)
    out = _grouped_matmul(cols, _weight_matrix(weight, groups))  # (G, N*Ho*Wo, O/G)
    out = out.reshape(groups, n, ho, wo, o // groups).transpose(1, 0, 4, 2, 3).reshape(n, o, ho, wo)
    if bias.ndim:
        out += bias.reshape(1, o, 1, 1)
    return out


def _conv_attrs(attrs: dict) -> dict:
    return {k: attrs[k] for k in ("stride", "padding", "dilation", "groups")}


def _conv2d_vjp(c, g):
    x, weight, bias = c.inputs
    attrs = _conv_attrs(c.attrs)
    need_x, need_w, need_b = c.needs_input_grad
    gx = gw = gb = None
    if need_x:
        gx = apply("conv2d_input_grad", g, weight, input_shape=tuple(x.shape), **attrs)
    if need_w:
        gw = apply("conv2d_weight_grad", x, g, weight_shape=tuple(weight.shape), **attrs)
    if need_b and isinstance(bias, Tensor):
        gb = g.sum((0, 2, 3))
    return gx, gw, gb


_CONV_ATTRS = {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1}

register(
    OpDef(
        "conv2d",
        ("x", "weight", "bias"),
        _conv2d_infer,
        _conv2d_kernel,
        _conv2d_vjp,
        attrs=dict(_CONV_ATTRS),
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="2-d cross-correlation; padding is (top, bottom, left, right).",
    )
)


def _input_grad_infer(grad, weight, input_shape, stride, padding, dilation, groups) -> AVal:
    _, _, (ho, wo) = _conv_geometry(
        "conv2d_input_grad", input_shape, weight.shape, stride, padding, dilation, groups
    )
    if tuple(grad.shape[2:]) != (ho, wo) or grad.shape[1] != weight.shape[0]:
        raise ValueError(
            f"conv2d_input_grad: grad shape {tuple(grad.shape)} does not match the conv output "
            f"(N, {weight.shape[0]}, {ho}, {wo})"
        )
    return AVal(tuple(input_shape), grad.dtype)


def _input_grad_kernel(grad, weight, input_shape, stride, padding, dilation, groups):
    (n, c, h, w), (o, cg, kh, kw), (ho, wo) = _conv_geometry(
        "conv2d_input_grad", input_shape, weight.shape, stride, padding, dilation, groups
    )
    wmat = _weight_matrix(weight, groups).transpose(0, 2, 1)
    dcols = _grouped_matmul(_grad_rows(grad, groups), wmat)  # (G, N*Ho*Wo, kh*kw*Cg)
    dcols = dcols.reshape(groups, n, ho, wo, kh, kw, cg)
    dcols = dcols[0] if groups == 1 else dcols.transpose(1, 2, 3, 4, 5, 0, 6)
    dcols = dcols.reshape(n, ho, wo, kh, kw, c)
    pt, pb, pl, pr = padding
    dxp = np.zeros((n, h + pt + pb, w + pl + pr, c), dtype=grad.dtype)
    sh, sw = stride
    for i in range(kh):
        r0 = i * dilation[0]
        for j in range(kw):
            c0 = j * dilation[1]
            dxp[:, r0 : r0 + sh * (ho - 1) + 1 : sh, c0 : c0 + sw * (wo - 1) + 1 : sw] += dcols[
                :, :, :, i, j
            ]
    return np.ascontiguousarray(dxp[:, pt : pt + h, pl : pl + w].transpose(0, 3, 1, 2))


def _input_grad_vjp(c, gg):
    grad, weight = c.inputs
    attrs = _conv_attrs(c.attrs)
    g_grad = g_weight = None
    if c.needs_input_grad[0]:
        g_grad = apply("conv2d", gg, weight, 0.0, **attrs)
    if c.needs_input_grad[1]:
        g_weight = apply("conv2d_weight_grad", gg, grad, weight_shape=tuple(weight.shape), **attrs)
    return g_grad, g_weight


register(
    OpDef(
        "conv2d_input_grad",
        ("grad", "weight"),
        _input_grad_infer,
        _input_grad_kernel,
        _input_grad_vjp,
        attrs={"input_shape": None, **_CONV_ATTRS},
        saves_outputs=False,
        doc="conv2d's gradient with respect to its input (a transposed convolution).",
    )
)


def _weight_grad_infer(x, grad, weight_shape, stride, padding, dilation, groups) -> AVal:
    _, _, (ho, wo) = _conv_geometry(
        "conv2d_weight_grad", x.shape, weight_shape, stride, padding, dilation, groups
    )
    if tuple(grad.shape) != (x.shape[0], weight_shape[0], ho, wo):
        raise ValueError(
            f"conv2d_weight_grad: grad shape {tuple(grad.shape)} does not match the conv output "
            f"{(x.shape[0], weight_shape[0], ho, wo)}"
        )
    return AVal(tuple(weight_shape), grad.dtype)


def _weight_grad_kernel(x, grad, weight_shape, stride, padding, dilation, groups):
    _, (o, cg, kh, kw), (ho, wo) = _conv_geometry(
        "conv2d_weight_grad", x.shape, weight_shape, stride, padding, dilation, groups
    )
    cols = _columns(x, kh, kw, stride, padding, dilation, ho, wo, groups)
    dw = _grouped_matmul(cols.transpose(0, 2, 1), _grad_rows(grad, groups))  # (G, kh*kw*Cg, O/G)
    dw = dw.reshape(groups, kh, kw, cg, o // groups).transpose(0, 4, 3, 1, 2)
    return dw.reshape(o, cg, kh, kw)


def _weight_grad_vjp(c, gg):
    x, grad = c.inputs
    attrs = _conv_attrs(c.attrs)
    g_x = g_grad = None
    if c.needs_input_grad[0]:
        g_x = apply("conv2d_input_grad", grad, gg, input_shape=tuple(x.shape), **attrs)
    if c.needs_input_grad[1]:
        g_grad = apply("conv2d", x, gg, 0.0, **attrs)
    return g_x, g_grad


register(
    OpDef(
        "conv2d_weight_grad",
        ("x", "grad"),
        _weight_grad_infer,
        _weight_grad_kernel,
        _weight_grad_vjp,
        attrs={"weight_shape": None, **_CONV_ATTRS},
        saves_outputs=False,
        doc="conv2d's gradient with respect to its weight.",
    )
)


# --- conv_transpose2d: conv2d_input_grad as a layer


def transpose_plan(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    """How ``conv_transpose2d`` runs as ``conv2d_input_grad``: (the conv input shape it produces,
    its (top, bottom, left, right) padding, the zero rows/columns appended (bottom, right)).

    PyTorch's output size per dim is ``(H - 1) * s - 2 * p + d * (k - 1) + output_padding + 1``;
    the extra ``output_padding`` rows come from a smaller bottom padding while they fit in it."""
    op = "conv_transpose2d"
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected a 4-d input (N, C, H, W), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(
            f"{op}: expected a 4-d weight (C_in, C_out/groups, kh, kw), got {tuple(w_shape)}"
        )
    n, c_in, h, w = x_shape
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    if c_in != w_shape[0]:
        raise ValueError(
            f"{op}: input has {c_in} channels but weight expects {w_shape[0]} (weight.shape[0])"
        )
    if c_in % groups:
        raise ValueError(f"{op}: in_channels {c_in} is not divisible by groups={groups}")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(output_padding) < 0:
        raise ValueError(
            f"{op}: stride and dilation must be >= 1, padding and output_padding >= 0, got "
            f"stride={stride}, padding={padding}, output_padding={output_padding}, "
            f"dilation={dilation}"
        )
    sizes, pads, extra = [], [], []
    for i, size in enumerate((h, w)):
        s, p, o, d, k = stride[i], padding[i], output_padding[i], dilation[i], w_shape[2 + i]
        if o >= s and o >= d:
            raise ValueError(
                f"{op}: output_padding {output_padding} must be smaller than either stride "
                f"{stride} or dilation {dilation}"
            )
        out = (size - 1) * s - 2 * p + d * (k - 1) + o + 1
        if out < 1:
            raise ValueError(f"{op}: the output size {out} (dim {2 + i}) is not positive")
        low_side = min(o, p)
        sizes.append(out - (o - low_side))
        pads += [p, p - low_side]
        extra.append(o - low_side)
    conv_input = (n, w_shape[1] * groups, sizes[0], sizes[1])
    return conv_input, tuple(pads), tuple(extra)


def _transpose_out_shape(conv_input, extra) -> tuple:
    n, c, h, w = conv_input
    return (n, c, h + extra[0], w + extra[1])


def _conv_transpose2d_infer(x, weight, bias, stride, padding, output_padding, dilation, groups):
    _check_float_pair("conv_transpose2d", x, weight)
    conv_input, _, extra = transpose_plan(
        x.shape, weight.shape, stride, padding, output_padding, dilation, groups
    )
    _check_bias("conv_transpose2d", bias, conv_input[1])
    return AVal(_transpose_out_shape(conv_input, extra), x.dtype)


def _conv_transpose2d_kernel(x, weight, bias, stride, padding, output_padding, dilation, groups):
    conv_input, pads, extra = transpose_plan(
        x.shape, weight.shape, stride, padding, output_padding, dilation, groups
    )
    out = _input_grad_kernel(x, weight, conv_input, stride, pads, dilation, groups)
    if any(extra):
        out = np.pad(out, ((0, 0), (0, 0), (0, extra[0]), (0, extra[1])))
    if bias.ndim:
        out += bias.reshape(1, -1, 1, 1)
    return out


def _conv_transpose2d_vjp(c, g):
    x, weight, bias = c.inputs
    need_x, need_w, need_b = c.needs_input_grad
    conv_input, pads, extra = transpose_plan(
        tuple(x.shape), tuple(weight.shape), **_transpose_attrs(c.attrs)
    )
    attrs = {
        "stride": c.attrs["stride"],
        "padding": pads,
        "dilation": c.attrs["dilation"],
        "groups": c.attrs["groups"],
    }
    # The appended zero rows/columns take no input: their gradient is dropped.
    g_in = g[:, :, : conv_input[2], : conv_input[3]] if any(extra) else g
    gx = gw = gb = None
    if need_x:
        gx = apply("conv2d", g_in, weight, 0.0, **attrs)
    if need_w:
        gw = apply("conv2d_weight_grad", g_in, x, weight_shape=tuple(weight.shape), **attrs)
    if need_b and isinstance(bias, Tensor):
        gb = g.sum((0, 2, 3))
    return gx, gw, gb


def _transpose_attrs(attrs: dict) -> dict:
    keys = ("stride", "padding", "output_padding", "dilation", "groups")
    return {k: attrs[k] for k in keys}


register(
    OpDef(
        "conv_transpose2d",
        ("x", "weight", "bias"),
        _conv_transpose2d_infer,
        _conv_transpose2d_kernel,
        _conv_transpose2d_vjp,
        attrs={
            "stride": (1, 1),
            "padding": (0, 0),
            "output_padding": (0, 0),
            "dilation": (1, 1),
            "groups": 1,
        },
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="2-d transposed convolution (conv2d's input gradient as a layer), PyTorch's sizes.",
    )
)


# --- fronts


def _conv_padding(padding, kernel: Sequence[int], stride, dilation, op: str) -> tuple:
    """Normalise int / tuple / 'same' / 'valid' to (before, after) per spatial dim."""
    if isinstance(padding, str):
        if padding == "valid":
            return tuple((0, 0) for _ in kernel)
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
            out = []
            for k, d in zip(kernel, dilation, strict=True):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return tuple(out)
        raise ValueError(
            f"{op}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}"
        )
    if isinstance(padding, int):
        padding = (padding,) * len(kernel)
    padding = tuple(padding)
    if len(padding) != len(kernel) or not all(isinstance(p, int) for p in padding):
        raise ValueError(f"{op}: padding must have {len(kernel)} ints, got {padding!r}")
    return tuple((p, p) for p in padding)


def _bias_operand(bias):
    return 0.0 if bias is None else bias


def conv2d(
    input: Tensor,  # noqa: A002  (PyTorch's argument name)
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Tensor:
    """2-d convolution (cross-correlation) over (N, C, H, W) or unbatched (C, H, W) input."""
    stride = _pair(stride, "stride", "conv2d")
    dilation = _pair(dilation, "dilation", "conv2d")
    if weight.ndim != 4:
        raise ValueError(f"conv2d: expected a 4-d weight, got shape {tuple(weight.shape)}")
    (pt, pb), (pl, pr) = _conv_padding(padding, weight.shape[2:], stride, dilation, "conv2d")
    unbatched = input.ndim == 3
    x = input.reshape(1, *input.shape) if unbatched else input
    out = apply(
        "conv2d",
        x,
        weight,
        _bias_operand(bias),
        stride=stride,
        padding=(pt, pb, pl, pr),
        dilation=dilation,
        groups=groups,
    )
    return out.reshape(out.shape[1:]) if unbatched else out


def _single(v, name: str, op: str) -> int:
    if isinstance(v, int):
        return v
    t = tuple(v)
    if len(t) != 1 or not isinstance(t[0], int):
        raise ValueError(f"{op}: {name} must be an int or a 1-tuple, got {v!r}")
    return t[0]


def conv1d(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
) -> Tensor:
    """1-d convolution over (N, C, L) or (C, L) input, run as a conv2d with a height of 1."""
    stride = _single(stride, "stride", "conv1d")
    dilation = _single(dilation, "dilation", "conv1d")
    if weight.ndim != 3:
        raise ValueError(
            f"conv1d: expected a 3-d weight (O, C/groups, k), got {tuple(weight.shape)}"
        )
    if input.ndim not in (2, 3):
        raise ValueError(f"conv1d: expected a 2-d or 3-d input, got shape {tuple(input.shape)}")
    ((pl, pr),) = _conv_padding(padding, weight.shape[2:], (stride,), (dilation,), "conv1d")
    unbatched = input.ndim == 2
    x = input.reshape(1, *input.shape) if unbatched else input
    n, c, length = x.shape
    if c != weight.shape[1] * groups:
        raise ValueError(
            f"conv1d: input has {c} channels but weight expects {weight.shape[1] * groups} "
            f"(weight.shape[1]={weight.shape[1]} x groups={groups})"
        )
    out = apply(
        "conv2d",
        x.reshape(n, c, 1, length),
        weight.reshape(weight.shape[0], weight.shape[1], 1, weight.shape[2]),
        _bias_operand(bias),
        stride=(1, stride),
        padding=(0, 0, pl, pr),
        dilation=(1, dilation),
        groups=groups,
    )
    out = out.reshape(n, out.shape[1], out.shape[3])
    return out.reshape(out.shape[1:]) if unbatched else out


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias`` with weight of shape (out_features, in_features)."""
    return apply("linear", input, weight, _bias_operand(bias))


def conv_transpose2d(
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    output_padding: int | tuple[int, int] = 0,
    groups: int = 1,
    dilation: int | tuple[int, int] = 1,
) -> Tensor:
    """2-d transposed convolution over (N, C_in, H, W) or unbatched (C_in, H, W) input; weight
    (C_in, C_out/groups, kh, kw); PyTorch's argument order and output size."""
    op = "conv_transpose2d"
    if not isinstance(padding, (int, tuple, list)):
        raise ValueError(f"{op}: padding must be an int or a pair of ints, got {padding!r}")
    if input.ndim not in (3, 4):
        raise ValueError(f"{op}: expected a 3-d or 4-d input, got shape {tuple(input.shape)}")
    unbatched = input.ndim == 3
    x = input.reshape(1, *input.shape) if unbatched else input
    out = apply(
        op,
        x,
        weight,
        _bias_operand(bias),
        stride=_pair(stride, "stride", op),
        padding=_pair(padding, "padding", op),
        output_padding=_pair(output_padding, "output_padding", op),
        dilation=_pair(dilation, "dilation", op),
        groups=groups,
    )
    return out.reshape(out.shape[1:]) if unbatched else out
