"""lucid.amp.GradScaler against torch.amp.GradScaler's documented behaviour.

https://pytorch.org/docs/stable/amp.html#gradient-scaling: ``step`` unscales the gradients and
skips ``optimizer.step()`` when any is inf/NaN; ``update`` multiplies the scale by
``backoff_factor`` after a skipped step, and by ``growth_factor`` after ``growth_interval``
unskipped steps in a row (an overflow resets the count).
"""

from __future__ import annotations

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.amp import GradScaler


def _reference_schedule(init_scale, grad_of, n_steps, growth=2.0, backoff=0.5, interval=3):
    """PyTorch's documented rule, step by step: (scale used, skipped) per iteration."""
    scale, tracker, out = init_scale, 0, []
    for _ in range(n_steps):
        with np.errstate(over="ignore"):
            skipped = not np.isfinite(np.float32(scale) * np.float32(grad_of))
        out.append((scale, skipped))
        if skipped:
            scale, tracker = scale * backoff, 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = scale * growth, 0
    return out


def test_forced_overflow_skips_steps_and_backs_off_as_documented():
    # loss = 4 * w: the scaled gradient 4 * S overflows float32 for S >= 2**126.
    w = nn.Parameter(lucid.tensor([1.0]))
    opt = lucid.optim.SGD([w], lr=0.125)
    scaler = GradScaler(init_scale=2.0**127, growth_interval=3)
    want = _reference_schedule(2.0**127, 4.0, 12, interval=3)
    assert [s for s, skipped in want].count(2.0**127) == 1 and want[0][1] and want[1][1]
    value = 1.0
    for scale, skipped in want:
        assert scaler.get_scale() == scale
        opt.zero_grad()
        scaler.scale((w * 4.0).sum()).backward()
        scaler.step(opt)
        scaler.update()
        if not skipped:
            value -= 0.125 * 4.0  # the unscaled gradient is exactly 4 (powers of two)
        assert w.item() == value, (scale, skipped)
    assert sum(skipped for _, skipped in want) >= 4  # growth ran into the overflow again


def test_nan_gradient_skips_and_resets_growth():
    w = nn.Parameter(lucid.tensor([1.0, 2.0]))
    opt = lucid.optim.SGD([w], lr=0.1)
    scaler = GradScaler(init_scale=8.0, growth_interval=2, backoff_factor=0.25)
    scaler.scale(w.sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler._get_growth_tracker() == 1 and scaler.get_scale() == 8.0
    opt.zero_grad()
    scaler.scale((w * float("nan")).sum()).backward()
    before = w.detach().numpy().copy()
    assert scaler.step(opt) is None
    scaler.update()
    np.testing.assert_array_equal(w.detach().numpy(), before)
    assert scaler.get_scale() == 2.0 and scaler._get_growth_tracker() == 0


def test_unscale_once_per_step_and_clipping_in_between():
    model = nn.Linear(3, 2)
    opt = lucid.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=1024.0)
    x = lucid.randn(4, 3)
    loss = model(x).pow(2).sum()
    scaler.scale(loss).backward()
    scaled = model.weight.grad.numpy().copy()
    scaler.unscale_(opt)
    np.testing.assert_allclose(model.weight.grad.numpy(), scaled / 1024.0, rtol=1e-7)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    # Clipping sees the true gradients, and step does not unscale again.
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    clipped = model.weight.grad.numpy().copy()
    w0 = model.weight.detach().numpy().copy()
    scaler.step(opt)
    np.testing.assert_allclose(model.weight.detach().numpy(), w0 - 0.1 * clipped, rtol=1e-6)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration: allowed again


def test_misuse_raises_clearly():
    w = nn.Parameter(lucid.tensor([1.0]))
    opt = lucid.optim.SGD([w], lr=0.1)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.update()
    scaler.scale(w.sum())
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    half = nn.Parameter(lucid.tensor([1.0]).half())
    half_opt = lucid.optim.SGD([half], lr=0.1)
    scaler.scale(half.sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(half_opt)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        GradScaler(growth_interval=0)


def test_bfloat16_gradients_are_unscaled():
    w = nn.Parameter(lucid.tensor([1.0, -3.0]).bfloat16())
    opt = lucid.optim.SGD([w], lr=0.5)
    scaler = GradScaler(init_scale=2.0**10)
    scaler.scale((w * 3.0).sum()).backward()
    scaler.step(opt)
    assert w.grad.dtype is lucid.bfloat16 and w.grad.tolist() == [3.0, 3.0]
    assert w.tolist() == [-0.5, -4.5]


def test_state_dict_round_trip_and_disabled_scaler():
    scaler = GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=7)
    w = nn.Parameter(lucid.tensor([1.0]))
    opt = lucid.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    scaler.step(opt)
    scaler.update()
    sd = scaler.state_dict()
    assert sd == {
        "scale": 256.0,
        "growth_factor": 4.0,
        "backoff_factor": 0.25,
        "growth_interval": 7,
        "_growth_tracker": 1,
    }
    other = GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    other.scale(w.sum())  # lazily created tensors take the loaded values
    assert other.get_scale() == 256.0 and other._get_growth_tracker() == 1
    off = GradScaler(enabled=False)
    assert not off.is_enabled() and off.get_scale() == 1.0 and off.state_dict() == {}
    loss = w.sum()
    assert off.scale(loss) is loss
    opt.zero_grad()
    loss.backward()
    w0 = w.item()
    off.step(opt)
    off.update()
    assert w.item() == pytest.approx(w0 - 0.1)
    with pytest.raises(RuntimeError, match="empty"):
        GradScaler().load_state_dict({})
    with pytest.warns(UserWarning, match="no 'cuda' device"):
        assert not GradScaler("cuda").is_enabled()


def _mlp_run(amp: bool, steps: int = 50, dtype=lucid.bfloat16) -> list[float]:
    lucid.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = lucid.optim.Adam(model.parameters(), lr=1e-2)
    scaler = GradScaler(enabled=amp)
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((64, 8)).astype(np.float32))
    y = lucid.tensor(np.sin(x.numpy().sum(1, keepdims=True)))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with lucid.autocast("cpu", dtype=dtype, enabled=amp):
            loss = F.mse_loss(model(x), y)
        assert loss.dtype is lucid.float32  # mse_loss autocasts to float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", [lucid.bfloat16, lucid.float16])
def test_mlp_trained_50_steps_with_autocast_and_scaler_tracks_float32(dtype):
    amp, full = _mlp_run(True, dtype=dtype), _mlp_run(False)
    assert amp[-1] < 0.6 * amp[0]  # it learns
    # bfloat16 has 8 significant bits: the curves agree to a few percent of the start.
    np.testing.assert_allclose(amp, full, atol=0.05 * full[0])


@pytest.mark.filterwarnings(
    "ignore:.*(invalid value|overflow):RuntimeWarning"
)  # the inf is the point
def test_huge_initial_scale_on_a_float16_model_backs_off_until_gradients_are_finite():
    lucid.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = lucid.optim.SGD(model.parameters(), lr=1e-2)
    scaler = GradScaler(init_scale=2.0**40)
    x, y = lucid.randn(32, 4), lucid.randn(32, 1)
    scales, changed = [], []
    for _ in range(40):
        before = [p.detach().numpy().copy() for p in model.parameters()]
        opt.zero_grad()
        with lucid.autocast("cpu", dtype=lucid.float16):
            loss = F.mse_loss(model(x), y)
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()  # float16 activation gradients overflow at first
        scaler.step(opt)
        scaler.update()
        changed.append(
            any(
                not np.array_equal(b, p.detach().numpy())
                for b, p in zip(before, model.parameters(), strict=True)
            )
        )
    first = changed.index(True)
    assert first >= 10  # 2**40 times a gradient is far beyond float16's 65504
    # Every skipped step halved the scale, exactly; steps then ran (none skipped at this scale).
    assert scales[: first + 1] == [2.0**40 * 0.5**k for k in range(first + 1)]
    assert all(changed[first:]) and scales[first:] == [scales[first]] * (40 - first)
