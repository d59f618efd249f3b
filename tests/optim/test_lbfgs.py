"""optim.LBFGS: convergence, the strong-Wolfe conditions, evaluation budgets, bad input; the
trajectory of torch.optim.LBFGS when torch is installed."""

import numpy as np
import pytest

import lucid
from lucid.optim.lbfgs import _strong_wolfe

RNG = np.random.default_rng(4)
A = RNG.standard_normal((20, 4))
B = RNG.standard_normal(20)


def _rosenbrock(x):
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2


def _least_squares(x):
    return ((lucid.tensor(A) @ x - lucid.tensor(B)) ** 2).sum()


def _run(fn, x0, steps, **kw):
    x = lucid.tensor(np.array(x0, dtype=np.float64), requires_grad=True)
    opt = lucid.optim.LBFGS([x], **kw)

    def closure():
        opt.zero_grad()
        loss = fn(x)
        loss.backward()
        return loss

    losses = [float(opt.step(closure)) for _ in range(steps)]
    return x, opt, losses


def test_least_squares_reaches_the_exact_solution():
    x, _, _ = _run(_least_squares, np.zeros(4), 3, history_size=10)
    want = np.linalg.lstsq(A, B, rcond=None)[0]
    np.testing.assert_allclose(x.detach().numpy(), want, atol=1e-8)


def test_strong_wolfe_solves_rosenbrock_and_counts_evaluations():
    x, opt, losses = _run(_rosenbrock, [-1.5, 2.0], 5, max_iter=20, line_search_fn="strong_wolfe")
    np.testing.assert_allclose(x.detach().numpy(), [1.0, 1.0], atol=1e-4)
    assert losses[0] == 12.5 and losses[-1] < 1e-8
    state = opt.state[x]
    assert state["n_iter"] >= 20 and state["func_evals"] > state["n_iter"]


def test_fixed_steps_respect_max_eval():
    calls = []

    def fn(x):
        calls.append(1)
        return _rosenbrock(x)

    _run(fn, [-1.5, 2.0], 1, lr=0.01, max_iter=10, max_eval=4)
    assert len(calls) == 4


def test_line_search_step_meets_the_strong_wolfe_conditions():
    # f(t) along d from x = 0: f(x) = sum((x - 3)^4), d = -grad at 0.
    def f_and_g(x):
        return float(((x - 3) ** 4).sum()), 4 * (x - 3) ** 3

    x0 = np.zeros(2)
    f0, g0 = f_and_g(x0)
    d = -g0
    gtd = float(g0.dot(d))
    f_t, g_t, t, evals = _strong_wolfe(lambda t: f_and_g(x0 + t * d), 1.0, d, f0, g0, gtd)
    assert f_t <= f0 + 1e-4 * t * gtd
    assert abs(float(g_t.dot(d))) <= 0.9 * abs(gtd)
    assert evals >= 1


def test_bad_input():
    x = lucid.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="closure"):
        lucid.optim.LBFGS([x]).step()
    with pytest.raises(ValueError, match="line_search_fn"):
        lucid.optim.LBFGS([x], line_search_fn="armijo")
    with pytest.raises(ValueError, match="parameter groups"):
        lucid.optim.LBFGS([{"params": [x]}, {"params": [lucid.zeros(1, requires_grad=True)]}])


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
@pytest.mark.parametrize("problem", ["rosenbrock", "least_squares"])
def test_torch_trajectory(line_search_fn, problem):
    torch = pytest.importorskip("torch")
    x0 = np.array([-1.5, 2.0]) if problem == "rosenbrock" else RNG.standard_normal(4)
    kw = {"lr": 1 if line_search_fn else 0.1, "max_iter": 15, "history_size": 5,
          "line_search_fn": line_search_fn}  # fmt: skip

    def fn(x, m):
        if problem == "rosenbrock":
            return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
        return ((m.tensor(A) @ x - m.tensor(B)) ** 2).sum()

    ours, _, our_losses = _run(lambda x: fn(x, lucid), x0, 3, **kw)
    xt = torch.tensor(x0.copy(), requires_grad=True)
    opt = torch.optim.LBFGS([xt], **kw)

    def closure():
        opt.zero_grad()
        loss = fn(xt, torch)
        loss.backward()
        return loss

    their_losses = [opt.step(closure).item() for _ in range(3)]
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-8)
    np.testing.assert_allclose(ours.detach().numpy(), xt.detach().numpy(), atol=1e-8)
