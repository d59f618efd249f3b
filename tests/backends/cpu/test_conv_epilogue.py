"""rewrites.conv.fold_conv_affine: a convolution followed by an inference BatchNorm (a per-channel
affine chain), optionally a residual add, then optionally a ReLU, runs as one ``conv2d_bias(x, w,
bias, scale[, residual])`` whose epilogue applies them, its per-channel scale and bias computed
before it by one small ``fused`` instruction. Native results of the folded program against the
float64 interpreter on the unfused one (every convolution path: shifted views, phases, implicit
GEMM, Winograd, float64's im2col fallback), the same bits at one and two threads, compiled
modules against eager Lucid, and no fold where the chain is not per-channel affine."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import _native
from lucid.backends.cpu import CPUBackend, Program, set_num_threads
from lucid.backends.cpu.program import FUSED
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.backends.cpu.testing import draw_conv_layer

pytestmark = pytest.mark.usefixtures("fixed_threads")

NUMPY = {"f32": np.float32, "f64": np.float64}


def bn_program(x_shape, w_shape, attrs, dtype="f32", *, residual=False, relu=True, conv_bias=False):
    """conv2d (+ a bias), then BatchNorm with running statistics as lowering emits it
    (``(y - mean) * (var + eps) ** -0.5 * gamma + beta``, each [C] operand reshaped to
    [1, C, 1, 1] where it is used), then + a residual feed and relu as asked. Feeds: x, w,
    [conv bias], mean, var, gamma, beta, [residual]."""
    channels = w_shape[0]
    p = Program()
    x, w = p.feed(x_shape, dtype), p.feed(w_shape, dtype)
    y = p.op("conv2d", x, w, **attrs)
    if conv_bias:
        y = p.op("add", y, p.op("reshape", p.feed((channels,), dtype), shape=(1, channels, 1, 1)))
    mean, var, gamma, beta = (p.feed((channels,), dtype) for _ in range(4))
    eps = p.op("constant", shape=(), dtype=dtype, value=(1e-5,))
    power = p.op("constant", shape=(), dtype=dtype, value=(-0.5,))
    rstd = p.op("pow", p.op("add", var, eps), power)

    def view(v):
        return p.op("reshape", v, shape=(1, channels, 1, 1))

    z = p.op("mul", p.op("sub", y, view(mean)), view(rstd))
    z = p.op("add", p.op("mul", z, view(gamma)), view(beta))
    if residual:
        z = p.op("add", z, p.feed(p.slots[y].shape, dtype))
    if relu:
        z = p.op("relu", z)
    p.result(z)
    return p


def bn_feeds(p: Program, rng) -> list[np.ndarray]:
    """Normal values; the [C] feeds (the running statistics, gamma and beta) positive, so the
    variance is."""
    out = []
    for s in p.feeds:
        a = p.slots[s]
        v = rng.standard_normal(a.shape)
        out.append(np.asarray(np.abs(v) + 0.25 if len(a.shape) == 1 else v, dtype=NUMPY[a.dtype]))
    return out


def folded(p: Program) -> Program:
    return fuse_kernels(p)


def assert_folds(p: Program, residual: bool) -> None:
    """One conv2d_bias with a scale (and the residual) and no pass over the output's shape
    left."""
    q = folded(p)
    convs = [i for i in q.instrs if i.op == "conv2d_bias"]
    assert len(convs) == 1 and len(convs[0].inputs) == (5 if residual else 4)
    out_shape = q.slots[convs[0].outputs[0]].shape
    others = [i for i in q.instrs if i.op != "conv2d_bias"]
    assert not any(q.slots[i.outputs[0]].shape == out_shape for i in others)


def check_native(p: Program, feeds, wide: Program | None = None, scale=1.0):
    """Native results at one and two threads (bit-identical) against the interpreter on the
    unfused program (``wide``: its float64 twin, run on the same values widened)."""
    ex = CPUBackend(cache=False).compile(p)
    outs = []
    for n in (1, 2):
        set_num_threads(n)
        outs.append(ex.run([f.copy() for f in feeds]))
    if wide is None:
        want = p.interpret([f.copy() for f in feeds])
    else:
        want = wide.interpret([f.astype(np.float64) for f in feeds])
    for one, two, ref in zip(*outs, want, strict=True):
        np.testing.assert_array_equal(one, two)
        tol = (2e-5 if one.dtype == np.float32 else 1e-11) * scale
        mag = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(one, ref.astype(one.dtype), rtol=tol, atol=tol * mag)


@st.composite
def conv_layers(draw):
    return draw_conv_layer(draw, in_per_group=4, out_per_group=6, side=10)


@settings(max_examples=40, deadline=None)
@given(
    layer=conv_layers(),
    residual=st.booleans(),
    relu=st.booleans(),
    conv_bias=st.booleans(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_conv_batch_norm_folds_and_matches_unfused(layer, residual, relu, conv_bias, dtype, seed):
    x_shape, w_shape, attrs = layer
    flags = {"residual": residual, "relu": relu, "conv_bias": conv_bias}
    p = bn_program(x_shape, w_shape, attrs, dtype, **flags)
    assert_folds(p, residual)
    feeds = bn_feeds(p, np.random.default_rng(seed))
    wide = bn_program(x_shape, w_shape, attrs, "f64", **flags)
    check_native(p, feeds, wide, scale=10)


STRIDE_ONE = {"strides": (1, 1), "dilation": (1, 1), "padding": (1, 1, 1, 1), "groups": 1}


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, dtype",
    [
        ((3, 16, 9, 11), (24, 16, 3, 3), STRIDE_ONE, "f32"),  # shifted views
        ((3, 16, 9, 11), (24, 16, 3, 3), STRIDE_ONE, "f64"),  # shifted views, float64
        # the stem's phases (3 -> 16 channels, 7x7 stride 2 on 32x32)
        (
            (2, 3, 32, 32),
            (16, 3, 7, 7),
            {**STRIDE_ONE, "strides": (2, 2), "padding": (3,) * 4},
            "f32",
        ),
        ((4, 64, 8, 8), (64, 64, 3, 3), {**STRIDE_ONE, "strides": (2, 2)}, "f32"),  # implicit
        (
            (4, 32, 6, 6),
            (48, 32, 1, 1),
            {**STRIDE_ONE, "strides": (2, 2), "padding": (0,) * 4},
            "f32",
        ),  # a 1x1 stride-2 projection: implicit GEMM read in place
        ((3, 128, 12, 11), (128, 128, 3, 3), STRIDE_ONE, "f32"),  # Winograd
        ((2, 128, 6, 5), (128, 128, 3, 3), STRIDE_ONE, "f64"),  # float64 im2col fallback
    ],
)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("isa", ["auto", "avx2"])  # the AVX-512 shifted-view tiles where present
def test_each_convolution_path_applies_the_epilogue(x_shape, w_shape, attrs, dtype, residual, isa):
    _native.set_sgemm_isa(isa)  # fixed_threads restores "auto"
    p = bn_program(x_shape, w_shape, attrs, dtype, residual=residual, relu=True)
    assert_folds(p, residual)
    rng = np.random.default_rng(sum(x_shape) + residual)
    feeds = bn_feeds(p, rng)
    wide = bn_program(x_shape, w_shape, attrs, "f64", residual=residual, relu=True)
    check_native(p, feeds, wide, scale=10)


def test_the_scale_and_bias_are_computed_before_the_conv_where_beta_is_reshaped_late():
    """A BatchNorm without ReLU or residual (a downsample branch): its last step's operand is
    reshaped right before the step, so the per-channel instruction takes the [C] vectors and
    goes at a position freed earlier in the chain."""
    p = bn_program((2, 4, 6, 6), (8, 4, 1, 1), {**STRIDE_ONE, "padding": (0,) * 4}, relu=False)
    instrs = folded(p).instrs
    ops = [i.op for i in instrs]
    assert ops.count("conv2d_bias") == 1 and ops.index(FUSED) < ops.index("conv2d_bias")
    assert "reshape" not in ops  # the views of the [C] operands are no longer read
    (fused,) = [i for i in instrs if i.op == FUSED]
    assert {folded(p).slots[s].shape for s in fused.outputs} == {(8,)}
    check_native(p, bn_feeds(p, np.random.default_rng(0)))


def _attrs(stride=1, pad=1):
    return {"strides": (stride,) * 2, "dilation": (1, 1), "padding": (pad,) * 4, "groups": 1}


def test_no_fold_when_the_conv_output_is_read_elsewhere():
    p = bn_program((2, 3, 6, 6), (4, 3, 3, 3), _attrs())
    conv = next(i for i in p.instrs if i.op == "conv2d")
    p.result(conv.outputs[0])  # the bare convolution is a result too
    ops = [i.op for i in folded(p).instrs]
    assert "conv2d" in ops and "conv2d_bias" not in ops
    check_native(p, bn_feeds(p, np.random.default_rng(1)))


def test_no_fold_through_a_non_affine_op():
    """tanh between the convolution and the BatchNorm: the chain is not affine in the conv."""
    p = Program()
    x, w, a, b = p.feed((2, 3, 6, 6)), p.feed((4, 3, 3, 3)), p.feed((4,)), p.feed((4,))
    y = p.op("tanh", p.op("conv2d", x, w, **_attrs()))
    y = p.op("mul", y, p.op("reshape", a, shape=(1, 4, 1, 1)))
    p.result(p.op("relu", p.op("add", y, p.op("reshape", b, shape=(1, 4, 1, 1)))))
    ops = [i.op for i in folded(p).instrs]
    assert "conv2d" in ops and "conv2d_bias" not in ops
    check_native(p, bn_feeds(p, np.random.default_rng(2)))


def test_no_fold_of_an_operand_along_the_width_or_of_the_conv_squared():
    """A [C] operand broadcasts along the width (here W == C), not per channel; y * y is not
    affine in y."""
    p = Program()
    x, w, a, b = p.feed((2, 3, 4, 4)), p.feed((4, 3, 1, 1)), p.feed((4,)), p.feed((1, 4, 1, 1))
    y = p.op("conv2d", x, w, **_attrs(pad=0))
    p.result(p.op("relu", p.op("add", p.op("mul", y, a), b)))
    q = Program()
    x, w, b = q.feed((2, 3, 4, 4)), q.feed((4, 3, 1, 1)), q.feed((4,))
    y = q.op("conv2d", x, w, **_attrs(pad=0))
    q.result(q.op("add", q.op("mul", y, y), q.op("reshape", b, shape=(1, 4, 1, 1))))
    for prog, seed in ((p, 3), (q, 4)):
        ops = [i.op for i in folded(prog).instrs]
        assert "conv2d" in ops and "conv2d_bias" not in ops
        check_native(prog, bn_feeds(prog, np.random.default_rng(seed)))


def test_a_chain_value_read_elsewhere_ends_the_fold_there():
    """The normalized value before gamma and beta is also a result: the fold stops at it (its
    scale and bias are the mean's and rstd's), the rest stays an elementwise pass."""
    p = bn_program((2, 3, 6, 6), (4, 3, 3, 3), _attrs())
    first_mul = next(i for i in p.instrs if i.op == "mul")
    p.result(first_mul.outputs[0])
    instrs = folded(p).instrs
    (conv,) = [i for i in instrs if i.op == "conv2d_bias"]
    assert conv.outputs[0] == first_mul.outputs[0] and len(conv.inputs) == 4
    assert not conv.attrs["relu"]
    check_native(p, bn_feeds(p, np.random.default_rng(5)), scale=10)


# --- compiled modules against eager Lucid ------------------------------------------------------


class ConvBN(lucid.nn.Module):
    def __init__(self, cin, cout, stride, relu, residual, conv_bias):
        super().__init__()
        self.conv = lucid.nn.Conv2d(cin, cout, 3, stride, 1, bias=conv_bias)
        self.bn = lucid.nn.BatchNorm2d(cout)
        self.relu, self.residual = relu, residual

    def forward(self, x, skip):
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + skip
        return lucid.nn.functional.relu(y) if self.relu else y


def _randomize_batch_norm(model, rng):
    state = model.state_dict()
    for name, value in state.items():
        if name.endswith(("running_mean", "running_var", "bn.weight", "bn.bias")):
            v = rng.standard_normal(tuple(value.shape))
            v = np.abs(v) + 0.25 if name.endswith("running_var") else v
            state[name] = lucid.tensor(v, dtype=value.dtype)
    model.load_state_dict(state)


@settings(max_examples=12, deadline=None)
@given(
    batch=st.integers(1, 3),
    cin=st.integers(1, 6),
    cout=st.integers(1, 9),
    stride=st.integers(1, 2),
    size=st.integers(3, 9),
    relu=st.booleans(),
    residual=st.booleans(),
    conv_bias=st.booleans(),
    double=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_compiled_conv_batch_norm_matches_eager(
    batch, cin, cout, stride, size, relu, residual, conv_bias, double, seed
):
    rng = np.random.default_rng(seed)
    lucid.manual_seed(seed)
    dtype = lucid.float64 if double else lucid.float32
    model = ConvBN(cin, cout, stride, relu, residual, conv_bias).to(dtype)
    _randomize_batch_norm(model, rng)
    model.eval()
    out_size = (size - 1) // stride + 1
    x = lucid.tensor(rng.standard_normal((batch, cin, size, size)), dtype=dtype)
    skip = lucid.tensor(rng.standard_normal((batch, cout, out_size, out_size)), dtype=dtype)
    compiled = lucid.compile(model)
    with lucid.no_grad():
        got, want = compiled(x, skip).numpy(), model(x, skip).numpy()
    tol = 1e-11 if double else 2e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    program = compiled.ir().split("// native program")[1]
    assert "conv2d_bias" in program and "= conv2d{" not in program
    assert "relu" not in program.replace("relu=", "")  # no ReLU pass: it is the conv's
