"""Optimizers and schedulers side by side with PyTorch (skipped when torch is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid import optim
from lucid.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")

N_STEPS = 12

OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1, maximize=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.2, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, centered=True, momentum=0.9, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, maximize=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.1, weight_decay=0.1, initial_accumulator_value=0.2)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.1, maximize=True)),
    ("Adamax", dict(lr=0.01)),
    ("Adamax", dict(lr=0.01, weight_decay=0.1, betas=(0.8, 0.9))),
    ("NAdam", dict(lr=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict(lr=0.01)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1)),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1, decoupled_weight_decay=True)),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(OPTIMIZERS)]
DTYPES = {
    "float32": (lucid.float32, torch.float32, 2e-5),
    "float64": (lucid.float64, torch.float64, 1e-9),
}


def _data(seed):
    rng = np.random.default_rng(seed)
    shapes = [(4, 3), (3,)]
    params = [rng.standard_normal(s) for s in shapes]
    grads = [
        [rng.standard_normal(s) * rng.uniform(0.1, 3.0) for s in shapes] for _ in range(N_STEPS)
    ]
    return params, grads


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name, options", OPTIMIZERS, ids=IDS)
def test_optimizer_matches_torch(name, options, dtype):
    lucid_dtype, torch_dtype, rtol = DTYPES[dtype]
    params0, grads = _data(seed=len(IDS) + len(options))
    lp = [lucid.tensor(p, dtype=lucid_dtype, requires_grad=True) for p in params0]
    tp = [torch.tensor(p, dtype=torch_dtype, requires_grad=True) for p in params0]
    lopt = getattr(optim, name)(lp, **options)
    topt = getattr(torch.optim, name)(tp, foreach=False, **options)
    for step_grads in grads:
        for a, b, g in zip(lp, tp, step_grads, strict=True):
            a.grad = lucid.tensor(g, dtype=lucid_dtype)
            b.grad = torch.tensor(g, dtype=torch_dtype)
        lopt.step()
        topt.step()
    for a, b in zip(lp, tp, strict=True):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=rtol)
        lstate, tstate = lopt.state[a], topt.state[b]
        assert set(lstate) == set(tstate)
        for key in tstate:
            np.testing.assert_allclose(
                lstate[key].numpy(), tstate[key].numpy(), rtol=rtol * 10, atol=rtol, err_msg=key
            )
            assert lstate[key].dtype.numpy == tstate[key].numpy().dtype, key


@pytest.mark.parametrize("name, options", OPTIMIZERS[::3], ids=IDS[::3])
def test_state_dict_layout_matches_torch(name, options):
    params0, grads = _data(seed=1)
    lp = [lucid.tensor(p, requires_grad=True) for p in params0]
    tp = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in params0]
    lopt = getattr(optim, name)(lp, **options)
    topt = getattr(torch.optim, name)(tp, **options)
    for a, b, g in zip(lp, tp, grads[0], strict=True):
        a.grad = lucid.tensor(g, dtype=lucid.float32)
        b.grad = torch.tensor(g, dtype=torch.float32)
    lopt.step()
    topt.step()
    lsd, tsd = lopt.state_dict(), topt.state_dict()
    assert lsd["state"].keys() == tsd["state"].keys()
    for k in tsd["state"]:
        assert lsd["state"][k].keys() == tsd["state"][k].keys()
    for lg, tg in zip(lsd["param_groups"], tsd["param_groups"], strict=True):
        assert lg["params"] == tg["params"]
        for key, value in lg.items():
            assert tg[key] == value, key  # every Lucid option exists in torch with the same value


SCHEDULERS = [
    ("StepLR", dict(step_size=4, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[3, 7, 7, 20], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=9, eta_min=0.001)),
    ("LinearLR", dict(start_factor=0.25, end_factor=0.9, total_iters=6)),
    ("LambdaLR", dict(lr_lambda=lambda e: 1.0 / (1 + 0.3 * e))),
    ("OneCycleLR", dict(max_lr=0.4, total_steps=30)),
    ("OneCycleLR", dict(max_lr=0.4, total_steps=30, anneal_strategy="linear", three_phase=True)),
]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize(
    "name, options", SCHEDULERS, ids=[s[0] + str(i) for i, s in enumerate(SCHEDULERS)]
)
def test_scheduler_matches_torch(name, options, opt_name):
    lp = lucid.tensor([1.0], requires_grad=True)
    tp = torch.tensor([1.0], requires_grad=True)
    extra = {"momentum": 0.9} if opt_name == "SGD" else {}
    lopt = getattr(optim, opt_name)([{"params": [lp], "lr": 0.1}], **extra)
    topt = getattr(torch.optim, opt_name)([{"params": [tp], "lr": 0.1}], **extra)
    ls = getattr(sched, name)(lopt, **options)
    ts = getattr(torch.optim.lr_scheduler, name)(topt, **options)
    for _ in range(29):
        lg, tg = lopt.param_groups[0], topt.param_groups[0]
        assert lg["lr"] == pytest.approx(tg["lr"], rel=1e-12, abs=1e-15)
        assert ls.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-15)
        if opt_name == "SGD":
            assert lg["momentum"] == pytest.approx(tg["momentum"], rel=1e-12)
        else:
            assert lg["betas"] == pytest.approx(tg["betas"], rel=1e-12)
        lp.grad = lucid.tensor([1.0])
        tp.grad = torch.tensor([1.0])
        lopt.step()
        topt.step()
        ls.step()
        ts.step()
    np.testing.assert_allclose(lp.numpy(), tp.detach().numpy(), rtol=1e-5)
