"""Step scalars (learning rate, momentum, bias corrections...) reach a compiled training step in
the dtype eager arithmetic gives the Python float: a float64 model trained with ``fused_step`` or
``compile_optimizer`` equals eager training to ~1e-12 for every optimizer, with the learning
rate changed by a scheduler each step; float32 models keep float32 scalar feeds; a group mixing
float32 and float64 parameters gets one feed per dtype."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compile_optimizer, fused_step
from lucid.compile.training.builder import build_training_module
from lucid.optim.lr_scheduler import ExponentialLR, LambdaLR

OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1)),
    "sgd-momentum-wd": (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov": (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "adam": (optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    "adam-amsgrad": (optim.Adam, dict(lr=0.01, amsgrad=True)),
    "adamw": (optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "rmsprop": (optim.RMSprop, dict(lr=0.01, weight_decay=0.01)),
    "rmsprop-centered-momentum": (
        optim.RMSprop,
        dict(lr=0.01, momentum=0.9, centered=True),
    ),
    "adagrad": (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01)),
    "adadelta": (optim.Adadelta, dict(lr=1.0, weight_decay=0.01)),
    "adamax": (optim.Adamax, dict(lr=0.01, weight_decay=0.01)),
    "nadam": (optim.NAdam, dict(lr=0.01, weight_decay=0.01)),
    "nadam-decoupled": (optim.NAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True)),
    "radam": (optim.RAdam, dict(lr=0.01, weight_decay=0.01)),
}
STEPS = 7  # RAdam rectifies from step 6 on: both of its branches are taken

# The fused and eager steps are not bit-identical in float64 (summation order in the backward
# differs) but a float32 scalar anywhere would show as ~1e-8 relative.
RTOL = 1e-12


def _model(dtype=lucid.float64) -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)


def _data(dtype=np.float64):
    rng = np.random.default_rng(1)
    x = lucid.tensor(rng.standard_normal((6, 4)).astype(dtype))
    y = lucid.tensor(rng.standard_normal((6, 2)).astype(dtype))
    return x, y


def _assert_same(model, ref, rtol=RTOL):
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        want = q.numpy()
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(p.numpy(), want, rtol=rtol, atol=rtol * scale, err_msg=name)


def _assert_state_same(opt, ref_opt, rtol=RTOL):
    for group, ref_group in zip(opt.param_groups, ref_opt.param_groups, strict=True):
        for p, q in zip(group["params"], ref_group["params"], strict=True):
            for key, value in ref_opt.state[q].items():
                got = opt.state[p][key]
                assert got.dtype == value.dtype, key
                np.testing.assert_allclose(got.numpy(), value.numpy(), rtol=rtol, err_msg=key)


def _eager_step(model, opt, x, y):
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()


def _scheduler(opt):
    # A learning rate that is not a float32 number and changes every step.
    return LambdaLR(opt, lambda epoch: 1.0 / (1.0 + 0.37 * epoch))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_step_float64_equals_eager(name):
    cls, options = OPTIMIZERS[name]
    x, y = _data()
    ref = _model()
    ref_opt = cls(ref.parameters(), **options)
    ref_sched = _scheduler(ref_opt)
    model = _model()
    opt = cls(model.parameters(), **options)
    sched = _scheduler(opt)
    step = fused_step(model, F.mse_loss, opt)
    for _ in range(STEPS):
        _eager_step(ref, ref_opt, x, y)
        ref_sched.step()
        step(x, y)
        sched.step()
    # the scheduler never forced a rebuild (RAdam's rectification is a static switch)
    assert step.cache_info()["entries"] == (2 if cls is optim.RAdam else 1)
    _assert_same(model, ref)
    _assert_state_same(opt, ref_opt)


@pytest.mark.parametrize("name", ["sgd-nesterov", "adam-amsgrad", "nadam", "radam", "adadelta"])
def test_compile_optimizer_float64_equals_eager(name):
    cls, options = OPTIMIZERS[name]
    x, y = _data()
    ref = _model()
    ref_opt = cls(ref.parameters(), **options)
    ref_sched = ExponentialLR(ref_opt, gamma=0.9)
    model = _model()
    opt = compile_optimizer(cls(model.parameters(), **options))
    sched = ExponentialLR(opt, gamma=0.9)
    for _ in range(STEPS):
        _eager_step(ref, ref_opt, x, y)
        ref_sched.step()
        _eager_step(model, opt, x, y)
        sched.step()
    assert opt.step.cache_info()["entries"] == (2 if cls is optim.RAdam else 1)
    _assert_same(model, ref)
    _assert_state_same(opt, ref_opt)


def test_one_sgd_step_on_float64_linear_is_exact():
    # The reproduction: lr=0.1 rounded to float32 moved the weights by ~3e-6.
    x, y = _data()
    lucid.manual_seed(0)
    ref = nn.Linear(4, 2).double()
    lucid.manual_seed(0)
    model = nn.Linear(4, 2).double()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    step = fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1))
    _eager_step(ref, ref_opt, x, y)
    step(x, y)
    _assert_same(model, ref, rtol=1e-15)


def _scalar_feed_dtypes(tm) -> dict[str, np.dtype]:
    return {r: tm.scalar_array(r).dtype for r in tm.feed_roles if r.startswith("scalar:")}


def test_float32_model_keeps_float32_scalar_feeds():
    x, y = _data(np.float32)
    model = _model(lucid.float32)
    opt = optim.Adam(model.parameters(), lr=0.01)
    tm = build_training_module(model, F.mse_loss, (x, y), optimizer=opt)
    dtypes = _scalar_feed_dtypes(tm)
    assert "scalar:0:step_size" in dtypes
    assert set(dtypes.values()) == {np.dtype(np.float32)}


def test_float64_model_feeds_float64_scalars():
    x, y = _data()
    model = _model()
    opt = optim.Adam(model.parameters(), lr=0.01)
    tm = build_training_module(model, F.mse_loss, (x, y), optimizer=opt)
    dtypes = _scalar_feed_dtypes(tm)
    assert "scalar:0:step_size:float64" in dtypes
    assert set(dtypes.values()) == {np.dtype(np.float64)}
    fed = tm.feed_values(x, y)
    assert fed["scalar:0:step_size:float64"] == opt.param_groups[0]["lr"] / (1 - 0.9)


def test_nadam_mu_product_is_fed_mu_in_float32():
    # mu_product is 0-d float32 state (like torch): eager multiplies it by the Python float mu
    # in float32, so the traced update must see mu at float32 even in a float64 model.
    x, y = _data()
    model = _model()
    opt = optim.NAdam(model.parameters(), lr=0.01)
    tm = build_training_module(model, F.mse_loss, (x, y), optimizer=opt)
    dtypes = _scalar_feed_dtypes(tm)
    assert dtypes["scalar:0:mu"] == np.float32
    assert "scalar:0:mu:float64" not in dtypes


class _MixedModel(nn.Module):
    def __init__(self):
        super().__init__()
        lucid.manual_seed(0)
        self.first = nn.Linear(4, 3).double()
        self.second = nn.Linear(3, 2)  # float32

    def forward(self, x):
        return self.second(lucid.tanh(self.first(x)).float())


@pytest.mark.parametrize("cls, options", [OPTIMIZERS["sgd-nesterov"], OPTIMIZERS["adam"]])
def test_group_mixing_float32_and_float64_parameters(cls, options):
    x, y = _data()
    y = y.float()
    ref, model = _MixedModel(), _MixedModel()
    ref_opt = cls(ref.parameters(), **options)
    opt = cls(model.parameters(), **options)
    step = fused_step(model, F.mse_loss, opt)
    for _ in range(3):
        _eager_step(ref, ref_opt, x, y)
        step(x, y)
    # one feed per dtype for the group's shared scalars
    (entry,) = step._entries.values()
    tm = entry.tm
    dtypes = _scalar_feed_dtypes(tm)
    assert {np.dtype(np.float32), np.dtype(np.float64)} <= set(dtypes.values())
    np.testing.assert_allclose(model.first.weight.numpy(), ref.first.weight.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        model.second.weight.numpy(), ref.second.weight.numpy(), rtol=1e-5, atol=1e-6
    )


class _MethodScalarSGD(optim.SGD):
    """An update that hands a step scalar to a method instead of an operator."""

    @staticmethod
    def _update(param, grad, state, *, lr, **_ignored):
        param.sub_(grad.mul(lr))


def test_update_passing_a_scalar_to_a_method_is_a_clear_error():
    x, y = _data()
    model = _model()
    opt = _MethodScalarSGD(model.parameters(), lr=0.1)
    before = [p.numpy().copy() for p in model.parameters()]
    step = fused_step(model, F.mse_loss, opt)
    with pytest.raises(Exception, match=r"step scalar.*\+, -, \*, /"):
        step(x, y)
    for p, b in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), b)


def test_batchnorm_cnn_with_nesterov_and_steplr_float64():
    # The ResNet-style case: BatchNorm (running statistics updated in the step),
    # SGD-Nesterov with weight decay, StepLR; parameters and buffers equal eager's.
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
    )
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)

    def make():
        lucid.manual_seed(0)
        return models.LeNet().double()

    options = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    ref, model = make(), make()
    ref_opt, opt = optim.SGD(ref.parameters(), **options), optim.SGD(model.parameters(), **options)
    ref_sched = optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.7)
    sched = optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)
    step = fused_step(model, F.cross_entropy, opt)
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((4, 1, 12, 12)))
    y = lucid.tensor(rng.integers(0, 10, 4))
    for _ in range(4):
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()
        step(x, y)
        sched.step()
    _assert_same(model, ref)
    for a, b in zip(model.buffers(), ref.buffers(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=RTOL)
    assert step.cache_info()["entries"] == 1
