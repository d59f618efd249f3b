"""rewrites.conv (conv2d + bias + ReLU as one ``conv2d_bias``; ReLU's gradient folded into the max
pool gradient as ``max_pool2d_relu_grad``): native results of the fused program against the prim
interpreter on the unfused one, the same bits at one and two threads, float64 gradients of a
compiled CNN against finite differences, and no fold where a removed value is still needed."""

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
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.backends.cpu.testing import draw_conv_layer
from lucid.testing import numerical_grads

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _feeds(p: Program, rng) -> list[np.ndarray]:
    out = []
    for s in p.feeds:
        a = p.slots[s]
        out.append(np.asarray(rng.standard_normal(a.shape), dtype=a.dtype.replace("f", "float")))
    return out


def _ops(p: Program) -> list[str]:
    return [i.op for i in fuse_kernels(p).instrs]


def _check_native(p: Program, feeds, scale=1.0):
    """Native results at one and two threads (bit-identical) against the unfused interpreter."""
    ex = CPUBackend(cache=False).compile(p)
    outs = []
    for n in (1, 2):
        set_num_threads(n)
        outs.append(ex.run([f.copy() for f in feeds]))
    want = p.interpret([f.copy() for f in feeds])
    for one, two, ref in zip(*outs, want, strict=True):
        np.testing.assert_array_equal(one, two)
        tol = (2e-5 if one.dtype == np.float32 else 1e-12) * scale
        np.testing.assert_allclose(one, ref, rtol=tol, atol=tol)


@st.composite
def conv_layers(draw):
    return draw_conv_layer(draw)


@settings(max_examples=30, deadline=None)
@given(
    layer=conv_layers(),
    bias_rank=st.sampled_from([3, 4]),
    bias_first=st.booleans(),
    relu=st.booleans(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_conv_bias_relu_folds_and_matches_unfused(layer, bias_rank, bias_first, relu, dtype, seed):
    x_shape, w_shape, attrs = layer
    channels = w_shape[0]
    p = Program()
    x, w = p.feed(x_shape, dtype), p.feed(w_shape, dtype)
    b = p.op("reshape", p.feed((channels,), dtype), shape=(1, channels, 1, 1)[4 - bias_rank :])
    y = p.op("conv2d", x, w, **attrs)
    y = p.op("add", b, y) if bias_first else p.op("add", y, b)
    if relu:
        y = p.op("relu", y)
    p.result(y)
    assert _ops(p)[-1:] == ["conv2d_bias"] and not {"conv2d", "add", "relu"} & set(_ops(p))
    _check_native(p, _feeds(p, np.random.default_rng(seed)), scale=10)


def test_a_bias_along_the_width_is_not_a_channel_bias():
    p = Program()
    x, w, b = p.feed((2, 3, 4, 4)), p.feed((4, 3, 1, 1)), p.feed((4,))  # W == O == 4
    y = p.op("conv2d", x, w, strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), groups=1)
    p.result(p.op("relu", p.op("add", y, b)))
    assert "conv2d_bias" not in _ops(p)
    _check_native(p, _feeds(p, np.random.default_rng(4)))


def test_conv_bias_keeps_values_that_are_still_needed():
    p = Program()
    x, w, b = p.feed((2, 3, 6, 6)), p.feed((4, 3, 3, 3)), p.feed((4, 1, 1))
    attrs = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}
    y = p.op("conv2d", x, w, **attrs)
    z = p.op("add", y, b)
    p.result(p.op("relu", z))
    p.result(z)  # the pre-activation is a result: the bias folds, the ReLU stays apart
    assert _ops(p) == ["conv2d_bias", "relu"]
    _check_native(p, _feeds(p, np.random.default_rng(0)))
    q = Program()
    x, w, b = q.feed((2, 3, 6, 6)), q.feed((4, 3, 3, 3)), q.feed((1, 4, 1, 1))
    y = q.op("conv2d", x, w, **attrs)
    q.result(q.op("relu", q.op("add", y, b)))
    q.result(q.op("exp", y))  # the bare convolution is read elsewhere: nothing folds
    assert "conv2d_bias" not in _ops(q)
    _check_native(q, _feeds(q, np.random.default_rng(1)))


@pytest.mark.parametrize(
    "kernel, strides, padding, shape",
    [
        ((2, 2), (2, 2), (0, 0, 0, 0), (2, 3, 8, 6)),  # the unrolled 2x2 path
        ((2, 2), (2, 2), (0, 0, 0, 0), (1, 2, 7, 5)),  # odd edges
        ((3, 3), (2, 2), (1, 1, 1, 1), (2, 2, 7, 7)),  # the general path: overlapping windows
        ((3, 2), (1, 2), (0, 1, 1, 0), (1, 3, 6, 9)),
    ],
)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_max_pool_relu_grad_folds_and_matches_unfused(kernel, strides, padding, shape, dtype):
    rng = np.random.default_rng(0)
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "dilation": (1, 1)}
    p = Program()
    z = p.feed(shape, dtype)
    r = p.op("relu", z)
    pooled = p.op("max_pool2d", r, **attrs)
    dy = p.feed(p.slots[pooled].shape, dtype)
    zero = p.op("constant", shape=(), dtype=dtype, value=(0.0,))
    grad = p.op("max_pool2d_grad", dy, r, **attrs)
    p.result(p.op("select", p.op("gt", r, zero), grad, zero))
    p.result(pooled)
    assert "max_pool2d_relu_grad" in _ops(p) and "select" not in _ops(p)
    # Integers from -2 to 2 with NaNs: ties, negative windows (winner 0 after the ReLU), NaNs.
    feeds = [rng.integers(-2, 3, size=shape).astype(dtype.replace("f", "float")), None]
    feeds[0][rng.random(shape) < 0.1] = np.nan
    feeds[1] = rng.standard_normal(p.slots[dy].shape).astype(feeds[0].dtype)
    ex = CPUBackend(cache=False).compile(p)
    got, want = ex.run([f.copy() for f in feeds]), p.interpret([f.copy() for f in feeds])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_select_of_another_mask_is_left_alone():
    attrs = {"kernel": (2, 2), "strides": (2, 2), "padding": (0, 0, 0, 0), "dilation": (1, 1)}
    p = Program()
    z, other = p.feed((1, 2, 4, 4)), p.feed((1, 2, 4, 4))
    r = p.op("relu", z)
    dy = p.feed((1, 2, 2, 2))
    zero = p.op("constant", shape=(), dtype="f32", value=(0.0,))
    grad = p.op("max_pool2d_grad", dy, r, **attrs)
    p.result(p.op("select", p.op("gt", other, zero), grad, zero))  # not the pooled input's mask
    assert "max_pool2d_relu_grad" not in _ops(p)
    _check_native(p, _feeds(p, np.random.default_rng(2)))


class SmallCNN(lucid.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = lucid.nn.Conv2d(2, 3, 3, padding=1)
        self.conv2 = lucid.nn.Conv2d(3, 4, 3, padding=1)
        self.pool = lucid.nn.MaxPool2d(2)
        self.head = lucid.nn.Linear(4, 2)

    def forward(self, x):
        x = self.pool(lucid.nn.functional.relu(self.conv1(x)))
        x = self.pool(lucid.nn.functional.relu(self.conv2(x)))
        return self.head(x.reshape(x.shape[0], -1))


def test_compiled_cnn_float64_gradients_match_finite_differences():
    """A two-layer CNN in float64 through fused_step's program (conv2d_bias forward,
    max_pool2d_relu_grad backward): its gradients (read back from one SGD step of lr 1) against
    central differences of the eager loss."""
    lucid.manual_seed(0)
    model = SmallCNN().to(lucid.float64)
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((3, 2, 4, 4)), dtype=lucid.float64)

    def loss_fn(out, target):
        return ((out - target) ** 2).sum()

    target = lucid.tensor(rng.standard_normal((3, 2)), dtype=lucid.float64)
    params = list(model.parameters())
    before = [p.numpy().copy() for p in params]
    numeric = numerical_grads(lambda *ps: loss_fn(model(x), target), params, np.ones(()), eps=1e-6)
    step = lucid.compile.fused_step(model, loss_fn, lucid.optim.SGD(params, lr=1.0))
    step(x, target)
    ops = next(iter(step._entries.values())).executable.dump()
    assert "conv2d_bias" in ops and "max_pool2d_relu_grad" in ops
    for p, b, n in zip(params, before, numeric, strict=True):
        np.testing.assert_allclose(b - p.numpy(), n, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("relu", [False, True])
def test_max_pool_split_over_planes_gives_the_same_bits_at_one_and_two_threads(relu):
    """Workload C's first pool (and its gradient) is split across the pool by planes."""
    attrs = {"kernel": (2, 2), "strides": (2, 2), "padding": (0, 0, 0, 0), "dilation": (1, 1)}
    p = Program()
    x = p.feed((8, 16, 28, 27))  # odd width: the gradient's uncovered column is zero
    dy = p.feed((8, 16, 14, 13))
    p.result(p.op("max_pool2d", x, **attrs))
    if relu:
        zero = p.op("constant", shape=(), dtype="f32", value=(0.0,))
        grad = p.op("max_pool2d_grad", dy, x, **attrs)
        p.result(p.op("select", p.op("gt", x, zero), grad, zero))
        assert "max_pool2d_relu_grad" in _ops(p)
    else:
        p.result(p.op("max_pool2d_grad", dy, x, **attrs))
    _check_native(p, _feeds(p, np.random.default_rng(6)))
