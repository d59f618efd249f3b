"""ReduceLROnPlateau against a reference written from torch's documented algorithm."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import optim
from lucid.optim.lr_scheduler import ReduceLROnPlateau


def _opt(lrs=(0.1,)):
    groups = [
        {"params": [lucid.tensor([float(i)], requires_grad=True)], "lr": lr}
        for i, lr in enumerate(lrs)
    ]
    return optim.SGD(groups)


def reference_plateau(metrics, lrs, mode, factor, patience, threshold, threshold_mode, cooldown,
                      min_lrs, eps):  # fmt: skip
    """torch's docs: a metric improves when it beats the best by the (relative or absolute)
    threshold; more than `patience` consecutive non-improving epochs multiply every lr by `factor`
    (floored at min_lr; changes of at most eps skipped); then `cooldown` epochs ignore bad epochs.
    Returns the lrs after each step."""
    sign = 1.0 if mode == "min" else -1.0
    best = math.inf * sign
    bad = cool = 0
    lrs = list(lrs)
    history = []
    for m in metrics:
        if threshold_mode == "rel":
            better = m < best * (1 - threshold) if mode == "min" else m > best * (1 + threshold)
        else:
            better = m < best - threshold if mode == "min" else m > best + threshold
        if better:
            best, bad = m, 0
        else:
            bad += 1
        if cool > 0:
            cool, bad = cool - 1, 0
        if bad > patience:
            for i, lr in enumerate(lrs):
                new = max(lr * factor, min_lrs[i])
                if lr - new > eps:
                    lrs[i] = new
            cool, bad = cooldown, 0
        history.append(list(lrs))
    return history


@settings(max_examples=60, deadline=None)
@given(
    metrics=st.lists(st.sampled_from([1.0, 0.99, 0.9, 0.5, 1.5, 0.9999, -1.0, 2.0]), max_size=40),
    mode=st.sampled_from(["min", "max"]),
    factor=st.sampled_from([0.1, 0.5, 0.9]),
    patience=st.integers(0, 4),
    threshold=st.sampled_from([0.0, 1e-4, 0.05, 0.2]),
    threshold_mode=st.sampled_from(["rel", "abs"]),
    cooldown=st.integers(0, 3),
    min_lr=st.sampled_from([0.0, 1e-3, [1e-3, 0.05]]),
    eps=st.sampled_from([1e-8, 1e-3]),
)
def test_matches_reference(metrics, mode, factor, patience, threshold, threshold_mode, cooldown,
                           min_lr, eps):  # fmt: skip
    lrs = (0.1, 0.2)
    opt = _opt(lrs)
    s = ReduceLROnPlateau(opt, mode, factor, patience, threshold, threshold_mode, cooldown,
                          min_lr, eps)  # fmt: skip
    min_lrs = min_lr if isinstance(min_lr, list) else [min_lr] * 2
    want = reference_plateau(metrics, lrs, mode, factor, patience, threshold, threshold_mode,
                             cooldown, min_lrs, eps)  # fmt: skip
    for i, m in enumerate(metrics):
        s.step(m)
        got = [g["lr"] for g in opt.param_groups]
        assert got == want[i]
        assert s.get_last_lr() == got
    assert s.last_epoch == len(metrics)


def test_documented_patience_example():
    # torch docs: with patience=2 the first 2 epochs without improvement are ignored and the lr
    # drops after the 3rd.
    opt = _opt()
    s = ReduceLROnPlateau(opt, patience=2)
    seen = []
    for loss in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]:
        s.step(loss)
        seen.append(opt.param_groups[0]["lr"])
    assert seen == [0.1, 0.1, 0.1] + [0.1 * 0.1] * 3 + [0.1 * 0.1 * 0.1]


def test_cooldown_and_min_lr():
    opt = _opt((1.0,))
    s = ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0, cooldown=2, min_lr=0.3)
    seen = []
    for acc in [0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]:
        s.step(lucid.tensor(acc))  # a 0-d tensor metric, like a loss
        seen.append(opt.param_groups[0]["lr"])
    # drop at epoch 2, two cooldown epochs, drop at 5 (floored at 0.3), then the change is <= 0
    assert seen == [1.0, 0.5, 0.5, 0.5, 0.3, 0.3, 0.3, 0.3]


def test_state_dict_round_trip_continues_identically():
    opt_a, opt_b = _opt(), _opt()
    a = ReduceLROnPlateau(opt_a, patience=1, cooldown=1)
    for m in [3.0, 2.0, 2.5, 2.5]:
        a.step(m)
    state = a.state_dict()
    assert "optimizer" not in state and state["best"] == 2.0
    b = ReduceLROnPlateau(opt_b, patience=7, mode="max")
    b.load_state_dict(state)
    opt_b.param_groups[0]["lr"] = opt_a.param_groups[0]["lr"]
    for m in [2.5, 2.5, 2.5, 1.0, 1.5]:
        a.step(m)
        b.step(m)
        assert opt_a.param_groups[0]["lr"] == opt_b.param_groups[0]["lr"]
        assert a.num_bad_epochs == b.num_bad_epochs and a.best == b.best


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"factor": 1.0}, "Factor should be < 1.0"),
        ({"mode": "up"}, "mode 'up' is unknown"),
        ({"threshold_mode": "pct"}, "threshold mode 'pct' is unknown"),
        ({"min_lr": [0.1, 0.2]}, "expected 1 min_lrs, got 2"),
        ({"patience": -1}, "patience"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReduceLROnPlateau(_opt(), **kwargs)


def test_bad_metric_and_new_group():
    opt = _opt()
    s = ReduceLROnPlateau(opt, min_lr=[0.0], patience=0)
    with pytest.raises(TypeError, match="expects the metric"):
        s.step("loss")
    with pytest.raises(TypeError, match="expects the metric"):
        s.step(None)
    opt.add_param_group({"params": [lucid.zeros(1, requires_grad=True)], "lr": 0.5})
    s.step(1.0)
    with pytest.raises(RuntimeError, match="number of param groups"):
        s.step(2.0)


def test_is_an_lr_scheduler_and_epoch_argument_warns():
    s = ReduceLROnPlateau(_opt())
    assert isinstance(s, optim.lr_scheduler.LRScheduler)
    with pytest.warns(UserWarning, match="deprecated"):
        s.step(1.0, epoch=5)
    assert s.last_epoch == 5


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("threshold_mode", ["rel", "abs"])
def test_matches_torch_if_installed(mode, threshold_mode):
    torch = pytest.importorskip("torch")
    metrics = np.random.default_rng(0).choice([1.0, 0.9, 0.95, 1.1, 0.5], size=60).tolist()
    opt = _opt((0.1, 0.3))
    t_params = [torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)]
    t_opt = torch.optim.SGD([{"params": [t_params[0]], "lr": 0.1}, {"params": [t_params[1]],
                             "lr": 0.3}])  # fmt: skip
    options = {"mode": mode, "factor": 0.5, "patience": 2, "threshold": 0.05,
               "threshold_mode": threshold_mode, "cooldown": 1, "min_lr": [0.01, 0.02]}  # fmt: skip
    ours = ReduceLROnPlateau(opt, **options)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(t_opt, **options)
    for m in metrics:
        ours.step(m)
        theirs.step(m)
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in t_opt.param_groups]
