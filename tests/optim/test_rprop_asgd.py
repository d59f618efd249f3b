"""optim.Rprop and optim.ASGD: PyTorch's documented algorithms step by step (numpy), bad input,
and torch's trajectories when torch is installed."""

import numpy as np
import pytest

import lucid

RNG = np.random.default_rng(31)
A = RNG.standard_normal((6, 3))
B = RNG.standard_normal(6)


def _grad(x):
    return 2 * A.T @ (A @ x - B)


def _run(cls, x0, steps, **kw):
    x = lucid.tensor(x0.copy(), requires_grad=True)
    opt = cls([x], **kw)
    for _ in range(steps):
        opt.zero_grad()
        ((lucid.tensor(A) @ x - lucid.tensor(B)) ** 2).sum().backward()
        opt.step()
    return x.detach().numpy(), opt.state[x]


def test_rprop_follows_the_documented_algorithm():
    x0 = RNG.standard_normal(3)
    got, state = _run(lucid.optim.Rprop, x0, 6, lr=0.1, etas=(0.4, 1.3), step_sizes=(1e-3, 0.25))
    x, prev, size = x0.copy(), np.zeros(3), np.full(3, 0.1)
    for _ in range(6):
        g = _grad(x)
        agree = np.sign(g * prev)
        size = np.clip(size * np.where(agree > 0, 1.3, np.where(agree < 0, 0.4, 1.0)), 1e-3, 0.25)
        g = np.where(agree < 0, 0.0, g)
        x = x - np.sign(g) * size
        prev = g
    np.testing.assert_allclose(got, x, rtol=1e-12)
    np.testing.assert_allclose(state["step_size"].numpy(), size, rtol=1e-12)
    with pytest.raises(ValueError, match="eta"):
        lucid.optim.Rprop([lucid.zeros(1, requires_grad=True)], etas=(1.5, 1.2))


def test_asgd_follows_the_documented_algorithm():
    x0 = RNG.standard_normal(3)
    lr, lambd, alpha, t0, wd = 0.05, 0.01, 0.75, 2, 0.1
    got, state = _run(lucid.optim.ASGD, x0, 6, lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                      weight_decay=wd)  # fmt: skip
    x, ax, eta, mu = x0.copy(), np.zeros(3), lr, 1.0
    for step in range(1, 7):
        g = _grad(x) + wd * x
        x = x * (1 - lambd * eta) - eta * g
        ax = x.copy() if mu == 1 else ax + (x - ax) * mu
        eta = lr / (1 + lambd * lr * step) ** alpha
        mu = 1 / max(1, step - t0)
    np.testing.assert_allclose(got, x, rtol=1e-12)
    np.testing.assert_allclose(state["ax"].numpy(), ax, rtol=1e-12)


@pytest.mark.parametrize(
    ("name", "kw"),
    [("Rprop", {}), ("Rprop", {"lr": 0.1, "etas": (0.3, 1.5), "maximize": True}),
     ("ASGD", {"lr": 0.05}), ("ASGD", {"lr": 0.05, "t0": 2, "weight_decay": 0.1})],
)  # fmt: skip
def test_torch_trajectories(name, kw):
    torch = pytest.importorskip("torch")
    x0 = RNG.standard_normal(3)
    ours, _ = _run(getattr(lucid.optim, name), x0, 8, **kw)
    xt = torch.tensor(x0.copy(), requires_grad=True)
    opt = getattr(torch.optim, name)([xt], **kw)
    for _ in range(8):
        opt.zero_grad()
        ((torch.tensor(A) @ xt - torch.tensor(B)) ** 2).sum().backward()
        opt.step()
    # ASGD: torch keeps eta and mu as float32 tensors, so it drifts from the float64 formula
    # by ~1e-9; Rprop agrees exactly.
    np.testing.assert_allclose(ours, xt.detach().numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(("name", "kw"), [("Rprop", {"lr": 0.1}), ("ASGD", {"lr": 0.05, "t0": 1})])
def test_compiled_step_equals_eager(name, kw):
    weights = []
    for compiled in (False, True):
        lucid.manual_seed(0)
        model = lucid.nn.Linear(3, 2).double()
        opt = getattr(lucid.optim, name)(model.parameters(), **kw)
        if compiled:
            lucid.compile.compile_optimizer(opt)
        for i in range(5):
            opt.zero_grad()
            model(lucid.ones(4, 3, dtype=lucid.float64) * (i + 1)).square().sum().backward()
            opt.step()
        weights.append(model.weight.detach().numpy().copy())
    np.testing.assert_allclose(weights[1], weights[0], rtol=1e-12, atol=1e-15)
