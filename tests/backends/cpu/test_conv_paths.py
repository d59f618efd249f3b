"""The forward convolution's paths by shape (native/src/conv.cpp): stride-1 convolutions whose
weights fit in L2 keep the shifted-view kernel; larger float32 3x3 ones on planes of more than 64
pixels with enough output tiles run as Winograd F(2x2, 3x3) GEMMs over the batch's tiles; the
rest without groups (strides, 1x1 projections, large kernels, planes of at most 64 pixels such as
workload G's 8x8 to 2x2 stages) as one implicit GEMM over the batch. Each must match
the float64 reference interpreter within float32 tolerance, give the same bits at any thread
count, and keep infinities and NaNs where the reference has them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import CPUBackend, Program, set_num_threads

pytestmark = pytest.mark.usefixtures("fixed_threads")

STRIDE_ONE = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}


def conv_program(x_shape, w_shape, attrs, dtype="f32", bias_relu=False):
    """conv2d (then + bias[O, 1, 1] and relu, which the backend folds into conv2d_bias)."""
    p = Program()
    feeds = [p.feed(x_shape, dtype), p.feed(w_shape, dtype)]
    y = p.op("conv2d", *feeds, **attrs)
    if bias_relu:
        bias = p.feed((w_shape[0], 1, 1), dtype)
        y = p.op("relu", p.op("add", y, bias))
    p.result(y)
    return p


def assert_close_to_float64(out, ref, terms):
    """Within float32 rounding of a sum of ``terms`` products: an absolute error that grows with
    the square root of the terms, relative to the output's scale (outputs near zero are the
    differences of large partial sums), and equal infinities and NaNs."""
    finite = np.isfinite(ref)
    scale = float(np.abs(ref[finite]).max()) if finite.any() else 1.0
    np.testing.assert_allclose(
        out, ref, rtol=1e-5, atol=2e-6 * np.sqrt(terms) * scale, equal_nan=True
    )


def check_paths(x, w, attrs, bias=None, threads=(1, 2, 3)):
    """Native results at each thread count equal each other bit for bit and match the float64
    reference (computed from the same float32 values) within float32 tolerance."""
    arrays = [x, w] + ([bias] if bias is not None else [])
    p = conv_program(x.shape, w.shape, attrs, bias_relu=bias is not None)
    ex = CPUBackend(cache=False).compile(p)
    outs = []
    for n in threads:
        set_num_threads(n)
        outs.append(ex.run(arrays)[0])
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0], err_msg="threads differ")
    wide = conv_program(x.shape, w.shape, attrs, "f64", bias_relu=bias is not None)
    ref = wide.interpret([a.astype(np.float64) for a in arrays])[0].astype(np.float32)
    assert_close_to_float64(outs[0], ref, terms=w.shape[1] * w.shape[2] * w.shape[3])
    return outs[0], ref


def normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "n, c, o, h, w, padding",
    [
        (16, 128, 128, 8, 8, (1, 1, 1, 1)),  # workload G's second stage (implicit GEMM now)
        (4, 256, 256, 4, 4, (1, 1, 1, 1)),  # its third stage (implicit GEMM now)
        (6, 128, 136, 7, 9, (1, 1, 1, 1)),  # odd output sizes: the last tile row and column drop
        (5, 130, 128, 9, 6, (0, 2, 1, 0)),  # one-sided padding
        (3, 128, 128, 12, 11, (0, 0, 0, 0)),  # no padding
        (2, 128, 128, 15, 13, (2, 2, 2, 2)),  # padding wider than a tile's overlap
    ],
)
def test_winograd_shapes_match_reference_with_and_without_epilogue(n, c, o, h, w, padding):
    rng = np.random.default_rng(n * 1000 + c + h)
    x, wt = normal(rng, (n, c, h, w)), normal(rng, (o, c, 3, 3))
    attrs = {**STRIDE_ONE, "padding": padding}
    check_paths(x, wt, attrs)
    out, _ = check_paths(x, wt, attrs, bias=normal(rng, (o, 1, 1)))
    assert (out >= 0).all() and (out == 0).any()  # the ReLU ran


@pytest.mark.parametrize(
    "n, c, o, side",
    [
        (16, 512, 512, 2),  # G's last stage: 16 tiles, below the Winograd threshold
        (1, 128, 128, 8),  # 16 tiles
        (16, 64, 64, 16),  # G's first stage: the weights fit the shifted-view kernel
        (16, 16, 32, 14),  # workload C's second layer (shifted views)
    ],
)
def test_shapes_off_the_winograd_path_keep_matching(n, c, o, side):
    rng = np.random.default_rng(c + o + side)
    x, wt = normal(rng, (n, c, side, side)), normal(rng, (o, c, 3, 3))
    check_paths(x, wt, STRIDE_ONE, bias=normal(rng, (o, 1, 1)))


@pytest.mark.parametrize(
    "kernel, attrs",
    [
        (3, {"strides": (2, 2), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}),
        (1, {"strides": (2, 2), "dilation": (1, 1), "padding": (0, 0, 0, 0), "groups": 1}),
        (3, {"strides": (1, 1), "dilation": (2, 2), "padding": (2, 2, 2, 2), "groups": 1}),
        (3, {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 2}),
        (7, {"strides": (2, 2), "dilation": (1, 1), "padding": (3, 3, 3, 3), "groups": 1}),
    ],
)
def test_large_channel_convolutions_off_the_winograd_path_match(kernel, attrs):
    """Strides, dilations, groups and other kernel sizes at Winograd-sized channel counts."""
    rng = np.random.default_rng(kernel * 10 + attrs["strides"][0] + attrs["groups"])
    c, o = 64, 64
    x = normal(rng, (8, c, 10, 10))
    wt = normal(rng, (o, c // attrs["groups"], kernel, kernel))
    check_paths(x, wt, attrs, bias=normal(rng, (o, 1, 1)))


@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_winograd_shape_with_non_finite_values_matches_reference(where, value):
    """The transforms would spread an inf or NaN over a whole tile: such calls take the direct
    sum, so every output the reference keeps finite stays finite and equal. (10x10 planes: 8x8
    ones now take the implicit GEMM before Winograd.)"""
    rng = np.random.default_rng(11)
    x, wt = normal(rng, (3, 128, 10, 10)), normal(rng, (128, 128, 3, 3))
    if where == "input":
        x[1, 3, 2, 5] = value
    else:
        wt[7, 4, 1, 2] = value
    out, ref = check_paths(x, wt, STRIDE_ONE)
    assert np.array_equal(np.isfinite(out), np.isfinite(ref))
    assert not np.isfinite(out).all()


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 5),
    c=st.integers(121, 130),
    o=st.integers(121, 130),
    h=st.integers(3, 12),
    w=st.integers(3, 12),
    pads=st.tuples(*[st.integers(0, 2)] * 4),
    seed=st.integers(0, 2**31),
)
def test_random_winograd_sized_convolutions_match_reference(n, c, o, h, w, pads, seed):
    if h + pads[0] + pads[1] < 3 or w + pads[2] + pads[3] < 3:
        return
    rng = np.random.default_rng(seed)
    x, wt = normal(rng, (n, c, h, w)), normal(rng, (o, c, 3, 3))
    check_paths(x, wt, {**STRIDE_ONE, "padding": pads}, threads=(1, 2))


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        # stride 2 with one-sided padding and odd planes
        ((3, 40, 9, 11), (48, 40, 3, 3), {"strides": (2, 2), "padding": (0, 1, 1, 0)}),
        # mixed strides, a dilated kernel
        ((2, 24, 10, 9), (16, 24, 3, 2), {"strides": (1, 3), "dilation": (2, 1)}),
        # stride 1 but weights too large for the shifted-view kernel and not 3x3
        ((2, 128, 6, 6), (128, 128, 5, 5), {"padding": (2, 2, 2, 2)}),
        # a 1x1 stride-2 projection on an odd plane
        ((4, 64, 7, 7), (96, 64, 1, 1), {"strides": (2, 2)}),
    ],
)
def test_batched_im2col_path_matches_reference(x_shape, w_shape, attrs):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    full = {"strides": (1, 1), "dilation": (1, 1), "padding": (0, 0, 0, 0), "groups": 1, **attrs}
    x, wt = normal(rng, x_shape), normal(rng, w_shape)
    check_paths(x, wt, full)
    check_paths(x, wt, full, bias=normal(rng, (w_shape[0], 1, 1)))


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_batched_im2col_path_with_non_finite_values_matches_reference(value):
    rng = np.random.default_rng(5)
    x, wt = normal(rng, (4, 64, 8, 8)), normal(rng, (64, 64, 3, 3))
    x[2, 10, 3, 3] = value
    attrs = {**STRIDE_ONE, "strides": (2, 2)}
    out, ref = check_paths(x, wt, attrs)
    assert np.array_equal(np.isfinite(out), np.isfinite(ref))
    assert not np.isfinite(out).all()
