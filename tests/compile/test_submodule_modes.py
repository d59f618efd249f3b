"""A submodule's train/eval mode flipped by hand (``model.bn.eval()`` while the model trains,
``cm.eval(); model.drop.train()``) is part of every cache key: the compiled module and the
training steps serve the executable traced in that combination, never a stale one, and keep
both combinations cached."""

import itertools

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import fused_step, make_step
from lucid.compile._binding import training_modes
from lucid.nn.modules.module import MODE_VERSION


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


def _pair():
    lucid.manual_seed(0)
    ref = Net().double()
    got = Net().double()
    got.load_state_dict(ref.state_dict())
    return ref, got


def _set_modes(model, top, bn, drop):
    model.train(top)
    model.bn.train(bn)
    model.drop.train(drop)


# Every combination, then each again (flipping back must hit the cache).
COMBOS = list(itertools.product((True, False), repeat=3))


def _data():
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((6, 8)))
    y = lucid.tensor(rng.integers(0, 4, 6))
    return x, y


def _assert_buffers_equal(got, ref):
    for (n, a), (_, b) in zip(got.named_buffers(), ref.named_buffers(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12, err_msg=n)


def test_training_modes_is_compact_and_tracks_flips():
    model = Net()
    assert training_modes([model]) is True
    before = MODE_VERSION[0]
    model.bn.eval()
    assert MODE_VERSION[0] > before
    assert training_modes([model]) == (True, ("bn",))
    model.eval()
    model.drop.training = True  # a plain assignment counts too
    assert training_modes([model]) == (False, ("drop",))
    model.drop.eval()
    assert training_modes([model]) is False
    assert training_modes([]) is False


@pytest.mark.parametrize("grad", [False, True])
def test_compiled_module_follows_every_mode_combination(grad):
    ref, got = _pair()
    cm = lucid.compile(got)
    x, _ = _data()
    for rounds in range(2):
        for top, bn, drop in COMBOS:
            _set_modes(ref, top, bn, drop)
            _set_modes(got, top, bn, drop)
            with lucid.set_grad_enabled(grad):
                lucid.manual_seed(7)
                want = ref(x)
                lucid.manual_seed(7)
                out = cm(x)
            msg = f"round {rounds}: model {top}, bn {bn}, drop {drop}"
            np.testing.assert_allclose(
                out.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=msg
            )
            _assert_buffers_equal(got, ref)
        info = cm.cache_info()
        if rounds == 0:
            compiled = (info["entries"], len(info["recompiles"]))
            assert info["entries"] == len(COMBOS)  # one executable per combination
        else:
            # Flipping back to each combination served its cached executable.
            assert (info["entries"], len(info["recompiles"])) == compiled
            assert all(n == 2 for n in info["n_calls"].values())


def test_frozen_batchnorm_keeps_running_stats_and_dropout_stays_on():
    """The fine-tuning pattern: the model trains, its BatchNorm is frozen (eval)."""
    ref, got = _pair()
    cm = lucid.compile(got)
    x, _ = _data()
    with lucid.no_grad():
        cm(x)  # all in train mode: cached
        ref(x)
        got.bn.eval()
        ref.bn.eval()
        frozen = {n: b.numpy().copy() for n, b in got.named_buffers()}
        lucid.manual_seed(3)
        out = cm(x)
        lucid.manual_seed(3)
        want = ref(x)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    for n, b in got.named_buffers():  # eval BatchNorm: statistics untouched
        np.testing.assert_array_equal(b.numpy(), frozen[n])
    with lucid.no_grad():
        lucid.manual_seed(4)
        other = cm(x)
    assert not np.allclose(other.numpy(), out.numpy())  # dropout still active (training)


def test_eval_then_dropout_train_is_not_served_the_eval_executable():
    ref, got = _pair()
    cm = lucid.compile(got)
    x, _ = _data()
    cm.eval()
    ref.eval()
    with lucid.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), ref(x).numpy(), rtol=1e-10)
        got.drop.train()
        ref.drop.train()
        lucid.manual_seed(5)
        out = cm(x)
        lucid.manual_seed(5)
        want = ref(x)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    assert "eval (train: drop)" in repr(cm.cache_info()["keys"])


def _eager_grads(model, x, y):
    for p in model.parameters():
        p.grad = None
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.item()), [p.grad.numpy().copy() for p in model.parameters()]


def test_make_step_follows_submodule_modes():
    ref, got = _pair()
    step = make_step(got, F.cross_entropy)
    x, y = _data()
    for rounds in range(2):
        for top, bn, drop in COMBOS:
            _set_modes(ref, top, bn, drop)
            _set_modes(got, top, bn, drop)
            lucid.manual_seed(11)
            want, want_grads = _eager_grads(ref, x, y)
            for p in got.parameters():
                p.grad = None
            lucid.manual_seed(11)
            loss = step(x, y)
            loss.backward()
            msg = f"round {rounds}: model {top}, bn {bn}, drop {drop}"
            assert float(loss.item()) == pytest.approx(want, rel=1e-10), msg
            for g, w in zip(got.parameters(), want_grads, strict=True):
                np.testing.assert_allclose(g.grad.numpy(), w, rtol=1e-9, atol=1e-12, err_msg=msg)
            _assert_buffers_equal(got, ref)
        if rounds == 0:
            n_entries = step.cache_info()["entries"]
            assert n_entries == len(COMBOS)
    assert step.cache_info()["entries"] == n_entries  # flipping back: no recompile


def test_fused_step_follows_submodule_modes():
    ref, got = _pair()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    opt = optim.SGD(got.parameters(), lr=0.1)
    step = fused_step(got, F.cross_entropy, opt)
    x, y = _data()
    for rounds in range(2):
        for top, bn, drop in COMBOS:
            _set_modes(ref, top, bn, drop)
            _set_modes(got, top, bn, drop)
            lucid.manual_seed(13)
            ref_opt.zero_grad()
            want = F.cross_entropy(ref(x), y)
            want.backward()
            ref_opt.step()
            lucid.manual_seed(13)
            loss = step(x, y)
            msg = f"round {rounds}: model {top}, bn {bn}, drop {drop}"
            assert float(loss.item()) == pytest.approx(float(want.item()), rel=1e-10), msg
            for (n, a), b in zip(got.named_parameters(), ref.parameters(), strict=True):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12, err_msg=n)
            _assert_buffers_equal(got, ref)
        if rounds == 0:
            n_entries = step.cache_info()["entries"]
            assert n_entries == len(COMBOS)
    assert step.cache_info()["entries"] == n_entries


def test_compiled_step_passes_on_options_and_check(tmp_path):
    _, got = _pair()
    cm = lucid.compile(got, check="always", options={"print_ir_tree_dir": tmp_path})
    x, y = _data()
    cm.step(x, y, loss_fn=F.cross_entropy).backward()
    (step,) = cm.__dict__["_steps"].values()
    assert step._opts.mode == "always"
    assert step._opts.switches.get("print_ir_tree_dir") == str(tmp_path)
    assert any(tmp_path.iterdir())  # the step's compile wrote its IR tree there


def test_save_compiled_skips_mixed_mode_signatures(tmp_path, caplog):
    from lucid.compile import save_compiled

    _, got = _pair()
    cm = lucid.compile(got)
    x, _ = _data()
    got.eval()
    got.drop.train()
    with lucid.no_grad():
        cm(x)
    # A loaded module knows one training flag: the mixed-mode executable is not saved.
    assert save_compiled(cm, tmp_path / "m.lucid") is False
    assert "mixed train/eval modes" in caplog.text
    got.drop.eval()
    with lucid.no_grad():
        cm(x)
    assert save_compiled(cm, tmp_path / "m.lucid") is True
