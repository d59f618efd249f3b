"""Walks the op registry: for every differentiable op, the ``vjp`` pass's gradient of a small
traced function using it equals eager autograd's (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid._dispatch import apply
from lucid.ir import forward_func, import_trace, interpret, result_roles
from lucid.ops._registry import GRAD_SINK, REGISTRY
from lucid.passes.vjp import differentiate
from lucid.testing import assert_close
from lucid.trace import _tracing

_rng = np.random.default_rng(0)


def f(*shape):
    return _rng.standard_normal(shape)


def pos(*shape):
    return _rng.uniform(0.5, 2.0, shape)


def probs(*shape):
    return _rng.uniform(0.1, 0.9, shape)


def ints(high, *shape):
    return _rng.integers(0, high, shape)


def distinct(*shape):
    """Values far apart, so max/min/sort-like ops have no ties and rounding ops no edge cases."""
    n = int(np.prod(shape))
    return (_rng.permutation(n) * 0.37 + 0.1).reshape(shape)


def well_conditioned(*shape):
    """Square matrices near the identity (far from singular), so inverses and solves are
    accurate."""
    return f(*shape) * 0.3 + np.eye(shape[-1])


def spd(*shape):
    """Symmetric positive-definite matrices with well separated eigenvalues."""
    m = f(*shape)
    return m @ np.swapaxes(m, -1, -2) + np.diag(np.arange(1.0, shape[-1] + 1) * 2.0)


POOL = dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))

# op name -> (function of the operands, operands); float arrays are differentiated, the rest
# (integer arrays) are plain inputs.
CASES: dict[str, tuple] = {
    "abs": (lambda x: x.abs(), [distinct(3, 4) - 2.0]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), [f(2, 2, 5, 7)]),
    "adaptive_avg_pool2d_backward": (
        lambda g: apply(
            "adaptive_avg_pool2d_backward", g, input_shape=(2, 2, 5, 7), output_size=(2, 3)
        ),
        [f(2, 2, 2, 3)],
    ),
    "add": (lambda x, y: x + y, [f(3, 4), f(4)]),
    "amax": (lambda x: lucid.amax(x, dim=1), [distinct(3, 4)]),
    "amin": (lambda x: lucid.amin(x, dim=0, keepdim=True), [distinct(3, 4)]),
    "avg_pool2d": (
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
        [f(2, 2, 5, 5)],
    ),
    "avg_pool2d_backward": (
        lambda g: apply("avg_pool2d_backward", g, input_shape=(1, 2, 4, 4), **POOL),
        [f(1, 2, 2, 2)],
    ),
    "batch_norm": (
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        [f(4, 3, 2), f(3), f(3)],
    ),
    "binary_cross_entropy": (lambda x, t: F.binary_cross_entropy(x, t), [probs(3, 4), probs(3, 4)]),
    "binary_cross_entropy_with_logits": (
        lambda x, t: F.binary_cross_entropy_with_logits(x, t),
        [f(3, 4), probs(3, 4)],
    ),
    "cast": (lambda x: x.float() * 1.5, [f(3, 2)]),
    "cat": (lambda x, y: lucid.cat([x, y, x], dim=1), [f(2, 3), f(2, 1)]),
    "ceil": (lambda x: x.ceil() * x, [distinct(5)]),
    "clamp": (
        lambda x, lo, hi: lucid.clamp(x, lo, hi),
        [distinct(3, 4) - 2.0, f(4) - 1.5, f(3, 1) + 1.5],
    ),
    "clamp_max": (lambda x: lucid.clamp_max(x, 1.0), [distinct(3, 4) - 0.05]),
    "clamp_min": (lambda x: lucid.clamp_min(x, 1.0), [distinct(3, 4) - 0.05]),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
        [f(2, 4, 5, 5), f(6, 2, 3, 2), f(6)],
    ),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(
            x, w, b, stride=2, padding=(1, 0), output_padding=(1, 1), groups=2, dilation=(1, 2)
        ),
        [f(2, 4, 3, 3), f(4, 3, 3, 2), f(6)],
    ),
    "conv2d_input_grad": (
        lambda g, w: apply(
            "conv2d_input_grad", g, w, input_shape=(1, 2, 4, 4), padding=(1, 1, 1, 1)
        ),
        [f(1, 3, 4, 4), f(3, 2, 3, 3)],
    ),
    "conv2d_weight_grad": (
        lambda x, g: apply(
            "conv2d_weight_grad", x, g, weight_shape=(3, 2, 3, 3), padding=(1, 1, 1, 1)
        ),
        [f(1, 2, 4, 4), f(1, 3, 4, 4)],
    ),
    "cos": (lambda x: x.cos(), [f(3)]),
    "cross_entropy": (
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        [f(3, 4), ints(4, 3)],
    ),
    "cross_entropy_backward": (
        lambda g, x: apply(
            "cross_entropy_backward", g, x, lucid.tensor([1, 0, 3]), 1.0, label_smoothing=0.1
        ),
        [f(), f(3, 4)],
    ),
    "cumprod": (lambda x: lucid.cumprod(x, dim=1), [f(3, 4)]),
    "cumsum": (lambda x: lucid.cumsum(x, dim=1), [f(3, 4)]),
    "div": (lambda x, y: x / y, [f(3, 4), pos(4)]),
    "einsum": (lambda x, y: lucid.einsum("ij,jk->ik", x, y), [f(2, 3), f(3, 4)]),
    "elu": (lambda x: F.elu(x, alpha=1.3), [distinct(3, 4) - 2.0]),
    "elu_backward": (
        lambda g, x: apply("elu_backward", g, x, alpha=1.3),
        [f(3, 4), distinct(3, 4) - 2.0],
    ),
    "embedding": (lambda i, w: F.embedding(i, w), [ints(4, 2, 3), f(4, 3)]),
    "embedding_backward": (
        lambda g, i: apply("embedding_backward", g, i, num_weights=5),
        [f(2, 3), ints(5, 2)],
    ),
    "erf": (lambda x: lucid.erf(x), [f(3)]),
    "exp": (lambda x: x.exp(), [f(3, 2)]),
    "expand": (lambda x: x.expand(2, 3, 4), [f(3, 1)]),
    "expm1": (lambda x: x.expm1(), [f(4)]),
    "fill": (lambda x, v: apply("fill", x, v), [f(3, 2), f()]),
    "flip": (lambda x: x.flip(0, 1), [f(3, 4)]),
    "floor": (lambda x: x.floor() * x, [distinct(5)]),
    "floor_divide": (lambda x, y: lucid.floor_divide(x, y) + x * y, [distinct(4) + 3.0, pos(4)]),
    "gather": (lambda x, i: lucid.gather(x, 1, i), [f(3, 4), ints(4, 3, 2)]),
    "gelu": (lambda x: F.gelu(x, approximate="tanh") + F.gelu(x), [f(3, 4)]),
    "gelu_backward": (
        lambda g, x: (
            apply("gelu_backward", g, x, approximate="tanh") + apply("gelu_backward", g, x)
        ),
        [f(3, 4), f(3, 4)],
    ),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.5), [distinct(3, 4) - 2.0]),
    "hardtanh_backward": (
        lambda g, x: apply("hardtanh_backward", g, x, min_val=-0.5, max_val=0.5),
        [f(3, 4), distinct(3, 4) - 2.0],
    ),
    "huber_loss": (lambda x, t: F.huber_loss(x, t, delta=0.7), [f(3, 4), f(3, 4)]),
    "index": (lambda x, i: x[1:, i] + x[0, 1], [f(3, 4), ints(4, 2)]),
    "index_put": (
        lambda x, v, i: apply("index_put", x, v, [i], index=(("tensor",),), accumulate=True),
        [f(4, 3), f(2, 3), ints(4, 2)],
    ),
    "l1_loss": (lambda x, t: F.l1_loss(x, t, reduction="sum"), [f(3, 4), f(3, 4)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), [f(2, 3, 4), f(4), f(4)]),
    "layer_norm_backward": (
        lambda g, x, w: apply("layer_norm_backward", g, x, w, normalized_shape=(4,), eps=1e-5),
        [f(2, 3, 4), f(2, 3, 4), f(4)],
    ),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), [distinct(3, 4) - 2.0]),
    "lstm_recurrence": (
        lambda p, h, c, w, b: apply("lstm_recurrence", p, h, c, w, b)[:3],
        [f(3, 2, 12), f(2, 3), f(2, 3), f(12, 3), f(12)],
    ),
    "leaky_relu_backward": (
        lambda g, x: apply("leaky_relu_backward", g, x, negative_slope=0.1),
        [f(3, 4), distinct(3, 4) - 2.0],
    ),
    "linear": (lambda x, w, b: F.linear(x, w, b), [f(2, 3, 4), f(5, 4), f(5)]),
    "log": (lambda x: x.log(), [pos(4)]),
    "log1p": (lambda x: x.log1p(), [pos(4)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=0), [f(3, 4)]),
    "logsumexp": (lambda x: lucid.logsumexp(x, dim=1), [f(3, 4)]),
    "masked_fill": (lambda x, m: x.masked_fill(m > 1, 0.5), [f(3, 4), ints(3, 4)]),
    "linalg_cholesky": (lambda a: lucid.linalg.cholesky(a), [spd(2, 3, 3)]),
    "linalg_det": (lambda a: lucid.linalg.det(a), [well_conditioned(2, 3, 3)]),
    "linalg_eigh": (lambda a: lucid.linalg.eigh(a), [spd(3, 3)]),
    "linalg_inv": (lambda a: lucid.linalg.inv(a), [well_conditioned(2, 3, 3)]),
    "linalg_qr": (
        lambda a, b: (*lucid.linalg.qr(a), *lucid.linalg.qr(b), *lucid.linalg.qr(b, "complete")),
        [f(2, 4, 3), f(3, 5)],
    ),
    "linalg_svd": (
        lambda a, b: (*lucid.linalg.svd(a, False), *lucid.linalg.svd(b), lucid.linalg.svdvals(a)),
        [f(2, 4, 3), f(3, 5)],
    ),
    "linalg_lu": (
        lambda a, b: (*lucid.linalg.lu(a), *lucid.linalg.lu(b)),
        [f(2, 3, 3), f(3, 4)],
    ),
    "linalg_matrix_exp": (lambda a: lucid.linalg.matrix_exp(a), [f(2, 3, 3)]),
    "linalg_pinv": (lambda a: lucid.linalg.pinv(a), [f(2, 4, 3)]),
    "linalg_solve": (
        lambda a, b, v: (lucid.linalg.solve(a, b), lucid.linalg.solve(a[0], v)),
        [well_conditioned(2, 3, 3), f(2, 3, 2), f(3)],
    ),
    "matmul": (lambda x, y: x @ y, [f(2, 3, 4), f(4, 2)]),
    "max_dim": (lambda x: lucid.max(x, dim=1)[0], [distinct(3, 4)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [distinct(2, 2, 4, 4)]),
    "max_pool2d_backward": (
        lambda g, x: apply(
            "max_pool2d_backward",
            g,
            apply("max_pool2d", x, kernel_size=(2, 2), stride=(2, 2))[1],
            input_shape=(1, 2, 4, 4),
        ),
        [f(1, 2, 2, 2), distinct(1, 2, 4, 4)],
    ),
    "maximum": (lambda x, y: lucid.maximum(x, y), [distinct(3, 4), distinct(4) + 0.05]),
    "mean": (lambda x: x.mean(dim=(0, 2), keepdim=True), [f(2, 3, 4)]),
    "min_dim": (lambda x: lucid.min(x, dim=0)[0], [distinct(3, 4)]),
    "minimum": (lambda x, y: lucid.minimum(x, y), [distinct(3, 4), distinct(4) + 0.05]),
    "mse_loss": (lambda x, t: F.mse_loss(x, t), [f(3, 4), f(3, 4)]),
    "mul": (lambda x, y: x * y * x, [f(3, 4), f(3, 1)]),
    "nan_to_num": (lambda x: lucid.nan_to_num(x), [f(3)]),
    "neg": (lambda x: -x, [f(3)]),
    "nll_loss": (lambda x, t: F.nll_loss(x, t), [f(3, 4), ints(4, 3)]),
    "norm": (lambda x: lucid.norm(x, dim=1), [f(3, 4)]),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), [f(2, 3)]),
    "permute": (lambda x: x.permute(2, 0, 1), [f(2, 3, 4)]),
    "pow": (lambda x, y: x**y + x**2.5, [pos(3, 4), f(4)]),
    "prod": (lambda x: lucid.prod(x, dim=1), [f(3, 4)]),
    "reciprocal": (lambda x: x.reciprocal(), [pos(4)]),
    "relu": (lambda x: F.relu(x), [distinct(3, 4) - 2.0]),
    "remainder": (lambda x, y: lucid.remainder(x, y), [distinct(4) + 0.05, pos(4)]),
    "reshape": (lambda x: x.reshape(4, 3), [f(2, 6)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), [f(2, 4), f(4)]),
    "roll": (lambda x: lucid.roll(x, (1, -2), (0, 1)), [f(3, 4)]),
    "round": (lambda x: lucid.round(x) * x, [distinct(5)]),
    "scaled_dot_product_attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [f(2, 3, 4), f(2, 3, 4), f(2, 3, 2)],
    ),
    "scatter": (lambda x, s: lucid.scatter(x, 0, lucid.tensor([[0, 1, 2]]), s), [f(3, 3), f(1, 3)]),
    "scatter_add": (
        lambda x, s, i: lucid.scatter_add(x, 0, i, s),
        [f(3, 3), f(2, 3), ints(3, 2, 3)],
    ),
    "sigmoid": (lambda x: x.sigmoid(), [f(4)]),
    "sign": (lambda x: x.sign() * x, [distinct(4) - 1.0]),
    "sin": (lambda x: x.sin(), [f(4)]),
    "smooth_l1_loss": (lambda x, t: F.smooth_l1_loss(x, t, beta=0.5), [f(3, 4), f(3, 4)]),
    "softmax": (lambda x: F.softmax(x, dim=1), [f(3, 4)]),
    "softplus": (lambda x: F.softplus(x, beta=2.0), [f(3, 4)]),
    "softplus_backward": (
        lambda g, x: apply("softplus_backward", g, x, beta=2.0, threshold=1.5),
        [f(3, 4), f(3, 4)],
    ),
    "sqrt": (lambda x: x.sqrt(), [pos(4)]),
    "sub": (lambda x, y: x - y, [f(3, 4), f(1, 4)]),
    "sum": (lambda x: x.sum(dim=1), [f(3, 4)]),
    "sum_to_size": (lambda x: apply("sum_to_size", x, shape=(1, 4)), [f(3, 4)]),
    "tanh": (lambda x: x.tanh(), [f(4)]),
    "threshold_backward": (
        lambda g, x: apply("threshold_backward", g, x, threshold=0.0),
        [f(3, 4), distinct(3, 4) - 2.0],
    ),
    "sort": (lambda x: x.sort(dim=0, descending=True)[0] * x, [distinct(3, 4)]),
    "topk": (lambda x: lucid.topk(x, 2, dim=1)[0] * x[:, :2], [distinct(3, 4)]),
    "tril": (lambda x: x.tril(-1), [f(3, 4)]),
    "triu": (lambda x: x.triu(1), [f(3, 4)]),
    "trunc": (lambda x: x.trunc() * x, [distinct(5)]),
    "trunc_divide": (
        lambda x, y: lucid.div(x, y, rounding_mode="trunc") + x * y,
        [distinct(4) + 3.0, pos(4)],
    ),
    "upsample2d": (
        lambda x: F.interpolate(x, size=(5, 7), mode="bilinear") * F.interpolate(x, size=(5, 7)),
        [f(2, 2, 3, 4)],
    ),
    "upsample2d_backward": (
        lambda g: apply(
            "upsample2d_backward", g, input_size=(3, 4), output_size=(5, 7), mode="bilinear"
        ),
        [f(2, 2, 5, 7)],
    ),
    "var": (lambda x: lucid.var(x, dim=0), [f(3, 4)]),
    "where": (lambda x, y: lucid.where(x > 0, x, y), [f(3, 4), f(4)]),
}

DIFFERENTIABLE = sorted(n for n, op in REGISTRY.items() if GRAD_SINK not in op.props and op.vjp)


def test_every_differentiable_op_has_a_case():
    missing = [n for n in DIFFERENTIABLE if n not in CASES]
    assert not missing, f"no vjp-pass gradient case for {missing}"


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_vjp_pass_gradient_matches_eager_autograd(name):
    fn, operands = CASES[name]
    arrays = [np.asarray(a) for a in operands]
    wrt = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]

    def loss(*xs):
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        total = 0.0
        for k, o in enumerate(outs):
            if o.dtype.is_floating_point:  # a fixed, non-uniform weighting of every element
                w = lucid.arange(o.numel(), dtype=o.dtype).reshape(o.shape) * 0.1 + k + 0.5
                total = total + (o * w).sum()
        return total

    with _tracing() as tracer:
        traced = [tracer.input_like(lucid.tensor(a)) for a in arrays]
        module = import_trace(tracer.finish(loss(*traced)))
    feeds = {f"input:{i}": a for i, a in enumerate(arrays)}
    feeds.update({r: t.numpy() for r, t in tracer.feed_tensors().items()})
    used = {op.name for op in forward_func(module).body.blocks.first.ops}
    assert f"lucid.{name}" in used, f"the case for {name} does not use it: {sorted(used)}"
    differentiate(forward_func(module), wrt=" ".join(f"input:{i}" for i in wrt))
    module.verify()
    got = dict(zip(result_roles(forward_func(module)), interpret(module, feeds), strict=True))

    tensors = [lucid.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    expected = lucid.autograd.grad(loss(*tensors), [tensors[i] for i in wrt], allow_unused=True)
    for i, e in zip(wrt, expected, strict=True):
        g = got[f"grad:input:{i}"]
        assert g.shape == arrays[i].shape and g.dtype == arrays[i].dtype
        want = np.zeros_like(arrays[i]) if e is None else e.numpy()
        assert_close(g, want, rtol=1e-9, atol=1e-12)
