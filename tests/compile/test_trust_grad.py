"""Grad-mode calls under ``LUCID_COMPILE_DYNAMIC=1`` use the symbolic entry; tensor keyword
arguments compile in grad mode and get gradients. References: eager autograd (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn


def _seq():
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 3)).double()


def _consistent(info):
    """Every key counted in ``n_calls`` is a cached entry or an eager-only signature."""
    for k in info["n_calls"]:
        assert k in info["keys"] or k in info["eager_only"], (k, info)


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_grad_mode_dynamic_uses_one_symbolic_entry(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    ref, model = _seq(), _seq()
    cm = lucid.compile(model, dynamic=True, strict=True)
    for b in (1, 5, 17, 64, 5):
        x = np.random.default_rng(b).standard_normal((b, 6))
        xr, xc = lucid.tensor(x, requires_grad=True), lucid.tensor(x, requires_grad=True)
        w = lucid.tensor(np.random.default_rng(b + 100).standard_normal((b, 3)))
        want, got = ref(xr), cm(xc)
        _close(got.detach().numpy(), want.detach().numpy())
        (want * w).sum().backward()
        (got * w).sum().backward()
        _close(xc.grad.numpy(), xr.grad.numpy())
        for pr, pc in zip(ref.parameters(), model.parameters(), strict=True):
            _close(pc.grad.numpy(), pr.grad.numpy())
            pr.grad = pc.grad = None
    info = cm.cache_info()
    assert info["entries"] == 1 and info["eager_only"] == (), info
    (key,) = info["keys"]
    assert "?x6" in repr(key) and "grad" in repr(key)
    assert info["n_calls"][key] == 5
    _consistent(info)


def test_grad_mode_dynamic_unsafe_graph_is_per_shape_and_consistent(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")

    class Centered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y - y.mean(0, keepdim=True)

    cm = lucid.compile(Centered(), dynamic=True)
    for b in (2, 3, 2):
        cm(lucid.randn(b, 4, requires_grad=True)).sum().backward()
    info = cm.cache_info()
    assert info["entries"] == 2 and info["eager_only"] == ()
    assert info["not_symbolic"]
    _consistent(info)
    assert sum(info["n_calls"].values()) == 3


class Biased(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x, bias=None, scale=1.0):
        y = self.fc(x) * scale
        return y + bias if bias is not None else y


@pytest.mark.parametrize("bias_grad", [True, False])
def test_tensor_keyword_compiles_in_grad_mode_with_gradients(bias_grad):
    lucid.manual_seed(0)
    ref = Biased().double()
    lucid.manual_seed(0)
    model = Biased().double()
    cm = lucid.compile(model, strict=True)  # strict: a fallback would raise
    rng = np.random.default_rng(1)
    x, b = rng.standard_normal((4, 5)), rng.standard_normal((3,))
    w = lucid.tensor(rng.standard_normal((4, 3)))
    for _ in range(2):  # the miss, then the cache hit
        xr, xc = lucid.tensor(x, requires_grad=True), lucid.tensor(x, requires_grad=True)
        br, bc = lucid.tensor(b, requires_grad=bias_grad), lucid.tensor(b, requires_grad=bias_grad)
        want, got = ref(xr, bias=br, scale=2.0), cm(xc, bias=bc, scale=2.0)
        _close(got.detach().numpy(), want.detach().numpy())
        (want * w).sum().backward()
        (got * w).sum().backward()
        _close(xc.grad.numpy(), xr.grad.numpy())
        if bias_grad:
            _close(bc.grad.numpy(), br.grad.numpy())
        else:
            assert bc.grad is None
        for pr, pc in zip(ref.parameters(), model.parameters(), strict=True):
            _close(pc.grad.numpy(), pr.grad.numpy())
            pr.grad = pc.grad = None
    info = cm.cache_info()
    assert info["eager_only"] == () and info["entries"] == 1
    assert "bias=" in repr(info["keys"][0])


def test_keyword_only_gradient():
    """Only the keyword tensor requires grad (the parameters do not)."""
    model = Biased().double()
    for p in model.parameters():
        p.requires_grad_(False)
    cm = lucid.compile(model, strict=True)
    x = lucid.tensor(np.ones((2, 5)))
    b = lucid.tensor(np.arange(3.0), requires_grad=True)
    (cm(x, bias=b) ** 2).sum().backward()
    want = 2 * model(x, bias=b.detach()).detach().numpy().sum(0)
    _close(b.grad.numpy(), want)


def test_dynamic_path_specialises_with_the_pass(monkeypatch, capfd):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    model = nn.Sequential(nn.Linear(6, 4), nn.GELU())
    cm = lucid.compile(model, dynamic=True, options={"print_ir_after_all": True})
    with lucid.no_grad():
        for b in (2, 5):
            x = lucid.randn(b, 6)
            np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    info = cm.cache_info()
    assert info["not_symbolic"] == {} and info["entries"] == 1, info
    out = capfd.readouterr()
    text = out.out + out.err
    assert "IR Dump After shape-specialize" in text and "tensor<5x6xf32>" in text


def test_cache_info_stays_consistent_when_a_parameter_changes_dtype_behind_our_back():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(lucid.randn(4))

        def forward(self, x):
            return (x * self.w.type(x.dtype)).sum(-1)

    model = M()
    cm = lucid.compile(model)
    x = lucid.randn(2, 4)
    with lucid.no_grad():
        for _ in range(3):
            cm(x)
        model.w.data = model.w.data.double()  # the executable's feed check catches it
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-6)
    info = cm.cache_info()
    _consistent(info)
    assert sum(info["n_calls"].values()) == 4
