"""Half-precision models through ``lucid.compile`` on the CPU backend: they run compiled (no
fallback) and equal eager Lucid, forward bit for bit or within the format's precision, backward
within it."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn

# A few units in the last place of each format, for values computed along different float32
# paths (fused kernels, gradients summed in another order) before their one rounding.
ULPS = {"float16": 4 * 2.0**-10, "bfloat16": 4 * 2.0**-7}
CONVERT = {"float16": "half", "bfloat16": "bfloat16"}


def _mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 5))


def _block():
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)


MODELS = {"mlp": (_mlp, (7, 12)), "transformer_block": (_block, (2, 5, 16))}


def _twins(model_name, dtype_name):
    make, shape = MODELS[model_name]
    lucid.manual_seed(0)
    eager = getattr(make(), CONVERT[dtype_name])()
    twin = getattr(make(), CONVERT[dtype_name])()
    twin.load_state_dict(eager.state_dict())
    x = lucid.randn(*shape).to(getattr(lucid, dtype_name))
    return eager, twin, x


def _close(got, want, dtype_name, what):
    assert got.dtype == want.dtype, what
    got32, want32 = got.astype(np.float32), want.astype(np.float32)
    scale = max(float(np.abs(want32).max()), 1e-3)
    np.testing.assert_allclose(
        got32, want32, rtol=ULPS[dtype_name], atol=ULPS[dtype_name] * scale, err_msg=what
    )


@pytest.mark.parametrize("dtype_name", sorted(CONVERT))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_half_inference_runs_compiled_and_matches_eager(model_name, dtype_name):
    eager, _, x = _twins(model_name, dtype_name)
    eager.eval()
    compiled = lucid.compile(eager)
    with lucid.no_grad():
        got, want = compiled(x).numpy(), eager(x).numpy()
    assert compiled.cache_info()["reasons"] == {}, compiled.cache_info()["reasons"]
    assert got.dtype == getattr(lucid, dtype_name).numpy
    if model_name == "mlp":  # linear, gelu, linear: the same float32 ops, each rounded once
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    _close(got, want, dtype_name, f"{model_name} {dtype_name} forward")


@pytest.mark.parametrize("dtype_name", sorted(CONVERT))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_half_backward_runs_compiled_and_matches_eager(model_name, dtype_name):
    eager, twin, x = _twins(model_name, dtype_name)
    compiled = lucid.compile(twin)
    (compiled(x) * 0.5).sum().backward()
    (eager(x) * 0.5).sum().backward()
    assert compiled.cache_info()["reasons"] == {}, compiled.cache_info()["reasons"]
    for (name, a), (_, b) in zip(twin.named_parameters(), eager.named_parameters(), strict=True):
        _close(a.grad.numpy(), b.grad.numpy(), dtype_name, f"{model_name} grad {name}")


@pytest.mark.parametrize("dtype_name", sorted(CONVERT))
def test_half_fused_sgd_steps_run_compiled_and_match_eager(dtype_name):
    eager, twin, x = _twins("mlp", dtype_name)

    def loss_of(out):
        return (out * out).mean()

    step = lucid.compile.fused_step(twin, loss_of, lucid.optim.SGD(twin.parameters(), lr=0.1))
    opt = lucid.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        step(x)
        opt.zero_grad()
        loss_of(eager(x)).backward()
        opt.step()
    assert step.cache_info()["reasons"] == {}, step.cache_info()["reasons"]
    for (name, a), (_, b) in zip(twin.named_parameters(), eager.named_parameters(), strict=True):
        _close(a.numpy(), b.numpy(), dtype_name, f"parameter {name} after 3 SGD steps")
