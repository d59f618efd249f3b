"""Lowering rules of reductions: sum/mean/prod/var, max/min (values and indices), arg reductions,
logsumexp, cumsum, norm, all/any, iota and sum_to_size."""

from __future__ import annotations

import math

from lucid import _dtype
from lucid.ops._registry import normalize_dim, normalize_dims
from lucid.passes.lowering._core import PV, Builder, LoweringUnsupported, rule, unsupported


def _axes(v: PV, dim) -> tuple[int, ...]:
    return normalize_dims(dim, v.ndim)


def _finish(b: Builder, r: PV) -> PV:
    """Reshape a reduction to the registry's result shape (same elements)."""
    return b.reshape(r, b.outs[0].shape)


@rule("sum")
def _sum(b: Builder, v, dim, keepdim, dtype):
    out = b.outs[0].dtype
    return _finish(b, b.reduce("reduce_sum", b.cast(v, out), _axes(v, dim), keepdim))


@rule("mean")
def _mean(b: Builder, v, dim, keepdim, dtype):
    out = b.outs[0].dtype
    return _finish(b, b.reduce("reduce_mean", b.cast(v, out), _axes(v, dim), keepdim))


@rule("prod")
def _prod(b: Builder, v, dim, keepdim):
    out = b.outs[0].dtype
    return _finish(b, b.reduce("reduce_prod", b.cast(v, out), _axes(v, dim), keepdim))


def _extreme(prim: str):
    def lower(b: Builder, v, dim, keepdim):
        axes = _axes(v, dim)
        if any(v.shape[a] == 0 for a in axes):
            raise LoweringUnsupported(f"{b.op_name} of an empty axis")
        work = b.cast(v, _dtype.int32) if v.dtype is _dtype.bool_ else v
        return _finish(b, b.reduce(prim, work, axes, keepdim))

    return lower


rule("amax")(_extreme("reduce_max"))
rule("amin")(_extreme("reduce_min"))


def _bool_reduce(prim: str, empty: bool):
    def lower(b: Builder, v, dim, keepdim):
        axes = _axes(v, dim)
        if any(v.shape[a] == 0 for a in axes):
            return b.full(empty, b.outs[0].shape, _dtype.bool_)
        truth = v if v.dtype is _dtype.bool_ else b.binary("ne", v, 0, v.dtype)
        r = b.reduce(prim, b.cast(truth, _dtype.int32), axes, keepdim)
        return _finish(b, b.cast(r, _dtype.bool_))

    return lower


rule("all")(_bool_reduce("reduce_min", True))
rule("any")(_bool_reduce("reduce_max", False))


@rule("var")
def _var(b: Builder, v, dim, correction, keepdim):
    axes = _axes(v, dim)
    n = math.prod(v.shape[a] for a in axes)
    dt = v.dtype
    centered = b.op("sub", v, b.reduce("reduce_mean", v, axes, True))
    total = b.reduce("reduce_sum", b.op("mul", centered, centered), axes, keepdim)
    # n - correction <= 0 divides by zero (inf or nan), as numpy's ddof does.
    return _finish(b, b.binary("div", total, float(max(n - correction, 0)), dt))


def _arg(prim: str):
    def lower(b: Builder, v, dim, keepdim):
        if v.ndim == 0:
            return b.full(0, b.outs[0].shape, _dtype.int64)
        work = b.cast(v, _dtype.int32) if v.dtype is _dtype.bool_ else v
        if dim is None:
            work = b.reshape(work, (v.size,))
            axis = 0
        else:
            axis = normalize_dim(dim, v.ndim)
        return _finish(b, b.op(prim, work, axis=axis, keepdims=keepdim))

    return lower


rule("argmax")(_arg("argmax"))
rule("argmin")(_arg("argmin"))


def _value_and_index(reduce: str, arg: str):
    def lower(b: Builder, v, dim, keepdim):
        if v.ndim == 0:
            return v, b.full(0, (), _dtype.int64)
        axis = normalize_dim(dim, v.ndim)
        work = b.cast(v, _dtype.int32) if v.dtype is _dtype.bool_ else v
        idx = b.op(arg, work, axis=axis, keepdims=True)
        # Gather at the index (not a max reduction) so a NaN wins as it does in eager.
        values = b.op("gather_along_axis", v, idx, axis=axis)
        if not keepdim:
            shape = tuple(d for i, d in enumerate(v.shape) if i != axis)
            values, idx = b.reshape(values, shape), b.reshape(idx, shape)
        return values, idx

    return lower


rule("max_dim")(_value_and_index("reduce_max", "argmax"))
rule("min_dim")(_value_and_index("reduce_min", "argmin"))


@rule("logsumexp")
def _logsumexp(b: Builder, v, dim, keepdim):
    axes = _axes(v, dim)
    dt = b.outs[0].dtype
    if any(v.shape[a] == 0 for a in axes):  # the sum of nothing: log(0), as eager
        return b.full(-math.inf, b.outs[0].shape, dt)
    v = b.cast(v, dt)
    m = b.reduce("reduce_max", v, axes, True)
    m = b.select(b.op("isfinite", m), m, 0.0, dt)
    s = b.reduce("reduce_sum", b.op("exp", b.op("sub", v, m)), axes, True)
    out = b.op("add", b.op("log", s), m)
    return _finish(b, out)


@rule("cumsum")
def _cumsum(b: Builder, v, dim, dtype):
    out = b.outs[0].dtype
    if v.ndim == 0:
        return b.cast(v, out)
    return b.op("cumsum", b.cast(v, out), axis=normalize_dim(dim, v.ndim))


@rule("cumprod")
def _cumprod(b: Builder, v, dim, dtype):
    """No prim scan multiplies, so a Hillis-Steele scan: log2(n) rounds, each multiplying by the
    running products shifted by 1, 2, 4, ... entries (ones shifted in). The association order
    differs from eager's left-to-right product: floats may differ in the last ulps."""
    out = b.outs[0].dtype
    v = b.cast(v, out)
    if v.ndim == 0:
        return v
    axis = normalize_dim(dim, v.ndim)
    n = v.shape[axis]
    shift = 1
    while shift < n:
        ones_shape = v.shape[:axis] + (shift,) + v.shape[axis + 1 :]
        shifted = b.concat([b.full(1, ones_shape, out), b.slice_axis(v, axis, 0, n - shift)], axis)
        v = b.op("mul", v, shifted)
        shift *= 2
    return v


@rule("iota")
def _iota(b: Builder, v, dim):
    d = normalize_dim(dim, v.ndim)
    return b.broadcast_to(b.arange_along(v.shape[d], d, v.ndim), v.shape)


@rule("sum_to_size")
def _sum_to_size(b: Builder, v, shape):
    shape = tuple(shape)
    lead = v.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and v.shape[i + lead] != 1
    )
    return b.reshape(b.reduce("reduce_sum", v, axes, True), shape)


@rule("norm")
def _norm(b: Builder, v, p, dim, keepdim):
    if isinstance(p, str):
        if p != "fro":
            raise LoweringUnsupported(f"norm with p={p!r}")
        p = 2.0
    axes = _axes(v, dim)
    dt = b.outs[0].dtype
    a = b.op("abs", b.cast(v, dt))
    if p == 2:
        r = b.op("sqrt", b.reduce("reduce_sum", b.op("mul", a, a), axes, keepdim))
    elif p == 1:
        r = b.reduce("reduce_sum", a, axes, keepdim)
    elif p in (math.inf, -math.inf):
        if any(v.shape[i] == 0 for i in axes):
            raise LoweringUnsupported("an infinity norm of an empty axis")
        r = b.reduce("reduce_max" if p > 0 else "reduce_min", a, axes, keepdim)
    elif p == 0:
        r = b.reduce("reduce_sum", b.cast(b.binary("ne", a, 0, dt), dt), axes, keepdim)
    else:
        powered = b.binary("pow", a, float(p), dt)
        r = b.binary("pow", b.reduce("reduce_sum", powered, axes, keepdim), 1.0 / p, dt)
    return _finish(b, r)


unsupported(
    "all_reduce",
    "a collective between processes (inserted by grad-allreduce): the interpreter and eager "
    "dispatch run it through the process group; the compiled backends do not yet",
)
