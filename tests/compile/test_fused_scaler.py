"""``fused_step(..., scaler=GradScaler)``: loss scaling, unscaling, the finite check, the
skipped update and the scale update inside the step, against eager Lucid training with
``lucid.amp.GradScaler`` (``torch.amp.GradScaler``'s semantics): the same skipped steps, the same
scale sequence and the same parameters, with overflow forced by a huge initial scale."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.amp import GradScaler
from lucid.compile import fused_step

STEPS = 32
# 2**127 overflows the first step's scaled gradients; the backoff then puts the scale far below
# overflow (a scale near the edge would make the verdict depend on the order of the backward's
# float operations), and every seventh batch holds an inf: skips keep coming, the scale keeps
# backing off and growing.
SCALER_OPTIONS = {"init_scale": 2.0**127, "backoff_factor": 2.0**-8, "growth_interval": 4}
POISONED = {5, 12, 19, 26}


def _model() -> nn.Module:
    lucid.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))


def _batches() -> list[tuple[lucid.Tensor, lucid.Tensor]]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(STEPS):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        if i in POISONED:
            x[0, 0] = np.inf
        y = 10 * rng.standard_normal((8, 3)).astype(np.float32)
        out.append((lucid.tensor(x), lucid.tensor(y)))
    return out


def _optimizer(kind: str, model: nn.Module):
    if kind == "adam":
        return optim.Adam(model.parameters(), lr=1e-2)
    return optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _params(model: nn.Module) -> list[np.ndarray]:
    return [np.array(p._data, copy=True) for p in model.parameters()]


def _unchanged(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def _eager_run(kind: str, **clip):
    model = _model()
    opt = _optimizer(kind, model)
    scaler = GradScaler(**SCALER_OPTIONS)
    scales, skipped, losses = [], [], []
    for x, y in _batches():
        before = _params(model)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(opt)
            lucid.nn.utils.clip_grad_norm_(list(model.parameters()), clip["max_grad_norm"])
        scaler.step(opt)
        scaler.update()
        after = _params(model)
        skipped.append(_unchanged(before, after))
        scales.append(scaler.get_scale())
        losses.append(float(loss.item()))
    return model, opt, scaler, scales, skipped, losses


def _compiled_run(kind: str, check: str | None = None, **clip):
    model = _model()
    opt = _optimizer(kind, model)
    scaler = GradScaler(**SCALER_OPTIONS)
    step = fused_step(model, F.mse_loss, opt, scaler=scaler, check=check, **clip)
    scales, skipped, losses = [], [], []
    for x, y in _batches():
        before = _params(model)
        losses.append(float(step(x, y).item()))
        after = _params(model)
        skipped.append(_unchanged(before, after))
        scales.append(scaler.get_scale())
    return model, opt, scaler, step, scales, skipped, losses


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_compiled_scaler_skips_the_same_steps_with_the_same_scales(kind):
    model_e, opt_e, scaler_e, scales_e, skipped_e, losses_e = _eager_run(kind)
    model_c, opt_c, scaler_c, step, scales_c, skipped_c, losses_c = _compiled_run(kind)
    assert [i for i, s in enumerate(skipped_e) if s] == [0, *sorted(POISONED)]
    assert skipped_c == skipped_e
    assert scales_c == scales_e
    assert scaler_c.state_dict() == scaler_e.state_dict()
    np.testing.assert_allclose(losses_c, losses_e, rtol=1e-5, atol=1e-6)
    for pc, pe in zip(model_c.parameters(), model_e.parameters(), strict=True):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-5)
    if kind == "adam":
        steps_c = [float(st["step"].item()) for st in opt_c.state.values()]
        steps_e = [float(st["step"].item()) for st in opt_e.state.values()]
        assert steps_c == steps_e == [float(STEPS - sum(skipped_e))] * len(steps_e)
    assert not step.cache_info()["eager_only"]  # compiled, not the eager fallback


def test_compiled_scaler_with_clipping_unscales_first():
    eager = _eager_run("adam", max_grad_norm=0.5)
    compiled = _compiled_run("adam", max_grad_norm=0.5)
    assert compiled[5] == eager[4]
    assert compiled[4] == eager[3]
    for pc, pe in zip(compiled[0].parameters(), eager[0].parameters(), strict=True):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-5)


def test_parity_checking_covers_the_scaler():
    _, _, scaler_e, scales_e, skipped_e, _ = _eager_run("adam")
    model, _, scaler, step, scales, skipped, _ = _compiled_run("adam", check="always")
    info = step.cache_info()
    assert info["parity"] == [] and not info["eager_only"], info
    assert skipped == skipped_e and scales == scales_e


def test_scaler_state_loaded_between_steps_is_used():
    model = _model()
    opt = _optimizer("adam", model)
    scaler = GradScaler(init_scale=4.0, growth_interval=2)
    step = fused_step(model, F.mse_loss, opt, scaler=scaler)
    x, y = _batches()[0]
    step(x, y)
    assert scaler.state_dict()["_growth_tracker"] == 1
    step(x, y)
    assert scaler.get_scale() == 8.0 and scaler.state_dict()["_growth_tracker"] == 0
    scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0**127, "_growth_tracker": 1})
    before = _params(model)
    step(x, y)  # overflows: skipped, backed off
    assert _unchanged(before, _params(model))
    assert scaler.get_scale() == 2.0**126 and scaler.state_dict()["_growth_tracker"] == 0


def test_a_disabled_scaler_changes_nothing():
    eager_model, compiled_model = _model(), _model()
    x, y = _batches()[0]
    plain = fused_step(eager_model, F.mse_loss, optim.SGD(eager_model.parameters(), lr=0.1))
    scaled = fused_step(
        compiled_model,
        F.mse_loss,
        optim.SGD(compiled_model.parameters(), lr=0.1),
        scaler=GradScaler(enabled=False),
    )
    for _ in range(3):
        assert plain(x, y).item() == scaled(x, y).item()
    for a, b in zip(eager_model.parameters(), compiled_model.parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_scaler_must_be_a_grad_scaler():
    model = _model()
    with pytest.raises(TypeError, match="GradScaler"):
        fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1), scaler=2.0)


@pytest.mark.parametrize("check", [None, "always"])
def test_compile_optimizer_with_scaler_matches_scaler_step_and_update(check):
    from lucid.compile import compile_optimizer

    model_e, _, scaler_e, scales_e, skipped_e, _ = _eager_run("adam")
    model = _model()
    scaler = GradScaler(**SCALER_OPTIONS)
    opt = compile_optimizer(_optimizer("adam", model), scaler=scaler, check=check)
    scales, skipped = [], []
    for x, y in _batches():
        before = _params(model)
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        opt.step()
        skipped.append(_unchanged(before, _params(model)))
        scales.append(scaler.get_scale())
    assert skipped == skipped_e and scales == scales_e
    assert scaler.state_dict() == scaler_e.state_dict()
    for pc, pe in zip(model.parameters(), model_e.parameters(), strict=True):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-5)
    info = opt.step.cache_info()
    assert not info["eager_only"] and not info.get("parity"), info


def test_float16_parameters_are_refused_as_eager_unscale_refuses_them():
    model = _model().half()
    opt = optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches()[0]
    eager_scaler = GradScaler()
    eager_scaler.scale(F.mse_loss(model(x.half()), y.half())).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        eager_scaler.unscale_(opt)
    with pytest.raises(ValueError, match="FP16 gradients"):
        fused_step(model, F.mse_loss, opt, scaler=GradScaler())


def test_a_bfloat16_model_with_a_scaler_compiles_and_equals_eager():
    """torch.amp.GradScaler refuses float16 gradients only: a bfloat16 model trains with a scaler
    (the first step overflowing at 2**127), and the compiled step (bfloat16 storage on the CPU
    backend) skips the same steps, keeps the same scale and equals eager within bfloat16's
    precision."""
    batches = [(x.bfloat16(), y.bfloat16()) for x, y in _batches()[:4]]
    options = {"init_scale": 2.0**127, "backoff_factor": 2.0**-100}
    eager = _model().bfloat16()
    eager_opt = optim.Adam(eager.parameters(), lr=1e-2)
    eager_scaler = GradScaler(**options)
    model = _model().bfloat16()
    scaler = GradScaler(**options)
    step = fused_step(model, F.mse_loss, optim.Adam(model.parameters(), lr=1e-2), scaler=scaler)
    for x, y in batches:
        eager_opt.zero_grad()
        eager_loss = F.mse_loss(eager(x), y)
        eager_scaler.scale(eager_loss).backward()
        eager_scaler.step(eager_opt)
        eager_scaler.update()
        loss = step(x, y)
        assert loss.dtype is lucid.bfloat16
        np.testing.assert_allclose(float(loss.float()), float(eager_loss.float()), rtol=2**-7)
        assert scaler.state_dict() == eager_scaler.state_dict()
    assert scaler.get_scale() == 2.0**27  # the first step overflowed and backed off
    info = step.cache_info()
    assert info["entries"] == 1 and not info["eager_only"], info
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        assert a.dtype is lucid.bfloat16
        # Each step rounds a weight once to bfloat16 on both sides: where their float32 updates
        # straddle a rounding boundary, one ulp (up to 2**-7 relative) apart; twice for margin.
        np.testing.assert_allclose(
            a.detach().float().numpy(), b.detach().float().numpy(), rtol=2**-6, atol=1e-4
        )


def test_parity_compare_is_not_blinded_by_an_inf_in_the_reference():
    from lucid.compile.parity.compare import compare

    want = [np.array([np.inf, 1.0, np.nan], dtype=np.float32)]
    assert compare([want[0].copy()], want, (1e-4, 1e-5)) is None
    off = np.array([np.inf, 2.0, np.nan], dtype=np.float32)
    assert "1 of 3 elements differ" in compare([off], want, (1e-4, 1e-5))


def test_a_step_with_a_scaler_is_not_saved(tmp_path, caplog):
    import logging

    from lucid.compile import save_compiled

    model = _model()
    step = fused_step(model, F.mse_loss, _optimizer("adam", model), scaler=GradScaler())
    step(*_batches()[0])
    with caplog.at_level(logging.WARNING, logger="lucid.compile"):
        assert save_compiled(step, tmp_path / "a.lucidc") is False
    assert "GradScaler" in caplog.text
    assert not list(tmp_path.iterdir())


def _dampened_sgd_run(
    mode: str, scaler: GradScaler, steps: int, kind: str = "sgd", lr_decay: float | None = None
):
    """SGD with dampened momentum (its first step differs from later ones; or Adam) on large
    targets, trained eagerly with the scaler, by ``fused_step`` or by ``compile_optimizer``, the
    learning rate decayed after every step when asked: (model, optimizer, for each skipped step
    whether optimizer state existed after it)."""
    from lucid.compile import compile_optimizer

    lucid.manual_seed(0)
    model = nn.Linear(3, 2)
    if kind == "sgd":
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    else:
        opt = optim.Adam(model.parameters(), lr=0.1)
    schedule = None if lr_decay is None else optim.lr_scheduler.ExponentialLR(opt, lr_decay)
    step = fused_step(model, F.mse_loss, opt, scaler=scaler) if mode == "fused_step" else None
    if mode == "compile_optimizer":
        compile_optimizer(opt, scaler=scaler)
    rng = np.random.default_rng(0)
    skipped_with_state = []
    for _ in range(steps):
        x = lucid.tensor(rng.standard_normal((4, 3)).astype(np.float32))
        y = lucid.tensor(100 * rng.standard_normal((4, 2)).astype(np.float32))
        scale = scaler.get_scale()
        if mode == "fused_step":
            step(x, y)
        else:
            opt.zero_grad()
            scaler.scale(F.mse_loss(model(x), y)).backward()
            if mode == "compile_optimizer":
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
        if scaler.get_scale() < scale:
            skipped_with_state.append(bool(opt.state))
        if schedule is not None:
            schedule.step()
    return model, opt, skipped_with_state


@pytest.mark.parametrize("compiled", ["fused_step", "compile_optimizer"])
def test_a_skipped_first_step_creates_no_optimizer_state(compiled):
    """Eager GradScaler skips opt.step() entirely: SGD's momentum buffer does not exist after a
    skipped first step, so the next step is the first (buf = grad, not dampened)."""

    def run(mode):
        scaler = GradScaler(init_scale=2.0**127, backoff_factor=2.0**-20)
        return _dampened_sgd_run(mode, scaler, steps=5)[0], scaler

    want_model, want_scaler = run("eager")
    model, scaler = run(compiled)
    assert scaler.get_scale() == want_scaler.get_scale() < 2.0**127
    np.testing.assert_allclose(
        model.weight.detach().numpy(), want_model.weight.detach().numpy(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("compiled", ["fused_step", "compile_optimizer"])
def test_a_run_of_skipped_first_steps_compiles_once(compiled, monkeypatch):
    """A scale far too large skips the first steps one after another (PyTorch's GradScaler
    starts at 2**16 for this reason); each leaves no optimizer state, as eager, and the entry is
    kept for the next step instead of compiled again."""
    from lucid.compile.training.fused import FusedStep
    from lucid.compile.training.optimizer import CompiledOptimizerStep

    owner = FusedStep if compiled == "fused_step" else CompiledOptimizerStep
    builds = []
    build = owner._build
    monkeypatch.setattr(owner, "_build", lambda self, *a: builds.append(1) or build(self, *a))
    # Halved per skip: several skips in a row.
    want_scaler, scaler = GradScaler(init_scale=2.0**127), GradScaler(init_scale=2.0**127)
    want_model, want_opt, want_skips = _dampened_sgd_run("eager", want_scaler, steps=8)
    model, opt, skips = _dampened_sgd_run(compiled, scaler, steps=8)
    assert len(want_skips) >= 3 and not any(want_skips)
    assert skips == want_skips
    assert scaler.state_dict() == want_scaler.state_dict()
    assert len(builds) == 1
    for p, w in zip(model.parameters(), want_model.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-6)
        buf, want_buf = opt.state[p]["momentum_buffer"], want_opt.state[w]["momentum_buffer"]
        np.testing.assert_allclose(buf.numpy(), want_buf.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiled", ["fused_step", "compile_optimizer"])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_learning_rate_changed_during_skipped_first_steps_is_used(compiled, kind):
    """A scheduler steps every iteration, skipped or not: the first step taken after a run of
    skipped ones uses the learning rate of its own iteration (as eager), not the one the entry
    was built with."""

    def run(mode):
        scaler = GradScaler(init_scale=2.0**127)
        model, opt, _ = _dampened_sgd_run(mode, scaler, steps=8, kind=kind, lr_decay=0.5)
        return model, scaler

    want_model, want_scaler = run("eager")
    model, scaler = run(compiled)
    assert scaler.state_dict() == want_scaler.state_dict()
    for p, w in zip(model.parameters(), want_model.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-6)
