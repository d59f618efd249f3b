"""Schedulers against their closed forms / documented recursions, and chained with optimizers."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid import optim
from lucid.optim import lr_scheduler as sched

EPOCHS = 60


def _opt(lrs=(0.1,), cls=optim.SGD, **options):
    groups = [
        {"params": [lucid.tensor([float(i)], requires_grad=True)], "lr": lr}
        for i, lr in enumerate(lrs)
    ]
    return cls(groups, **options)


def _lrs_over(scheduler, n=EPOCHS):
    """The lr of every group at epochs 0..n-1 (epoch 0: right after construction)."""
    out = []
    for _ in range(n):
        out.append([g["lr"] for g in scheduler.optimizer.param_groups])
        assert scheduler.get_last_lr() == out[-1]
        scheduler.optimizer.step()
        scheduler.step()
    return np.array(out)


def _closed(fn, base_lrs, n=EPOCHS):
    return np.array([[fn(base, t) for base in base_lrs] for t in range(n)])


def test_step_lr():
    s = sched.StepLR(_opt((0.1, 0.5)), step_size=7, gamma=0.3)
    expected = _closed(lambda b, t: b * 0.3 ** (t // 7), (0.1, 0.5))
    np.testing.assert_allclose(_lrs_over(s), expected, rtol=1e-12)


def test_multistep_lr_with_repeated_milestone():
    s = sched.MultiStepLR(_opt((0.1, 1.0)), milestones=[30, 10, 10, 45], gamma=0.5)

    def closed(b, t):
        return b * 0.5 ** sum(1 for m in (10, 10, 30, 45) if t >= m)

    np.testing.assert_allclose(_lrs_over(s), _closed(closed, (0.1, 1.0)), rtol=1e-12)


def test_exponential_lr():
    s = sched.ExponentialLR(_opt((0.1, 0.02)), gamma=0.93)
    expected = _closed(lambda b, t: b * 0.93**t, (0.1, 0.02))
    np.testing.assert_allclose(_lrs_over(s), expected, rtol=1e-12)


@pytest.mark.parametrize("eta_min", [0.0, 0.01])
def test_cosine_annealing_recursion_matches_closed_form(eta_min):
    t_max = 13
    s = sched.CosineAnnealingLR(_opt((0.1, 0.4)), T_max=t_max, eta_min=eta_min)

    def closed(b, t):  # SGDR without restarts: continues as a cosine wave past T_max
        return eta_min + (b - eta_min) * (1 + math.cos(math.pi * t / t_max)) / 2

    np.testing.assert_allclose(_lrs_over(s), _closed(closed, (0.1, 0.4)), rtol=1e-9, atol=1e-12)


def test_lambda_lr_per_group():
    s = sched.LambdaLR(_opt((0.1, 0.2)), lr_lambda=[lambda e: 0.95**e, lambda e: 1 / (1 + e)])
    expected = np.array([[0.1 * 0.95**t, 0.2 / (1 + t)] for t in range(EPOCHS)])
    np.testing.assert_allclose(_lrs_over(s), expected, rtol=1e-12)


def test_lambda_lr_wrong_count():
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas"):
        sched.LambdaLR(_opt((0.1, 0.2)), lr_lambda=[lambda e: 1.0])


@pytest.mark.parametrize("start, end, total", [(1 / 3, 1.0, 5), (1.0, 0.1, 20), (0.5, 0.0, 9)])
def test_linear_lr(start, end, total):
    s = sched.LinearLR(_opt((0.1, 0.3)), start_factor=start, end_factor=end, total_iters=total)

    def closed(b, t):
        return b * (start + (end - start) * min(t, total) / total)

    np.testing.assert_allclose(_lrs_over(s), _closed(closed, (0.1, 0.3)), rtol=1e-9, atol=1e-15)


def test_linear_lr_bad_factors():
    with pytest.raises(ValueError, match="start_factor"):
        sched.LinearLR(_opt(), start_factor=0.0)
    with pytest.raises(ValueError, match="end_factor"):
        sched.LinearLR(_opt(), end_factor=1.5)


def _one_cycle_reference(t, total, max_lr, pct, div, final_div, strategy, three_phase, lo, hi):
    """(lr, momentum) at step t, from the 1cycle policy as PyTorch documents it."""
    initial = max_lr / div
    minimum = initial / final_div

    def anneal(a, b, frac):
        if strategy == "cos":
            return b + (a - b) / 2 * (1 + math.cos(math.pi * frac))
        return a + (b - a) * frac

    if three_phase:
        phases = [
            (pct * total - 1, initial, max_lr, hi, lo),
            (2 * pct * total - 2, max_lr, initial, lo, hi),
            (total - 1, initial, minimum, hi, hi),
        ]
    else:
        phases = [(pct * total - 1, initial, max_lr, hi, lo), (total - 1, max_lr, minimum, lo, hi)]
    start = 0.0
    for i, (end, lr0, lr1, m0, m1) in enumerate(phases):
        if t <= end or i == len(phases) - 1:
            frac = (t - start) / (end - start)
            return anneal(lr0, lr1, frac), anneal(m0, m1, frac)
        start = end
    raise AssertionError


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("three_phase", [False, True])
def test_one_cycle_with_sgd_momentum(strategy, three_phase):
    total = 40
    opt = _opt((0.1,), momentum=0.9)
    s = sched.OneCycleLR(
        opt, max_lr=0.5, total_steps=total, anneal_strategy=strategy, three_phase=three_phase
    )
    for t in range(total):
        lr, m = _one_cycle_reference(
            t, total, 0.5, 0.3, 25.0, 1e4, strategy, three_phase, 0.85, 0.95
        )
        group = opt.param_groups[0]
        assert group["lr"] == pytest.approx(lr, rel=1e-9, abs=1e-15)
        assert group["momentum"] == pytest.approx(m, rel=1e-9)
        opt.step()
        s.step()
    with pytest.raises(ValueError, match="Tried to step"):
        s.step()


def test_one_cycle_with_adam_cycles_beta1_and_epochs():
    opt = _opt((0.1, 0.1), cls=optim.Adam, betas=(0.9, 0.99))
    s = sched.OneCycleLR(
        opt,
        max_lr=[0.01, 0.02],
        epochs=3,
        steps_per_epoch=10,
        base_momentum=0.8,
        max_momentum=0.9,
        div_factor=10.0,
        final_div_factor=100.0,
    )
    assert s.total_steps == 30
    for t in range(30):
        for g, max_lr in zip(opt.param_groups, (0.01, 0.02), strict=True):
            lr, m = _one_cycle_reference(t, 30, max_lr, 0.3, 10.0, 100.0, "cos", False, 0.8, 0.9)
            assert g["lr"] == pytest.approx(lr, rel=1e-9)
            assert g["betas"][0] == pytest.approx(m, rel=1e-9)
            assert g["betas"][1] == 0.99
        opt.step()
        s.step()


def test_one_cycle_errors():
    with pytest.raises(ValueError, match="total_steps OR"):
        sched.OneCycleLR(_opt(), max_lr=0.1)
    with pytest.raises(ValueError, match="total_steps"):
        sched.OneCycleLR(_opt(), max_lr=0.1, total_steps=0)
    with pytest.raises(ValueError, match="pct_start"):
        sched.OneCycleLR(_opt(), max_lr=0.1, total_steps=10, pct_start=1.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        sched.OneCycleLR(_opt(), max_lr=0.1, total_steps=10, anneal_strategy="exp")
    with pytest.raises(ValueError, match="momentum or beta1"):
        sched.OneCycleLR(_opt(cls=optim.Adagrad), max_lr=0.1, total_steps=10)
    with pytest.raises(ValueError, match="max_lr"):
        sched.OneCycleLR(_opt((0.1, 0.2)), max_lr=[0.1], total_steps=10)


def test_initial_lr_recorded_and_resume_needs_it():
    opt = _opt((0.1, 0.2))
    sched.StepLR(opt, step_size=2)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.2]
    with pytest.raises(KeyError, match="initial_lr"):
        sched.StepLR(_opt(), step_size=2, last_epoch=5)


def test_scheduler_changes_what_the_optimizer_does():
    p = lucid.tensor([0.0], requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    s = sched.ExponentialLR(opt, gamma=0.5)
    for _ in range(4):
        p.grad = lucid.tensor([1.0])
        opt.step()
        s.step()
    np.testing.assert_allclose(p.numpy(), [-(1 + 0.5 + 0.25 + 0.125)])


def test_chained_schedulers_multiply():
    opt = _opt((1.0,))
    warm = sched.LinearLR(opt, start_factor=0.5, total_iters=4)
    decay = sched.ExponentialLR(opt, gamma=0.9)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        warm.step()
        decay.step()
    expected = [(0.5 + 0.5 * min(t, 4) / 4) * 0.9**t for t in range(10)]
    np.testing.assert_allclose(seen, expected, rtol=1e-9)


def test_state_dict_round_trip():
    opt = _opt((0.1,))
    s = sched.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        opt.step()
        s.step()
    sd = s.state_dict()
    assert "optimizer" not in sd and sd["last_epoch"] == 4
    pickle.dumps(sd)  # plain data
    opt2 = _opt((0.1,))
    s2 = sched.CosineAnnealingLR(opt2, T_max=10)
    s2.load_state_dict(sd)
    opt2.param_groups[0]["lr"] = opt.param_groups[0]["lr"]
    for _ in range(5):
        opt.step()
        s.step()
        opt2.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()
    assert s2.last_epoch == 9


def test_lambda_lr_state_dict_saves_callable_objects_not_functions():
    class Decay:
        def __init__(self):
            self.factor = 0.5

        def __call__(self, epoch):
            return self.factor**epoch

    decay = Decay()
    s = sched.LambdaLR(_opt((0.1, 0.1)), lr_lambda=[decay, lambda e: 1.0])
    decay.factor = 0.25
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [{"factor": 0.25}, None]
    other = Decay()
    s2 = sched.LambdaLR(_opt((0.1, 0.1)), lr_lambda=[other, lambda e: 1.0])
    s2.load_state_dict(sd)
    assert other.factor == 0.25


def test_step_with_epoch_uses_closed_form():
    opt = _opt((0.1,))
    s = sched.StepLR(opt, step_size=3, gamma=0.5)
    with pytest.warns(UserWarning, match="deprecated"):
        s.step(7)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def test_base_class_is_abstract():
    with pytest.raises(TypeError):
        sched.LRScheduler(_opt())
    with pytest.raises(TypeError, match="not an Optimizer"):
        sched.StepLR(object(), step_size=1)


@given(
    step_size=st.integers(1, 10),
    gamma=st.floats(0.1, 1.0),
    lrs=st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=3),
)
def test_step_lr_any_settings(step_size, gamma, lrs):
    s = sched.StepLR(_opt(tuple(lrs)), step_size=step_size, gamma=gamma)
    expected = _closed(lambda b, t: b * gamma ** (t // step_size), lrs, n=25)
    np.testing.assert_allclose(_lrs_over(s, n=25), expected, rtol=1e-9)
