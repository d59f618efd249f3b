"""Parity checking: ``check="first"|"always"`` compares compiled calls with eager; a mismatch
gives the eager result, marks the signature eager-only and bisects to the guilty pass or
lowering rule (tests inject a broken pass and a broken lowering rule)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.ir import _xdsl as x
from lucid.passes import registry as pass_registry
from lucid.passes.lowering import _core as lowering_core


class Diff(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        return h - 2.0 * h.relu()


@dataclass(frozen=True)
class SwapSub(x.ModulePass):
    """Deliberately wrong: swaps the operands of every ``lucid.sub``."""

    name = "test-swap-sub"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for o in list(op.walk()):
            if o.name == "lucid.sub":
                a, b = o.operands
                o.operands = (b, a)


@pytest.fixture
def broken_pass():
    pass_registry.register_pass(SwapSub)
    yield "canonicalize,test-swap-sub,cse,dce"
    pass_registry._PASSES.pop("test-swap-sub", None)


@pytest.fixture
def broken_lowering(monkeypatch):
    good = lowering_core.RULES["sub"]
    monkeypatch.setitem(lowering_core.RULES, "sub", lambda b, a, c: good(b, c, a))


def _run(cm, model, x):
    with lucid.no_grad():
        return cm(x).numpy(), model(x).numpy()


def test_matching_signature_stays_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    model = Diff()
    cm = lucid.compile(model, check="first")
    got, want = _run(cm, model, lucid.randn(2, 4))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    info = cm.cache_info()
    assert info["entries"] == 1 and info["eager_only"] == () and info["parity"] == []


def test_broken_pass_is_named_and_user_gets_eager(broken_pass, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    model = Diff()
    cm = lucid.compile(model, check="first", options={"pipeline": broken_pass})
    x_ = lucid.randn(3, 4)
    got, want = _run(cm, model, x_)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # the eager result, not the wrong one
    info = cm.cache_info()
    assert info["entries"] == 0 and len(info["eager_only"]) == 1
    (reason,) = info["reasons"].values()
    assert "parity check failed" in reason and "test-swap-sub" in reason
    (record,) = info["parity"]
    culprit = record["culprit"]
    assert culprit.pass_name == "test-swap-sub" and "lucid.sub" in culprit.op
    folder = culprit.folder
    assert folder.startswith(str(tmp_path)) and folder in reason
    names = set(os.listdir(folder))
    assert {"trace.json", "before.mlir", "after.mlir", "README.txt", "inputs"} <= names
    assert os.listdir(os.path.join(folder, "inputs"))
    readme = open(os.path.join(folder, "README.txt")).read()
    assert "lucid-opt" in readme and "test-swap-sub" in readme
    # Later calls run eagerly (and are right).
    got2, want2 = _run(cm, model, x_)
    np.testing.assert_allclose(got2, want2, rtol=1e-6)


def test_broken_lowering_rule_names_lower_to_prim_and_the_op(
    broken_lowering, tmp_path, monkeypatch
):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    model = Diff()
    cm = lucid.compile(model, check="first")
    got, want = _run(cm, model, lucid.randn(3, 4))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (record,) = cm.cache_info()["parity"]
    culprit = record["culprit"]
    assert culprit.stage == "lowering" and culprit.pass_name == "lower-to-prim"
    assert culprit.op == "lucid.sub", culprit
    assert "lucid-opt" in culprit.files["command"] and "lower-to-prim" in culprit.files["command"]


def test_always_checks_every_call(broken_lowering, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    model = Diff()
    cm = lucid.compile(model, check="always")
    with lucid.no_grad():
        out = cm(lucid.randn(2, 4))
    assert cm.cache_info()["eager_only"]  # the first call already found it
    assert out.shape == (2, 3)


def test_always_on_a_correct_model_keeps_the_entry_and_counts_hits():
    model = Diff()
    cm = lucid.compile(model, check="always")
    x_ = lucid.randn(2, 4)
    for _ in range(3):
        got, want = _run(cm, model, x_)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    info = cm.cache_info()
    assert info["entries"] == 1 and info["parity"] == []
    assert info["n_calls"][info["keys"][0]] == 3


def test_tolerance_is_settable_and_env_selects_mode(broken_lowering, monkeypatch, tmp_path):
    monkeypatch.setenv("LUCID_COMPILE_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("LUCID_COMPILE_CHECK", "first")
    model = Diff()
    cm = lucid.compile(model, check_tolerance=(1e9, 1e9))  # everything "matches"
    _run(cm, model, lucid.randn(2, 4))
    assert cm.cache_info()["parity"] == [] and cm.cache_info()["entries"] == 1
    with pytest.raises(ValueError, match="check must be"):
        lucid.compile(model, check="sometimes")
    with pytest.raises(ValueError, match="check_tolerance"):
        lucid.compile(model, check="first", check_tolerance=(1e-3,))
