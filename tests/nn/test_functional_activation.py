"""Activations and linear: values against numpy references, gradients against finite differences."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0, scale=1.0):
    data = np.random.default_rng(seed).standard_normal(shape) * scale
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=True)


def randn(*shape, seed=0):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=lucid.float32)


def arr(t):
    return t.detach().numpy()


_ERF = np.vectorize(math.erf)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


# (front, numpy reference) with PyTorch's documented formulas
ACTIVATIONS = {
    "relu": (F.relu, lambda x: np.maximum(x, 0)),
    "relu6": (F.relu6, lambda x: np.minimum(np.maximum(x, 0), 6)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    "elu": (lambda x: F.elu(x, 1.5), lambda x: np.where(x > 0, x, 1.5 * (np.exp(x) - 1))),
    "gelu": (F.gelu, lambda x: 0.5 * x * (1 + _ERF(x / math.sqrt(2)))),
    "gelu_tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    "softplus": (F.softplus, _softplus),
    "softplus_beta": (
        lambda x: F.softplus(x, beta=2.0, threshold=3.0),
        lambda x: _softplus(x, 2.0, 3.0),
    ),
    "silu": (F.silu, lambda x: x * _sigmoid(x)),
    "mish": (F.mish, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "sigmoid": (F.sigmoid, _sigmoid),
    "tanh": (F.tanh, np.tanh),
    "logsigmoid": (F.logsigmoid, lambda x: np.log(_sigmoid(x))),
    "hardsigmoid": (F.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1)),
    "hardswish": (F.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "selu": (
        F.selu,
        lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
    ),
    "celu": (lambda x: F.celu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x / 0.7))),
    "softsign": (F.softsign, lambda x: x / (1 + np.abs(x))),
    "tanhshrink": (F.tanhshrink, lambda x: x - np.tanh(x)),
    "threshold": (lambda x: F.threshold(x, 0.3, -2.0), lambda x: np.where(x > 0.3, x, -2.0)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values_match_numpy_reference(name):
    front, ref = ACTIVATIONS[name]
    x = np.random.default_rng(1).standard_normal((4, 5)) * 4
    x[0, :3] = [0.0, 6.5, -0.5]
    assert_close(front(lucid.tensor(x, dtype=lucid.float64)), ref(x), rtol=1e-10, atol=1e-12)
    out32 = front(lucid.tensor(x, dtype=lucid.float32))
    assert out32.dtype is lucid.float32
    assert_close(out32, ref(x).astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradients_match_finite_differences(name):
    front, _ = ACTIVATIONS[name]
    x = f64(3, 4, seed=2, scale=2.0)
    # keep points away from the kinks, where finite differences are meaningless
    x._data[np.abs(x._data) < 1e-2] = 0.5
    for kink in (6.0, 3.0, -3.0, 0.3):
        x._data[np.abs(x._data - kink) < 1e-2] = kink - 0.5
    gradcheck(front, x)


@pytest.mark.parametrize(
    "name", ["relu", "leaky_relu", "elu", "hardtanh", "gelu", "gelu_tanh", "softplus_beta", "silu"]
)
def test_activation_second_derivative_matches_finite_differences(name):
    front, _ = ACTIVATIONS[name]
    x = f64(2, 3, seed=3, scale=2.0)

    def first_grad(t):
        (g,) = lucid.autograd.grad(front(t).sum() * 1.0, t, create_graph=True)
        return g * t  # d/dt of g*t involves the second derivative through g

    gradcheck(first_grad, x)


def test_inplace_activation_writes_into_its_input():
    x = lucid.tensor([-1.0, 2.0, -3.0])
    out = F.relu(x, inplace=True)
    assert out is x
    assert_close(x, np.array([0.0, 2.0, 0.0]))
    y = lucid.tensor([-1.0, 2.0])
    F.leaky_relu(y, 0.5, inplace=True)
    assert_close(y, np.array([-0.5, 2.0]))


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(lucid.tensor([1.0]), approximate="fast")


def test_hardtanh_rejects_inverted_bounds():
    with pytest.raises(ValueError, match="min_val"):
        F.hardtanh(lucid.tensor([1.0]), 1.0, -1.0)


# --- softmax / log_softmax


def _np_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_softmax_and_log_softmax_match_numpy_on_any_dim(shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(len(shape)).standard_normal(shape) * 10
    assert_close(F.softmax(lucid.tensor(x, dtype=lucid.float64), dim), _np_softmax(x, dim))
    assert_close(
        F.log_softmax(lucid.tensor(x, dtype=lucid.float64), dim=dim),
        np.log(_np_softmax(x, dim)),
        atol=1e-9,
    )


def test_softmax_is_stable_for_large_logits():
    out = F.softmax(lucid.tensor([1000.0, 1000.0, -1000.0]), dim=0)
    assert_close(out, np.array([0.5, 0.5, 0.0]))
    logp = F.log_softmax(lucid.tensor([1000.0, 0.0]), dim=0)
    assert np.isfinite(arr(logp)).all()


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_gradients_match_finite_differences(fn, dim):
    gradcheck(lambda t: fn(t, dim), f64(3, 4, seed=dim + 5))


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_softmax_second_derivative_matches_finite_differences(fn):
    x = f64(2, 3, seed=7)

    def first_grad(t):
        (g,) = lucid.autograd.grad((fn(t, 1) * fn(t, 1)).sum(), t, create_graph=True)
        return g

    gradcheck(first_grad, x)


def test_softmax_rejects_out_of_range_dim():
    with pytest.raises(IndexError, match="dim 2"):
        F.softmax(lucid.tensor([[1.0, 2.0]]), dim=2)


def test_softmax_dtype_argument_casts_first():
    out = F.softmax(lucid.tensor([1.0, 2.0]), dim=0, dtype=lucid.float64)
    assert out.dtype is lucid.float64


# --- linear


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_values_and_gradients(batch, with_bias):
    x, w = f64(*batch, 4, seed=1), f64(5, 4, seed=2)
    b = f64(5, seed=3) if with_bias else None
    expected = arr(x) @ arr(w).T + (arr(b) if with_bias else 0)
    assert_close(F.linear(x, w, b), expected, rtol=1e-12)
    if with_bias:
        gradcheck(F.linear, x, w, b)
    else:
        gradcheck(F.linear, x, w)


def test_linear_names_the_mismatched_features():
    with pytest.raises(ValueError, match=r"last dim \(3,\) does not match weight's in-features 4"):
        F.linear(randn(2, 3), randn(5, 4))
    with pytest.raises(ValueError, match="bias must have shape"):
        F.linear(randn(2, 4), randn(5, 4), randn(4))


def test_glu_and_softmin():
    x = f64(2, 6, seed=4)
    a, b = x.detach().numpy()[:, :3], x.detach().numpy()[:, 3:]
    assert_close(F.glu(x), a * _sigmoid(b), rtol=1e-12)
    gradcheck(lambda t: F.glu(t, dim=1), x)
    with pytest.raises(ValueError, match="even size"):
        F.glu(f64(2, 5))
    assert_close(F.softmin(x, 1), _np_softmax(-x.detach().numpy(), 1), rtol=1e-12)
    gradcheck(lambda t: F.softmin(t, 0), x)


def test_kl_div_reductions_and_log_target():
    rng = np.random.default_rng(5)
    logq = np.log(_np_softmax(rng.standard_normal((3, 4)), 1))
    p = _np_softmax(rng.standard_normal((3, 4)), 1)
    p[0, 1] = 0.0  # zero targets contribute 0, as torch's xlogy
    pointwise = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - logq), 0.0)
    inp, tgt = lucid.tensor(logq, dtype=lucid.float64), lucid.tensor(p, dtype=lucid.float64)
    assert_close(F.kl_div(inp, tgt, reduction="none"), pointwise, rtol=1e-12)
    assert_close(F.kl_div(inp, tgt, reduction="batchmean"), np.asarray(pointwise.sum() / 3))
    assert_close(F.kl_div(inp, tgt), np.asarray(pointwise.mean()))
    logp = np.log(_np_softmax(rng.standard_normal((3, 4)), 1))
    got = F.kl_div(inp, lucid.tensor(logp, dtype=lucid.float64), reduction="sum", log_target=True)
    assert_close(got, np.asarray((np.exp(logp) * (logp - logq)).sum()), rtol=1e-12)
    gradcheck(lambda t: F.kl_div(t, tgt, reduction="batchmean"), f64(3, 4, seed=6))


def test_cosine_similarity_values_and_gradients():
    a, b = f64(3, 4, seed=1), f64(1, 4, seed=2)
    an, bn = a.detach().numpy(), b.detach().numpy()
    expected = (an * bn).sum(1) / (np.linalg.norm(an, axis=1) * np.linalg.norm(bn, axis=1))
    assert_close(F.cosine_similarity(a, b), expected, rtol=1e-12)
    gradcheck(F.cosine_similarity, a, b)


def test_bilinear_values_and_gradients():
    x1, x2, w, b = f64(2, 3, seed=1), f64(2, 4, seed=2), f64(5, 3, 4, seed=3), f64(5, seed=4)
    expected = np.einsum("bi,oij,bj->bo", arr(x1), arr(w), arr(x2)) + arr(b)
    assert_close(F.bilinear(x1, x2, w, b), expected, rtol=1e-12)
    gradcheck(F.bilinear, x1, x2, w, b)
    with pytest.raises(ValueError, match="bilinear"):
        F.bilinear(x1, x2, f64(5, 4, 3))
