"""Parity checking of training steps: ``check="first"|"always"`` on ``make_step``,
``compiled_step`` and ``fused_step`` compares the loss, the gradients and every update with an
eager step; a mismatch leaves the eager step's values (parameters, optimizer state, buffers),
makes the signature eager-only and bisects to the guilty pass or lowering rule (tests inject a
broken pass and broken lowering rules, in the forward, the backward and the optimizer update)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.ir import _xdsl as x
from lucid.passes import registry as pass_registry
from lucid.passes.lowering import _core as lowering_core


class Net(nn.Module):
    """A forward with ``sub`` and ``relu`` (whose backward is ``threshold_backward``) and a
    BatchNorm (running statistics are updated in place)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(self.bn(x))
        return h - 2.0 * h.relu()


def mse(y, t):
    return ((y - t) ** 2).mean()


@dataclass(frozen=True)
class SwapSub(x.ModulePass):
    """Deliberately wrong: swaps the operands of every ``lucid.sub``."""

    name = "test-step-swap-sub"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for o in list(op.walk()):
            if o.name == "lucid.sub":
                a, b = o.operands
                o.operands = (b, a)


@dataclass(frozen=True)
class BreakReluGrad(x.ModulePass):
    """Deliberately wrong in the backward only: relu's gradient reads the other operand."""

    name = "test-step-break-relu-grad"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for o in list(op.walk()):
            if o.name == "lucid.threshold_backward":
                grad, v = o.operands
                o.operands = (v, grad)


@pytest.fixture
def broken_passes():
    for cls in (SwapSub, BreakReluGrad):
        pass_registry.register_pass(cls)
    yield
    for cls in (SwapSub, BreakReluGrad):
        pass_registry._PASSES.pop(cls.name, None)


@pytest.fixture(autouse=True)
def _debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    monkeypatch.delenv("LUCID_COMPILE_CHECK", raising=False)


def _break_rule(monkeypatch, name, replacement):
    monkeypatch.setitem(lowering_core.RULES, name, replacement)


def _data(seed=0, n=6):
    rng = np.random.default_rng(seed)
    return (
        lucid.tensor(rng.standard_normal((n, 4)).astype(np.float32)),
        lucid.tensor(rng.standard_normal((n, 3)).astype(np.float32)),
    )


def _eager_grads(model, xb, tb):
    model.zero_grad()
    loss = mse(model(xb), tb)
    loss.backward()
    return loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def _assert_same_state(a, b, rtol=1e-5, atol=1e-6):
    for (name, ta), (_, tb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        np.testing.assert_allclose(ta.numpy(), tb.numpy(), rtol=rtol, atol=atol, err_msg=name)


def _assert_same_optimizer(a, b, rtol=1e-5, atol=1e-6):
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for name in sa[k]:
            va, vb = sa[k][name], sb[k][name]
            va = va.numpy() if hasattr(va, "numpy") else va
            vb = vb.numpy() if hasattr(vb, "numpy") else vb
            np.testing.assert_allclose(va, vb, rtol=rtol, atol=atol, err_msg=f"{k}.{name}")


# --- make_step / compiled_step ----------------------------------------------------------------
def test_make_step_check_first_on_a_correct_model_stays_compiled():
    model = Net()
    ref = copy.deepcopy(model)
    step = lucid.compile.make_step(model, mse, check="first")
    for seed in range(3):
        xb, tb = _data(seed)
        model.zero_grad()
        loss = step(xb, tb)
        loss.backward()
        want_loss, want_grads = _eager_grads(ref, xb, tb)
        assert abs(loss.item() - want_loss) < 1e-5
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), want_grads[name], rtol=1e-4, atol=1e-6)
        _assert_same_state(model, ref)  # BatchNorm running statistics
    info = step.cache_info()
    assert info["entries"] == 1 and info["eager_only"] == () and info["parity"] == []


def test_make_step_broken_pass_is_named_and_user_gets_eager(broken_passes, tmp_path):
    model = Net()
    ref = copy.deepcopy(model)
    step = lucid.compile.make_step(
        model, mse, check="first", options={"pipeline": "canonicalize,test-step-swap-sub,cse,dce"}
    )
    for seed in range(2):  # the first call finds it; the second runs eagerly
        xb, tb = _data(seed)
        model.zero_grad()
        loss = step(xb, tb)
        loss.backward()
        want_loss, want_grads = _eager_grads(ref, xb, tb)
        assert abs(loss.item() - want_loss) < 1e-6
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), want_grads[name], rtol=1e-5, atol=1e-7)
        _assert_same_state(model, ref)
    info = step.cache_info()
    assert info["entries"] == 0 and len(info["eager_only"]) == 1
    (reason,) = info["reasons"].values()
    assert "parity check failed" in reason and "test-step-swap-sub" in reason
    (record,) = info["parity"]
    culprit = record["culprit"]
    assert culprit.stage == "pass" and culprit.pass_name == "test-step-swap-sub"
    assert culprit.op == "rewritten in place: lucid.sub"
    folder = culprit.folder
    assert folder.startswith(str(tmp_path)) and folder in reason
    assert {"trace.json", "before.mlir", "after.mlir", "README.txt", "inputs"} <= set(
        os.listdir(folder)
    )
    assert "input_0.npy" in os.listdir(os.path.join(folder, "inputs"))
    readme = open(os.path.join(folder, "README.txt")).read()
    assert "lucid-opt" in readme and "test-step-swap-sub" in readme


def test_a_pass_that_breaks_only_gradients_is_found(broken_passes):
    model = Net()
    step = lucid.compile.make_step(
        model, mse, check="first", options={"pipeline": "canonicalize,test-step-break-relu-grad"}
    )
    step(*_data())
    (record,) = step.cache_info()["parity"]
    assert record["mismatch"].startswith("grad:param:")  # the loss itself agrees
    culprit = record["culprit"]
    assert culprit.pass_name == "test-step-break-relu-grad"
    assert culprit.op == "rewritten in place: lucid.threshold_backward"


def test_make_step_broken_forward_lowering_rule_names_the_op(monkeypatch):
    good = lowering_core.RULES["sub"]
    _break_rule(monkeypatch, "sub", lambda b, a, c: good(b, c, a))
    model = Net()
    ref = copy.deepcopy(model)
    step = lucid.compile.make_step(model, mse, check="first")
    xb, tb = _data()
    loss = step(xb, tb)
    loss.backward()
    want_loss, want_grads = _eager_grads(ref, xb, tb)
    assert abs(loss.item() - want_loss) < 1e-6
    np.testing.assert_allclose(model.fc.weight.grad.numpy(), want_grads["fc.weight"], rtol=1e-5)
    (record,) = step.cache_info()["parity"]
    culprit = record["culprit"]
    assert culprit.stage == "lowering" and culprit.pass_name == "lower-to-prim"
    assert culprit.op == "lucid.sub"
    assert "lower-to-prim" in culprit.files["command"]


def test_broken_backward_lowering_rule_is_found_in_the_differentiated_step(monkeypatch):
    # threshold_backward exists only after vjp: op by op over the differentiated module.
    _break_rule(monkeypatch, "threshold_backward", lambda b, grad, v, threshold: grad)
    step = lucid.compile.make_step(Net(), mse, check="first")
    step(*_data())
    (record,) = step.cache_info()["parity"]
    culprit = record["culprit"]
    assert culprit.pass_name == "lower-to-prim" and culprit.op == "lucid.threshold_backward"
    assert "differentiated step" in culprit.detail


def test_compiled_step_env_check_and_settable_tolerance(monkeypatch):
    good = lowering_core.RULES["sub"]
    _break_rule(monkeypatch, "sub", lambda b, a, c: good(b, c, a))
    monkeypatch.setenv("LUCID_COMPILE_CHECK", "first")
    model, ref = Net(), None
    ref = copy.deepcopy(model)
    xb, tb = _data()
    loss = lucid.compile.compiled_step(model, xb, mse, tb)
    want_loss, want_grads = _eager_grads(ref, xb, tb)
    assert abs(loss.item() - want_loss) < 1e-6
    np.testing.assert_allclose(model.fc.weight.grad.numpy(), want_grads["fc.weight"], rtol=1e-5)
    # A tolerance that lets everything through keeps the (wrong) compiled step.
    loose = lucid.compile.make_step(Net(), mse, check_tolerance=(1e9, 1e9))
    loose(xb, tb)
    assert loose.cache_info()["parity"] == [] and loose.cache_info()["entries"] == 1
    with pytest.raises(ValueError, match="check must be"):
        lucid.compile.make_step(model, mse, check="sometimes")
    with pytest.raises(ValueError, match="check_tolerance"):
        lucid.compile.fused_step(
            model,
            mse,
            lucid.optim.SGD(model.parameters(), lr=0.1),
            check="first",
            check_tolerance=(1e-3,),
        )


# --- fused_step -------------------------------------------------------------------------------
def _fused_pair(make_opt, **kw):
    model = Net()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
    return model, ref, opt, ref_opt, lucid.compile.fused_step(model, mse, opt, **kw)


def _eager_step(model, opt, xb, tb):
    opt.zero_grad()
    loss = mse(model(xb), tb)
    loss.backward()
    opt.step()
    return loss.item()


def _sgd(params):
    return lucid.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)


def _adam(params):
    return lucid.optim.Adam(params, lr=0.01)


@pytest.mark.parametrize("make_opt", [_sgd, _adam], ids=["sgd-momentum", "adam"])
@pytest.mark.parametrize("mode", ["first", "always"])
def test_fused_step_check_on_a_correct_step_matches_eager(make_opt, mode):
    model, ref, opt, ref_opt, step = _fused_pair(make_opt, check=mode)
    for seed in range(3):
        xb, tb = _data(seed)
        loss = step(xb, tb)
        assert abs(loss.item() - _eager_step(ref, ref_opt, xb, tb)) < 1e-5
        _assert_same_state(model, ref)
        _assert_same_optimizer(opt, ref_opt)
    info = step.cache_info()
    assert info["entries"] == 1 and info["parity"] == [] and info["eager_only"] == ()
    assert all(p.grad is None for p in model.parameters())  # a fused step never fills .grad
    # The compiled entry still binds the optimizer's state tensors: later steps stay right.
    xb, tb = _data(7)
    step(xb, tb)
    _eager_step(ref, ref_opt, xb, tb)
    _assert_same_state(model, ref)
    _assert_same_optimizer(opt, ref_opt)


@pytest.mark.parametrize("make_opt", [_sgd, _adam], ids=["sgd-momentum", "adam"])
def test_fused_step_broken_pass_leaves_eager_parameters_and_state(broken_passes, make_opt):
    model, ref, opt, ref_opt, step = _fused_pair(
        make_opt, check="first", options={"pipeline": "canonicalize,test-step-swap-sub,cse,dce"}
    )
    for seed in range(3):
        xb, tb = _data(seed)
        loss = step(xb, tb)
        assert abs(loss.item() - _eager_step(ref, ref_opt, xb, tb)) < 1e-6
        _assert_same_state(model, ref)  # parameters and BatchNorm statistics
        _assert_same_optimizer(opt, ref_opt)
    info = step.cache_info()
    assert info["entries"] == 0 and len(info["eager_only"]) == 1
    (record,) = info["parity"]
    assert record["culprit"].pass_name == "test-step-swap-sub"
    assert record["culprit"].op == "rewritten in place: lucid.sub"
    assert all(p.grad is None for p in model.parameters())


def test_fused_step_broken_optimizer_lowering_rule_is_named(monkeypatch):
    # sqrt appears only in Adam's update.
    _break_rule(monkeypatch, "sqrt", lambda b, v: b.op("exp", b.cast(v, b.outs[0].dtype)))
    model, ref, opt, ref_opt, step = _fused_pair(_adam, check="first")
    xb, tb = _data()
    loss = step(xb, tb)
    assert abs(loss.item() - _eager_step(ref, ref_opt, xb, tb)) < 1e-6
    _assert_same_state(model, ref)
    _assert_same_optimizer(opt, ref_opt)
    (record,) = step.cache_info()["parity"]
    assert record["mismatch"].startswith("update:")
    culprit = record["culprit"]
    assert culprit.pass_name == "lower-to-prim" and culprit.op == "lucid.sqrt"


def test_fused_step_broken_lowering_other_signatures_stay_compiled(monkeypatch):
    model, ref, opt, ref_opt, step = _fused_pair(_sgd, check="first")
    xb, tb = _data(0, n=6)
    step(xb, tb)
    _eager_step(ref, ref_opt, xb, tb)
    good = lowering_core.RULES["sub"]
    _break_rule(monkeypatch, "sub", lambda b, a, c: good(b, c, a))
    for seed in (1, 2):  # a new batch size compiles with the broken rule
        xb, tb = _data(seed, n=5)
        step(xb, tb)
        _eager_step(ref, ref_opt, xb, tb)
        _assert_same_state(model, ref)
        _assert_same_optimizer(opt, ref_opt)
    info = step.cache_info()
    assert info["entries"] == 1 and len(info["eager_only"]) == 1
    assert info["parity"][0]["culprit"].op == "lucid.sub"
    xb, tb = _data(3, n=6)  # the first signature's compiled entry still binds the state
    step(xb, tb)
    _eager_step(ref, ref_opt, xb, tb)
    _assert_same_state(model, ref)
    _assert_same_optimizer(opt, ref_opt)


# --- compile_optimizer ------------------------------------------------------------------------
def _optimizer_steps(model, opt, ref, ref_opt, seeds):
    for seed in seeds:
        xb, tb = _data(seed)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            mse(m(xb), tb).backward()
            o.step()
        _assert_same_state(model, ref)
        _assert_same_optimizer(opt, ref_opt)


@pytest.mark.parametrize("make_opt", [_sgd, _adam], ids=["sgd-momentum", "adam"])
def test_compile_optimizer_check_on_a_correct_update(make_opt):
    model = Net()
    ref = copy.deepcopy(model)
    opt = lucid.compile.compile_optimizer(make_opt(model.parameters()), check="always")
    _optimizer_steps(model, opt, ref, make_opt(ref.parameters()), range(3))
    info = opt.step.cache_info()
    assert info["entries"] == 1 and info["parity"] == []


def test_compile_optimizer_broken_lowering_rule_leaves_eager_values(monkeypatch):
    _break_rule(monkeypatch, "sqrt", lambda b, v: b.op("exp", b.cast(v, b.outs[0].dtype)))
    model = Net()
    ref = copy.deepcopy(model)
    opt = lucid.compile.compile_optimizer(_adam(model.parameters()), check="first")
    _optimizer_steps(model, opt, ref, _adam(ref.parameters()), range(3))
    info = opt.step.cache_info()
    assert info["entries"] == 0 and len(info["eager_only"]) == 1
    (record,) = info["parity"]
    assert record["mismatch"].startswith("update:")
    assert record["culprit"].pass_name == "lower-to-prim" and record["culprit"].op == "lucid.sqrt"


@pytest.mark.parametrize("broken", [False, True])
def test_compile_optimizer_check_with_clipping(broken, monkeypatch):
    if broken:
        _break_rule(monkeypatch, "sqrt", lambda b, v: b.op("exp", b.cast(v, b.outs[0].dtype)))
    model = Net()
    ref = copy.deepcopy(model)
    opt = lucid.compile.compile_optimizer(
        _adam(model.parameters()), check="always", max_grad_norm=0.05
    )
    ref_opt = _adam(ref.parameters())
    for seed in range(2):
        xb, tb = _data(seed)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            mse(m(xb), tb).backward()
        opt.step()
        norm = lucid.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.05)
        ref_opt.step()
        assert abs(opt.step.grad_norm.item() - norm.item()) < 1e-5
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, err_msg=name)
        _assert_same_state(model, ref)
        _assert_same_optimizer(opt, ref_opt)
    info = opt.step.cache_info()
    assert (len(info["parity"]) == 1) == broken
    if broken:
        assert info["parity"][0]["culprit"].op == "lucid.sqrt"
