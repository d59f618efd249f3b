"""Gradient clipping inside ``fused_step`` (``max_grad_norm``, ``norm_type``, ``clip_grad_value``)
against eager training that calls ``lucid.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``
between ``backward()`` and ``opt.step()`` (torch's formulas): exact-ish in float64, float32
tolerance in float32, with the norm below and above the limit, non-finite gradients handled as
torch's default (``error_if_nonfinite=False``), and the whole step still one executable."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compile_optimizer, fused_step
from lucid.compile.training.builder import build_training_module
from lucid.nn.utils import clip_grad_norm_, clip_grad_value_

_spec = importlib.util.spec_from_file_location(
    "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

RTOL = {lucid.float64: 1e-12, lucid.float32: 2e-5}
NP = {lucid.float64: np.float64, lucid.float32: np.float32}


def _model(dtype, sizes=(4, 5, 2), seed=0) -> nn.Module:
    lucid.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=False):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(dtype)


def _data(dtype, sizes=(4, 5, 2), batch=6, seed=1):
    rng = np.random.default_rng(seed)
    x = lucid.tensor(rng.standard_normal((batch, sizes[0])).astype(NP[dtype]))
    y = lucid.tensor(rng.standard_normal((batch, sizes[-1])).astype(NP[dtype]))
    return x, y


def _eager_step(model, opt, loss_fn, x, y, *, max_norm=None, norm_type=2.0, clip_value=None):
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    total = None
    if clip_value is not None:
        clip_grad_value_(model.parameters(), clip_value)
    if max_norm is not None:
        total = clip_grad_norm_(model.parameters(), max_norm, norm_type)
    opt.step()
    return total


def _assert_close(got, want, rtol, what=""):
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * scale, err_msg=what)


def _assert_models_close(model, ref, rtol):
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        _assert_close(p.numpy(), q.numpy(), rtol, name)


def _train_both(dtype, opt_cls, opt_kw, steps, sizes=(4, 5, 2), loss_fn=F.mse_loss, **clip):
    ref, model = _model(dtype, sizes), _model(dtype, sizes)
    ref_opt, opt = opt_cls(ref.parameters(), **opt_kw), opt_cls(model.parameters(), **opt_kw)
    step = fused_step(
        model,
        loss_fn,
        opt,
        max_grad_norm=clip.get("max_norm"),
        norm_type=clip.get("norm_type", 2.0),
        clip_grad_value=clip.get("clip_value"),
    )
    x, y = _data(dtype, sizes)
    norms = []
    for _ in range(steps):
        want = _eager_step(ref, ref_opt, loss_fn, x, y, **clip)
        step(x, y)
        norms.append((None if step.grad_norm is None else step.grad_norm.numpy(), want))
    return ref, model, step, norms


OPTIMIZERS = {
    "sgd-momentum": (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    "adam": (optim.Adam, dict(lr=0.05)),
    "adamw": (optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
}


def _unclipped_norm(dtype) -> float:
    model = _model(dtype)
    x, y = _data(dtype)
    F.mse_loss(model(x), y).backward()
    return float(clip_grad_norm_(model.parameters(), math.inf).item())


@pytest.mark.parametrize("dtype", [lucid.float64, lucid.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("limit", ["below", "above"])
def test_max_grad_norm_matches_eager_clip_grad_norm(dtype, opt_name, limit):
    norm = _unclipped_norm(dtype)
    # "below": the gradients' norm is under the limit (coefficient 1); "above": they are scaled
    max_norm = norm * 10 if limit == "below" else norm / 7
    cls, kw = OPTIMIZERS[opt_name]
    ref, model, step, norms = _train_both(dtype, cls, kw, 3, max_norm=max_norm)
    _assert_models_close(model, ref, RTOL[dtype])
    for got, want in norms:
        assert got.shape == () and got.dtype == NP[dtype]
        _assert_close(got, want.numpy(), RTOL[dtype])
    assert float(norms[0][1].item()) == pytest.approx(norm)
    assert step.cache_info()["entries"] == 1


def test_clipping_changes_the_update():
    # The reference without clipping differs: the clipped step is not a no-op by accident.
    norm = _unclipped_norm(lucid.float64)
    ref, model, _, _ = _train_both(lucid.float64, optim.SGD, dict(lr=0.1), 1, max_norm=norm / 4)
    plain = _model(lucid.float64)
    x, y = _data(lucid.float64)
    _eager_step(plain, optim.SGD(plain.parameters(), lr=0.1), F.mse_loss, x, y)
    diff = max(
        float(np.abs(p.numpy() - q.numpy()).max())
        for p, q in zip(plain.parameters(), model.parameters(), strict=True)
    )
    assert diff > 1e-3
    _assert_models_close(model, ref, 1e-12)


@pytest.mark.parametrize("norm_type", [math.inf, "inf", 1.0, 3.0])
def test_other_norm_types(norm_type):
    ref, model, _, norms = _train_both(
        lucid.float64, optim.Adam, dict(lr=0.05), 2, max_norm=0.05, norm_type=norm_type
    )
    _assert_models_close(model, ref, 1e-12)
    for got, want in norms:
        _assert_close(got, want.numpy(), 1e-12)


@pytest.mark.parametrize("max_norm", [None, 0.05])
def test_clip_grad_value(max_norm):
    ref, model, step, _ = _train_both(
        lucid.float64,
        optim.SGD,
        dict(lr=0.1, momentum=0.5),
        2,
        clip_value=0.01,
        max_norm=max_norm,
    )
    _assert_models_close(model, ref, 1e-12)
    assert (step.grad_norm is None) == (max_norm is None)


def test_tiny_gpt_with_adamw_and_clipping_is_one_executable():
    # A GPT training loop with clip_grad_norm_: one fused executable, same training as eager.
    def loss_fn(out, target):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    def make():
        lucid.manual_seed(0)
        return models.TinyGPT().double()

    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.integers(0, 20, (2, 8)))
    y = lucid.tensor(rng.integers(0, 20, (2, 8)))
    ref, model = make(), make()
    ref_opt = optim.AdamW(ref.parameters(), lr=3e-3)
    opt = optim.AdamW(model.parameters(), lr=3e-3)
    step = fused_step(model, loss_fn, opt, max_grad_norm=0.5)
    for _ in range(3):
        want = _eager_step(ref, ref_opt, loss_fn, x, y, max_norm=0.5)
        step(x, y)
        _assert_close(step.grad_norm.numpy(), want.numpy(), 1e-11)
    assert float(want.item()) > 0.5  # the limit was active
    _assert_models_close(model, ref, 1e-11)
    assert step.cache_info()["entries"] == 1


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=4),
    batch=st.integers(1, 5),
    ratio=st.sampled_from([0.01, 0.3, 0.999, 1.5, 100.0]),
)
def test_random_shapes_and_limits(sizes, batch, ratio):
    sizes = tuple(sizes)
    dtype = lucid.float64
    model = _model(dtype, sizes)
    x, y = _data(dtype, sizes, batch)
    F.mse_loss(model(x), y).backward()
    norm = float(clip_grad_norm_(model.parameters(), math.inf).item())
    max_norm = norm * ratio
    ref, got = _model(dtype, sizes), _model(dtype, sizes)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = optim.SGD(got.parameters(), lr=0.1, momentum=0.9)
    step = fused_step(got, F.mse_loss, opt, max_grad_norm=max_norm)
    for _ in range(2):
        want = _eager_step(ref, ref_opt, F.mse_loss, x, y, max_norm=max_norm)
        step(x, y)
        _assert_close(step.grad_norm.numpy(), want.numpy(), 1e-12)
    _assert_models_close(got, ref, 1e-12)


def _huge_loss(out, target):
    # Finite loss whose gradients' squares overflow float32: the total norm is inf.
    return (out * 1e20).sum() + F.mse_loss(out, target)


def test_infinite_total_norm_zeroes_the_gradients_like_torch():
    # clip_coef = max_norm / (inf + 1e-6) = 0: every gradient is scaled to 0, no error.
    ref, model, step, norms = _train_both(
        lucid.float32, optim.SGD, dict(lr=0.1), 1, loss_fn=_huge_loss, max_norm=1.0
    )
    got, want = norms[0]
    assert math.isinf(float(want.item())) and math.isinf(float(got))
    fresh = _model(lucid.float32)
    for p, q, r in zip(model.parameters(), ref.parameters(), fresh.parameters(), strict=True):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
        np.testing.assert_array_equal(p.numpy(), r.numpy())  # a zero gradient: no change


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_gradients_propagate_like_torch(bad):
    dtype = lucid.float64
    ref, model = _model(dtype), _model(dtype)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    step = fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    x, y = _data(dtype)
    x.numpy()[0, 0] = bad
    want = _eager_step(ref, ref_opt, F.mse_loss, x, y, max_norm=1.0)
    step(x, y)
    assert np.isnan(float(step.grad_norm)) == np.isnan(float(want))
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        np.testing.assert_array_equal(np.isnan(p.numpy()), np.isnan(q.numpy()))
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, equal_nan=True)


def test_check_finite_refuses_a_non_finite_norm_and_leaves_the_model_intact():
    model = _model(lucid.float32)
    opt = optim.Adam(model.parameters(), lr=0.1)
    step = fused_step(model, _huge_loss, opt, max_grad_norm=1.0, check_finite=True)
    x, y = _data(lucid.float32)
    before = [p.numpy().copy() for p in model.parameters()]
    with pytest.raises(FloatingPointError, match="gradient norm is inf"):
        step(x, y)
    for p, b in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), b)
    assert not opt.state  # the failed first step left no optimizer state
    # a healthy loss then trains normally
    step2 = fused_step(model, F.mse_loss, opt, max_grad_norm=1.0, check_finite=True)
    step2(x, y)
    assert float(step2.grad_norm) > 0


def test_grad_norm_is_none_without_norm_clipping_and_before_a_step():
    model = _model(lucid.float64)
    step = fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    assert step.grad_norm is None
    plain = fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1))
    plain(*_data(lucid.float64))
    assert plain.grad_norm is None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_grad_norm=-1.0), ValueError, "max_grad_norm must be >= 0"),
        (dict(max_grad_norm=math.nan), ValueError, "max_grad_norm"),
        (dict(max_grad_norm="1"), TypeError, "max_grad_norm must be a number"),
        (dict(max_grad_norm=True), TypeError, "max_grad_norm must be a number"),
        (dict(clip_grad_value=-0.5), ValueError, "clip_grad_value must be >= 0"),
        (dict(max_grad_norm=1.0, norm_type="l2"), TypeError, "norm_type"),
    ],
)
def test_bad_clipping_options_are_clear_errors(kwargs, error, match):
    model = _model(lucid.float64)
    with pytest.raises(error, match=match):
        fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_norm_is_a_second_result_and_clipping_feeds_the_fused_update():
    model = _model(lucid.float64)
    opt = optim.Adam(model.parameters(), lr=0.1)
    from lucid.compile.training.builder import GradClip

    tm = build_training_module(
        model, F.mse_loss, _data(lucid.float64), optimizer=opt, grad_clip=GradClip(1.0)
    )
    assert tm.result_roles[tm.grad_norm_index] == "output:1"
    assert not any(r.startswith("grad:") for r in tm.result_roles)


# --- compile_optimizer(..., max_grad_norm=): the gradients are real p.grad tensors there -------
@pytest.mark.parametrize("dtype", [lucid.float64, lucid.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("limit", ["below", "above"])
@pytest.mark.parametrize("clip_value", [None, 0.02])
def test_compile_optimizer_clipping_matches_eager(dtype, limit, clip_value):
    norm = _unclipped_norm(dtype)
    max_norm = norm * 10 if limit == "below" else norm / 7
    ref, model = _model(dtype), _model(dtype)
    ref_opt = optim.AdamW(ref.parameters(), lr=0.05)
    opt = compile_optimizer(
        optim.AdamW(model.parameters(), lr=0.05), max_grad_norm=max_norm, clip_grad_value=clip_value
    )
    x, y = _data(dtype)
    for _ in range(3):
        want = _eager_step(ref, ref_opt, F.mse_loss, x, y, max_norm=max_norm, clip_value=clip_value)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        _assert_close(opt.step.grad_norm.numpy(), want.numpy(), RTOL[dtype])
        # p.grad is left clipped, as eager clipping leaves it
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            _assert_close(p.grad.numpy(), q.grad.numpy(), RTOL[dtype])
    _assert_models_close(model, ref, RTOL[dtype])
    assert opt.step.cache_info()["entries"] == 1


def test_compile_optimizer_infinite_norm_zeroes_the_gradients():
    dtype = lucid.float32
    ref, model = _model(dtype), _model(dtype)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    opt = compile_optimizer(optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    x, y = _data(dtype)
    want = _eager_step(ref, ref_opt, _huge_loss, x, y, max_norm=1.0)
    opt.zero_grad()
    _huge_loss(model(x), y).backward()
    opt.step()
    assert math.isinf(float(want)) and math.isinf(float(opt.step.grad_norm))
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_compile_optimizer_without_gradients_reports_a_zero_norm():
    model = _model(lucid.float64)
    opt = compile_optimizer(optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    opt.step()
    assert float(opt.step.grad_norm) == 0.0


def test_compile_optimizer_twice_with_other_clipping_is_an_error():
    model = _model(lucid.float64)
    opt = compile_optimizer(optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    assert compile_optimizer(opt, max_grad_norm=1.0) is opt
    with pytest.raises(ValueError, match="already compiled with gradient clipping"):
        compile_optimizer(opt, max_grad_norm=2.0)
    with pytest.raises(ValueError, match="max_grad_norm must be >= 0"):
        compile_optimizer(optim.SGD(model.parameters(), lr=0.1), max_grad_norm=-2.0)


def test_parity_check_clips_the_eager_reference_too():
    # check="always" compares each compiled step with an eager one that clips the same way
    # (clip_grad_value_, then clip_grad_norm_): no mismatch, and the eager values stay.
    norm = _unclipped_norm(lucid.float64)
    ref, model = _model(lucid.float64), _model(lucid.float64)
    ref_opt = optim.Adam(ref.parameters(), lr=0.05)
    opt = optim.Adam(model.parameters(), lr=0.05)
    step = fused_step(
        model, F.mse_loss, opt, max_grad_norm=norm / 5, clip_grad_value=0.05, check="always"
    )
    x, y = _data(lucid.float64)
    for _ in range(2):
        want = _eager_step(ref, ref_opt, F.mse_loss, x, y, max_norm=norm / 5, clip_value=0.05)
        step(x, y)
        _assert_close(step.grad_norm.numpy(), want.numpy(), 1e-12)
    info = step.cache_info()
    assert info["parity"] == [] and info["eager_only"] == ()
    _assert_models_close(model, ref, 1e-12)
