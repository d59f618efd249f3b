"""``lucid.compile.fused_step``: forward + loss + backward + optimizer update as one executable,
against eager training of an identical model (float64 models, so differences are the
compiler's), plus its cache, failure policy and the state it leaves behind."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import CompileError, fused_step

_spec = importlib.util.spec_from_file_location(
    "compile_models", os.path.join(os.path.dirname(__file__), "models.py")
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


def _gpt_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


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


MODELS = {
    "mlp": (models.MLP, F.cross_entropy),
    "cnn_bn": (models.LeNet, F.cross_entropy),
    "transformer": (models.TinyGPT, _gpt_loss),
    "lstm": (models.LSTMModel, F.mse_loss),
}
OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "adam": (optim.Adam, dict(lr=0.01, amsgrad=True)),
}


def _model(name: str, seed: int = 0):
    lucid.manual_seed(seed)
    return MODELS[name][0]().double()


def eager_step(model, loss_fn, opt, *inputs) -> float:
    opt.zero_grad()
    loss = loss_fn(model(inputs[0]), *inputs[1:])
    loss.backward()
    opt.step()
    return float(loss.item())


def assert_rel_close(got, want, rtol):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def assert_models_close(got, want, rtol):
    pairs = [*zip(got.parameters(), want.parameters(), strict=True)]
    pairs += [*zip(got.buffers(), want.buffers(), strict=True)]
    for a, b in pairs:
        assert_rel_close(a.numpy(), b.numpy(), rtol)


def train_both(model_name: str, opt_name: str, steps: int):
    cls, kw = OPTIMIZERS[opt_name]
    loss_fn = MODELS[model_name][1]
    ref, got = _model(model_name), _model(model_name)
    ref_opt, opt = cls(ref.parameters(), **kw), cls(got.parameters(), **kw)
    step = fused_step(got, loss_fn, opt)
    inputs = _data(model_name)
    ref_losses, losses = [], []
    for _ in range(steps):
        ref_losses.append(eager_step(ref, loss_fn, ref_opt, *inputs))
        losses.append(float(step(*inputs).item()))
    return ref, got, ref_losses, losses, step, ref_opt, opt


LONG_RUNS = [
    pytest.param(m, o, id=f"{m}-{o}", marks=() if m == "mlp" else pytest.mark.slow)
    for m in MODELS
    for o in OPTIMIZERS
]


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_one_step_matches_eager(model_name, opt_name):
    ref, got, ref_losses, losses, step, _, _ = train_both(model_name, opt_name, 2)
    assert_rel_close(losses, ref_losses, 1e-6)
    assert_models_close(got, ref, 1e-6)
    assert losses[1] != losses[0]  # the first step's update reached the second forward
    assert step.cache_info()["entries"] == 1


@pytest.mark.parametrize(("model_name", "opt_name"), LONG_RUNS)
def test_hundred_steps_match_eager_training(model_name, opt_name):
    ref, got, ref_losses, losses, step, ref_opt, opt = train_both(model_name, opt_name, 100)
    assert_rel_close(losses, ref_losses, 1e-4)
    assert losses[-1] < losses[0]
    assert_models_close(got, ref, 1e-4)
    p_ref, p_got = next(iter(ref.parameters())), next(iter(got.parameters()))
    for key, v in ref_opt.state[p_ref].items():
        assert_rel_close(opt.state[p_got][key].numpy(), v.numpy(), 1e-4)
    assert step.cache_info()["entries"] == 1


def test_batchnorm_running_stats_are_written_back():
    ref, got, _, _, _, _, _ = train_both("cnn_bn", "sgd", 3)
    stats = dict(got.named_buffers())
    assert float(stats["bn1.num_batches_tracked"].item()) == 3
    assert not np.allclose(stats["bn1.running_mean"].numpy(), 0.0)
    assert_models_close(got, ref, 1e-6)


def test_eval_mode_is_its_own_entry_and_leaves_running_stats_alone():
    model = _model("cnn_bn")
    opt = optim.SGD(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _data("cnn_bn")
    step(x, y)
    model.eval()
    before = {n: b.numpy().copy() for n, b in model.named_buffers()}
    step(x, y)
    for n, b in model.named_buffers():
        np.testing.assert_array_equal(b.numpy(), before[n])
    assert step.cache_info()["entries"] == 2


class DropoutMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))


def test_training_dropout_draws_new_masks_each_call_like_eager():
    lucid.manual_seed(0)
    ref = DropoutMLP().double()
    lucid.manual_seed(0)
    got = DropoutMLP().double()
    x, y = _data("mlp")
    ref_opt, opt = optim.SGD(ref.parameters(), lr=0.0), optim.SGD(got.parameters(), lr=0.0)
    step = fused_step(got, F.cross_entropy, opt)
    lucid.manual_seed(123)
    ref_losses = [eager_step(ref, F.cross_entropy, ref_opt, x, y) for _ in range(3)]
    lucid.manual_seed(123)
    losses = [float(step(x, y).item()) for _ in range(3)]
    assert len(set(losses)) == 3  # lr 0: only the masks differ between calls
    assert_rel_close(losses, ref_losses, 1e-10)


def test_new_input_shape_compiles_a_new_entry():
    ref, got = _model("mlp"), _model("mlp")
    ref_opt, opt = optim.Adam(ref.parameters(), lr=0.01), optim.Adam(got.parameters(), lr=0.01)
    step = fused_step(got, F.cross_entropy, opt)
    rng = np.random.default_rng(1)
    for batch in (8, 5, 8, 5):
        x = lucid.tensor(rng.standard_normal((batch, 16)))
        y = lucid.tensor(rng.integers(0, 4, batch))
        want = eager_step(ref, F.cross_entropy, ref_opt, x, y)
        assert float(step(x, y).item()) == pytest.approx(want, rel=1e-6)
    assert step.cache_info()["entries"] == 2
    assert_models_close(got, ref, 1e-6)


def test_scheduler_changes_lr_mid_run_without_recompiling():
    ref, got = _model("mlp"), _model("mlp")
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = optim.SGD(got.parameters(), lr=0.1, momentum=0.9)
    scheds = [optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (ref_opt, opt)]
    step = fused_step(got, F.cross_entropy, opt)
    x, y = _data("mlp")
    for _ in range(7):
        eager_step(ref, F.cross_entropy, ref_opt, x, y)
        step(x, y)
        for s in scheds:
            s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert_models_close(got, ref, 1e-6)
    assert step.cache_info()["entries"] == 1


def test_state_dict_save_and_load_mid_run_continues_identically():
    model = _model("mlp")
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _data("mlp")
    for _ in range(3):
        step(x, y)
    saved_model = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    saved_opt = opt.state_dict()
    want = [float(step(x, y).item()) for _ in range(3)]
    want_params = [p.numpy().copy() for p in model.parameters()]

    resumed = _model("mlp", seed=5)
    resumed.load_state_dict({k: lucid.tensor(v) for k, v in saved_model.items()})
    opt2 = optim.Adam(resumed.parameters(), lr=0.01)
    opt2.load_state_dict(saved_opt)
    step2 = fused_step(resumed, F.cross_entropy, opt2)
    got = [float(step2(x, y).item()) for _ in range(3)]
    assert got == pytest.approx(want, rel=1e-12)
    for p, w in zip(resumed.parameters(), want_params, strict=True):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-12)
    assert float(opt2.state[next(iter(resumed.parameters()))]["step"].item()) == 6


def _snapshot(model, opt):
    params = [p.numpy().copy() for p in model.parameters()]
    state = {id(p): {k: np.array(v.numpy()) for k, v in st.items()} for p, st in opt.state.items()}
    return params, state


def _assert_unchanged(model, opt, snap):
    params, state = snap
    for p, a in zip(model.parameters(), params, strict=True):
        np.testing.assert_array_equal(p.numpy(), a)
    assert {id(p) for p in opt.state} == set(state)
    for p, st in opt.state.items():
        for k, v in st.items():
            np.testing.assert_array_equal(v.numpy(), state[id(p)][k])


def test_wrong_target_shape_raises_and_parameters_stay_intact():
    model = _model("mlp")
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _data("mlp")
    step(x, y)
    snap = _snapshot(model, opt)
    with pytest.raises((ValueError, RuntimeError), match="(?i)shape|size|batch"):
        step(x, lucid.tensor(np.zeros(5, dtype=np.int64)))
    _assert_unchanged(model, opt, snap)


def test_wrong_target_dtype_raises_and_parameters_stay_intact():
    model = _model("mlp")
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = fused_step(model, F.cross_entropy, opt)
    x, _ = _data("mlp")
    snap = _snapshot(model, opt)
    with pytest.raises((TypeError, ValueError, RuntimeError), match="target"):
        step(x, lucid.tensor(np.zeros(8, dtype=np.float64)))
    _assert_unchanged(model, opt, snap)


def test_nan_loss_is_reported_when_asked_and_nothing_is_written():
    model = _model("mlp")
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, F.cross_entropy, opt, check_finite=True)
    x, y = _data("mlp")
    step(x, y)
    snap = _snapshot(model, opt)
    bad = x.numpy().copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="nan"):
        step(lucid.tensor(bad), y)
    _assert_unchanged(model, opt, snap)
    # ...and the next good step continues as if the bad one never happened.
    ref = _model("mlp")
    ref_opt = optim.Adam(ref.parameters(), lr=0.01)
    for _ in range(2):
        eager_step(ref, F.cross_entropy, ref_opt, x, y)
    step(x, y)
    assert_models_close(model, ref, 1e-6)


class ReadsAValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * 2 if h.sum().item() > 0 else h  # a graph break


def test_what_cannot_compile_raises_and_leaves_optimizer_state_unchanged():
    lucid.manual_seed(0)
    model = ReadsAValue().double()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = fused_step(model, F.cross_entropy, opt)
    x, y = _data("mlp")
    before = [p.numpy().copy() for p in model.parameters()]
    with pytest.raises(CompileError, match="graph break"):
        step(x, y)
    assert len(opt.state) == 0
    for p, a in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), a)


def test_float32_training_matches_eager():
    lucid.manual_seed(0)
    ref = models.MLP()
    lucid.manual_seed(0)
    got = models.MLP()
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((8, 16)).astype(np.float32))
    y = lucid.tensor(rng.integers(0, 4, 8))
    ref_opt, opt = optim.Adam(ref.parameters(), lr=0.01), optim.Adam(got.parameters(), lr=0.01)
    step = fused_step(got, F.cross_entropy, opt)
    for _ in range(10):
        want = eager_step(ref, F.cross_entropy, ref_opt, x, y)
        loss = step(x, y)
        assert loss.dtype == lucid.float32
        assert float(loss.item()) == pytest.approx(want, rel=1e-4)
    assert_models_close(got, ref, 1e-4)


def test_rejects_what_is_not_a_model_or_an_optimizer():
    model = _model("mlp")
    with pytest.raises(TypeError, match="optimizer"):
        fused_step(model, F.cross_entropy, object())
    with pytest.raises(TypeError, match="nn.Module"):
        fused_step(lambda x: x, F.cross_entropy, optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_unfused_updates_for_large_parameters_match_eager(monkeypatch, opt_name):
    # Large models skip optimizer-fusion (its concat/slice copies cost more than they save).
    import lucid.compile.training.entries as training

    monkeypatch.setattr(training, "_FUSE_LIMIT_ELEMENTS", 0)
    ref, got, ref_losses, losses, step, _, _ = train_both("mlp", opt_name, 3)
    assert "concat" not in str(step.module())
    assert_rel_close(losses, ref_losses, 1e-6)
    assert_models_close(got, ref, 1e-6)


def test_a_failed_first_step_leaves_no_optimizer_state_behind():
    model = _model("mlp")
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    step = fused_step(model, F.cross_entropy, opt, check_finite=True)
    x, y = _data("mlp")
    bad = x.numpy().copy()
    bad[0, 0] = np.inf
    before = [p.numpy().copy() for p in model.parameters()]
    with pytest.raises(FloatingPointError):
        step(lucid.tensor(bad), y)
    assert len(opt.state) == 0 and step.cache_info()["entries"] == 0
    for p, a in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), a)
    # The next step is a true first step (momentum buffer = gradient, despite dampening).
    ref = _model("mlp")
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    eager_step(ref, F.cross_entropy, ref_opt, x, y)
    eager_step(ref, F.cross_entropy, ref_opt, x, y)
    step(x, y)
    step(x, y)
    assert_models_close(model, ref, 1e-6)


def test_a_runtime_error_inside_the_step_writes_nothing():
    # An out-of-range token id fails inside the native run (a gather's range check), after
    # part of the program ran: the in-place writes come last, so nothing was written.
    model = _model("transformer")
    opt = optim.Adam(model.parameters(), lr=0.01)
    step = fused_step(model, _gpt_loss, opt)
    x, y = _data("transformer")
    step(x, y)
    snap = _snapshot(model, opt)
    bad = x.numpy().copy()
    bad[0, 0] = 99
    with pytest.raises(IndexError):
        step(lucid.tensor(bad), y)
    _assert_unchanged(model, opt, snap)
    assert step.cache_info()["entries"] == 1


def test_parameter_groups_with_their_own_options():
    ref, got = _model("mlp"), _model("mlp")

    def groups(m):
        return [
            {"params": list(m.fc1.parameters()), "lr": 0.05},
            {"params": list(m.fc2.parameters()), "lr": 0.005, "weight_decay": 0.1},
        ]

    ref_opt, opt = optim.Adam(groups(ref)), optim.Adam(groups(got))
    step = fused_step(got, F.cross_entropy, opt)
    x, y = _data("mlp")
    for _ in range(5):
        want = eager_step(ref, F.cross_entropy, ref_opt, x, y)
        assert float(step(x, y).item()) == pytest.approx(want, rel=1e-6)
    assert_models_close(got, ref, 1e-6)
    opt.param_groups[1]["lr"] = ref_opt.param_groups[1]["lr"] = 0.05  # by hand, mid-run
    for _ in range(3):
        eager_step(ref, F.cross_entropy, ref_opt, x, y)
        step(x, y)
    assert_models_close(got, ref, 1e-6)
    assert step.cache_info()["entries"] == 1
