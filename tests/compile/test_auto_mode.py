"""mode="auto": per signature the first calls time compiled against eager (interleaved) and the
faster path serves from then on; the decision and both times are in cache_info() / timing()."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lucid
import lucid.nn as nn
from lucid.compile.inference import checked


def _mlp():
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _calls(cm, model, n, x):
    with lucid.no_grad():
        for _ in range(n):
            np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_auto_decides_after_interleaved_trials_and_reports_both_times():
    model = _mlp()
    cm = lucid.compile(model, mode="auto")
    x = lucid.randn(4, 8)
    _calls(cm, model, 2 * checked.AUTO_TRIALS - 1, x)
    (key,) = cm.cache_info()["keys"]
    assert cm.cache_info()["auto"][key]["decision"] is None  # still timing
    _calls(cm, model, 3, x)
    auto = cm.cache_info()["auto"][key]
    assert auto["decision"] in ("compiled", "eager")
    assert auto["compiled_ms"] > 0 and auto["eager_ms"] > 0
    faster = "compiled" if auto["compiled_ms"] <= auto["eager_ms"] else "eager"
    assert auto["decision"] == faster
    (row,) = cm.timing()
    assert row["auto"] == auto
    assert cm.cache_info()["n_calls"][key] == 2 * checked.AUTO_TRIALS + 2


class _Slow:
    """Wraps an entry: every compiled run takes at least 20 ms."""

    def __init__(self, inner):
        self.inner, self.runs = inner, 0

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)

    def __call__(self, args, kwargs):
        self.runs += 1
        time.sleep(0.02)
        return self.inner(args, kwargs)


def test_a_slower_compiled_path_is_left_for_eager(monkeypatch):
    model = _mlp()
    cm = lucid.compile(model, mode="auto")
    real = checked.AutoEntry.__init__

    def slow_init(self, owner, key, inner):
        real(self, owner, key, _Slow(inner))

    monkeypatch.setattr(checked.AutoEntry, "__init__", slow_init)
    x = lucid.randn(4, 8)
    _calls(cm, model, 2 * checked.AUTO_TRIALS, x)
    (key,) = cm.cache_info()["keys"]
    auto = cm.cache_info()["auto"][key]
    assert auto["decision"] == "eager" and auto["compiled_ms"] > auto["eager_ms"]
    entry = cm._entries[key]
    runs = entry.inner.runs
    _calls(cm, model, 4, x)
    assert entry.inner.runs == runs  # eager serves now


def test_a_faster_compiled_path_puts_the_plain_entry_back(monkeypatch):
    model = _mlp()
    cm = lucid.compile(model, mode="auto")
    monkeypatch.setattr(checked.AutoEntry, "_decide", _force_compiled(checked.AutoEntry._decide))
    _calls(cm, model, 2 * checked.AUTO_TRIALS, lucid.randn(4, 8))
    (key,) = cm.cache_info()["keys"]
    assert not isinstance(cm._entries[key], checked.AutoEntry)
    assert cm.cache_info()["auto"][key]["decision"] == "compiled"


def _force_compiled(decide):
    def wrapper(self):
        self.times["compiled"] = [0.0] * len(self.times["compiled"])
        decide(self)

    return wrapper


def test_default_mode_is_always_compiled_and_bad_mode_is_an_error():
    model = _mlp()
    cm = lucid.compile(model)
    _calls(cm, model, 3, lucid.randn(4, 8))
    assert cm.cache_info()["auto"] == {}
    assert not any(isinstance(e, checked.AutoEntry) for e in cm._entries.values())
    with pytest.raises(ValueError, match="mode"):
        lucid.compile(model, mode="fastest")
