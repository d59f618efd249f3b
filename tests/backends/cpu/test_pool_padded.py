"""The padded-plane max pool kernels (max_pool2d with padding or dilation, and the gradient of
every max pool but the 2x2/2 one, ReLU-masked or not) against float64 numpy references, and bit
for bit against a scalar model of the row-major scan (first maximum wins ties, the last NaN wins,
gradients added in float32 in output order)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.backends.cpu.testing import run_both

_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _out_size(size, k, s, p0, p1, d):
    return (size + p0 + p1 - (k - 1) * d - 1) // s + 1


@st.composite
def pools(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pt, pb = draw(st.integers(0, kh // 2)), draw(st.integers(0, kh // 2))
    pl, pr = draw(st.integers(0, kw // 2)), draw(st.integers(0, kw // 2))
    h = draw(st.integers(max(1, (kh - 1) * dh + 1 - pt - pb), 9))
    w = draw(st.integers(max(1, (kw - 1) * dw + 1 - pl - pr), 37))  # past 16 output columns
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    attrs = {
        "kernel": (kh, kw),
        "strides": (sh, sw),
        "padding": (pt, pb, pl, pr),
        "dilation": (dh, dw),
    }
    return (n, c, h, w), attrs


def _values(rng, shape, dtype, ties):
    if ties:  # few distinct values: ties in most windows, signed zeros among them
        x = rng.integers(-1, 2, size=shape).astype(dtype)
        x[rng.random(shape) < 0.3] = -0.0
    else:
        x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) < 0.05] = np.nan
    x[rng.random(shape) < 0.05] = -np.inf
    return x


def _scan(x, dy, attrs, relu):
    """(values, gradient) by the scalar row-major scan: padding taps are -inf and a window's
    winner in the padding drops its gradient; the gradient is added in x's dtype in output
    order; with `relu` only winners > 0 get it."""
    (kh, kw), (sh, sw), (pt, _, pl, _), (dh, dw) = (
        attrs["kernel"],
        attrs["strides"],
        attrs["padding"],
        attrs["dilation"],
    )
    n, c, h, w = x.shape
    ho, wo = dy.shape[2:]
    values = np.empty(dy.shape, x.dtype)
    grad = np.zeros(x.shape, x.dtype)
    for b, ch, oh, ow in np.ndindex(n, c, ho, wo):
        best, at = None, None
        for i in range(kh):
            for j in range(kw):
                ih, iw = oh * sh - pt + i * dh, ow * sw - pl + j * dw
                inside = 0 <= ih < h and 0 <= iw < w
                v = x[b, ch, ih, iw] if inside else x.dtype.type(-np.inf)
                if best is None or v > best or v != v:
                    best, at = v, (ih, iw) if inside else None
        values[b, ch, oh, ow] = best
        if at is not None and (not relu or x[b, ch, at[0], at[1]] > 0):
            grad[b, ch, at[0], at[1]] += dy[b, ch, oh, ow]
    return values, grad


def _relu_grad_native(dy, z, attrs):
    """(max_pool2d_relu_grad's result, the pool's input relu(z)): the rewrite folds ReLU's mask
    into the pool gradient only where the pool reads the ReLU's output."""
    dtype = "f32" if z.dtype == np.float32 else "f64"
    p = Program()
    zs, dys = p.feed(z.shape, dtype), p.feed(dy.shape, dtype)
    r = p.op("relu", zs)
    zero = p.op("constant", shape=(), dtype=dtype, value=(0.0,))
    grad = p.op("max_pool2d_grad", dys, r, **attrs)
    p.result(p.op("select", p.op("gt", r, zero), grad, zero))
    p.result(r)
    assert "max_pool2d_relu_grad" in [i.op for i in fuse_kernels(p).instrs]
    got = CPUBackend(cache=False).compile(p).run([z.copy(), dy.copy()])
    ref = p.interpret([z.copy(), dy.copy()])
    return got[0], got[1], ref[0]


def _reference_grad(x, dy, attrs, relu):
    """float64 scatter of dy to the winners (the same winners as the scan: numpy picks them
    from the float64 windows by the same rule)."""
    _, grad = _scan(x.astype(np.float64), dy.astype(np.float64), attrs, relu)
    return grad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ties", [False, True])
@_SETTINGS
@given(case=pools(), seed=st.integers(0, 2**31 - 1))
def test_max_pool_values_match_the_scan_bit_for_bit(dtype, ties, case, seed):
    shape, attrs = case
    rng = np.random.default_rng(seed)
    x = _values(rng, shape, dtype, ties)
    native, ref = run_both("max_pool2d", [x], attrs)
    want, _ = _scan(x, np.zeros(native.shape, dtype), attrs, relu=False)
    np.testing.assert_array_equal(native, want)
    np.testing.assert_array_equal(np.signbit(native), np.signbit(want))
    np.testing.assert_allclose(native, ref, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["max_pool2d_grad", "max_pool2d_relu_grad"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ties", [False, True])
@_SETTINGS
@given(case=pools(), seed=st.integers(0, 2**31 - 1))
def test_max_pool_gradient_matches_the_scan_bit_for_bit(op, dtype, ties, case, seed):
    shape, attrs = case
    rng = np.random.default_rng(seed)
    x = _values(rng, shape, dtype, ties)
    n, c, h, w = shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = (
        attrs["kernel"],
        attrs["strides"],
        attrs["padding"],
        attrs["dilation"],
    )
    out_shape = (n, c, _out_size(h, kh, sh, pt, pb, dh), _out_size(w, kw, sw, pl, pr, dw))
    dy = rng.standard_normal(out_shape).astype(dtype)
    relu = op == "max_pool2d_relu_grad"
    if relu:
        native, x, ref = _relu_grad_native(dy, x, attrs)
    else:
        native, ref = run_both(op, [dy, x], attrs)
    _, want = _scan(x, dy, attrs, relu)
    np.testing.assert_array_equal(native, want)
    np.testing.assert_array_equal(np.signbit(native), np.signbit(want))
    np.testing.assert_allclose(native, _reference_grad(x, dy, attrs, relu), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(native, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["max_pool2d_grad", "max_pool2d_relu_grad"])
def test_resnet_stem_pool_gradient_on_many_planes(op):
    # The stem's 3x3/2 pool with padding 1 over enough planes to be split across threads.
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal((2, 64, 32, 32)), 0).astype(np.float32)
    dy = rng.standard_normal((2, 64, 16, 16)).astype(np.float32)
    attrs = {"kernel": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1), "dilation": (1, 1)}
    if op == "max_pool2d_relu_grad":
        native, _, ref = _relu_grad_native(dy, x, attrs)
    else:
        native, ref = run_both(op, [dy, x], attrs)
    np.testing.assert_allclose(native, ref, rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(native) > 0
    values, _ = run_both("max_pool2d", [x], attrs)
    want, _ = _scan(x[:1, :2], dy[:1, :2], attrs, relu=False)
    np.testing.assert_array_equal(values[:1, :2], want)
