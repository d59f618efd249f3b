"""The ``vjp`` pass: the synthesized backward graph, interpreted, gives eager autograd's
gradients; the forward results are unchanged; errors name what is wrong."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid.ir import feed_roles, forward_func, import_trace, interpret, result_roles
from lucid.ops._registry import REGISTRY, AVal, OpDef, register
from lucid.passes import PassFailure, PassManager
from lucid.passes.vjp import VJPError, differentiate
from lucid.testing import assert_close
from lucid.trace import _tracing, trace

_spec = importlib.util.spec_from_file_location(
    "training_models", os.path.join(os.path.dirname(__file__), "_training_models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


def _model_feeds(model, inputs) -> dict:
    feeds = {f"input:{i}": np.array(t.numpy(), copy=True) for i, t in enumerate(inputs)}
    for name, p in model.named_parameters():
        feeds[f"param:{name}"] = np.array(p.numpy(), copy=True)
    for name, b in model.named_buffers():
        feeds[f"buffer:{name}"] = np.array(b.numpy(), copy=True)
    return feeds


def _by_role(module, values) -> dict:
    return dict(zip(result_roles(forward_func(module)), values, strict=True))


@pytest.mark.parametrize("kind", models.MODEL_KINDS)
def test_vjp_of_model_matches_eager_autograd(kind):
    model, loss_fn, inputs = models.make(kind)

    def step(x, t):
        return loss_fn(model(x), t)

    module = import_trace(trace(step, *inputs, model=model))
    feeds = _model_feeds(model, inputs)
    before = _by_role(module, interpret(module, feeds))
    PassManager("vjp{wrt=params},canonicalize,cse,dce", verify_each=True).run(module)
    after = _by_role(module, interpret(module, feeds))

    for role, value in before.items():  # the forward results are untouched
        np.testing.assert_allclose(after[role], value, rtol=1e-6, atol=1e-7)
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    loss = step(*inputs)
    expected = lucid.autograd.grad(loss, params)
    assert_close(after["output:0"], loss.detach().numpy(), rtol=1e-5)
    assert sorted(r for r in after if r.startswith("grad:")) == sorted(
        f"grad:param:{n}" for n in names
    )
    for name, g in zip(names, expected, strict=True):
        got = after[f"grad:param:{name}"]
        assert got.shape == tuple(g.shape) and got.dtype == g.numpy().dtype
        assert_close(got, g.numpy(), rtol=2e-4, atol=2e-6)


@given(
    st.sampled_from([((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (2, 2))]),
)
def test_broadcast_operands_get_gradients_of_their_own_shape(shapes):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s) for s in shapes)

    def f(x, y):
        return (x * y + x / (y * y + 1.0)).sum()

    module = import_trace(trace(f, lucid.tensor(a), lucid.tensor(b)))
    differentiate(forward_func(module), wrt="inputs")
    module.verify()
    got = _by_role(module, interpret(module, [a, b]))
    xa, yb = lucid.tensor(a, requires_grad=True), lucid.tensor(b, requires_grad=True)
    ga, gb = lucid.autograd.grad(f(xa, yb), [xa, yb])
    assert got["grad:input:0"].shape == a.shape and got["grad:input:1"].shape == b.shape
    assert_close(got["grad:input:0"], ga.numpy(), rtol=1e-10)
    assert_close(got["grad:input:1"], gb.numpy(), rtol=1e-10)


def test_value_used_several_times_sums_its_gradients_and_multi_output_gets_zeros():
    def f(x):
        values, _ = lucid.max(x, dim=1)  # max_dim: the index output gets no gradient
        return (x.exp() * x).sum() + (values * values).sum() + x.mean()

    a = np.random.default_rng(2).standard_normal((3, 4))
    module = import_trace(trace(f, lucid.tensor(a)))
    differentiate(forward_func(module), wrt="input:0")
    got = _by_role(module, interpret(module, [a]))
    x = lucid.tensor(a, requires_grad=True)
    (expected,) = lucid.autograd.grad(f(x), [x])
    assert_close(got["grad:input:0"], expected.numpy(), rtol=1e-10)


def test_only_ops_between_wrt_and_loss_are_differentiated():
    w = lucid.tensor(np.ones((3, 3)))

    def f(x):
        side = (x * 2.0).exp()  # not on the loss path: no backward for it
        return (x @ w).sum(), side

    with _tracing() as tr:
        x = tr.input((2, 3), lucid.float64)
        out = tr.finish(f(x))
    module = import_trace(out)
    differentiate(forward_func(module), wrt="input:0")
    names = [op.name for op in forward_func(module).body.blocks.first.ops]
    assert names.count("lucid.exp") == 1  # only the forward one
    assert result_roles(forward_func(module))[-1] == "grad:input:0"


def test_unused_wrt_feed_gets_zeros_and_grad_sink_stops_the_gradient():
    def f(x, y):
        mask = (x > 0).float()  # gt is a grad sink: no gradient flows through the mask
        return (mask * x).sum()

    a = np.random.default_rng(3).standard_normal((4,))
    b = np.ones(2)
    module = import_trace(trace(f, lucid.tensor(a), lucid.tensor(b)))
    differentiate(forward_func(module), wrt="inputs")
    got = _by_role(module, interpret(module, [a, b]))
    np.testing.assert_array_equal(got["grad:input:0"], (a > 0).astype(np.float64))
    np.testing.assert_array_equal(got["grad:input:1"], np.zeros(2))


def test_seed_option_takes_the_output_gradient_as_a_feed():
    a = np.random.default_rng(4).standard_normal((3, 2))
    module = import_trace(trace(lambda x: x.sin() * 3.0, lucid.tensor(a)))
    with pytest.raises(PassFailure, match="seed=true"):
        PassManager("vjp{wrt=inputs}").run(module)
    PassManager("vjp{wrt=inputs seed=true}", verify_each=True).run(module)
    fn = forward_func(module)
    assert feed_roles(fn) == ["input:0", "grad_seed"]
    cot = np.random.default_rng(5).standard_normal((3, 2))
    got = _by_role(module, interpret(module, [a, cot]))
    assert_close(got["grad:input:0"], 3.0 * np.cos(a) * cot, rtol=1e-10)


def test_wrt_accepts_a_quoted_list_of_roles_and_rejects_unknown_ones():
    a, b = np.ones((2,)), np.full((2,), 3.0)
    module = import_trace(trace(lambda x, y: (x * y).sum(), lucid.tensor(a), lucid.tensor(b)))
    PassManager('vjp{wrt="input:1"}').run(module)
    got = _by_role(module, interpret(module, [a, b]))
    assert set(got) == {"output:0", "grad:input:1"}
    np.testing.assert_array_equal(got["grad:input:1"], a)
    module = import_trace(trace(lambda x: x.sum(), lucid.tensor(a)))
    with pytest.raises(VJPError, match="unknown feeds"):
        differentiate(forward_func(module), wrt="param:nope")
    with pytest.raises(VJPError, match="no result has role"):
        differentiate(forward_func(module), wrt="inputs", loss="output:7")


def test_op_without_rule_is_reported_by_name_and_count():
    op = register(
        OpDef(
            name="test_vjp_norule",
            operands=("x",),
            infer=lambda x: AVal(tuple(x.shape), x.dtype),
            kernel=lambda x: x * 2,
        )
    )
    try:
        from lucid._dispatch import apply

        def f(x):
            return (apply(op, apply(op, x)) + x).sum()

        module = import_trace(trace(f, lucid.tensor(np.ones(3))))
        with pytest.raises(VJPError, match=r"test_vjp_norule \(x2\)") as info:
            differentiate(forward_func(module), wrt="inputs")
        assert info.value.missing == {"test_vjp_norule": 2}
    finally:
        del REGISTRY[op.name]


def test_integer_feed_cannot_be_differentiated():
    module = import_trace(
        trace(lambda x, i: x.sum() + i.float().sum(), lucid.ones(2), lucid.tensor([1, 2]))
    )
    with pytest.raises(VJPError, match="not floating point"):
        differentiate(forward_func(module), wrt="inputs")


def test_gradients_keep_the_feed_dtype_under_mixed_precision():
    a = np.random.default_rng(6).standard_normal((3,)).astype(np.float32)
    b = np.random.default_rng(7).standard_normal((3,))

    def f(x, y):
        return F.softplus(x * y).sum()  # float32 * float64 promotes to float64

    module = import_trace(trace(f, lucid.tensor(a), lucid.tensor(b)))
    differentiate(forward_func(module), wrt="inputs")
    got = _by_role(module, interpret(module, [a, b]))
    xa, yb = lucid.tensor(a, requires_grad=True), lucid.tensor(b, requires_grad=True)
    ga, gb = lucid.autograd.grad(f(xa, yb), [xa, yb])
    assert got["grad:input:0"].dtype == np.float32 and got["grad:input:1"].dtype == np.float64
    assert_close(got["grad:input:0"], ga.numpy(), rtol=1e-6)
    assert_close(got["grad:input:1"], gb.numpy(), rtol=1e-6)


def test_require_env_fails_on_an_uncovered_op_off_the_loss_path(monkeypatch):
    op = register(
        OpDef(
            name="test_vjp_offpath",
            operands=("x",),
            infer=lambda x: AVal(tuple(x.shape), x.dtype),
            kernel=lambda x: x * 2,
        )
    )
    try:
        from lucid._dispatch import apply

        def f(x):
            return x.sum(), apply(op, x)  # the op feeds a side output, not the loss

        def build():
            return import_trace(trace(f, lucid.tensor(np.ones(3))))

        differentiate(forward_func(build()), wrt="inputs")  # not needed: fine by default
        monkeypatch.setenv("LUCID_MANUAL_VJP_REQUIRE", "1")
        with pytest.raises(VJPError, match=r"test_vjp_offpath \(x1\)"):
            differentiate(forward_func(build()), wrt="inputs")
    finally:
        del REGISTRY[op.name]


def test_differentiating_twice_is_an_error():
    module = import_trace(trace(lambda x: x.exp().sum(), lucid.tensor(np.ones(2))))
    differentiate(forward_func(module), wrt="inputs")
    with pytest.raises(VJPError, match="already returns"):
        differentiate(forward_func(module), wrt="inputs")
