"""Normalisation: values against numpy formulas, running statistics as torch, gradients."""

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid.testing import assert_close, gradcheck


def f64(*shape, seed=0, requires_grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=requires_grad)


def arr(t):
    return t.detach().numpy()


def ref_norm(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


@pytest.mark.parametrize("normalized_shape", [(5,), (4, 5)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_values_and_gradients(normalized_shape, affine):
    x = f64(2, 4, 5)
    w = f64(*normalized_shape, seed=1) if affine else None
    b = f64(*normalized_shape, seed=2) if affine else None
    axes = tuple(range(3 - len(normalized_shape), 3))
    expected = ref_norm(arr(x), axes, 1e-5)
    if affine:
        expected = expected * arr(w) + arr(b)
    assert_close(F.layer_norm(x, normalized_shape, w, b), expected, rtol=1e-10, atol=1e-12)
    args = (x, w, b) if affine else (x,)
    gradcheck(lambda *a: F.layer_norm(a[0], normalized_shape, *a[1:], eps=1e-3), *args)


def test_layer_norm_second_derivative():
    x, w = f64(2, 4), f64(4, seed=1)

    def grad_x(a, b):
        (g,) = lucid.autograd.grad((F.layer_norm(a, 4, b) ** 3).sum(), a, create_graph=True)
        return g

    gradcheck(grad_x, x, w)


def test_layer_norm_rejects_mismatched_shape():
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\) does not match"):
        F.layer_norm(lucid.tensor(np.zeros((2, 5), np.float32)), 4)
    with pytest.raises(ValueError, match="weight must have shape"):
        F.layer_norm(
            lucid.tensor(np.zeros((2, 5), np.float32)), 5, lucid.tensor(np.ones(4, np.float32))
        )


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_values_and_gradients(eps):
    x, w = f64(3, 4), f64(4, seed=1)
    e = np.finfo(np.float64).eps if eps is None else eps
    expected = arr(x) / np.sqrt((arr(x) ** 2).mean(-1, keepdims=True) + e) * arr(w)
    assert_close(F.rms_norm(x, (4,), w, eps), expected, rtol=1e-10)
    gradcheck(lambda a, b: F.rms_norm(a, 4, b, eps=1e-3), x, w)
    gradcheck(lambda a: F.rms_norm(a, 4), x)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 2, 3)])
def test_batch_norm_training_normalises_and_updates_running_stats_like_torch(shape):
    x = f64(*shape)
    w, b = f64(3, seed=1), f64(3, seed=2)
    rm = lucid.tensor(np.array([0.5, -1.0, 2.0]), dtype=lucid.float64)
    rv = lucid.tensor(np.array([1.0, 2.0, 0.5]), dtype=lucid.float64)
    rm0, rv0 = arr(rm).copy(), arr(rv).copy()
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-5)
    axes = (0, *range(2, len(shape)))
    view = (1, 3) + (1,) * (len(shape) - 2)
    expected = ref_norm(arr(x), axes, 1e-5) * arr(w).reshape(view) + arr(b).reshape(view)
    assert_close(out, expected, rtol=1e-10, atol=1e-12)
    # running estimates use the unbiased variance (torch's documented behaviour)
    assert_close(rm, 0.7 * rm0 + 0.3 * arr(x).mean(axis=axes), rtol=1e-12)
    assert_close(rv, 0.7 * rv0 + 0.3 * arr(x).var(axis=axes, ddof=1), rtol=1e-10)


def test_batch_norm_training_gradients():
    x, w, b = f64(4, 3, 2), f64(3, seed=1), f64(3, seed=2)
    gradcheck(lambda *a: F.batch_norm(a[0], None, None, a[1], a[2], training=True), x, w, b)
    gradcheck(lambda a: F.batch_norm(a, None, None, training=True), x)


def test_batch_norm_eval_uses_running_stats_and_leaves_them_alone():
    x, w, b = f64(4, 3, 2), f64(3, seed=1), f64(3, seed=2)
    rm = lucid.tensor(np.array([0.5, -1.0, 2.0]))
    rv = lucid.tensor(np.array([1.0, 2.0, 0.5]))
    out = F.batch_norm(x, rm.double(), rv.double(), w, b, training=False, eps=1e-3)
    expected = (arr(x) - arr(rm)[:, None]) / np.sqrt(arr(rv)[:, None] + 1e-3) * arr(w)[
        :, None
    ] + arr(b)[:, None]
    assert_close(out, expected, rtol=1e-6)
    assert_close(rm, np.array([0.5, -1.0, 2.0], np.float32))
    rmd, rvd = rm.double(), rv.double()
    gradcheck(lambda *a: F.batch_norm(a[0], rmd, rvd, a[1], a[2], training=False), x, w, b)


def test_batch_norm_rejects_a_single_value_per_channel_in_training():
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(lucid.tensor(np.zeros((1, 3), np.float32)), None, None, training=True)
    with pytest.raises(ValueError, match=r"running_mean must have shape \(3,\)"):
        F.batch_norm(
            lucid.tensor(np.zeros((2, 3), np.float32)),
            lucid.tensor(np.zeros(4, np.float32)),
            lucid.tensor(np.ones(3, np.float32)),
        )


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm_values_and_gradients(groups):
    x, w, b = f64(2, 4, 3), f64(4, seed=1), f64(4, seed=2)
    xn = arr(x).reshape(2, groups, -1)
    expected = ref_norm(xn, (2,), 1e-5).reshape(2, 4, 3) * arr(w)[:, None] + arr(b)[:, None]
    assert_close(F.group_norm(x, groups, w, b), expected, rtol=1e-10, atol=1e-12)
    gradcheck(lambda *a: F.group_norm(a[0], groups, a[1], a[2]), x, w, b)


def test_group_norm_rejects_indivisible_channels():
    with pytest.raises(ValueError, match="divisible by num_groups 3"):
        F.group_norm(lucid.tensor(np.zeros((2, 4, 3), np.float32)), 3)


def test_instance_norm_values_running_stats_and_gradients():
    x, w = f64(2, 3, 4), f64(3, seed=1)
    rm = lucid.tensor(np.zeros(3), dtype=lucid.float64)
    rv = lucid.tensor(np.ones(3), dtype=lucid.float64)
    out = F.instance_norm(x, rm, rv, weight=w, momentum=0.5)
    assert_close(out, ref_norm(arr(x), (2,), 1e-5) * arr(w)[:, None], rtol=1e-10, atol=1e-12)
    assert_close(rm, 0.5 * arr(x).mean(-1).mean(0), rtol=1e-10)
    assert_close(rv, 0.5 + 0.5 * arr(x).var(-1, ddof=1).mean(0), rtol=1e-6)
    gradcheck(lambda a, b: F.instance_norm(a, weight=b), x, w)


def test_normalize_divides_by_clamped_norm():
    x = f64(3, 4)
    expected = arr(x) / np.maximum(np.linalg.norm(arr(x), axis=1, keepdims=True), 1e-12)
    assert_close(F.normalize(x), expected, rtol=1e-10)
    zero = F.normalize(lucid.tensor(np.zeros((2, 3))), dim=1)
    assert np.all(arr(zero) == 0)
    gradcheck(lambda a: F.normalize(a, p=3.0, dim=0), x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: F.batch_norm(a, None, None, b, None, training=True),
        lambda a, b: F.rms_norm(a, 2, b),
    ],
)
def test_batch_and_rms_norm_second_derivative(fn):
    x, w = f64(3, 2), f64(2, seed=1)

    def grad_x(a, b):
        (g,) = lucid.autograd.grad((fn(a, b) ** 3).sum(), a, create_graph=True)
        return g

    gradcheck(grad_x, x, w)
