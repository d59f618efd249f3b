"""dynamic=True: per-shape by default; one symbolic-batch entry with LUCID_COMPILE_DYNAMIC=1."""

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F


class SafeMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)

    def forward(self, x):
        return F.softmax(self.fc2(F.gelu(self.ln(self.fc1(x)))), dim=-1)


class Unsafe(nn.Module):
    """A reduction over the batch: not in the symbolic-safe op class."""

    def forward(self, x):
        return x - x.mean(0, keepdim=True)


@pytest.fixture(autouse=True)
def _no_grad():
    with lucid.no_grad():
        yield


def test_dynamic_without_env_is_per_shape(monkeypatch):
    monkeypatch.delenv("LUCID_COMPILE_DYNAMIC", raising=False)
    cm = lucid.compile(SafeMLP(), dynamic=True)
    for b in (1, 2, 3):
        cm(lucid.randn(b, 8))
    assert cm.dynamic and cm.cache_info()["entries"] == 3


def test_safe_mlp_serves_batch_1_to_64_from_one_entry(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    model = SafeMLP()
    cm = lucid.compile(model, dynamic=True)
    for b in range(1, 65):
        x = lucid.randn(b, 8)
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-6)
    info = cm.cache_info()
    assert info["entries"] == 1 and info["eager_only"] == () and info["not_symbolic"] == {}
    (key,) = info["keys"]
    assert "tensor<?x8xfloat32>" in repr(key)
    assert info["n_calls"][key] == 64


def test_unsafe_graph_falls_back_per_shape(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    model = Unsafe()
    cm = lucid.compile(model, dynamic=True)
    for b in (2, 3, 4):
        x = lucid.randn(b, 5)
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    info = cm.cache_info()
    assert info["entries"] == 3 and info["eager_only"] == ()
    (reason,) = info["not_symbolic"].values()
    assert "mean" in reason or "sum" in reason


def test_dynamic_false_ignores_env(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    cm = lucid.compile(SafeMLP())
    cm(lucid.randn(2, 8))
    cm(lucid.randn(3, 8))
    assert cm.cache_info()["entries"] == 2
