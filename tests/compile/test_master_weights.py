"""``fused_step(..., master_weights=True)``: float32 master weights for half-precision models,
against eager training that keeps float32 copies by hand (the optimizer over the copies, the
half gradients widened, the parameters set to the copies rounded). The CPU backend stores no half
types yet: the step runs eagerly and says so; the traced step is checked on the IR interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.amp import GradScaler
from lucid.compile import fused_step

STEPS = 6


def _model(dtype) -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(dtype)


def _batches(dtype) -> list[tuple[lucid.Tensor, lucid.Tensor]]:
    rng = np.random.default_rng(2)
    return [
        (
            lucid.tensor(rng.standard_normal((6, 4)).astype(np.float32)).to(dtype),
            lucid.tensor(rng.standard_normal((6, 2)).astype(np.float32)).to(dtype),
        )
        for _ in range(STEPS)
    ]


def _eager_master_training(dtype, scaler=None):
    """Master weights by hand, as apex/PyTorch users write them."""
    model = _model(dtype)
    params = list(model.parameters())
    masters = [lucid.tensor(p.detach().float().numpy(), requires_grad=True) for p in params]
    opt = optim.Adam(masters, lr=1e-2)
    losses = []
    for x, y in _batches(dtype):
        for p in params:
            p.grad = None
        loss = F.mse_loss(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        for m, p in zip(masters, params, strict=True):
            m.grad = p.grad.float()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        with lucid.no_grad():
            for m, p in zip(masters, params, strict=True):
                p.copy_(m.to(dtype))
        losses.append(float(loss.float().item()))
    return model, masters, losses


@pytest.mark.parametrize("dtype", [lucid.bfloat16, lucid.float16])
def test_master_weights_train_as_float32_copies_by_hand(dtype):
    want_model, want_masters, want_losses = _eager_master_training(dtype)
    model = _model(dtype)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    step = fused_step(model, F.mse_loss, opt, master_weights=True)
    losses = [float(step(x, y).float().item()) for x, y in _batches(dtype)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for p, w in zip(model.parameters(), want_model.parameters(), strict=True):
        assert p.dtype is dtype
        np.testing.assert_array_equal(p.detach().float().numpy(), w.detach().float().numpy())
    masters = step.master_weights()
    assert list(masters) == list(model.parameters())
    for m, w in zip(masters.values(), want_masters, strict=True):
        assert m.dtype is lucid.float32
        np.testing.assert_allclose(m.detach().numpy(), w.detach().numpy(), rtol=1e-6, atol=1e-7)
    for st in opt.state.values():
        assert st["exp_avg"].dtype is lucid.float32
    assert not step.cache_info()["reasons"]  # compiled: the backend stores half


def test_master_weights_with_a_float16_scaler_skip_overflowing_steps():
    scaler_e = GradScaler(init_scale=2.0**40, growth_interval=2)
    want_model, _, _ = _eager_master_training(lucid.float16, scaler_e)
    model = _model(lucid.float16)
    scaler = GradScaler(init_scale=2.0**40, growth_interval=2)
    step = fused_step(
        model,
        F.mse_loss,
        optim.Adam(model.parameters(), lr=1e-2),
        scaler=scaler,
        master_weights=True,
    )
    for x, y in _batches(lucid.float16):
        step(x, y)
    assert scaler.get_scale() < 2.0**40  # float16 gradients overflowed at first
    assert scaler.state_dict() == scaler_e.state_dict()
    for p, w in zip(model.parameters(), want_model.parameters(), strict=True):
        np.testing.assert_array_equal(p.detach().float().numpy(), w.detach().float().numpy())


def test_the_traced_master_weight_step_equals_eager_on_the_interpreter():
    from lucid.compile.training.builder import build_training_module
    from lucid.compile.training.fused import _master_weights
    from lucid.ir.interpreter import interpret

    dtype = lucid.bfloat16
    want_model, want_masters, _ = _eager_master_training(dtype)
    model = _model(dtype)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    masters = _master_weights(opt)
    for x, y in _batches(dtype):
        tm = build_training_module(model, F.mse_loss, (x, y), optimizer=opt, masters=masters)
        assert any(r.startswith("update:master:") for r in tm.result_roles)
        tm.write_back(interpret(tm.module, tm.feed_values(x, y)))
    for p, w in zip(model.parameters(), want_model.parameters(), strict=True):
        got, want = p.detach().float().numpy(), w.detach().float().numpy()
        np.testing.assert_allclose(got, want, atol=1e-2)


def test_master_weights_need_a_fresh_optimizer():
    model = _model(lucid.bfloat16)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = _batches(lucid.bfloat16)[0]
    F.mse_loss(model(x), y).backward()
    opt.step()
    with pytest.raises(ValueError, match="not taken a step"):
        fused_step(model, F.mse_loss, opt, master_weights=True)
