"""Lowering rules of linear algebra and network layers: matmul, linear, einsum, conv2d and its
gradients, pooling, normalization, activations and scaled dot-product attention."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lucid import _dtype
from lucid.ir.prim.composite import attention_output, attention_scores, attention_weights
from lucid.ops._registry import normalize_dim
from lucid.ops.pool import _adaptive_matrix, _avg_divisor, _geometry
from lucid.passes.lowering._core import (
    PV,
    Builder,
    LoweringUnsupported,
    P,
    is_scalar,
    lower_dtype,
    rule,
)
from lucid.passes.lowering.shape import tri_mask

# --- linear algebra


def _matmul(b: Builder, a: PV, c: PV, out_shape: tuple, transpose_b: bool = False) -> PV:
    if a.ndim == 1:
        a = b.reshape(a, (1, a.shape[0]))
    if c.ndim == 1:
        c = b.reshape(c, (c.shape[0], 1) if not transpose_b else (1, c.shape[0]))
    return b.reshape(b.op("matmul", a, c, transpose_b=transpose_b), out_shape)


def _numeric(dt: _dtype.dtype) -> _dtype.dtype:
    return _dtype.int64 if dt is _dtype.bool_ else dt


@rule("matmul")
def _matmul_rule(b: Builder, a, c):
    out = b.outs[0]
    dt = _numeric(out.dtype)
    return _matmul(b, b.cast(a, dt), b.cast(c, dt), out.shape)


@rule("linear")
def _linear(b: Builder, v, weight, bias):
    out = b.outs[0]
    y = _matmul(b, b.cast(v, out.dtype), b.cast(weight, out.dtype), out.shape, transpose_b=True)
    if isinstance(bias, PV):
        y = b.op("add", y, b.cast(bias, out.dtype))
    return y


@rule("einsum")
def _einsum(b: Builder, operands, equation):
    eq = equation.replace(" ", "")
    if "." in eq:
        raise LoweringUnsupported("einsum with an ellipsis")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if not arrow:
        counts = {ch: lhs.count(ch) for ch in lhs if ch.isalpha()}
        rhs = "".join(sorted(ch for ch, n in counts.items() if n == 1))
    if any(len(set(t)) != len(t) for t in terms):
        raise LoweringUnsupported("einsum with a repeated index inside one operand (a diagonal)")
    dt = _numeric(b.outs[0].dtype)
    letters = list(rhs) + sorted({ch for t in terms for ch in t} - set(rhs))
    sizes: dict[str, int] = {}
    for t, v in zip(terms, operands, strict=True):
        for ch, d in zip(t, v.shape, strict=True):
            if sizes.get(ch, 1) == 1:
                sizes[ch] = d
    if len(terms) == 2:
        out = _einsum_as_matmul(b, terms, operands, rhs, sizes, dt)
        if out is not None:
            return b.reshape(out, b.outs[0].shape)
    # Each operand in the common index order (missing letters as size-1 dims), multiplied with
    # broadcasting, then summed over the contracted letters.
    product = None
    for t, v in zip(terms, operands, strict=True):
        v = b.cast(v, dt)
        mine = [ch for ch in letters if ch in t]
        v = b.transpose(v, [t.index(ch) for ch in mine])
        v = b.reshape(v, [v.shape[mine.index(ch)] if ch in t else 1 for ch in letters])
        product = v if product is None else b.op("mul", product, v)
    product = b.broadcast_to(product, [sizes[ch] for ch in letters])
    return b.reshape(
        b.reduce("reduce_sum", product, range(len(rhs), len(letters))), b.outs[0].shape
    )


def _einsum_as_matmul(b: Builder, terms, operands, rhs: str, sizes: dict, dt) -> PV | None:
    """A two-operand einsum as one batched matmul: letters in both operands and the output are
    the batch, in both but not the output are contracted, in one operand and the output are rows
    or columns. None when a letter is broadcast (size 1 against a larger size)."""
    (ta, tb), (va, vb) = terms, operands
    for t, v in zip(terms, operands, strict=True):
        if any(d != sizes[ch] for ch, d in zip(t, v.shape, strict=True)):
            return None
    va, vb = b.cast(va, dt), b.cast(vb, dt)
    # A letter in one operand only and not in the output is summed away first.
    for which, (t, other) in enumerate(((ta, tb), (tb, ta))):
        lone = [t.index(ch) for ch in t if ch not in other and ch not in rhs]
        if lone:
            v = b.reduce("reduce_sum", va if which == 0 else vb, lone)
            t = "".join(ch for ch in t if ch in other or ch in rhs)
            if which == 0:
                va, ta = v, t
            else:
                vb, tb = v, t
    batch = [ch for ch in ta if ch in tb and ch in rhs]
    contract = [ch for ch in ta if ch in tb and ch not in rhs]
    rows = [ch for ch in ta if ch not in tb]
    cols = [ch for ch in tb if ch not in ta]

    def size(letters):
        return math.prod(sizes[ch] for ch in letters)

    a = b.transpose(va, [ta.index(ch) for ch in batch + rows + contract])
    a = b.reshape(a, (size(batch), size(rows), size(contract)))
    c = b.transpose(vb, [tb.index(ch) for ch in batch + contract + cols])
    c = b.reshape(c, (size(batch), size(contract), size(cols)))
    y = b.op("matmul", a, c)
    order = batch + rows + cols
    y = b.reshape(y, [sizes[ch] for ch in order])
    return b.transpose(y, [order.index(ch) for ch in rhs])


# --- convolution


def _conv_attrs(stride, padding, dilation, groups) -> dict:
    return {"strides": stride, "padding": padding, "dilation": dilation, "groups": groups}


@rule("conv2d")
def _conv2d(b: Builder, v, weight, bias, stride, padding, dilation, groups):
    dt = b.outs[0].dtype
    y = b.op(
        "conv2d",
        b.cast(v, dt),
        b.cast(weight, dt),
        **_conv_attrs(stride, padding, dilation, groups),
    )
    if isinstance(bias, PV):
        y = b.op("add", y, b.reshape(b.cast(bias, dt), (1, bias.size, 1, 1)))
    return y


@rule("conv2d_input_grad")
def _conv2d_input_grad(b: Builder, grad, weight, input_shape, stride, padding, dilation, groups):
    dt = b.outs[0].dtype
    return b.op(
        "conv2d_data_grad", b.cast(grad, dt), b.cast(weight, dt), input_shape=input_shape,
        **_conv_attrs(stride, padding, dilation, groups),
    )  # fmt: skip


@rule("conv2d_weight_grad")
def _conv2d_weight_grad(b: Builder, v, grad, weight_shape, stride, padding, dilation, groups):
    dt = b.outs[0].dtype
    return b.op(
        "conv2d_weights_grad", b.cast(v, dt), b.cast(grad, dt), weight_shape=weight_shape,
        **_conv_attrs(stride, padding, dilation, groups),
    )  # fmt: skip


@rule("conv_transpose2d")
def _conv_transpose2d(
    b: Builder, v, weight, bias, stride, padding, output_padding, dilation, groups
):
    from lucid.ops.conv import transpose_plan

    dt = b.outs[0].dtype
    conv_input, pads, extra = transpose_plan(
        v.shape, weight.shape, stride, padding, output_padding, dilation, groups
    )
    y = b.op(
        "conv2d_data_grad", b.cast(v, dt), b.cast(weight, dt), input_shape=conv_input,
        **_conv_attrs(stride, pads, dilation, groups),
    )  # fmt: skip
    if any(extra):
        y = b.op("pad", y, low=(0, 0, 0, 0), high=(0, 0, *extra), value=0.0)
    if isinstance(bias, PV):
        y = b.op("add", y, b.reshape(b.cast(bias, dt), (1, bias.size, 1, 1)))
    return y


# --- upsampling: constant-index gathers (and scatter-adds for the gradient) per spatial dim


def _weights_along(b: Builder, w, axis: int, dt) -> PV:
    shape = [1, 1, 1, 1]
    shape[axis] = w.size
    return b.const(w.reshape(shape), dt, tuple(shape))


def _upsample_tables(x_shape, output_size, mode, align_corners, scales, dt):
    from lucid.ops.upsample import axis_table

    return [
        axis_table(mode, x_shape[2 + i], output_size[i], scales[i], align_corners, dt.numpy)
        for i in range(2)
    ]


@rule("upsample2d")
def _upsample2d(b: Builder, v, output_size, mode, align_corners, scales):
    dt = b.outs[0].dtype
    tables = _upsample_tables(v.shape, output_size, mode, align_corners, scales, dt)
    out = b.cast(v, dt)
    for axis in (3, 2):  # width first, as eager (PyTorch's order for bilinear)
        idx0, idx1, w0, w1 = tables[axis - 2]
        a = b.op("gather", out, b.const(idx0, _dtype.int64, idx0.shape), axis=axis)
        if w0 is not None:
            c = b.op("gather", out, b.const(idx1, _dtype.int64, idx1.shape), axis=axis)
            a = b.op(
                "add",
                b.op("mul", a, _weights_along(b, w0, axis, dt)),
                b.op("mul", c, _weights_along(b, w1, axis, dt)),
            )
        out = a
    return out


@rule("upsample2d_backward")
def _upsample2d_backward(b: Builder, g, input_size, output_size, mode, align_corners, scales):
    dt = b.outs[0].dtype
    in_shape = (*g.shape[:2], *input_size)
    tables = _upsample_tables(in_shape, output_size, mode, align_corners, scales, dt)
    out = b.cast(g, dt)
    for axis in (2, 3):  # the adjoint of the forward: height first
        idx0, idx1, w0, w1 = tables[axis - 2]
        shape = list(out.shape)
        shape[axis] = input_size[axis - 2]
        acc = b.full(0, tuple(shape), dt)
        if w0 is None:
            acc = b.op("scatter_add", acc, b.const(idx0, _dtype.int64, idx0.shape), out, axis=axis)
        else:
            for idx, w in ((idx0, w0), (idx1, w1)):
                part = b.op("mul", out, _weights_along(b, w, axis, dt))
                acc = b.op(
                    "scatter_add", acc, b.const(idx, _dtype.int64, idx.shape), part, axis=axis
                )
        out = acc
    return out


# --- pooling


def _pool_padding(shape, out_hw, kernel_size, stride, padding, dilation) -> tuple:
    """prim's (top, bottom, left, right) padding that yields ``out_hw`` (ceil mode pads the
    bottom/right further, as eager's windows do)."""
    pads = []
    for size, o, k, s, p, d in zip(
        shape[2:], out_hw, kernel_size, stride, padding, dilation, strict=True
    ):
        need = (o - 1) * s + d * (k - 1) + 1
        pads += [p, max(need - size - p, 0)]
    return tuple(pads)


def _need_float(b: Builder, v: PV) -> None:
    if not v.dtype.is_floating_point:
        raise LoweringUnsupported(
            f"{b.op_name} of a {v.dtype.name} tensor (prim pools floats; only int32 max pooling "
            "goes through float64 exactly)"
        )


@rule("max_pool2d")
def _max_pool2d(b: Builder, v, kernel_size, stride, padding, dilation, ceil_mode):
    if v.dtype is _dtype.int32:  # float64 holds every int32 exactly: pool there
        values, idx = _max_pool2d(
            b, b.cast(v, _dtype.float64), kernel_size, stride, padding, dilation, ceil_mode
        )
        return b.cast(values, v.dtype), idx
    _need_float(b, v)
    out_hw = b.outs[0].shape[2:]
    pads = _pool_padding(v.shape, out_hw, kernel_size, stride, padding, dilation)
    window = {"kernel": kernel_size, "strides": stride, "padding": pads, "dilation": dilation}
    values = b.op("max_pool2d", v, **window)
    if not b.used[1]:
        return values, None
    # Indices: stack every window tap, take the first maximum (eager's tie rule), and map the
    # winning tap to its flat H*W position through a constant table.
    n, c, h, w = v.shape
    ho, wo = out_hw
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, stride, dilation
    pt, pb, pl, pr = pads
    xp = b.op("pad", v, low=(0, 0, pt, pl), high=(0, 0, pb, pr), value=-math.inf)
    taps, offsets = [], []
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            tap = b.op(
                "slice", xp, starts=(0, 0, r0, c0),
                ends=(n, c, r0 + sh * (ho - 1) + 1, c0 + sw * (wo - 1) + 1), strides=(1, 1, sh, sw),
            )  # fmt: skip
            taps.append(b.reshape(tap, (1, n, c, ho, wo)))
            offsets.append((r0 - pt) * w + (c0 - pl))
    winner = b.reshape(b.op("argmax", b.concat(taps, 0), axis=0), (n, c, ho, wo))
    # position = tap offset + output row * sh * W + output col * sw, from small ranges.
    i64 = _dtype.int64
    tap_offset = b.op("gather", b.const(np.array(offsets), i64), winner, axis=0)
    rows = b.binary("mul", b.arange_along(ho, 2, 4), sh * w, i64)
    cols = b.binary("mul", b.arange_along(wo, 3, 4), sw, i64)
    indices = b.op("add", tap_offset, b.op("add", rows, cols))
    b.facts[indices.ssa] = ("max_pool2d", v, window)
    return values, indices


@rule("max_pool2d_backward")
def _max_pool2d_backward(b: Builder, grad, indices, input_shape):
    fact = b.facts.get(indices.ssa)
    if fact is not None and fact[0] == "max_pool2d" and fact[1].dtype == grad.dtype:
        # Indices straight from a max_pool2d lowered here: route the gradient with the window
        # rule itself (one pass over the input) instead of scattering through the index tensor;
        # the index computation is then dead and prim-simplify erases it.
        _, x, window = fact
        return b.op("max_pool2d_grad", grad, x, **window)
    n, c, h, w = input_shape
    g = b.reshape(grad, (n, c, grad.size // max(n * c, 1)))
    idx = b.reshape(b.cast(indices, _dtype.int64), g.shape)
    zeros = b.full(0, (n, c, h * w), grad.dtype)
    return b.reshape(b.op("scatter_add_along_axis", zeros, idx, g, axis=2), tuple(input_shape))


def _avg_prim_attrs(kernel_size, stride, pads, count_include_pad) -> dict:
    return {"kernel": kernel_size, "strides": stride, "padding": pads,
            "count_include_pad": count_include_pad}  # fmt: skip


def _avg_plan(shape, out_hw, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor):
    """(prim attrs, divisor map or None): a direct prim pool when its divisor is eager's, else a
    window sum (count_include_pad mean times the window size) over an explicit divisor map."""
    pads = _pool_padding(shape, out_hw, kernel_size, stride, padding, (1, 1))
    if not ceil_mode and not divisor:
        return _avg_prim_attrs(kernel_size, stride, pads, count_include_pad), None
    div = _avg_divisor(shape, kernel_size, stride, padding, out_hw, count_include_pad, divisor)
    return _avg_prim_attrs(kernel_size, stride, pads, True), div


@rule("avg_pool2d")
def _avg_pool2d(b, v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _need_float(b, v)
    out_hw = b.outs[0].shape[2:]
    attrs, div = _avg_plan(
        v.shape,
        out_hw,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    )
    y = b.op("avg_pool2d", v, **attrs)
    if div is not None:
        scale = float(kernel_size[0] * kernel_size[1]) / div
        y = b.op("mul", y, b.const(scale, v.dtype, div.shape))
    return y


@rule("avg_pool2d_backward")
def _avg_pool2d_backward(
    b, grad, input_shape, kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override,
):  # fmt: skip
    _need_float(b, grad)
    out_hw = grad.shape[2:]
    attrs, div = _avg_plan(
        input_shape, out_hw, kernel_size, stride, padding, ceil_mode, count_include_pad,
        divisor_override,
    )  # fmt: skip
    if div is not None:
        scale = float(kernel_size[0] * kernel_size[1]) / div
        grad = b.op("mul", grad, b.const(scale, grad.dtype, div.shape))
    return b.op("avg_pool2d_grad", grad, input_shape=tuple(input_shape), **attrs)


@rule("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(b: Builder, v, output_size):
    _need_float(b, v)
    a_h = b.const(_adaptive_matrix(v.shape[2], output_size[0]), v.dtype)
    a_w = b.const(_adaptive_matrix(v.shape[3], output_size[1]), v.dtype)
    return b.op("matmul", b.op("matmul", a_h, v), a_w, transpose_b=True)


@rule("adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(b: Builder, grad, input_shape, output_size):
    _need_float(b, grad)
    a_h = b.const(_adaptive_matrix(input_shape[2], output_size[0]), grad.dtype)
    a_w = b.const(_adaptive_matrix(input_shape[3], output_size[1]), grad.dtype)
    return b.op("matmul", b.op("matmul", a_h, grad, transpose_a=True), a_w)


_ = _geometry  # eager's geometry is the reference the pool rules follow

# --- normalization


def _affine(b: Builder, t, dt, shape, default: float) -> PV:
    if isinstance(t, PV):
        return b.reshape(b.cast(t, dt), shape)
    return b.const(default, dt, ())


@rule("layer_norm")
def _layer_norm(b: Builder, v, weight, bias, normalized_shape, eps):
    if len(normalized_shape) == 1 and v.ndim >= 1:  # over the last axis: a composite op
        row = (v.shape[-1],)
        gamma, beta = (
            b.reshape(b.cast(t, v.dtype), row) if isinstance(t, PV) else b.const(d, v.dtype, row)
            for t, d in ((weight, 1.0), (bias, 0.0))
        )
        return _composite(b, "layer_norm", v, gamma, beta, epsilon=float(eps))
    axes = tuple(range(v.ndim - len(normalized_shape), v.ndim))
    mean = b.reduce("reduce_mean", v, axes, True)
    centered = b.op("sub", v, mean)
    var = b.reduce("reduce_mean", b.op("mul", centered, centered), axes, True)
    gamma = _affine(b, weight, v.dtype, tuple(normalized_shape), 1.0)
    beta = _affine(b, bias, v.dtype, tuple(normalized_shape), 0.0)
    return b.op("normalize", v, mean, var, gamma, beta, epsilon=float(eps))


@rule("layer_norm_backward")
def _layer_norm_backward(b: Builder, grad, v, weight, normalized_shape, eps):
    # Over several trailing axes it is layer norm over their flattening: one composite op.
    n = math.prod(normalized_shape)
    rows = (*v.shape[: v.ndim - len(normalized_shape)], n)
    gamma = b.cast(weight, v.dtype) if isinstance(weight, PV) else b.const(1.0, v.dtype, (n,))
    if math.prod(gamma.shape) != n:  # a 0-d weight (InstanceNorm passes 1.0)
        gamma = b.broadcast_to(gamma, tuple(normalized_shape))
    dx, dgamma, dbeta = _composite_results(
        b,
        "layer_norm_grad",
        # The seed of a sum's gradient may arrive 0-d: broadcast it before flattening.
        b.reshape(b.broadcast_to(b.cast(grad, v.dtype), v.shape), rows),
        b.reshape(v, rows),
        b.reshape(gamma, (n,)),
        epsilon=float(eps),
    )
    shape = tuple(normalized_shape)
    return b.reshape(dx, v.shape), b.reshape(dgamma, shape), b.reshape(dbeta, shape)


@rule("batch_norm")
def _batch_norm(b: Builder, v, weight, bias, eps):
    axes = (0, *range(2, v.ndim))
    stat = (1, v.shape[1]) + (1,) * (v.ndim - 2)
    mean = b.reduce("reduce_mean", v, axes, True)
    centered = b.op("sub", v, mean)
    var = b.reduce("reduce_mean", b.op("mul", centered, centered), axes, True)
    gamma = _affine(b, weight, v.dtype, stat, 1.0)
    beta = _affine(b, bias, v.dtype, stat, 0.0)
    y = b.op("normalize", v, mean, var, gamma, beta, epsilon=float(eps))
    return y, b.reshape(mean, (v.shape[1],)), b.reshape(var, (v.shape[1],))


@rule("rms_norm")
def _rms_norm(b: Builder, v, weight, normalized_shape, eps):
    axes = tuple(range(v.ndim - len(normalized_shape), v.ndim))
    eps = float(np.finfo(v.dtype.numpy).eps) if eps is None else float(eps)
    ms = b.reduce("reduce_mean", b.op("mul", v, v), axes, True)
    y = b.op("div", v, b.op("sqrt", b.binary("add", ms, eps, v.dtype)))
    if isinstance(weight, PV):
        y = b.op("mul", y, b.cast(weight, v.dtype))
    return y


# --- activations (float tensors; eager computes each in the input's dtype)


def _gt0(b: Builder, v: PV) -> PV:
    return b.binary("gt", v, 0, v.dtype)


@rule("elu")
def _elu(b: Builder, v, alpha):
    neg = b.binary("mul", b.op("expm1", b.binary("minimum", v, 0, v.dtype)), alpha, v.dtype)
    return b.op("select", _gt0(b, v), v, neg)


@rule("elu_backward")
def _elu_backward(b: Builder, grad, v, alpha):
    dt = grad.dtype
    v = b.cast(v, dt)
    scaled = b.op(
        "mul", b.binary("mul", grad, alpha, dt), b.op("exp", b.binary("minimum", v, 0, dt))
    )
    return b.op("select", _gt0(b, v), grad, scaled)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_parts(b: Builder, v: PV) -> tuple[PV, PV]:
    """(cdf-like factor, tanh value) of the tanh approximation."""
    dt = v.dtype
    cube = b.op("mul", b.op("mul", v, v), v)
    inner = b.binary(
        "mul", b.op("add", v, b.binary("mul", cube, 0.044715, dt)), _SQRT_2_OVER_PI, dt
    )
    t = b.op("tanh", inner)
    return b.binary("mul", b.binary("add", t, 1.0, dt), 0.5, dt), t


def _need_gelu_form(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise LoweringUnsupported(f"gelu approximate={approximate!r}")


def _emit(b: Builder):
    """A composite decomposition's ``emit`` that appends to lowering's builder."""
    return lambda name, *operands, **attrs: b.op(name, *operands, **attrs)


def _const(b: Builder):
    """A composite decomposition's ``const``: a 0-d constant of ``like``'s dtype."""
    return lambda value, like: b.const(value, like.dtype, ())


def _composite_results(b: Builder, name: str, *operands: PV, **attrs: Any) -> list[PV]:
    """Composite prim op ``name`` (``lucid.ir.prim.composite``) on ``operands``: emitted whole
    when its rule takes them (a backend then runs its kernel or expands it), else decomposed
    here through the same definition."""
    op = P.COMPOSITE_OPS[name]
    full = P.check_attrs(op, attrs)
    try:
        op.infer([P.Aval(o.shape, lower_dtype(o.dtype)) for o in operands], full)
    except P.PrimError:
        return list(op.decompose(_emit(b), _const(b), operands, full))
    return list(b.emit(name, operands, **attrs))


def _composite(b: Builder, name: str, *operands: PV, **attrs: Any) -> PV:
    """The one result of composite ``name`` (see ``_composite_results``)."""
    (out,) = _composite_results(b, name, *operands, **attrs)
    return out


@rule("gelu")
def _gelu(b: Builder, v, approximate):
    _need_gelu_form(approximate)
    if approximate == "none":  # the erf form: a composite op
        return _composite(b, "gelu", v)
    cdf, _ = _gelu_tanh_parts(b, v)
    return b.op("mul", v, cdf)


@rule("gelu_backward")
def _gelu_backward(b: Builder, grad, v, approximate):
    dt = grad.dtype
    v = b.cast(v, dt)
    _need_gelu_form(approximate)
    if approximate == "none":
        return _composite(b, "gelu_grad", grad, v)
    cdf, t = _gelu_tanh_parts(b, v)
    d_inner = b.binary(
        "mul",
        b.binary("add", b.binary("mul", b.op("mul", v, v), 3 * 0.044715, dt), 1.0, dt),
        _SQRT_2_OVER_PI,
        dt,
    )
    one_minus_t2 = b.binary("sub", 1.0, b.op("mul", t, t), dt)
    d = b.op(
        "add", cdf, b.op("mul", b.binary("mul", v, 0.5, dt), b.op("mul", one_minus_t2, d_inner))
    )
    return b.op("mul", grad, d)


@rule("hardtanh")
def _hardtanh(b: Builder, v, min_val, max_val):
    return b.binary("minimum", b.binary("maximum", v, min_val, v.dtype), max_val, v.dtype)


@rule("hardtanh_backward")
def _hardtanh_backward(b: Builder, grad, v, min_val, max_val):
    inside = b.op(
        "logical_and", b.binary("gt", v, min_val, v.dtype), b.binary("lt", v, max_val, v.dtype)
    )
    return b.select(inside, grad, 0, grad.dtype)


@rule("leaky_relu")
def _leaky_relu(b: Builder, v, negative_slope):
    return b.op("select", _gt0(b, v), v, b.binary("mul", v, negative_slope, v.dtype))


@rule("leaky_relu_backward")
def _leaky_relu_backward(b: Builder, grad, v, negative_slope):
    return b.op("select", _gt0(b, v), grad, b.binary("mul", grad, negative_slope, grad.dtype))


@rule("threshold_backward")
def _threshold_backward(b: Builder, grad, v, threshold):
    return b.select(b.binary("gt", v, threshold, v.dtype), grad, 0, grad.dtype)


@rule("softplus")
def _softplus(b: Builder, v, beta, threshold):
    dt = v.dtype
    bx = b.binary("mul", v, beta, dt)
    # log(1 + e^bx) without overflow: max(bx, 0) + log1p(e^-|bx|).
    soft = b.op(
        "add",
        b.binary("maximum", bx, 0, dt),
        b.op("log1p", b.op("exp", b.op("neg", b.op("abs", bx)))),
    )
    return b.op("select", b.binary("gt", bx, threshold, dt), v, b.binary("div", soft, beta, dt))


@rule("softplus_backward")
def _softplus_backward(b: Builder, grad, v, beta, threshold):
    dt = grad.dtype
    bx = b.binary("mul", b.cast(v, dt), beta, dt)
    return b.op(
        "select", b.binary("gt", bx, threshold, dt), grad, b.op("mul", grad, b.op("sigmoid", bx))
    )


def _softmax(prim: str, zero_d: float):
    def lower(b: Builder, v, dim):
        if v.ndim == 0:
            return b.full(zero_d, (), v.dtype)
        return b.op(prim, v, axis=normalize_dim(dim, v.ndim))

    return lower


rule("softmax")(_softmax("softmax", 1.0))
rule("log_softmax")(_softmax("log_softmax", 0.0))

# --- attention


def _attention_scale(q: PV, scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _masked_scores(b: Builder, q: PV, k: PV, mask, is_causal, scale: float) -> PV:
    """The composite's scores (``composite.attention_scores``) with the mask applied."""
    dt = q.dtype
    s = attention_scores(_emit(b), _const(b), q, k, scale)
    if isinstance(mask, PV):
        if mask.dtype is _dtype.bool_:
            s = b.select(mask, s, -math.inf, dt)
        else:
            s = b.op("add", s, b.cast(mask, dt))
    elif not is_scalar(mask):
        raise LoweringUnsupported("attn_mask must be a tensor or the scalar 0.0")
    if is_causal:
        length, size = s.shape[-2:]
        s = b.select(tri_mask(b, length, size, 0, True), s, -math.inf, dt)
    return s


def _fused_attention_case(q: PV, attn_mask) -> bool:
    """Whether attention is the composite op: no mask tensor (causal or not) and [B, H, L, D]
    heads (its rule refuses other shapes, which ``_composite`` then decomposes)."""
    return is_scalar(attn_mask) and q.ndim == 4


@rule("scaled_dot_product_attention")
def _sdpa(b: Builder, q, k, v, attn_mask, is_causal, scale):
    scale = _attention_scale(q, scale)
    if _fused_attention_case(q, attn_mask):
        out = _composite(b, "attention", q, k, v, alpha=scale, causal=bool(is_causal))
    else:
        out = attention_output(_emit(b), _masked_scores(b, q, k, attn_mask, is_causal, scale), v)
    return b.reshape(out, b.outs[0].shape)


@rule("scaled_dot_product_attention_backward")
def _sdpa_backward(b: Builder, grad, q, k, v, attn_mask, is_causal, scale):
    scale = _attention_scale(q, scale)
    # The weights are recomputed (a backend may take them from the forward's kernel instead);
    # given them, the gradient is the composite op, masked or not.
    attrs: dict[str, Any] = {"alpha": scale}
    if _fused_attention_case(q, attn_mask):
        causal = bool(is_causal)
        p = attention_weights(_emit(b), _const(b), q, k, scale, causal)
        attrs["causal"] = causal
    else:
        p = b.op("softmax", _masked_scores(b, q, k, attn_mask, is_causal, scale), axis=-1)
    grads = _composite_results(b, "attention_grad", grad, q, k, v, p, **attrs)
    return tuple(b.broadcast_to(t, o.shape) for t, o in zip(grads, b.outs, strict=True))
