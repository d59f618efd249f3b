"""``make_step``, ``compiled_step`` and ``CompiledModule.step``: compiled forward + backward whose
gradients equal eager autograd's (float64 models) for the MLP, the CNN with BatchNorm, the
transformer block and the LSTM."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import CompileError, compiled_step, make_step

_spec = importlib.util.spec_from_file_location(
    "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


def _gpt_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


MODELS = {
    "mlp": (models.MLP, F.cross_entropy),
    "cnn_bn": (models.LeNet, F.cross_entropy),
    "transformer": (models.TinyGPT, _gpt_loss),
    "lstm": (models.LSTMModel, F.mse_loss),
}


def _data(name: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    if name == "mlp":
        return lucid.tensor(rng.standard_normal((8, 16))), lucid.tensor(rng.integers(0, 4, 8))
    if name == "cnn_bn":
        x = lucid.tensor(rng.standard_normal((4, 1, 12, 12)))
        return x, lucid.tensor(rng.integers(0, 10, 4))
    if name == "transformer":
        return lucid.tensor(rng.integers(0, 20, (2, 8))), lucid.tensor(rng.integers(0, 20, (2, 8)))
    return lucid.tensor(rng.standard_normal((3, 5, 6))), lucid.tensor(rng.standard_normal((3, 3)))


def _model(name: str):
    lucid.manual_seed(0)
    return MODELS[name][0]().double()


def eager_grads(model, loss_fn, *inputs):
    loss = loss_fn(model(inputs[0]), *inputs[1:])
    loss.backward()
    return float(loss.item()), [
        p.grad.numpy().copy() for p in model.parameters() if p.grad is not None
    ]


def assert_rel_close(got, want, rtol, scale=None):
    got, want = np.asarray(got), np.asarray(want)
    if scale is None:
        scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("name", list(MODELS))
def test_make_step_gradients_equal_eager_autograd(name):
    loss_fn = MODELS[name][1]
    ref, got = _model(name), _model(name)
    inputs = _data(name)
    want_loss, want = eager_grads(ref, loss_fn, *inputs)
    step = make_step(got, loss_fn)
    loss = step(*inputs)
    assert loss.grad_fn is not None
    assert float(loss.item()) == pytest.approx(want_loss, rel=1e-9)
    assert all(p.grad is None for p in got.parameters())  # only backward() fills .grad
    loss.backward()
    # A bias followed by BatchNorm has a gradient that is rounding noise: judge it against the
    # model's gradient scale.
    scale = max(float(np.abs(w).max()) for w in want)
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), w, 1e-7, scale=max(float(np.abs(w).max()), 1e-6 * scale))
    # Buffers (BatchNorm running statistics) advanced exactly as in the eager forward.
    for b, c in zip(got.buffers(), ref.buffers(), strict=True):
        assert_rel_close(b.numpy(), c.numpy(), 1e-9)


def test_backward_scales_by_the_upstream_gradient_and_accumulates():
    ref, got = _model("mlp"), _model("mlp")
    x, y = _data("mlp")
    _, want = eager_grads(ref, F.cross_entropy, x, y)
    step = make_step(got, F.cross_entropy)
    (step(x, y) * 3.0).backward()
    step(x, y).backward()
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), 4.0 * w, 1e-9)


def test_eager_optimizer_after_make_step_trains_like_eager():
    ref, got = _model("cnn_bn"), _model("cnn_bn")
    ref_opt = optim.Adam(ref.parameters(), lr=0.01)
    opt = optim.Adam(got.parameters(), lr=0.01)
    step = make_step(got, F.cross_entropy)
    x, y = _data("cnn_bn")
    for _ in range(5):
        ref_opt.zero_grad()
        want = F.cross_entropy(ref(x), y)
        want.backward()
        ref_opt.step()
        opt.zero_grad()
        loss = step(x, y)
        loss.backward()
        opt.step()
        assert float(loss.item()) == pytest.approx(float(want.item()), rel=1e-7)
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        assert_rel_close(p.numpy(), q.numpy(), 1e-6)
    assert step.cache_info()["entries"] == 1


def test_make_step_caches_per_shape_and_training_flag():
    model = _model("cnn_bn")
    step = make_step(model, F.cross_entropy)
    x, y = _data("cnn_bn")
    step(x, y)
    step(x[:2], y[:2])
    model.eval()
    step(x, y)
    step(x, y)
    assert step.cache_info()["entries"] == 3


def test_make_step_under_no_grad_returns_a_plain_loss():
    step = make_step(_model("mlp"), F.cross_entropy)
    with lucid.no_grad():
        loss = step(*_data("mlp"))
    assert loss.grad_fn is None


def test_frozen_parameters_get_no_gradient():
    ref, got = _model("mlp"), _model("mlp")
    for m in (ref, got):
        m.fc1.weight.requires_grad_(False)
    x, y = _data("mlp")
    _, want = eager_grads(ref, F.cross_entropy, x, y)
    make_step(got, F.cross_entropy)(x, y).backward()
    assert got.fc1.weight.grad is None
    for p, w in zip([got.fc1.bias, got.fc2.weight, got.fc2.bias], want, strict=True):
        assert_rel_close(p.grad.numpy(), w, 1e-9)


def test_compiled_step_writes_grads_and_returns_the_loss():
    ref, got = _model("transformer"), _model("transformer")
    x, y = _data("transformer")
    want_loss, want = eager_grads(ref, _gpt_loss, x, y)
    loss = compiled_step(got, x, _gpt_loss, y)
    assert loss.grad_fn is None
    assert float(loss.item()) == pytest.approx(want_loss, rel=1e-9)
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), w, 1e-7)
    compiled_step(got, x, _gpt_loss, y)  # accumulates, as backward() does
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), 2 * w, 1e-7)


def test_compiled_module_step_is_make_step_cached_per_loss_fn():
    ref, model = _model("mlp"), _model("mlp")
    cm = lucid.compile(model)
    x, y = _data("mlp")
    _, want = eager_grads(ref, F.cross_entropy, x, y)
    loss = cm.step(x, y, loss_fn=F.cross_entropy)
    loss.backward()
    for p, w in zip(model.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), w, 1e-9)
    cm.step(x, y, loss_fn=F.cross_entropy)
    assert len(cm.__dict__["_steps"]) == 1


class ReadsAValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * 2 if h.sum().item() > 0 else h


def test_what_cannot_compile_raises_a_clear_error():
    lucid.manual_seed(0)
    model = ReadsAValue().double()
    x, y = _data("mlp")
    with pytest.raises(CompileError, match="make_step.*graph break"):
        make_step(model, F.cross_entropy)(x, y)
    with pytest.raises(CompileError, match="graph break"):
        compiled_step(model, x, F.cross_entropy, y)
    assert model.fc.weight.grad is None


def test_bad_target_shape_raises_and_leaves_buffers_alone():
    model = _model("cnn_bn")
    x, _ = _data("cnn_bn")
    before = [b.numpy().copy() for b in model.buffers()]
    with pytest.raises(ValueError, match="(?i)shape|size|batch"):
        make_step(model, F.cross_entropy)(x, lucid.tensor(np.zeros(3, dtype=np.int64)))
    for b, a in zip(model.buffers(), before, strict=True):
        np.testing.assert_array_equal(b.numpy(), a)


def test_non_contiguous_inputs_are_accepted():
    ref, got = _model("mlp"), _model("mlp")
    x, y = _data("mlp")
    xt = lucid.tensor(np.asfortranarray(x.numpy()))
    _, want = eager_grads(ref, F.cross_entropy, x, y)
    make_step(got, F.cross_entropy)(xt, y).backward()
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), w, 1e-9)


@settings(max_examples=5, deadline=None)
@given(
    batch=st.integers(1, 9),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_make_step_over_batch_sizes_and_dtypes(batch, dtype, seed):
    lucid.manual_seed(0)
    ref = models.MLP()
    lucid.manual_seed(0)
    got = models.MLP()
    if dtype == np.float64:
        ref, got = ref.double(), got.double()
    rng = np.random.default_rng(seed)
    x = lucid.tensor(rng.standard_normal((batch, 16)).astype(dtype))
    y = lucid.tensor(rng.integers(0, 4, batch))
    _, want = eager_grads(ref, F.cross_entropy, x, y)
    loss = make_step(got, F.cross_entropy)(x, y)
    assert loss.dtype == (lucid.float32 if dtype == np.float32 else lucid.float64)
    loss.backward()
    rtol = 1e-4 if dtype == np.float32 else 1e-9
    for p, w in zip(got.parameters(), want, strict=True):
        assert_rel_close(p.grad.numpy(), w, rtol)
