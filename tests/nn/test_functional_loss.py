"""Losses against PyTorch's documented formulas, written here in numpy; gradients by gradcheck."""

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


def ints(values):
    return lucid.tensor(np.asarray(values), dtype=lucid.int64)


def np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def reduce_np(loss, reduction):
    return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction]


# --- cross_entropy / nll_loss reference: PyTorch's documented formula, sample by sample


def ref_nll(logp, target, weight=None, ignore_index=-100, reduction="mean", ls=0.0):
    """logp (N, C, d...) and target (N, d...) -> loss, written as loops over samples."""
    c = logp.shape[1]
    w = np.ones(c) if weight is None else weight
    lp = np.moveaxis(logp, 1, -1).reshape(-1, c)
    t = target.reshape(-1)
    losses, weights = [], []
    for row, cls in zip(lp, t, strict=True):
        if cls == ignore_index:
            losses.append(0.0)
            weights.append(0.0)
            continue
        nll = -w[cls] * row[cls]
        smooth = -(w * row).sum()
        losses.append((1 - ls) * nll + ls / c * smooth)
        weights.append(w[cls])
    losses = np.array(losses)
    if reduction == "none":
        return losses.reshape(target.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / np.sum(weights)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy_with_class_indices_matches_formula(reduction, use_weight, ls):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4))
    t = np.array([0, 3, -100, 2, 1, 3])
    w = rng.uniform(0.5, 2.0, 4) if use_weight else None
    got = F.cross_entropy(
        lucid.tensor(x, dtype=lucid.float64),
        ints(t),
        weight=None if w is None else lucid.tensor(w, dtype=lucid.float64),
        reduction=reduction,
        label_smoothing=ls,
    )
    expected = ref_nll(np_log_softmax(x, 1), t, w, -100, reduction, ls)
    assert_close(got, np.asarray(expected), rtol=1e-10, atol=1e-12)


def test_cross_entropy_spatial_targets_and_custom_ignore_index():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 2))
    t = rng.integers(0, 3, (2, 4, 2))
    t[0, 1, 0] = 7
    got = F.cross_entropy(lucid.tensor(x, dtype=lucid.float64), ints(t), ignore_index=7)
    assert_close(got, np.asarray(ref_nll(np_log_softmax(x, 1), t, ignore_index=7)), rtol=1e-10)
    none = F.cross_entropy(lucid.tensor(x), ints(t), ignore_index=7, reduction="none")
    assert none.shape == (2, 4, 2)
    assert arr(none)[0, 1, 0] == 0.0


def test_cross_entropy_unbatched_input():
    x = np.array([0.5, -1.0, 2.0])
    got = F.cross_entropy(lucid.tensor(x, dtype=lucid.float64), ints(2))
    assert_close(got, np.asarray(-np_log_softmax(x, 0)[2]), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("ls", [0.0, 0.3])
def test_cross_entropy_with_probability_targets(reduction, ls):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 2))
    p = rng.uniform(size=(3, 4, 2))
    p /= p.sum(1, keepdims=True)
    w = rng.uniform(0.5, 2.0, 4)
    got = F.cross_entropy(
        lucid.tensor(x, dtype=lucid.float64),
        lucid.tensor(p, dtype=lucid.float64),
        weight=lucid.tensor(w, dtype=lucid.float64),
        reduction=reduction,
        label_smoothing=ls,
    )
    smoothed = p * (1 - ls) + ls / 4
    per = -(np_log_softmax(x, 1) * smoothed * w[None, :, None]).sum(1)
    # torch's mean divides by the number of samples (input.numel() / C), not by the weights
    expected = {"none": per, "sum": per.sum(), "mean": per.sum() / per.size}[reduction]
    assert_close(got, np.asarray(expected), rtol=1e-10)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_gradients(reduction):
    w = lucid.tensor([0.5, 2.0, 1.0], dtype=lucid.float64)
    t = ints([[0, 2], [1, -100], [2, 2]])
    gradcheck(
        lambda x: F.cross_entropy(x, t, weight=w, reduction=reduction, label_smoothing=0.1),
        f64(3, 3, 2, seed=3),
    )


def test_cross_entropy_probability_target_gradients_reach_input_and_target():
    x = f64(2, 3, seed=4)
    p = lucid.tensor(np.full((2, 3), 1 / 3) + 0.01 * np.arange(6).reshape(2, 3), requires_grad=True)
    p = p.double().detach().requires_grad_()
    w = lucid.tensor([1.0, 2.0, 0.5], dtype=lucid.float64)
    for reduction in ("none", "mean", "sum"):
        gradcheck(
            lambda a, b, r=reduction: F.cross_entropy(
                a, b, weight=w, reduction=r, label_smoothing=0.2
            ),
            x,
            p,
        )


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_matches_formula_and_gradients(reduction):
    rng = np.random.default_rng(5)
    logp = np_log_softmax(rng.standard_normal((5, 3)), 1)
    t = np.array([2, 0, 1, -100, 2])
    w = np.array([1.0, 0.3, 2.0])
    got = F.nll_loss(
        lucid.tensor(logp, dtype=lucid.float64),
        ints(t),
        weight=lucid.tensor(w, dtype=lucid.float64),
        reduction=reduction,
    )
    assert_close(got, np.asarray(ref_nll(logp, t, w, reduction=reduction)), rtol=1e-10)
    gradcheck(
        lambda a: F.nll_loss(a, ints(t), weight=lucid.tensor(w), reduction=reduction),
        f64(5, 3, seed=6),
    )


def test_cross_entropy_all_targets_ignored_gives_nan_like_torch():
    out = F.cross_entropy(randn(2, 3), ints([-100, -100]))
    assert np.isnan(out.item())


def test_cross_entropy_rejects_out_of_range_target():
    with pytest.raises(IndexError, match="target 5 is out of bounds for 3 classes"):
        F.cross_entropy(randn(2, 3), ints([0, 5]))
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(randn(2, 3), ints([-1, 0]))


def test_cross_entropy_rejects_mismatched_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"expected a target of shape \(2,\)"):
        F.cross_entropy(randn(2, 3), ints([0, 1, 2]))
    with pytest.raises(ValueError, match="probability target shape"):
        F.cross_entropy(randn(2, 3), randn(2, 4))
    with pytest.raises(ValueError, match=r"weight must have shape \(3,\)"):
        F.cross_entropy(
            randn(2, 3), ints([0, 1]), weight=lucid.tensor(np.ones(4, dtype=np.float32))
        )
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(randn(2, 3), ints([0, 1]), reduction="avg")
    with pytest.raises(TypeError, match="class indices"):
        F.nll_loss(randn(2, 3), randn(2, 3))


def test_legacy_size_average_and_reduce_arguments():
    x, t = randn(4, 3), ints([0, 1, 2, 0])
    assert_close(F.cross_entropy(x, t, reduce=False), F.cross_entropy(x, t, reduction="none"))
    assert_close(F.cross_entropy(x, t, size_average=False), F.cross_entropy(x, t, reduction="sum"))


# --- pointwise losses


def _smooth_l1(d, beta):
    ad = np.abs(d)
    return np.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)


def _huber(d, delta):
    ad = np.abs(d)
    return np.where(ad <= delta, 0.5 * d * d, delta * (ad - 0.5 * delta))


POINTWISE = {
    "mse_loss": (F.mse_loss, lambda x, y: (x - y) ** 2),
    "l1_loss": (F.l1_loss, lambda x, y: np.abs(x - y)),
    "smooth_l1_loss": (
        lambda x, y, reduction: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5),
        lambda x, y: _smooth_l1(x - y, 0.5),
    ),
    "huber_loss": (
        lambda x, y, reduction: F.huber_loss(x, y, reduction=reduction, delta=0.7),
        lambda x, y: _huber(x - y, 0.7),
    ),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses_values_and_gradients(name, reduction):
    front, ref = POINTWISE[name]
    x, y = f64(3, 4, seed=1), f64(3, 4, seed=2)
    expected = reduce_np(ref(arr(x), arr(y)), reduction)
    assert_close(front(x, y, reduction=reduction), np.asarray(expected), rtol=1e-10)
    gradcheck(lambda a, b: front(a, b, reduction=reduction), x, y)


def test_smooth_l1_with_zero_beta_is_l1():
    x, y = randn(5), randn(5)
    assert_close(F.smooth_l1_loss(x, y, beta=0.0), F.l1_loss(x, y))


@given(
    shapes=st.sampled_from([((3, 1), (1, 4)), ((2, 3), (3,)), ((4,), (4,)), ((), (2, 2))]),
    reduction=st.sampled_from(["none", "mean", "sum"]),
)
def test_mse_loss_broadcasts_like_torch(shapes, reduction):
    xs, ys = shapes
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(xs), rng.standard_normal(ys)
    got = F.mse_loss(lucid.tensor(x), lucid.tensor(y), reduction=reduction)
    assert_close(got, np.asarray(reduce_np((x - y) ** 2, reduction), dtype=np.float32), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_cross_entropy_values_and_gradients(reduction):
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, (3, 4))
    y = rng.uniform(0, 1, (3, 4))
    w = rng.uniform(0.5, 2, (4,))
    expected = -w * (y * np.log(p) + (1 - y) * np.log(1 - p))
    got = F.binary_cross_entropy(
        lucid.tensor(p, dtype=lucid.float64),
        lucid.tensor(y, dtype=lucid.float64),
        weight=lucid.tensor(w, dtype=lucid.float64),
        reduction=reduction,
    )
    assert_close(got, np.asarray(reduce_np(expected, reduction)), rtol=1e-10)
    pt = lucid.tensor(p, dtype=lucid.float64, requires_grad=True)
    yt = lucid.tensor(y, dtype=lucid.float64, requires_grad=True)
    gradcheck(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), pt, yt)


def test_binary_cross_entropy_clamps_log_at_minus_100():
    out = F.binary_cross_entropy(
        lucid.tensor([0.0, 1.0]), lucid.tensor([1.0, 0.0]), reduction="none"
    )
    assert_close(out, np.array([100.0, 100.0]))


def test_binary_cross_entropy_rejects_values_outside_unit_interval():
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(lucid.tensor([1.5]), lucid.tensor([1.0]))
    with pytest.raises(ValueError, match="same as input size"):
        F.binary_cross_entropy(lucid.tensor([0.5, 0.5]), lucid.tensor([1.0]))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bce_with_logits_values_and_gradients(reduction):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4)) * 3
    y = rng.uniform(0, 1, (3, 4))
    w = rng.uniform(0.5, 2, (3, 1))
    pw = rng.uniform(0.5, 3, (4,))
    sig = 1 / (1 + np.exp(-x))
    expected = -w * (pw * y * np.log(sig) + (1 - y) * np.log(1 - sig))
    got = F.binary_cross_entropy_with_logits(
        lucid.tensor(x, dtype=lucid.float64),
        lucid.tensor(y, dtype=lucid.float64),
        weight=lucid.tensor(w, dtype=lucid.float64),
        reduction=reduction,
        pos_weight=lucid.tensor(pw, dtype=lucid.float64),
    )
    assert_close(got, np.asarray(reduce_np(expected, reduction)), rtol=1e-9)
    xt = lucid.tensor(x, dtype=lucid.float64, requires_grad=True)
    yt = lucid.tensor(y, dtype=lucid.float64, requires_grad=True)
    pwt = lucid.tensor(pw, dtype=lucid.float64)
    gradcheck(
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pwt),
        xt,
        yt,
    )


def test_bce_with_logits_is_stable_for_large_logits():
    out = F.binary_cross_entropy_with_logits(
        lucid.tensor([1000.0, -1000.0]), lucid.tensor([0.0, 1.0]), reduction="none"
    )
    assert_close(out, np.array([1000.0, 1000.0]))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("probabilities", [False, True])
def test_cross_entropy_second_derivative(reduction, probabilities):
    w = lucid.tensor([0.5, 2.0, 1.0], dtype=lucid.float64)
    if probabilities:
        p = np.random.default_rng(7).uniform(0.1, 1.0, (2, 3, 2))
        target = lucid.tensor(p / p.sum(1, keepdims=True), dtype=lucid.float64, requires_grad=True)
    else:
        target = ints([[0, 2], [1, -100]])

    def grad_input(x, *t):
        tgt = t[0] if t else target
        loss = F.cross_entropy(x, tgt, weight=w, reduction=reduction, label_smoothing=0.1)
        loss = (loss * loss).sum()  # a non-linear use of the loss, so every term matters
        (g,) = lucid.autograd.grad(loss, x, create_graph=True)
        return g

    x = f64(2, 3, 2, seed=8)
    if probabilities:
        gradcheck(grad_input, x, target)
    else:
        gradcheck(grad_input, x)
