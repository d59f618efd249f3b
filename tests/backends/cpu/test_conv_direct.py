"""Stride-1 convolutions run as shifted GEMMs over a padded image (native/src/conv.cpp), other
strides and edge cases through im2col + BLAS: both must match the float64 reference interpreter,
give the same bits at any thread count, and their gradients must match finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)
from lucid.backends.cpu.testing import assert_match
from lucid.ir.prim import dtype_of

pytestmark = pytest.mark.usefixtures("fixed_threads")


def compiled(name, arrays, attrs):
    p = Program()
    slots = [p.feed(a.shape, dtype_of(a)) for a in arrays]
    p.result(p.op(name, *slots, **attrs))
    return p, CPUBackend(cache=False).compile(p)


def run_at(threads, name, arrays, attrs):
    """The op's reference result and its native results at each thread count."""
    p, ex = compiled(name, arrays, attrs)
    outs = []
    for n in threads:
        set_num_threads(n)
        outs.append(ex.run(arrays)[0])
    return p.interpret(arrays)[0], outs


@st.composite
def conv_cases(draw, stride_one=True):
    groups = draw(st.integers(1, 3))
    cg, og = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sh, sw = (1, 1) if stride_one else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 11))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 11))
    n = draw(st.integers(1, 6))
    attrs = {"strides": (sh, sw), "dilation": (dh, dw), "padding": pads, "groups": groups}
    return (n, cg * groups, h, w), (og * groups, cg, kh, kw), attrs, draw(st.integers(0, 2**31))


def output_shape(x_shape, w_shape, attrs):
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    ho = (x_shape[2] + pt + pb - dh * (w_shape[2] - 1) - 1) // sh + 1
    wo = (x_shape[3] + pl + pr - dw * (w_shape[3] - 1) - 1) // sw + 1
    return (x_shape[0], w_shape[0], ho, wo)


def check_all_three(case, dtype, threads=(1, 2)):
    x_shape, w_shape, attrs, seed = case
    rng = np.random.default_rng(seed)
    np_dtype = np.float32 if dtype == "f32" else np.float64
    x = rng.standard_normal(x_shape).astype(np_dtype)
    w = rng.standard_normal(w_shape).astype(np_dtype)
    dy = rng.standard_normal(output_shape(x_shape, w_shape, attrs)).astype(np_dtype)
    checks = [
        ("conv2d", [x, w], attrs),
        ("conv2d_data_grad", [dy, w], {**attrs, "input_shape": x_shape}),
        ("conv2d_weights_grad", [x, dy], {**attrs, "weight_shape": w_shape}),
    ]
    for name, arrays, op_attrs in checks:
        ref, outs = run_at(threads, name, arrays, op_attrs)
        for out in outs[1:]:
            np.testing.assert_array_equal(out, outs[0], err_msg=f"{name}: threads differ")
        # Sums of up to ~150 products of N(0,1) values: scale the float32 tolerance with them.
        assert_match(outs[0], ref.astype(np_dtype), scale=50)


@settings(max_examples=40, deadline=None)
@given(conv_cases(), st.sampled_from(["f32", "f64"]))
def test_stride_one_conv_and_gradients_match_reference_at_one_and_two_threads(case, dtype):
    check_all_three(case, dtype)


@settings(max_examples=15, deadline=None)
@given(conv_cases(stride_one=False), st.sampled_from(["f32", "f64"]))
def test_strided_conv_falls_back_and_matches_reference(case, dtype):
    check_all_three(case, dtype)


@pytest.mark.parametrize(
    "x_shape, w_shape",
    [((64, 1, 28, 28), (16, 1, 3, 3)), ((64, 16, 14, 14), (32, 16, 3, 3))],
)
def test_workload_c_layers_match_reference_and_split_over_threads(x_shape, w_shape):
    attrs = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}
    check_all_three((x_shape, w_shape, attrs, 7), "f32", threads=(1, 2, 3))


def test_gradients_match_finite_differences_in_float64():
    """d/dx and d/dw of sum(conv2d(x, w) * c) from the native gradient ops against central
    differences of the native forward."""
    rng = np.random.default_rng(3)
    attrs = {"strides": (1, 1), "dilation": (2, 1), "padding": (2, 0, 1, 1), "groups": 2}
    x = rng.standard_normal((2, 4, 6, 5))
    w = rng.standard_normal((4, 2, 2, 3))
    _, forward = compiled("conv2d", [x, w], attrs)
    c = rng.standard_normal(forward.run([x, w])[0].shape)

    def objective(xv, wv):
        return float(np.sum(forward.run([xv, wv])[0] * c))

    def central(values, index_of):
        grad, eps = np.zeros_like(values), 1e-6
        for i in np.ndindex(values.shape):
            plus, minus = values.copy(), values.copy()
            plus[i] += eps
            minus[i] -= eps
            grad[i] = (index_of(plus) - index_of(minus)) / (2 * eps)
        return grad

    _, dgrad = compiled("conv2d_data_grad", [c, w], {**attrs, "input_shape": x.shape})
    _, wgrad = compiled("conv2d_weights_grad", [x, c], {**attrs, "weight_shape": w.shape})
    np.testing.assert_allclose(
        dgrad.run([c, w])[0], central(x, lambda v: objective(v, w)), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(
        wgrad.run([x, c])[0], central(w, lambda v: objective(x, v)), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_non_finite_values_give_the_reference_result(dtype):
    """An inf in x (weight gradient) or in w (data gradient) must not turn the dropped grid
    columns' 0 * inf into NaNs where the reference has none."""
    rng = np.random.default_rng(5)
    np_dtype = np.float32 if dtype == "f32" else np.float64
    attrs = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}
    x = rng.standard_normal((3, 2, 5, 6)).astype(np_dtype)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np_dtype)
    dy = rng.standard_normal((3, 3, 5, 6)).astype(np_dtype)
    x[1, 0, 2, 5] = np.inf  # the last column: only dropped grid columns read it with tap j = 0
    w[2, 1, 0, 0] = -np.inf
    cases = [
        ("conv2d", [x, w], attrs),
        ("conv2d_data_grad", [dy, w], {**attrs, "input_shape": x.shape}),
        ("conv2d_weights_grad", [x, dy], {**attrs, "weight_shape": w.shape}),
    ]
    for name, arrays, op_attrs in cases:
        ref, (out,) = run_at((2,), name, arrays, op_attrs)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=name)
        finite = np.isfinite(ref)
        np.testing.assert_allclose(out[finite], ref[finite], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(out[~finite], ref[~finite].astype(np_dtype))


def test_compiled_cnn_matches_eager_forward_and_training():
    """Workload C's layers (smaller batch) compiled against eager Lucid: the forward, and the
    parameters after two fused SGD steps."""
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((8, 1, 28, 28)).astype(np.float32))
    labels = lucid.tensor(rng.integers(0, 10, size=8))

    def build():
        lucid.manual_seed(0)
        return lucid.nn.Sequential(
            lucid.nn.Conv2d(1, 16, 3, padding=1),
            lucid.nn.ReLU(),
            lucid.nn.MaxPool2d(2),
            lucid.nn.Conv2d(16, 32, 3, padding=1),
            lucid.nn.ReLU(),
            lucid.nn.MaxPool2d(2),
            lucid.nn.Flatten(),
            lucid.nn.Linear(1568, 10),
        )

    eager, model = build(), build()
    with lucid.no_grad():
        np.testing.assert_allclose(
            lucid.compile(model.eval())(x).numpy(), eager.eval()(x).numpy(), rtol=1e-4, atol=1e-5
        )
    eager.train(), model.train()
    loss_fn = lucid.nn.CrossEntropyLoss()
    opt_e = lucid.optim.SGD(eager.parameters(), lr=0.1)
    step = lucid.compile.fused_step(model, loss_fn, lucid.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        opt_e.zero_grad()
        loss_fn(eager(x), labels).backward()
        opt_e.step()
        step(x, labels)
    for pe, pc in zip(eager.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-5)
