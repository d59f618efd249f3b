"""The convolution kernels on each instruction set (native/src/conv.cpp): the AVX-512 shifted-view
forward (which also computes the data gradient) and weight gradient where the CPU has AVX-512,
the AVX2 ones when ``set_sgemm_isa("avx2")`` forces them (one switch for the GEMM and the
convolutions), and the batched im2col backward passes of the shapes the direct kernels leave.
Each result must match a float64 numpy reference within float32 (or float64) rounding; the
forward and data gradient give the same bits on both instruction sets (each pixel sums its taps
in order, one FMA each) and every path the same bits at one and two threads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program, set_num_threads
from tests.backends.cpu.test_conv_direct import output_shape
from tests.backends.cpu.test_sgemm_isa import _isa

pytestmark = [
    pytest.mark.usefixtures("fixed_threads"),
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
]


def _padded(x, pads):
    pt, pb, pl, pr = pads
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))


def _window(xp, i, j, ho, wo, attrs):
    """The padded input read by tap (i, j) for every output pixel: [N, C, HO, WO]."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    return xp[
        :, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw
    ]


def _groups(a, g):
    """[N, G*c, ...] as [N, G, c, ...]."""
    return a.reshape(a.shape[0], g, a.shape[1] // g, *a.shape[2:])


def reference(op, a, b, attrs, out_shape):
    """conv2d, conv2d_data_grad or conv2d_weights_grad in float64 numpy, tap by tap."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    g, pads = attrs["groups"], attrs["padding"]
    if op == "conv2d":
        x, w = a, b
        n, o, ho, wo = out_shape
        xp, out = _padded(x, pads), np.zeros(out_shape)
        wg = w.reshape(g, o // g, *w.shape[1:])
        for i in range(w.shape[2]):
            for j in range(w.shape[3]):
                win = _groups(_window(xp, i, j, ho, wo, attrs), g)
                out += np.einsum("ngchw,goc->ngohw", win, wg[:, :, :, i, j]).reshape(out.shape)
        return out
    if op == "conv2d_data_grad":
        dy, w = a, b
        ho, wo = dy.shape[2:]
        xp = np.zeros(_padded(np.zeros(out_shape), pads).shape)
        wg = w.reshape(g, w.shape[0] // g, *w.shape[1:])
        for i in range(w.shape[2]):
            for j in range(w.shape[3]):
                part = np.einsum("ngohw,goc->ngchw", _groups(dy, g), wg[:, :, :, i, j])
                _window(xp, i, j, ho, wo, attrs)[...] += part.reshape(part.shape[0], -1, ho, wo)
        pt, pb, pl, pr = pads
        return xp[:, :, pt : xp.shape[2] - pb, pl : xp.shape[3] - pr]
    x, dy = a, b
    ho, wo = dy.shape[2:]
    xp, out = _padded(x, pads), np.zeros(out_shape)
    for i in range(out_shape[2]):
        for j in range(out_shape[3]):
            win = _groups(_window(xp, i, j, ho, wo, attrs), g)
            out[:, :, i, j] = np.einsum("ngohw,ngchw->goc", _groups(dy, g), win).reshape(
                out_shape[0], -1
            )
    return out


def run(op, arrays, attrs, extra, isa, threads):
    p = Program()
    slots = [p.feed(a.shape, a.dtype.name.replace("float", "f")) for a in arrays]
    p.result(p.op(op, *slots, **attrs, **extra))
    set_num_threads(threads)
    with _isa(isa):
        ex = CPUBackend(cache=False).compile(p)
        return ex.run(arrays)[0]


def assert_near(out, ref, terms, dtype):
    """Within rounding of a sum of `terms` products, relative to the output's scale."""
    scale = max(float(np.abs(ref).max()), 1.0)
    eps = 2e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=eps * np.sqrt(terms) * scale)


@st.composite
def cases(draw, stride_one: bool):
    groups = draw(st.sampled_from([1, 1, 2]))
    cg, og = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sh, sw = (1, 1) if stride_one else (draw(st.integers(1, 3)), draw(st.integers(2, 3)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    # Planes from 1 to 40 wide: partial 16-lane segments, several segments per row, and
    # segment counts that leave a last tile of 1-3 segments.
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 12))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 40))
    n = draw(st.integers(1, 6))
    attrs = {"strides": (sh, sw), "dilation": (dh, dw), "padding": pads, "groups": groups}
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
    return (
        (n, cg * groups, h, w),
        (og * groups, cg, kh, kw),
        attrs,
        dtype,
        draw(st.integers(0, 2**31)),
    )


def check_case(case):
    """All three ops on both instruction sets and at one and two threads against the reference."""
    x_shape, w_shape, attrs, dtype, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    y_shape = output_shape(x_shape, w_shape, attrs)
    dy = rng.standard_normal(y_shape).astype(dtype)
    taps = w_shape[1] * w_shape[2] * w_shape[3]
    checks = [
        ("conv2d", [x, w], {}, y_shape, taps, True),
        ("conv2d_data_grad", [dy, w], {"input_shape": x_shape}, x_shape, taps * w_shape[0], True),
        # The weight gradient's lane sums follow the register width: close, not equal, bits.
        (
            "conv2d_weights_grad",
            [x, dy],
            {"weight_shape": w_shape},
            w_shape,
            y_shape[0] * y_shape[2] * y_shape[3],
            False,
        ),
    ]
    for op, arrays, extra, shape, terms, same_bits in checks:
        ref = reference(op, *arrays, attrs, shape)
        best = run(op, arrays, attrs, extra, "auto", 1)
        avx2 = run(op, arrays, attrs, extra, "avx2", 1)
        assert_near(best, ref, terms, dtype)
        assert_near(avx2, ref, terms, dtype)
        if same_bits:
            np.testing.assert_array_equal(best, avx2, err_msg=f"{op}: the ISAs differ")
        two = run(op, arrays, attrs, extra, "auto", 2)
        np.testing.assert_array_equal(two, best, err_msg=f"{op}: threads differ")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(stride_one=True))
def test_stride_one_kernels_match_the_reference_on_both_isas(case):
    check_case(case)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(stride_one=False))
def test_strided_convolutions_match_the_reference_on_both_isas(case):
    check_case(case)


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, pads",
    [
        ((4, 64, 16, 16), (64, 64, 3, 3), 1, (1, 1, 1, 1)),  # workload G's first stage
        ((2, 16, 28, 28), (24, 16, 3, 3), 1, (1, 1, 1, 1)),  # two segments per row, 12 tiles
        ((3, 128, 8, 8), (128, 128, 3, 3), 1, (1, 1, 1, 1)),  # weights past the direct kernels
        ((4, 3, 32, 32), (16, 3, 7, 7), 2, (3, 3, 3, 3)),  # a stem: 7x7 stride 2
        ((4, 32, 8, 8), (64, 32, 1, 1), 2, (0, 0, 0, 0)),  # a 1x1 stride-2 projection
    ],
)
def test_workload_shapes_match_the_reference_on_both_isas(x_shape, w_shape, stride, pads):
    attrs = {"strides": (stride, stride), "dilation": (1, 1), "padding": pads, "groups": 1}
    check_case((x_shape, w_shape, attrs, np.float32, sum(x_shape) + sum(w_shape)))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(1, 4),
    o=st.integers(1, 20),
    kernel=st.sampled_from([(7, 7), (5, 5), (4, 6), (3, 3), (7, 4)]),
    stride=st.sampled_from([(2, 2), (3, 3), (2, 3)]),
    pads=st.tuples(*[st.integers(0, 3)] * 4),
    h=st.integers(32, 44),
    w=st.integers(32, 44),
    seed=st.integers(0, 2**31),
)
def test_strided_first_layers_over_phases_match_the_reference(
    c, o, kernel, stride, pads, h, w, seed
):
    """Few channels, large planes: the shapes that run as stride-1 convolutions over the
    input's phases (where their zero taps cost little; the others take im2col)."""
    attrs = {"strides": stride, "dilation": (1, 1), "padding": pads, "groups": 1}
    check_case(((2, c, h, w), (o, c, *kernel), attrs, np.float32, seed))


@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_strided_first_layer_with_non_finite_values_matches_the_reference(where, value):
    """A zero phase tap times an inf would be NaN where the reference has none: such calls take
    the im2col path, whose infinities and NaNs are the reference's."""
    rng = np.random.default_rng(3)
    attrs = {"strides": (2, 2), "dilation": (1, 1), "padding": (3, 3, 3, 3), "groups": 1}
    x, wt = rng.standard_normal((2, 3, 32, 32)), rng.standard_normal((8, 3, 7, 7))
    x, wt = x.astype(np.float32), wt.astype(np.float32)
    if where == "input":
        x[1, 2, 9, 14] = value
    else:
        wt[5, 1, 3, 2] = value
    y_shape = output_shape(x.shape, wt.shape, attrs)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    for op, arrays, extra, shape in [
        ("conv2d", [x, wt], {}, y_shape),
        ("conv2d_weights_grad", [x, dy], {"weight_shape": wt.shape}, wt.shape),
    ]:
        with np.errstate(invalid="ignore"):
            ref = reference(op, *arrays, attrs, shape)
        out = run(op, arrays, attrs, extra, "auto", 2)
        assert np.array_equal(np.isfinite(out), np.isfinite(ref)), op
        assert np.array_equal(np.isnan(out), np.isnan(ref)), op
        finite = np.isfinite(ref)
        np.testing.assert_allclose(out[finite], ref[finite], rtol=1e-4, atol=1e-4)
