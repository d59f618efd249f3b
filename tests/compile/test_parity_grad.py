"""Parity checking of compiled calls in grad mode: outputs and, through a probe backward,
the gradients of inputs and parameters are compared with eager; a mismatch gives eager's
outputs (and so eager's gradients), makes the signature eager-only and bisects to the guilty
pass or lowering rule, in the forward or the backward (VJP) part."""

from __future__ import annotations

import os

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.passes import registry as pass_registry
from lucid.passes.lowering import _core as lowering_core

from .test_parity import Diff, SwapSub


class TanhNet(nn.Module):
    """No ``sub`` in the forward; tanh's VJP (g * (1 - y*y)) has one in the backward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).tanh() * 3.0


@pytest.fixture
def broken_pass():
    pass_registry.register_pass(SwapSub)
    yield "canonicalize,test-swap-sub,cse,dce"
    pass_registry._PASSES.pop("test-swap-sub", None)


@pytest.fixture
def broken_lowering(monkeypatch):
    good = lowering_core.RULES["sub"]
    monkeypatch.setitem(lowering_core.RULES, "sub", lambda b, a, c: good(b, c, a))


def _grads(model, cm, x):
    """The call's output and the gradients (parameters, input) after a backward, by eager and
    by the compiled wrapper, from the same state."""
    results = []
    for fn in (model, cm):
        model.zero_grad()
        xi = lucid.tensor(x.numpy(), requires_grad=True)
        out = fn(xi)
        (out * lucid.arange(out.numel()).reshape(out.shape).float()).sum().backward()
        results.append(
            (out.detach().numpy(), [p.grad.numpy() for p in model.parameters()], xi.grad.numpy())
        )
    return results


def _assert_same(a, b, rtol=1e-6, atol=1e-7):
    np.testing.assert_allclose(a[0], b[0], rtol=rtol, atol=atol)
    for g, w in zip(a[1], b[1], strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    np.testing.assert_allclose(a[2], b[2], rtol=rtol, atol=atol)


def _culprit(cm):
    info = cm.cache_info()
    assert info["entries"] == 0 and len(info["eager_only"]) == 1
    (key,) = info["eager_only"]
    assert key[3]  # the grad-mode signature
    (reason,) = info["reasons"].values()
    (record,) = info["parity"]
    culprit = record["culprit"]
    assert culprit is not None and culprit.folder in reason
    return record, culprit


def test_a_correct_model_stays_compiled_in_grad_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 2))
    cm = lucid.compile(model, check="always")
    x = lucid.randn(6, 4)
    for _ in range(2):
        eager, compiled = _grads(model, cm, x)
        _assert_same(compiled, eager, rtol=1e-4, atol=1e-5)
    info = cm.cache_info()
    assert info["parity"] == [] and info["entries"] == 1 and info["eager_only"] == ()
    assert not os.listdir(tmp_path)


def test_broken_pass_in_the_forward_is_named_in_grad_mode(broken_pass, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = Diff()
    cm = lucid.compile(model, check="first", options={"pipeline": broken_pass})
    x = lucid.randn(3, 4)
    eager, compiled = _grads(model, cm, x)
    _assert_same(compiled, eager)  # the user got eager's outputs and gradients
    record, culprit = _culprit(cm)
    assert record["mismatch"].startswith("output 0")
    assert culprit.stage == "pass" and culprit.pass_name == "test-swap-sub"
    assert "lucid.sub" in culprit.op
    assert {"trace.json", "before.mlir", "after.mlir", "README.txt", "inputs"} <= set(
        os.listdir(culprit.folder)
    )
    eager, compiled = _grads(model, cm, x)  # later calls: eager, right
    _assert_same(compiled, eager)


def test_broken_pass_in_the_backward_only_is_caught_by_the_gradients(
    broken_pass, tmp_path, monkeypatch
):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = TanhNet()
    cm = lucid.compile(model, check="first", options={"pipeline": broken_pass})
    x = lucid.randn(3, 4)
    eager, compiled = _grads(model, cm, x)
    _assert_same(compiled, eager)
    record, culprit = _culprit(cm)
    assert record["mismatch"].startswith("gradient of "), record["mismatch"]
    assert culprit.stage == "pass" and culprit.pass_name == "test-swap-sub"
    assert "lucid.sub" in culprit.op
    readme = open(os.path.join(culprit.folder, "README.txt")).read()
    assert "test-swap-sub" in readme and "lucid-opt" in readme


def test_broken_lowering_rule_in_the_forward_names_the_op(broken_lowering, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = Diff()
    cm = lucid.compile(model, check="first")
    eager, compiled = _grads(model, cm, lucid.randn(3, 4))
    _assert_same(compiled, eager)
    _, culprit = _culprit(cm)
    assert culprit.stage == "lowering" and culprit.pass_name == "lower-to-prim"
    assert culprit.op == "lucid.sub"


def test_broken_lowering_rule_in_the_backward_only_names_the_op(
    broken_lowering, tmp_path, monkeypatch
):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = TanhNet()
    cm = lucid.compile(model, check="first")
    eager, compiled = _grads(model, cm, lucid.randn(3, 4))
    _assert_same(compiled, eager)
    record, culprit = _culprit(cm)
    assert record["mismatch"].startswith("gradient of ")
    assert culprit.stage == "lowering" and culprit.pass_name == "lower-to-prim"
    assert culprit.op == "lucid.sub" and "differentiated" in culprit.detail


def test_tolerance_applies_to_gradients(broken_lowering, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    lucid.manual_seed(0)
    model = TanhNet()
    cm = lucid.compile(model, check="first", check_tolerance=(1e9, 1e9))
    x = lucid.randn(3, 4, requires_grad=True)
    cm(x).sum().backward()
    assert cm.cache_info()["parity"] == [] and cm.cache_info()["entries"] == 1
