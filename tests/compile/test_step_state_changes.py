"""A compiled training step follows the optimizer's state as eager does when the user changes it
between steps: a layer frozen and trained again (Adam's step counts within a group drift apart),
state tensors replaced or emptied, a parameter group added. Each case runs an eager twin and
compares parameters and optimizer state after every step. Inputs a step cannot compile faithfully
(a tuple holding tensors, a tensor that requires grad) are refused with the reason."""

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid import nn


def _twins(opt_cls=lucid.optim.Adam, **kw):
    def make():
        lucid.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        return m, opt_cls(m.parameters(), **kw)

    return make(), make()


def _batches(n):
    lucid.manual_seed(1)
    return [(lucid.randn(6, 4), lucid.randint(0, 3, (6,))) for _ in range(n)]


def _eager_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _compiled_step(kind, model, opt):
    if kind == "fused_step":
        return lucid.compile.fused_step(model, F.cross_entropy, opt)
    lucid.compile.compile_optimizer(opt)

    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _assert_same(me, oe, mc, oc):
    for a, b in zip(me.parameters(), mc.parameters(), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    for a, b in zip(me.parameters(), mc.parameters(), strict=True):
        se, sc = oe.state.get(a, {}), oc.state.get(b, {})
        assert set(se) == set(sc)
        for k in se:
            np.testing.assert_allclose(
                np.asarray(sc[k].numpy()), np.asarray(se[k].numpy()), rtol=1e-5, atol=1e-6
            )


KINDS = ["fused_step", "compile_optimizer"]


@pytest.mark.parametrize("kind", KINDS)
def test_freezing_then_unfreezing_a_layer_keeps_each_parameters_bias_correction(kind):
    # While the first layer is frozen its step count stops; Adam's bias correction is then per
    # parameter, and a step fed once per group (from the frozen weight) was wrong.
    (me, oe), (mc, oc) = _twins(lr=1e-2)
    step = _compiled_step(kind, mc, oc)
    for i, (x, y) in enumerate(_batches(8)):
        if i in (2, 5):
            frozen = i == 2
            me[0].requires_grad_(not frozen)
            mc[0].requires_grad_(not frozen)
        _eager_step(me, oe, x, y)
        step(x, y)
        _assert_same(me, oe, mc, oc)
    assert float(oc.state[mc[0].weight]["step"].item()) == 5.0  # 2 before, 3 after the freeze
    assert float(oc.state[mc[2].weight]["step"].item()) == 8.0


@pytest.mark.parametrize("kind", KINDS)
def test_replaced_state_tensors_are_the_ones_the_next_step_updates(kind):
    (me, oe), (mc, oc) = _twins(lr=1e-2)
    step = _compiled_step(kind, mc, oc)
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:  # a reset in place of the optimizer's own tensors
            for m, o in ((me, oe), (mc, oc)):
                for p in m.parameters():
                    o.state[p]["exp_avg"] = lucid.zeros_like(p)
                    o.state[p]["exp_avg_sq"] = lucid.zeros_like(p)
                    o.state[p]["step"] = lucid.tensor(0.0)
        _eager_step(me, oe, x, y)
        step(x, y)
        _assert_same(me, oe, mc, oc)
    assert float(oc.state[mc[0].weight]["step"].item()) == 3.0


@pytest.mark.parametrize("kind", KINDS)
def test_an_emptied_parameter_state_starts_afresh_as_in_eager(kind):
    (me, oe), (mc, oc) = _twins(lr=1e-2)
    step = _compiled_step(kind, mc, oc)
    for i, (x, y) in enumerate(_batches(4)):
        if i == 2:
            oe.state[me[0].weight] = {}
            oc.state[mc[0].weight] = {}
        _eager_step(me, oe, x, y)
        step(x, y)
        _assert_same(me, oe, mc, oc)
    assert float(oc.state[mc[0].weight]["step"].item()) == 2.0


def test_a_parameter_group_added_after_compiling_is_trained():
    # Progressive unfreezing: the last layer first, the first layer's group added later.
    def make():
        lucid.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        m[0].requires_grad_(False)
        return m, lucid.optim.SGD(m[2].parameters(), lr=0.1, momentum=0.9)

    (me, oe), (mc, oc) = make(), make()
    step = lucid.compile.fused_step(mc, F.cross_entropy, oc)
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:
            for m, o in ((me, oe), (mc, oc)):
                m[0].requires_grad_(True)
                o.add_param_group({"params": list(m[0].parameters()), "lr": 0.05})
        _eager_step(me, oe, x, y)
        step(x, y)
        _assert_same(me, oe, mc, oc)
    assert not np.allclose(mc[0].weight.numpy(), make()[0][0].weight.numpy())


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, pair):
        x, z = pair
        return self.a(x) + self.b(z)


@pytest.mark.parametrize("kind", ["fused_step", "make_step"])
def test_a_tuple_of_tensors_as_a_step_input_is_refused_with_the_reason(kind):
    # Hashable by the tensors' identities, it would be baked in and compiled anew every call
    # (and the recompile explanation compared tensors with ==, which raised).
    m = _TwoInputs()
    if kind == "fused_step":
        step = lucid.compile.fused_step(m, F.cross_entropy, lucid.optim.SGD(m.parameters(), lr=0.1))
    else:
        step = lucid.compile.make_step(m, F.cross_entropy)
    before = [p.numpy().copy() for p in m.parameters()]
    with pytest.raises(TypeError, match="not a tuple holding tensors"):
        step((lucid.randn(6, 4), lucid.randn(6, 4)), lucid.randint(0, 3, (6,)))
    for p, old in zip(m.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), old)


@pytest.mark.parametrize("kind", ["fused_step", "make_step"])
def test_an_input_that_requires_grad_is_refused(kind):
    # A parameter (or a tensor computed from one) as the input: eager sends a gradient through
    # it, the compiled step fed it as a constant (the weight's gradient missed that path).
    lucid.manual_seed(0)
    m = nn.Linear(4, 4)

    def loss_fn(out, t):
        return (out * t).sum()

    if kind == "fused_step":
        step = lucid.compile.fused_step(m, loss_fn, lucid.optim.SGD(m.parameters(), lr=0.1))
    else:
        step = lucid.compile.make_step(m, loss_fn)
    before = [p.numpy().copy() for p in m.parameters()]
    t = lucid.ones(4, 4)
    for x in (m.weight, m.weight * 2.0, lucid.randn(4, 4).requires_grad_()):
        with pytest.raises(lucid.compile.CompileError, match="input 0 requires grad"):
            step(x, t)
    for p, old in zip(m.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), old)
    assert all(p.grad is None for p in m.parameters())
    step(m.weight.detach(), t)  # the documented way out
