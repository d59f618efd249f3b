"""``ghost-grads`` and ``build_training_module``: an optimizer update traced against ghost
gradient feeds, bound to the ``vjp`` pass's gradients, computes what eager backward + step do."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import lucid
from lucid import optim
from lucid.compile.training import build_training_module
from lucid.ir import feed_roles, forward_func, import_trace, interpret, result_roles
from lucid.passes import PassFailure, PassManager
from lucid.testing import assert_close
from lucid.trace import _tracing

_spec = importlib.util.spec_from_file_location(
    "training_models", os.path.join(os.path.dirname(__file__), "_training_models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

OPTIMIZERS = [
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    (optim.AdamW, dict(lr=0.01)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    (optim.Adadelta, dict(lr=1.0, weight_decay=0.01)),
    (optim.Adamax, dict(lr=0.01)),
    (optim.NAdam, dict(lr=0.01)),
    (optim.RAdam, dict(lr=0.01)),
]


def _sgd_step_module():
    """forward + loss + a hand-written SGD update reading ghost gradient feeds."""
    w0 = np.random.default_rng(0).standard_normal((3, 2))
    b0 = np.random.default_rng(1).standard_normal((2,))
    with _tracing() as tr:
        x = tr.input((4, 3), lucid.float64)
        w = tr.input((3, 2), lucid.float64, role="param:w")
        b = tr.input((2,), lucid.float64, role="param:b")
        loss = ((x @ w + b).tanh() ** 2).mean()
        gw = tr.input((3, 2), lucid.float64, role="ghost:param:w")
        gb = tr.input((2,), lucid.float64, role="ghost:param:b")
        trace = tr.finish([loss, w - gw * 0.5, b - gb * 0.5])
    module = import_trace(trace)
    return module, w0, b0


def test_ghost_feeds_are_bound_to_the_vjp_gradients():
    module, w0, b0 = _sgd_step_module()
    xa = np.random.default_rng(2).standard_normal((4, 3))
    x = lucid.tensor(xa)
    w, b = lucid.tensor(w0, requires_grad=True), lucid.tensor(b0, requires_grad=True)
    gw, gb = lucid.autograd.grad(((x @ w + b).tanh() ** 2).mean(), [w, b])
    before = interpret(
        module,
        {
            "input:0": xa,
            "param:w": w0,
            "param:b": b0,
            "ghost:param:w": gw.numpy(),
            "ghost:param:b": gb.numpy(),
        },
    )
    PassManager("vjp{wrt=params},ghost-grads,canonicalize,cse,dce", verify_each=True).run(module)
    fn = forward_func(module)
    assert feed_roles(fn) == ["input:0", "param:w", "param:b"]
    assert result_roles(fn) == ["output:0", "output:1", "output:2"]
    after = interpret(module, {"input:0": xa, "param:w": w0, "param:b": b0})
    for a, e in zip(after, before, strict=True):
        assert_close(a, e, rtol=1e-12)
    assert_close(after[1], w0 - 0.5 * gw.numpy(), rtol=1e-12)


def test_keep_grads_keeps_the_gradient_results():
    module, w0, b0 = _sgd_step_module()
    PassManager("vjp{wrt=params},ghost-grads{keep-grads=true}", verify_each=True).run(module)
    roles = result_roles(forward_func(module))
    assert roles[-2:] == ["grad:param:w", "grad:param:b"]
    assert not any(r.startswith("ghost:") for r in feed_roles(forward_func(module)))


def test_ghost_without_gradient_is_an_error_naming_it():
    module, _, _ = _sgd_step_module()
    with pytest.raises(PassFailure, match=r"ghost:param:b"):
        PassManager('vjp{wrt="param:w"},ghost-grads').run(module)


def _state_arrays(opt, params):
    return [{k: np.array(v.numpy(), copy=True) for k, v in opt.state[p].items()} for p in params]


@pytest.mark.parametrize("kind", models.MODEL_KINDS)
@pytest.mark.parametrize("cls, options", OPTIMIZERS, ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_training_module_step_matches_eager_backward_and_step(kind, cls, options):
    model, loss_fn, inputs = models.make(kind)
    eager_model, _, _ = models.make(kind)
    opt, eager_opt = cls(model.parameters(), **options), cls(eager_model.parameters(), **options)
    tm = build_training_module(model, loss_fn, inputs, opt)
    assert all(not r.startswith(("ghost:", "grad:")) for r in tm.feed_roles + tm.result_roles)
    for _ in range(2):  # the second step checks the refreshed scalars and written-back state
        loss = tm.write_back(interpret(tm.module, tm.feed_values(*inputs)))
        tm.refresh_scalars()
        eager_opt.zero_grad()
        eager_loss = loss_fn(eager_model(inputs[0]), *inputs[1:])
        eager_loss.backward()
        eager_opt.step()
        assert_close(loss, eager_loss.detach().numpy(), rtol=1e-5)
        params, eager_params = list(model.parameters()), list(eager_model.parameters())
        for p, ep in zip(params, eager_params, strict=True):
            assert_close(p.detach().numpy(), ep.detach().numpy(), rtol=1e-4, atol=1e-6)
        for st, est in zip(
            _state_arrays(opt, params), _state_arrays(eager_opt, eager_params), strict=True
        ):
            assert st.keys() == est.keys()
            for k in st:
                assert_close(st[k], est[k], rtol=1e-4, atol=1e-6)
        for (_, b), (_, eb) in zip(model.named_buffers(), eager_model.named_buffers(), strict=True):
            assert_close(b.numpy(), eb.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", models.MODEL_KINDS)
def test_training_module_without_optimizer_returns_gradients(kind):
    model, loss_fn, inputs = models.make(kind)
    tm = build_training_module(model, loss_fn, inputs)
    got = dict(zip(tm.result_roles, interpret(tm.module, tm.feed_values(*inputs)), strict=True))
    named = list(model.named_parameters())
    expected = lucid.autograd.grad(loss_fn(model(inputs[0]), *inputs[1:]), [p for _, p in named])
    for (name, _), g in zip(named, expected, strict=True):
        assert_close(got[f"grad:param:{name}"], g.numpy(), rtol=2e-4, atol=2e-6)


def test_training_module_rejects_a_non_scalar_loss():
    model, _, inputs = models.make("mlp")
    with pytest.raises(ValueError, match="one-element"):
        build_training_module(model, lambda out, t: out, inputs)


def test_docs_training_example_runs_and_matches_eager_steps():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "passes.md").read_text()
    section = doc[doc.index("## Training passes") :]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    ns: dict = {}
    exec(code, ns)
    # the same three steps eagerly, from the same seed
    lucid.manual_seed(0)
    nn, F = ns["nn"], ns["F"]
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x, target = lucid.randn(5, 4), ns["target"]
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
    assert_close(ns["loss"], loss.detach().numpy(), rtol=1e-5)
    for p, ep in zip(ns["model"].parameters(), model.parameters(), strict=True):
        assert_close(p.detach().numpy(), ep.detach().numpy(), rtol=1e-5, atol=1e-7)


class _PartlyUsed(lucid.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = lucid.nn.Linear(3, 2)
        self.side = lucid.nn.Linear(3, 2)  # only reaches the loss through a comparison
        self.frozen = lucid.nn.Linear(2, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        gate = (self.side(x) > 0).float()
        return self.frozen(self.used(x) * gate)


def test_only_parameters_with_an_eager_gradient_are_updated():
    lucid.manual_seed(0)
    model = _PartlyUsed()
    lucid.manual_seed(0)
    eager_model = _PartlyUsed()
    x = lucid.randn(4, 3)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    eager_opt = optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    tm = build_training_module(model, lambda out: out.sum(), (x,), opt)
    updated = {r for r in tm.result_roles if r.startswith("update:param:")}
    assert updated == {"update:param:used.weight", "update:param:used.bias"}
    tm.write_back(interpret(tm.module, tm.feed_values(x)))
    eager_model(x).sum().backward()
    eager_opt.step()
    for p, ep in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert_close(p.detach().numpy(), ep.detach().numpy(), rtol=1e-6)
    assert set(opt.state) == {model.used.weight, model.used.bias}


def test_dropout_draws_from_the_rng_feed_as_eager_does():
    def make():
        lucid.manual_seed(0)
        return lucid.nn.Sequential(
            lucid.nn.Linear(4, 16), lucid.nn.Dropout(0.3), lucid.nn.ReLU(), lucid.nn.Linear(16, 2)
        )

    model, eager_model = make(), make()
    x, t = lucid.randn(6, 4), lucid.randn(6, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    eager_opt = optim.SGD(eager_model.parameters(), lr=0.1)
    tm = build_training_module(model, lucid.nn.functional.mse_loss, (x, t), opt)
    assert "rng" in tm.feed_roles and "update:rng" in tm.result_roles
    lucid.manual_seed(5)
    losses = [tm.write_back(interpret(tm.module, tm.feed_values(x, t))) for _ in range(2)]
    lucid.manual_seed(5)
    for loss in losses:  # different masks each step, as eager draws them
        eager_opt.zero_grad()
        eager_loss = lucid.nn.functional.mse_loss(eager_model(x), t)
        eager_loss.backward()
        eager_opt.step()
        assert_close(loss, eager_loss.detach().numpy(), rtol=1e-6)
    for p, ep in zip(model.parameters(), eager_model.parameters(), strict=True):
        assert_close(p.detach().numpy(), ep.detach().numpy(), rtol=1e-6)
