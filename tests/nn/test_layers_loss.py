"""Loss modules against PyTorch's documented formulas, written in numpy."""

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.testing import assert_close, gradcheck

RNG = np.random.default_rng(1)


def _t(a, **kw):
    return lucid.tensor(np.asarray(a), **kw)


def _log_softmax(x, axis=1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _reduce(per, reduction, denom=None):
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / (per.size if denom is None else denom)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_class_indices_weight_ignore_index(reduction, smoothing):
    n, c = 6, 4
    x = RNG.standard_normal((n, c))
    y = np.array([0, 3, 1, -100, 2, 3])
    w = np.array([1.0, 2.0, 0.5, 1.5])
    loss = nn.CrossEntropyLoss(
        weight=_t(w), ignore_index=-100, reduction=reduction, label_smoothing=smoothing
    )
    out = loss(_t(x), _t(y))
    logp = _log_softmax(x)
    valid = y != -100
    yv = np.where(valid, y, 0)
    nll = -w[yv] * logp[np.arange(n), yv]
    smooth = -(w * logp).sum(1) / c
    per = np.where(valid, (1 - smoothing) * nll + smoothing * smooth, 0.0)
    assert_close(out, _reduce(per, reduction, denom=w[yv][valid].sum()), atol=1e-12)


def test_cross_entropy_spatial_and_probability_targets():
    x = RNG.standard_normal((2, 3, 4))
    y = RNG.integers(0, 3, (2, 4))
    logp = _log_softmax(x)
    per = -np.take_along_axis(logp, y[:, None], 1)[:, 0]
    assert_close(nn.CrossEntropyLoss()(_t(x), _t(y)), per.mean())
    probs = np.exp(_log_softmax(RNG.standard_normal((5, 3))))
    x2 = RNG.standard_normal((5, 3))
    expected = -(probs * _log_softmax(x2)).sum(1).mean()
    assert_close(nn.CrossEntropyLoss()(_t(x2), _t(probs)), expected)


def test_cross_entropy_gradient():
    x = _t(RNG.standard_normal((3, 4)), requires_grad=True)
    y = _t([1, 0, 3])
    loss = nn.CrossEntropyLoss(weight=_t([1.0, 2.0, 3.0, 4.0]), label_smoothing=0.1)
    gradcheck(lambda t: loss(t, y), x)


def test_nll_loss():
    logp = _log_softmax(RNG.standard_normal((4, 3)))
    y = np.array([2, 0, 1, 1])
    w = np.array([0.5, 1.0, 2.0])
    per = -w[y] * logp[np.arange(4), y]
    assert_close(nn.NLLLoss(weight=_t(w))(_t(logp), _t(y)), per.sum() / w[y].sum())
    unweighted = -logp[np.arange(4), y]
    kept = y != 1
    out = nn.NLLLoss(ignore_index=1, reduction="sum")(_t(logp), _t(y))
    assert_close(out, unweighted[kept].sum())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    d = a - b
    assert_close(nn.MSELoss(reduction=reduction)(_t(a), _t(b)), _reduce(d**2, reduction))
    assert_close(nn.L1Loss(reduction=reduction)(_t(a), _t(b)), _reduce(np.abs(d), reduction))
    beta = 0.7
    smooth = np.where(np.abs(d) < beta, 0.5 * d**2 / beta, np.abs(d) - 0.5 * beta)
    assert_close(
        nn.SmoothL1Loss(reduction=reduction, beta=beta)(_t(a), _t(b)), _reduce(smooth, reduction)
    )
    delta = 0.5
    huber = np.where(np.abs(d) < delta, 0.5 * d**2, delta * (np.abs(d) - 0.5 * delta))
    assert_close(
        nn.HuberLoss(reduction=reduction, delta=delta)(_t(a), _t(b)), _reduce(huber, reduction)
    )


def test_binary_cross_entropy_losses():
    p = RNG.uniform(0.05, 0.95, (4, 3))
    y = RNG.integers(0, 2, (4, 3)).astype(np.float64)
    w = RNG.uniform(0.5, 2, (3,))
    bce = -w * (y * np.log(p) + (1 - y) * np.log(1 - p))
    assert_close(nn.BCELoss(weight=_t(w))(_t(p), _t(y)), bce.mean())
    x = RNG.standard_normal((4, 3))
    pos = np.array([1.0, 3.0, 0.5])
    log_sig = -np.log1p(np.exp(-x))
    log_one_minus = -np.log1p(np.exp(x))
    per = -(pos * y * log_sig + (1 - y) * log_one_minus)
    assert_close(nn.BCEWithLogitsLoss(pos_weight=_t(pos))(_t(x), _t(y)), per.mean())
    assert_close(
        nn.BCEWithLogitsLoss(reduction="sum")(_t(x), _t(y)),
        -(y * log_sig + (1 - y) * log_one_minus).sum(),
    )


def test_loss_options_are_validated_and_weights_are_buffers():
    with pytest.raises(ValueError, match="reduction"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)
    loss = nn.CrossEntropyLoss(weight=_t([1.0, 2.0]))
    assert list(loss.state_dict()) == ["weight"]
    loss.double()
    assert loss.weight.dtype == lucid.float64
