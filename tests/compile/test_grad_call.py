"""``cm(x)`` with grad mode on: a compiled forward (returning residuals) whose outputs carry a
grad_fn running a compiled backward; gradients against eager autograd (float64 models)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid.compile.entry import GradEntry
from lucid.ir import feed_roles, forward_func, result_roles

_spec = importlib.util.spec_from_file_location(
    "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


def _input(name: str, requires_grad: bool):
    rng = np.random.default_rng(0)
    if name == "transformer":
        return lucid.tensor(rng.integers(0, 20, (2, 8)))
    shape = {"mlp": (8, 16), "cnn_bn": (4, 1, 12, 12), "lstm": (3, 5, 6)}[name]
    return lucid.tensor(rng.standard_normal(shape), requires_grad=requires_grad)


MODELS = {
    "mlp": models.MLP,
    "cnn_bn": models.LeNet,
    "transformer": models.TinyGPT,
    "lstm": models.LSTMModel,
}


def _pair(name):
    lucid.manual_seed(0)
    ref = MODELS[name]().double()
    lucid.manual_seed(0)
    got = MODELS[name]().double()
    return ref, got


def _weights(out):
    """A fixed, non-uniform upstream gradient so every output element matters differently."""
    return lucid.tensor(np.random.default_rng(7).standard_normal(tuple(out.shape)))


def assert_rel_close(got, want, rtol, floor):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.abs(want).max(initial=0.0)), floor)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_through_a_compiled_call_equal_eager(name):
    ref, got = _pair(name)
    x_ref = _input(name, requires_grad=True)
    x_got = _input(name, requires_grad=True)
    cm = lucid.compile(got, strict=True)
    out = cm(x_got)
    want = ref(x_ref)
    assert out.grad_fn is not None
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-10)
    w = _weights(want)
    (want * w).sum().backward()
    (out * w).sum().backward()
    # Judged against the model's gradient scale: a bias followed by BatchNorm has a gradient
    # that is pure rounding noise.
    floor = max(float(np.abs(p.grad.numpy()).max()) for p in ref.parameters())
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        assert_rel_close(p.grad.numpy(), q.grad.numpy(), 1e-6, floor)
    if x_ref.grad is not None:
        assert_rel_close(x_got.grad.numpy(), x_ref.grad.numpy(), 1e-6, 1e-12)
    for b, c in zip(got.buffers(), ref.buffers(), strict=True):
        np.testing.assert_allclose(b.numpy(), c.numpy(), rtol=1e-10)
    (entry,) = cm._entries.values()
    assert isinstance(entry, GradEntry)


def test_forward_returns_residuals_and_backward_reads_no_cotangent_free_recompute():
    _, model = _pair("mlp")
    cm = lucid.compile(model, strict=True)
    cm(_input("mlp", requires_grad=False))
    (entry,) = cm._entries.values()
    f_roles = feed_roles(forward_func(entry.fwd_module))
    r_roles = result_roles(forward_func(entry.fwd_module))
    b_roles = feed_roles(forward_func(entry.bwd_module))
    assert not any(r.startswith("cot:") for r in f_roles)
    assert any(r.startswith("residual:") for r in r_roles)
    assert any(r.startswith("residual:") for r in b_roles)
    assert any(r.startswith("cot:") for r in b_roles)
    assert set(result_roles(forward_func(entry.bwd_module))) == {
        f"grad:param:{n}" for n, _ in model.named_parameters()
    }
    # The backward does not recompute the first layer's matmul: it has fewer matmuls than
    # the two of the forward plus the four of the gradient formulas.
    text = str(entry.bwd_module)
    assert text.count("lucid.matmul") + text.count("lucid.linear") <= 4


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        h = F.tanh(self.body(x))
        return {"a": self.a(h), "b": self.b(h), "idx": h.argmax(-1)}


def test_several_outputs_and_an_unused_one():
    lucid.manual_seed(0)
    ref = TwoHeads().double()
    lucid.manual_seed(0)
    got = TwoHeads().double()
    x = lucid.tensor(np.random.default_rng(1).standard_normal((5, 6)))
    cm = lucid.compile(got, strict=True)
    out, want = cm(x), ref(x)
    assert out["idx"].dtype == lucid.int64
    np.testing.assert_array_equal(out["idx"].numpy(), want["idx"].numpy())
    (want["a"] ** 2).sum().backward()
    (out["a"] ** 2).sum().backward()  # head b gets no gradient
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None or not np.any(p.grad.numpy())
        else:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_cache_hit_and_a_second_backward_with_retain_graph():
    ref, got = _pair("mlp")
    cm = lucid.compile(got, strict=True)
    x = _input("mlp", requires_grad=False)
    cm(x)
    out = cm(x)
    assert cm.timing()[0]["n_hits"] == 1
    loss = out.sum()
    loss.backward(retain_graph=True)
    loss.backward()
    ref(x).sum().backward()
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), 2 * q.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_modifying_a_parameter_before_backward_raises_like_eager():
    _, model = _pair("mlp")
    cm = lucid.compile(model, strict=True)
    out = cm(_input("mlp", requires_grad=False))
    with lucid.no_grad():
        model.fc2.weight.mul_(2.0)  # the backward reads it (dh = dy @ W2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation|version"):
        out.sum().backward()


def test_create_graph_is_refused_clearly():
    _, model = _pair("mlp")
    cm = lucid.compile(model, strict=True)
    out = cm(_input("mlp", requires_grad=True))
    with pytest.raises(RuntimeError, match="create_graph"):
        out.sum().backward(create_graph=True)


def test_grad_mode_and_no_grad_are_separate_entries():
    _, model = _pair("mlp")
    cm = lucid.compile(model, strict=True)
    x = _input("mlp", requires_grad=False)
    y1 = cm(x)
    with lucid.no_grad():
        y2 = cm(x)
    assert y1.grad_fn is not None and y2.grad_fn is None
    np.testing.assert_array_equal(y1.detach().numpy(), y2.numpy())
    assert cm.cache_info()["entries"] == 2


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def test_training_dropout_masks_reach_the_backward_as_residuals():
    lucid.manual_seed(0)
    ref = DropoutNet().double()
    lucid.manual_seed(0)
    got = DropoutNet().double()
    x = _input("mlp", requires_grad=False)
    cm = lucid.compile(got, strict=True)
    lucid.manual_seed(11)
    outs = [cm(x) for _ in range(2)]
    lucid.manual_seed(11)
    wants = [ref(x) for _ in range(2)]
    assert not np.allclose(outs[0].detach().numpy(), outs[1].detach().numpy())
    for o, w in zip(outs, wants, strict=True):
        np.testing.assert_allclose(o.detach().numpy(), w.detach().numpy(), rtol=1e-10)
    sum(((o * o).sum() for o in outs), lucid.tensor(0.0)).backward()
    sum(((w * w).sum() for w in wants), lucid.tensor(0.0)).backward()
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_compiled_scalar_loss_backpropagates_like_eager():
    # The loss computed inside the compiled function: its cotangent is 0-d.
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)

    def loss(t):
        return (lucid.tanh(t) * 3.0).sum()

    xe = lucid.tensor(x, requires_grad=True)
    loss(xe).backward()
    xc = lucid.tensor(x, requires_grad=True)
    out = lucid.compile(loss)(xc)
    assert out.shape == ()
    out.backward()
    np.testing.assert_allclose(xc.grad.numpy(), xe.grad.numpy(), rtol=1e-5, atol=1e-6)


@dataclasses.dataclass
class _WithInput:
    y: lucid.Tensor
    x: lucid.Tensor
    mask: lucid.Tensor


class _ReturnsItsInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x, mask=None):
        return _WithInput(self.fc(x).tanh(), x, mask)


@pytest.mark.parametrize("strict", [False, True])
def test_inputs_returned_unchanged_in_grad_mode_come_back_as_themselves(strict):
    lucid.manual_seed(0)
    ref = _ReturnsItsInputs().double()
    lucid.manual_seed(0)
    got = _ReturnsItsInputs().double()
    cm = lucid.compile(got, strict=strict)
    data = np.random.default_rng(2).standard_normal((4, 6))
    xs = [lucid.tensor(data, requires_grad=True) for _ in range(2)]
    masks = [lucid.ones(4, 3, dtype=lucid.float64) for _ in range(2)]
    want = ref(xs[0], mask=masks[0])
    for _ in range(2):  # the compile, then a cache hit
        for x in xs[1:]:
            x.grad = None
        out = cm(xs[1], mask=masks[1])
        assert out.x is xs[1] and out.mask is masks[1]
        np.testing.assert_allclose(out.y.detach().numpy(), want.y.detach().numpy(), rtol=1e-12)
        ((out.y * out.mask).sum() + (out.x**2).sum()).backward()
    ((want.y * want.mask).sum() + (want.x**2).sum()).backward()
    assert not cm.cache_info()["eager_only"]
    assert isinstance(next(iter(cm._entries.values())), GradEntry)
    np.testing.assert_allclose(xs[1].grad.numpy(), xs[0].grad.numpy(), rtol=1e-12)
    for p, q in zip(got.parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), 2 * q.grad.numpy(), rtol=1e-12)


def test_a_transposed_index_input_backpropagates_like_eager():
    # The runtime takes C-contiguous feeds only: the grad path feeds a contiguous copy to the
    # forward and to the backward (which used to fail with "feed 0 must be C-contiguous").
    lucid.manual_seed(0)
    ref = nn.Embedding(10, 4).double()
    lucid.manual_seed(0)
    got = nn.Embedding(10, 4).double()
    idx = lucid.tensor(np.random.default_rng(3).integers(0, 10, (3, 5)))
    cm = lucid.compile(got, strict=True)
    w = _weights(ref(idx.t()))
    for _ in range(2):  # the compile, then a cache hit
        (cm(idx.t()) * w).sum().backward()
    (ref(idx.t()) * w).sum().backward()
    np.testing.assert_allclose(got.weight.grad.numpy(), 2 * ref.weight.grad.numpy(), rtol=1e-12)
    assert isinstance(next(iter(cm._entries.values())), GradEntry)


def test_a_transposed_float_input_gets_its_gradient():
    lucid.manual_seed(0)
    ref = nn.Linear(3, 2).double()
    lucid.manual_seed(0)
    got = nn.Linear(3, 2).double()
    data = np.random.default_rng(4).standard_normal((3, 4))
    x_ref, x_got = (lucid.tensor(data, requires_grad=True) for _ in range(2))
    out, want = lucid.compile(got, strict=True)(x_got.t()), ref(x_ref.t())
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    (out**2).sum().backward()
    (want**2).sum().backward()
    np.testing.assert_allclose(x_got.grad.numpy(), x_ref.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("state_grad", [True, False])
def test_an_lstm_state_tuple_is_compiled_in_grad_mode(state_grad):
    lucid.manual_seed(0)
    ref = nn.LSTM(3, 4, batch_first=True).double()
    lucid.manual_seed(0)
    got = nn.LSTM(3, 4, batch_first=True).double()
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) for s in ((2, 5, 3), (1, 2, 4), (1, 2, 4))]

    def tensors():
        x, h, c = (lucid.tensor(a) for a in arrays)
        x.requires_grad = True
        h.requires_grad = c.requires_grad = state_grad
        return x, h, c

    (xr, hr, cr), (xg, hg, cg) = tensors(), tensors()
    cm = lucid.compile(got, strict=True)
    for _ in range(2):  # the compile, then a cache hit
        out, (hn, cn) = cm(xg, (hg, cg))
        (out.sum() + (hn * 2).sum() + cn.sum()).backward()
    want, (hw, cw) = ref(xr, (hr, cr))
    (want.sum() + (hw * 2).sum() + cw.sum()).backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    info = cm.cache_info()
    assert info["eager_only"] == () and info["entries"] == 1
    assert isinstance(next(iter(cm._entries.values())), GradEntry)
    pairs = [(xg, xr), *zip(got.parameters(), ref.parameters(), strict=True)]
    if state_grad:
        pairs += [(hg, hr), (cg, cr)]
    else:
        assert hg.grad is None and cg.grad is None
    for a, b in pairs:
        np.testing.assert_allclose(a.grad.numpy(), 2 * b.grad.numpy(), rtol=1e-10)
