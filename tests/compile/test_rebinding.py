"""Replacing a parameter, buffer or submodule after compiling (issue 15, item 1): every compiled
entry point notices it (the module-structure version) and rebinds or recompiles, so results equal
eager's; fused_step refuses a replaced parameter its optimizer still holds, naming it."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compile_optimizer, compiled_step, fused_step, make_step
from lucid.nn.modules.module import STRUCTURE_VERSION


def _mlp(seed: int = 0) -> nn.Sequential:
    lucid.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _x(seed: int = 1, shape=(4, 8)) -> lucid.Tensor:
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _close(a, b, tol=1e-5) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=tol, atol=tol)


def test_replacing_a_submodule_recompiles():
    model = _mlp()
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        assert cm(x).shape == (4, 4)
        model[2] = nn.Linear(16, 7)
        out = cm(x)
        assert out.shape == (4, 7)
        _close(out, model(x))


@pytest.mark.parametrize("mode", ["infer", "fused_step"])
def test_swapping_a_submodule_without_parameters_recompiles(mode):
    # An activation has no tensors: only its identity says the graph changed.
    model, twin = _mlp(), _mlp()
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    if mode == "infer":
        cm = lucid.compile(model)
        with lucid.no_grad():
            cm(x)
            model[1], twin[1] = nn.Tanh(), nn.Tanh()
            _close(cm(x), twin(x))
        return
    opt, opt_twin = optim.SGD(model.parameters(), lr=0.1), optim.SGD(twin.parameters(), lr=0.1)
    step = fused_step(model, F.cross_entropy, opt)
    for i in range(3):
        if i == 1:
            model[1], twin[1] = nn.Sigmoid(), nn.Sigmoid()
        step(x, y)
        opt_twin.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        opt_twin.step()
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            _close(a, b)


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.temperature = 1.0
        self.act = nn.LeakyReLU()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.act(self.fc(x))) / self.temperature


@pytest.mark.parametrize(
    "change",
    ["temperature", "negative_slope", "dropout_p", "hook_added", "hook_removed"],
)
def test_a_changed_plain_attribute_or_hook_recompiles(change):
    # Baked into the trace: a recompile is the only way to follow it, as eager does.
    lucid.manual_seed(0)
    model = _Scaled()
    model.eval()
    handle = (
        model.fc.register_forward_hook(lambda m, i, o: o * 2) if change == "hook_removed" else None
    )
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        cm(x)
        if change == "temperature":
            model.temperature = 4.0
        elif change == "negative_slope":
            model.act.negative_slope = 0.5
        elif change == "dropout_p":
            model.train()
            model.drop.p = 0.0
        elif change == "hook_added":
            model.fc.register_forward_hook(lambda m, i, o: o * 3)
        else:
            handle.remove()
        _close(cm(x), model(x))


def test_a_forward_that_sets_an_attribute_does_not_recompile_every_call():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)
            self.seen = 0

        def forward(self, x):
            self.seen = self.seen + 1  # runs when traced only, as torch.compile
            return self.fc(x)

    cm = lucid.compile(Counting())
    with lucid.no_grad():
        for _ in range(4):
            cm(_x())
    info = cm.cache_info()
    assert info["entries"] == 1 and not info["recompiles"] and cm._model.seen == 1


def test_replacing_a_parameter_by_a_same_shape_one():
    model = _mlp()
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        cm(x)
        model[0].weight = nn.Parameter(lucid.randn(16, 8))
        _close(cm(x), model(x))


def test_load_state_dict_assign_on_the_model():
    model = _mlp()
    other = _mlp(seed=5)
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        cm(x)
        model.load_state_dict(other.state_dict(), assign=True)
        _close(cm(x), other(x))


def test_a_replaced_buffer_is_the_one_updated():
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3))
    ref = copy.deepcopy(model)
    cm = lucid.compile(model)
    x = _x(shape=(2, 1, 6, 6))
    with lucid.no_grad():
        cm(x)
        ref(x)
        old = model[1].running_mean
        before = old.numpy().copy()
        model[1].running_mean = lucid.zeros(3)
        ref[1].running_mean = lucid.zeros(3)
        cm(x)
        ref(x)
    np.testing.assert_array_equal(old.numpy(), before)  # the old buffer is left alone
    _close(model[1].running_mean, ref[1].running_mean)


def test_grad_mode_call_after_replacing_a_parameter():
    model = _mlp()
    cm = lucid.compile(model)
    x = _x()
    cm(x).sum().backward()
    new = nn.Parameter(lucid.randn(4, 16))
    model[2].weight = new
    loss = cm(x).sum()
    loss.backward()
    ref = copy.deepcopy(model)
    ref.zero_grad()
    ref(x).sum().backward()
    assert new.grad is not None
    _close(new.grad, ref[2].weight.grad)


def test_a_function_closing_over_a_model():
    model = _mlp()

    def f(x):
        return model(x) * 2

    cf = lucid.compile(f)
    x = _x()
    with lucid.no_grad():
        cf(x)
        model[2] = nn.Linear(16, 3)
        _close(cf(x), model(x) * 2)


def test_a_forward_does_not_bump_the_structure_version():
    # The per-call check is one int comparison; it only re-reads the model after a change.
    model = _mlp()
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        cm(x)
        v = STRUCTURE_VERSION[0]
        cm(x)
        model(x)
    assert STRUCTURE_VERSION[0] == v
    model[0].bias = nn.Parameter(lucid.zeros(16))
    assert STRUCTURE_VERSION[0] != v


def test_container_mutations_bump_the_structure_version():
    seq = _mlp()
    for mutate in (
        lambda: seq.append(nn.ReLU()),
        lambda: seq.__delitem__(-1),
        lambda: seq.insert(0, nn.Identity()),
        lambda: delattr(seq[1], "bias"),
        lambda: seq[1].register_buffer("extra", lucid.zeros(1)),
        lambda: nn.ModuleList([nn.ReLU()]).__setitem__(0, nn.Tanh()),
    ):
        v = STRUCTURE_VERSION[0]
        mutate()
        assert STRUCTURE_VERSION[0] != v


def _eager_step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def test_make_step_and_cm_step_after_replacing_a_parameter():
    model = _mlp()
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    step = make_step(model, F.cross_entropy)
    cm = lucid.compile(model)
    step(x, y)
    cm.step(x, y, loss_fn=F.cross_entropy)
    new = nn.Parameter(lucid.randn(4, 16))
    model[2].weight = new
    ref = copy.deepcopy(model)
    ref.zero_grad()
    ref_loss = _eager_step(ref, x, y)
    for run in (lambda: step(x, y), lambda: cm.step(x, y, loss_fn=F.cross_entropy)):
        model.zero_grad()
        loss = run()
        loss.backward()
        _close(loss, ref_loss)
        _close(new.grad, ref[2].weight.grad)


def test_compiled_step_after_replacing_a_submodule():
    model = _mlp()
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    compiled_step(model, x, F.cross_entropy, y)
    model[2] = nn.Linear(16, 5)
    model.zero_grad()
    ref = copy.deepcopy(model)
    loss = compiled_step(model, x, F.cross_entropy, y)
    ref_loss = _eager_step(ref, x, y)
    _close(loss, ref_loss)
    _close(model[2].weight.grad, ref[2].weight.grad)


def test_fused_step_rebinds_a_replaced_buffer():
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 4))
    ref = copy.deepcopy(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    step(x, y)
    _eager_step(ref, x, y)
    ref_opt.step()
    ref_opt.zero_grad()
    model[1].running_var = lucid.full((6,), 2.0)
    ref[1].running_var = lucid.full((6,), 2.0)
    step(x, y)
    _eager_step(ref, x, y)
    ref_opt.step()
    _close(model[1].running_var, ref[1].running_var)
    _close(model[2].weight, ref[2].weight)


def test_fused_step_refuses_a_parameter_its_optimizer_no_longer_trains():
    model = _mlp()
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    step(x, y)
    state_before = {
        id(p): {k: v.numpy().copy() for k, v in s.items()} for p, s in opt.state.items()
    }
    new = nn.Parameter(lucid.randn(4, 16))
    new_before = new.numpy().copy()
    model[2].weight = new
    for _ in range(2):  # refused on every call, not only the first
        with pytest.raises(RuntimeError, match=r"'2\.weight'.*replaced after the optimizer"):
            step(x, y)
    np.testing.assert_array_equal(new.numpy(), new_before)
    for p, s in opt.state.items():
        for k, v in s.items():
            np.testing.assert_array_equal(v.numpy(), state_before[id(p)][k])
    # A new optimizer and fused step over the new parameters train them.
    opt2 = optim.SGD(model.parameters(), lr=0.1)
    fused_step(model, F.cross_entropy, opt2)(x, y)
    assert not np.array_equal(new.numpy(), new_before)


def test_compile_optimizer_follows_its_param_groups():
    model = _mlp()
    ref = copy.deepcopy(model)
    opt = compile_optimizer(optim.SGD(model.parameters(), lr=0.1))
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    x, y = _x(), lucid.tensor(np.array([0, 1, 2, 3]))
    for m, o in ((model, opt), (ref, ref_opt)):
        _eager_step(m, x, y)
        o.step()
        o.zero_grad()
    # A parameter swapped inside param_groups: the compiled step updates the new object.
    for m, o in ((model, opt), (ref, ref_opt)):
        new = nn.Parameter(m[0].weight.detach() * 0.5)
        o.param_groups[0]["params"][0] = new
        m[0].weight = new
        _eager_step(m, x, y)
        o.step()
    _close(model[0].weight, ref[0].weight)
    assert opt.param_groups[0]["params"][0] is model[0].weight


_GLOBAL_MODEL = _mlp(seed=3)


def _helper(x):
    return _GLOBAL_MODEL(x)


def _calls_a_helper(x):
    return _helper(x) + 1.0


def test_a_function_reaching_a_model_through_a_helper():
    cf = lucid.compile(_calls_a_helper)
    x = _x()
    old = _GLOBAL_MODEL[2]
    try:
        with lucid.no_grad():
            cf(x)
            _GLOBAL_MODEL[2] = nn.Linear(16, 2)
            _close(cf(x), _calls_a_helper(x))
    finally:
        _GLOBAL_MODEL[2] = old
