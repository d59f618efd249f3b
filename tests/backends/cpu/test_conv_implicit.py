"""The implicit-GEMM convolutions (native/src/conv_im2col.cpp): the shapes the shifted-view
kernels leave (strides, 1x1 projections, weights past L2 on planes of at most 64 pixels, as in
workload G's 128- to 512-channel stages) run as one GEMM over the batch whose packed operand is
gathered straight from a zero-padded copy of the batch (or from the input itself where no tap
reads outside it) into sgemm_prepacked's layout. Forward, data and weight gradients must match a
float64 reference, give the same bits on the AVX2 and AVX-512 tiles (forward and data gradient)
and at one and two threads, with and without the bias + ReLU epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid import _native
from tests.backends.cpu.test_conv_isa import check_case
from tests.backends.cpu.test_conv_paths import check_paths, normal

pytestmark = [
    pytest.mark.usefixtures("fixed_threads"),
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
]


@st.composite
def large_weight_cases(draw):
    """Weights past the shifted-view kernels' 512 KB (more than 131072 taps) on small planes:
    odd channel counts, strides, dilations, one-sided padding, batches from one image."""
    c, o = draw(st.integers(115, 140)), draw(st.integers(115, 140))
    kh, kw = draw(st.sampled_from([(3, 3), (3, 3), (1, 1), (3, 1), (2, 3)]))
    if c * o * kh * kw <= 131072:
        kh, kw = 3, 3
    sh, sw = draw(st.sampled_from([(1, 1), (1, 1), (2, 2), (1, 2)]))
    dh, dw = draw(st.sampled_from([(1, 1), (1, 1), (2, 1)]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 9))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 9))
    n = draw(st.integers(1, 3))
    attrs = {"strides": (sh, sw), "dilation": (dh, dw), "padding": pads, "groups": 1}
    return (n, c, h, w), (o, c, kh, kw), attrs, np.float32, draw(st.integers(0, 2**31))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=large_weight_cases())
def test_large_weights_on_small_planes_match_the_reference_on_both_isas(case):
    check_case(case)


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, pads",
    [
        ((2, 128, 8, 8), (128, 128, 3, 3), 1, (1, 1, 1, 1)),  # workload G's second stage
        ((3, 256, 4, 4), (256, 256, 3, 3), 1, (1, 1, 1, 1)),  # its third
        ((2, 512, 2, 2), (512, 512, 3, 3), 1, (1, 1, 1, 1)),  # its fourth
        ((1, 256, 4, 4), (512, 256, 3, 3), 2, (1, 1, 1, 1)),  # a downsampling 3x3, one image
        ((2, 128, 8, 8), (256, 128, 1, 1), 2, (0, 0, 0, 0)),  # a projection: read in place
        ((2, 37, 7, 5), (19, 37, 1, 1), 2, (0, 0, 0, 0)),  # odd sizes, read in place
    ],
)
def test_workload_g_stages_match_the_reference_on_both_isas(x_shape, w_shape, stride, pads):
    attrs = {"strides": (stride, stride), "dilation": (1, 1), "padding": pads, "groups": 1}
    check_case((x_shape, w_shape, attrs, np.float32, sum(x_shape) + sum(w_shape)))


@pytest.mark.parametrize("side, channels", [(8, 128), (4, 136), (3, 130)])
def test_bias_relu_epilogue_on_the_implicit_gemm(side, channels):
    rng = np.random.default_rng(side + channels)
    x, wt = normal(rng, (3, channels, side, side)), normal(rng, (channels, channels, 3, 3))
    attrs = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}
    out, _ = check_paths(x, wt, attrs, bias=normal(rng, (channels, 1, 1)))
    assert (out >= 0).all() and (out == 0).any()  # the ReLU ran


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_non_finite_inputs_on_the_implicit_gemm_match_the_reference(value):
    """Padding is a real zero in the gathered operand, as in the reference's padded windows."""
    rng = np.random.default_rng(5)
    x, wt = normal(rng, (2, 128, 4, 4)), normal(rng, (128, 128, 3, 3))
    x[1, 7, 0, 3] = value
    attrs = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}
    out, ref = check_paths(x, wt, attrs, threads=(1, 2))
    assert np.array_equal(np.isfinite(out), np.isfinite(ref))
    assert not np.isfinite(out).all()
