"""The autocast region is part of every compiled wrapper's cache key: a function traced outside
autocast must not serve calls inside it (nor the reverse), and each region compiles once."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile import CacheKey, CompileError


def _model() -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def _close(got: lucid.Tensor, want: lucid.Tensor) -> None:
    assert got.dtype is want.dtype
    np.testing.assert_allclose(
        got.detach().float().numpy(), want.detach().float().numpy(), rtol=1e-2, atol=1e-2
    )


@pytest.mark.parametrize("dtype", [lucid.bfloat16, lucid.float16])
def test_entering_and_leaving_autocast_compiles_once_per_region(dtype):
    model = _model()
    cm = lucid.compile(model)
    x = lucid.randn(4, 3)
    with lucid.no_grad():
        for _ in range(2):
            _close(cm(x), model(x))
            with lucid.autocast("cpu", dtype=dtype):
                got = cm(x)
                want = model(x)
            assert want.dtype is dtype
            _close(got, want)
    info = cm.cache_info()
    keys = set(info["keys"]) | set(info["eager_only"])
    assert len(keys) == 2, keys
    assert sorted(info["n_calls"].values()) == [2, 2]
    regions = {k[-1] for k in keys}
    assert regions == {None, ("cpu", dtype.name)}
    inside = next(k for k in keys if k[-1] is not None)
    assert "autocast(cpu" in repr(CacheKey(inside))


def test_a_disabled_region_shares_the_key_of_no_region():
    model = _model()
    cm = lucid.compile(model)
    x = lucid.randn(4, 3)
    with lucid.no_grad():
        cm(x)
        with lucid.autocast("cpu", enabled=False):
            assert cm(x).dtype is lucid.float32
    assert sum(cm.cache_info()["n_calls"].values()) == 2
    assert len(cm.cache_info()["n_calls"]) == 1


def test_compiled_function_with_gradients_under_autocast_equals_eager():
    model = _model()
    x = lucid.randn(4, 3)

    def loss_of(inp):
        return F.log_softmax(model(inp), -1).sum()

    compiled = lucid.compile(model)
    with lucid.autocast("cpu"):
        eager = loss_of(x)
        got = F.log_softmax(compiled(x), -1).sum()
    _close(got, eager)
    plain = F.log_softmax(compiled(x), -1).sum()
    assert plain.dtype is lucid.float32
    np.testing.assert_allclose(plain.item(), loss_of(x).item(), rtol=1e-5)


def test_fused_step_keys_on_the_autocast_region():
    """Under autocast the step traces bfloat16 casts: a new signature (which the CPU backend
    refuses with a clear error until it stores half types), never the float32 executable."""
    model = _model()
    opt = lucid.optim.SGD(model.parameters(), lr=0.1)
    step = lucid.compile.fused_step(model, lambda out, y: F.mse_loss(out, y), opt)
    x, y = lucid.randn(4, 3), lucid.randn(4, 2)
    step(x, y)
    before = [p.numpy().copy() for p in model.parameters()]
    with lucid.autocast("cpu"):
        try:
            step(x, y)
        except CompileError as e:
            assert "bfloat16" in str(e)
            for p, b in zip(model.parameters(), before, strict=True):
                np.testing.assert_array_equal(p.numpy(), b)
    step(x, y)
    regions = [k[4] for k in step._entries]
    assert None in regions
    assert len(step.cache_info()["recompiles"]) >= 1


def test_a_compiled_function_recompiles_per_region():
    w = lucid.randn(3, 5)

    def project(x):
        return F.softmax(lucid.matmul(x, w), -1)

    compiled = lucid.compile(project)
    x = lucid.randn(4, 3)
    with lucid.no_grad():
        assert compiled(x).dtype is lucid.float32
        with lucid.autocast("cpu", dtype=lucid.float16):
            got, want = compiled(x), project(x)
        _close(got, want)
        assert compiled(x).dtype is lucid.float32
    assert len(compiled.cache_info()["n_calls"]) == 2
