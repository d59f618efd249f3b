"""Recompile explanations: the ``lucid.compile`` logger says why a new signature compiles
against the nearest cached key; past ``LUCID_COMPILE_RECOMPILE_LIMIT`` one warning names what
varies; ``cache_info()["recompiles"]`` keeps the explanations."""

from __future__ import annotations

import logging

import pytest

import lucid
import lucid.nn as nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(lucid.randn(4))

    def forward(self, x, scale=1.0, bias=None):
        y = (x * self.w.type(x.dtype)).sum(-1, keepdim=True) * scale
        return y if bias is None else y + bias


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="lucid.compile")
    return caplog


def _messages(caplog, level=logging.INFO):
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_first_compile_explains_nothing(logs):
    cm = lucid.compile(Scaled())
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
    assert cm.cache_info()["recompiles"] == []
    assert not any("recompiling" in m for m in _messages(logs))


def test_batch_dim_change_names_argument_dim_and_hints_dynamic(logs):
    cm = lucid.compile(Scaled())
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
        cm(lucid.randn(5, 4))
    (r,) = cm.cache_info()["recompiles"]
    assert r["differences"] == ["argument 0: shape dim 0 2 -> 5"]
    assert any("dynamic=True" in h for h in r["hints"])
    assert any(
        "argument 0: shape dim 0 2 -> 5" in m and "dynamic=True" in m for m in _messages(logs)
    )


def test_dtype_requires_grad_scalar_keyword_and_training(logs):
    model = Scaled()
    cm = lucid.compile(model)
    x = lucid.randn(2, 4)
    with lucid.no_grad():
        cm(x)
        cm(x.double())  # dtype
        cm(x, 2.0)  # a scalar's value (the default is not in the key: keyword count differs)
        cm(x, 3.0)
        cm(x, bias=lucid.randn(1))  # a keyword
        model.eval()
        cm(x)  # the training flag
    diffs = [r["differences"] for r in cm.cache_info()["recompiles"]]
    assert diffs[0] == ["argument 0: dtype 'float32' -> 'float64'"]
    assert diffs[1] == ["arguments: count 1 -> 2"]
    assert diffs[2] == ["argument 1: value 2.0 -> 3.0"]
    assert diffs[3] == ["keyword 'bias': presence 'absent' -> 'given'"]
    assert diffs[4] == ["model: training flag 'train' -> 'eval'"]
    hints = cm.cache_info()["recompiles"][2]["hints"]
    assert any("as a tensor" in h for h in hints)


def test_requires_grad_difference():
    cm = lucid.compile(Scaled())
    for p in cm.parameters():
        p.requires_grad_(False)
    cm(lucid.randn(2, 4))
    cm(lucid.randn(2, 4, requires_grad=True))
    (r,) = cm.cache_info()["recompiles"]
    assert "argument 0: requires_grad False -> True" in r["differences"]
    assert "call: grad mode False -> True" in r["differences"]


def test_limit_warns_once_naming_the_varying_part(logs, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_RECOMPILE_LIMIT", "3")
    cm = lucid.compile(Scaled())
    x = lucid.randn(2, 4)
    with lucid.no_grad():
        for i in range(6):
            cm(x, float(i))
    warnings = [m for m in _messages(logs, logging.WARNING) if "LUCID_COMPILE_RECOMPILE_LIMIT" in m]
    assert len(warnings) == 1
    assert "argument 1: value" in warnings[0] and "as a tensor" in warnings[0]


def test_bad_limit_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_RECOMPILE_LIMIT", "many")
    cm = lucid.compile(Scaled())
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
        with pytest.raises(ValueError, match="LUCID_COMPILE_RECOMPILE_LIMIT"):
            cm(lucid.randn(3, 4))


def test_verbose_prints_explanations_as_warnings(logs, monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_VERBOSE", "1")
    cm = lucid.compile(Scaled())
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
        cm(lucid.randn(2, 4).double())
    assert any("recompiling" in m and "dtype" in m for m in _messages(logs, logging.WARNING))


def test_nearest_key_is_the_one_with_fewest_differences():
    cm = lucid.compile(Scaled())
    with lucid.no_grad():
        cm(lucid.randn(2, 4))
        cm(lucid.randn(7, 4).double())
        cm(lucid.randn(7, 4))  # one difference from each... dim from the first, dtype second
        cm(lucid.randn(2, 4).double())
    last = cm.cache_info()["recompiles"][-1]
    assert len(last["differences"]) == 1


def test_training_steps_explain_their_recompiles(logs):
    lucid.manual_seed(0)
    model = nn.Linear(4, 2)

    def loss_fn(out, y):
        return ((out - y) ** 2).mean()

    step = lucid.compile.make_step(model, loss_fn)
    step(lucid.randn(3, 4), lucid.randn(3, 2))
    step(lucid.randn(5, 4), lucid.randn(5, 2))
    (r,) = step.cache_info()["recompiles"]
    assert "input 0: shape dim 0 3 -> 5" in r["differences"]
    assert any("dynamic=True" in h for h in r["hints"])
    assert any("make_step" in m and "shape dim 0" in m for m in _messages(logs))

    opt = lucid.optim.SGD(model.parameters(), lr=0.1)
    fused = lucid.compile.fused_step(model, loss_fn, opt)
    fused(lucid.randn(3, 4), lucid.randn(3, 2))
    model.eval()
    fused(lucid.randn(3, 4), lucid.randn(3, 2))
    (r,) = fused.cache_info()["recompiles"]
    assert "model: training flag 'train' -> 'eval'" in r["differences"]
