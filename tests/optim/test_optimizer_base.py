"""The Optimizer base: parameter groups, zero_grad, closures, state_dict round trips, errors."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid import optim

ALL = [
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    (optim.AdamW, dict(lr=0.01, amsgrad=True)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (optim.Adadelta, dict(weight_decay=0.01)),
    (optim.Adamax, dict(lr=0.01)),
    (optim.NAdam, dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.01)),
    (optim.RAdam, dict(lr=0.01, betas=(0.9, 0.8))),
]
IDS = [cls.__name__ for cls, _ in ALL]


def _quadratic_problem(seed=0, dtype=lucid.float64):
    rng = np.random.default_rng(seed)
    w = lucid.tensor(rng.standard_normal((3, 2)), dtype=dtype, requires_grad=True)
    b = lucid.tensor(rng.standard_normal(2), dtype=dtype, requires_grad=True)
    x = lucid.tensor(rng.standard_normal((4, 3)), dtype=dtype)
    target = lucid.tensor(rng.standard_normal((4, 2)), dtype=dtype)

    def loss_fn():
        err = x @ w + b - target
        return (err * err).sum()

    return [w, b], loss_fn


def _train(opt, params, loss_fn, n):
    for _ in range(n):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()


@pytest.mark.parametrize("cls, options", ALL, ids=IDS)
def test_state_dict_round_trip_continues_identically(cls, options):
    params_a, loss_a = _quadratic_problem()
    opt_a = cls(params_a, **options)
    _train(opt_a, params_a, loss_a, 3)
    saved = opt_a.state_dict()
    saved_params = [p.numpy().copy() for p in params_a]

    params_b, loss_b = _quadratic_problem()  # starting values overwritten below
    for pb, value in zip(params_b, saved_params, strict=True):
        with lucid.no_grad():
            pb.copy_(lucid.tensor(value))
    opt_b = cls(params_b, lr=123.0)  # options come from the state dict
    opt_b.load_state_dict(saved)
    assert opt_b.param_groups[0]["lr"] == options.get("lr", opt_a.defaults["lr"])

    _train(opt_a, params_a, loss_a, 4)
    _train(opt_b, params_b, loss_b, 4)
    for pa, pb in zip(params_a, params_b, strict=True):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
    for pa, pb in zip(params_a, params_b, strict=True):
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k].numpy(), sb[k].numpy())


@pytest.mark.parametrize("cls, options", ALL, ids=IDS)
def test_state_dict_is_a_snapshot(cls, options):
    params, loss_fn = _quadratic_problem()
    opt = cls(params, **options)
    _train(opt, params, loss_fn, 2)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1]
    assert sd["param_groups"][0]["params"] == [0, 1]
    before = {k: v.numpy().copy() for k, v in sd["state"][0].items()}
    _train(opt, params, loss_fn, 1)
    for k, v in sd["state"][0].items():
        np.testing.assert_array_equal(v.numpy(), before[k])  # later steps do not leak in
    if "step" in sd["state"][0]:
        assert sd["state"][0]["step"].item() == 2.0


def test_state_dict_numbers_parameters_across_groups():
    a, b, c = (lucid.tensor([float(i)], requires_grad=True) for i in range(3))
    opt = optim.SGD([{"params": [a, b]}, {"params": [c], "lr": 0.5}], lr=0.1, momentum=0.9)
    for p in (a, c):
        p.grad = lucid.tensor([1.0])
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sorted(sd["state"]) == [0, 2]
    assert sd["param_groups"][1]["lr"] == 0.5


def test_load_state_dict_validates_groups():
    a, b = lucid.tensor([1.0], requires_grad=True), lucid.tensor([2.0], requires_grad=True)
    opt = optim.Adam([a, b])
    sd = optim.Adam([{"params": [a]}, {"params": [b]}]).state_dict()
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict(sd)
    sd_small = optim.Adam([a]).state_dict()
    with pytest.raises(ValueError, match="group 0 has 1 parameters"):
        opt.load_state_dict(sd_small)
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        opt.load_state_dict({"param_groups": []})


def test_load_state_dict_rejects_wrong_state_shape():
    a = lucid.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.Adam([a])
    a.grad = lucid.tensor([1.0, 1.0])
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = lucid.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="exp_avg"):
        optim.Adam([lucid.tensor([0.0, 0.0], requires_grad=True)]).load_state_dict(sd)


def test_load_state_dict_casts_state_to_parameter_dtype():
    a = lucid.tensor([1.0, 2.0], dtype=lucid.float64, requires_grad=True)
    opt = optim.Adam([a])
    a.grad = lucid.tensor([1.0, 1.0], dtype=lucid.float64)
    opt.step()
    sd = opt.state_dict()
    b = lucid.tensor([1.0, 2.0], dtype=lucid.float32, requires_grad=True)
    opt_b = optim.Adam([b])
    opt_b.load_state_dict(sd)
    assert opt_b.state[b]["exp_avg"].dtype == lucid.float32
    assert opt_b.state[b]["step"].dtype == lucid.float32
    b.grad = lucid.tensor([1.0, 1.0])
    opt_b.step()
    assert opt_b.state[b]["step"].item() == 2.0


def test_loaded_state_does_not_alias_the_dict():
    a = lucid.tensor([1.0], requires_grad=True)
    opt = optim.SGD([a], lr=0.1, momentum=0.9)
    a.grad = lucid.tensor([1.0])
    opt.step()
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    opt.step()
    np.testing.assert_allclose(sd["state"][0]["momentum_buffer"].numpy(), [1.0])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    params, loss_fn = _quadratic_problem()
    opt = optim.SGD(params, lr=0.1)
    loss_fn().backward()
    grads = [p.grad for p in params]
    opt.zero_grad(set_to_none=set_to_none)
    for p, g in zip(params, grads, strict=True):
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is g  # zeroed in place
            np.testing.assert_array_equal(g.numpy(), np.zeros(p.shape))
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_zero_grad_default_makes_step_skip_parameters():
    params, loss_fn = _quadratic_problem()
    opt = optim.SGD(params, lr=0.1)
    loss_fn().backward()
    opt.zero_grad()
    before = [p.numpy().copy() for p in params]
    opt.step()
    for p, b in zip(params, before, strict=True):
        np.testing.assert_array_equal(p.numpy(), b)


def test_step_with_closure_returns_loss_and_uses_its_gradients():
    params, loss_fn = _quadratic_problem()
    ref_params, ref_loss = _quadratic_problem()
    opt = optim.SGD(params, lr=0.01)
    calls = []

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        calls.append(loss.item())
        return loss

    with lucid.no_grad():  # the closure must still get gradients
        loss = opt.step(closure)
    assert len(calls) == 1 and loss.item() == calls[0]
    ref_loss().backward()
    for p, r in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(p.numpy(), r.numpy() - 0.01 * r.grad.numpy())


def test_step_does_not_record_autograd_history():
    params, loss_fn = _quadratic_problem()
    opt = optim.Adam(params, lr=0.1)
    loss_fn().backward()
    opt.step()
    assert all(p.is_leaf and p.requires_grad for p in params)
    assert all(v.grad_fn is None for st in opt.state.values() for v in st.values())


def test_training_reduces_loss():
    params, loss_fn = _quadratic_problem()
    opt = optim.Adam(params, lr=0.05)
    first = loss_fn().item()
    _train(opt, params, loss_fn, 50)
    assert loss_fn().item() < 0.5 * first


def test_add_param_group():
    a = lucid.tensor([1.0], requires_grad=True)
    b = lucid.tensor([2.0], requires_grad=True)
    opt = optim.SGD([a], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": b, "lr": 0.01})
    assert len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[1]["momentum"] == 0.9
    b.grad = lucid.tensor([1.0])
    opt.step()
    np.testing.assert_allclose(b.numpy(), [2.0 - 0.01])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.add_param_group({"params": [lucid.tensor([0.0], requires_grad=True)], "lr": -1.0})
    assert len(opt.param_groups) == 2


def test_bad_params():
    a = lucid.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(a, lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": {a}}], lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        optim.SGD([a, 3.0], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([a * 2], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [a]}, {"params": [a]}], lr=0.1)
    with pytest.raises(ValueError, match="same parameter more than once"):
        optim.SGD([a, a], lr=0.1)


BAD_OPTIONS = [
    (optim.SGD, dict(lr=-0.1), "learning rate"),
    (optim.SGD, dict(momentum=-0.5), "momentum"),
    (optim.SGD, dict(weight_decay=-1e-3), "weight_decay"),
    (optim.SGD, dict(nesterov=True), "Nesterov"),
    (optim.SGD, dict(nesterov=True, momentum=0.9, dampening=0.1), "dampening"),
    (optim.Adam, dict(lr=-1.0), "learning rate"),
    (optim.Adam, dict(betas=(1.0, 0.999)), "beta parameter at index 0"),
    (optim.Adam, dict(betas=(0.9, -0.1)), "beta parameter at index 1"),
    (optim.Adam, dict(eps=-1e-8), "epsilon"),
    (optim.Adam, dict(weight_decay=-0.1), "weight_decay"),
    (optim.AdamW, dict(betas=(0.9, 1.5)), "beta parameter at index 1"),
    (optim.RMSprop, dict(alpha=-0.1), "alpha"),
    (optim.RMSprop, dict(momentum=-0.1), "momentum"),
    (optim.RMSprop, dict(eps=-1.0), "epsilon"),
    (optim.Adagrad, dict(lr_decay=-0.1), "lr_decay"),
    (optim.Adagrad, dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (optim.Adadelta, dict(rho=1.5), "rho"),
    (optim.Adadelta, dict(lr=-1.0), "learning rate"),
    (optim.Adamax, dict(betas=(-0.1, 0.9)), "beta parameter at index 0"),
    (optim.NAdam, dict(momentum_decay=-1.0), "momentum_decay"),
    (optim.RAdam, dict(betas=(0.9, 1.0)), "beta parameter at index 1"),
    (optim.RAdam, dict(weight_decay=-1.0), "weight_decay"),
]


@pytest.mark.parametrize("cls, options, name", BAD_OPTIONS)
def test_bad_hyperparameters_raise_value_error_naming_the_option(cls, options, name):
    a = lucid.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match=name):
        cls([a], **options)
    with pytest.raises(ValueError, match=name):  # also when given per group
        cls([{"params": [a], **options}])


def test_adagrad_state_exists_from_construction():
    a = lucid.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.Adagrad([a], initial_accumulator_value=0.25)
    np.testing.assert_array_equal(opt.state[a]["sum"].numpy(), [0.25, 0.25])
    assert opt.state[a]["step"].item() == 0.0


def test_sgd_momentum_turned_on_later_starts_its_buffer():
    a = lucid.tensor([1.0], requires_grad=True)
    opt = optim.SGD([a], lr=0.1)
    a.grad = lucid.tensor([1.0])
    opt.step()
    assert "momentum_buffer" not in opt.state[a]
    opt.param_groups[0]["momentum"] = 0.5
    opt.step()
    opt.step()
    # buffer: 1 (first momentum step), then 0.5 * 1 + 1 = 1.5
    np.testing.assert_allclose(opt.state[a]["momentum_buffer"].numpy(), [1.5])
    np.testing.assert_allclose(a.numpy(), [1.0 - 0.1 - 0.1 - 0.15], rtol=1e-6)


def test_repr_lists_groups():
    a = lucid.tensor([1.0], requires_grad=True)
    text = repr(optim.Adam([a], lr=0.5))
    assert text.startswith("Adam (") and "Parameter Group 0" in text and "lr: 0.5" in text


def test_non_numeric_hyperparameters_raise_type_error():
    a = lucid.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match="lr must be a number"):
        optim.SGD([a], lr="0.1")
    with pytest.raises(TypeError, match=r"betas\[1\] must be a number"):
        optim.Adam([a], betas=(0.9, None))
    with pytest.raises(ValueError, match="learning rate"):
        optim.Adam([a], lr=float("nan"))


@pytest.mark.parametrize(
    "cls, options",
    [
        (optim.SGD, dict(lr=0.1, momentum=0.9)),
        (optim.Adam, dict(lr=0.02)),
        (optim.AdamW, dict(lr=0.02)),
        (optim.RMSprop, dict(lr=0.005)),
        (optim.Adagrad, dict(lr=0.1)),
        (optim.Adadelta, dict(lr=1.0)),
        (optim.Adamax, dict(lr=0.02)),
        (optim.NAdam, dict(lr=0.02)),
        (optim.RAdam, dict(lr=0.05)),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_trains_an_nn_module(cls, options):
    nn = pytest.importorskip("lucid.nn")
    functional = pytest.importorskip("lucid.nn.functional")
    rng = np.random.default_rng(0)
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    x = lucid.tensor(rng.standard_normal((32, 3)).astype(np.float32))
    y = lucid.tensor(np.sin(x.numpy().sum(1, keepdims=True)))
    opt = cls(model.parameters(), **options)
    first = functional.mse_loss(model(x), y).item()
    for _ in range(40):
        opt.zero_grad()
        loss = functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    assert functional.mse_loss(model(x), y).item() < 0.7 * first
