"""The lucid.compile entry points with ``backend="mpsgraph-reference"``: every graph goes through
lower-to-prim, mpsgraph-legalize, the emitter and the reference builder. ``lucid.compile(m)(x)``
(the zoo, eval and train), gradients through ``cm(x)``, ``make_step``, ``fused_step`` with each of
the nine optimizers, ``compile_optimizer`` with a scheduler, dropout, a float64 model's fallback
and the symbolic batch (``LUCID_COMPILE_DYNAMIC=1``). The backend is named explicitly in each
call; the fixture also sets ``LUCID_COMPILE_BACKEND`` so an entry point that ignored ``backend=``
would still not reach the CPU, and it fails a test that never reached the backend. Models are
float32 (MPSGraph has no float64).
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.backends.mpsgraph import MPSGraphLegalize, MPSGraphReferenceBackend
from lucid.compile import compile_optimizer, fused_step, make_step

_spec = importlib.util.spec_from_file_location(
    "compile_models_mps",
    os.path.join(os.path.dirname(__file__), "..", "..", "compile", "models.py"),
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

REF = "mpsgraph-reference"


@pytest.fixture(autouse=True)
def mpsgraph_reference(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_BACKEND", REF)
    calls = []
    real = MPSGraphReferenceBackend.compile

    def counting(self, module, **kw):
        calls.append(1)
        return real(self, module, **kw)

    monkeypatch.setattr(MPSGraphReferenceBackend, "compile", counting)
    # The backend's pipeline (mpsgraph-legalize) runs before compile and is where float64 is
    # refused: it counts too.
    real_apply = MPSGraphLegalize.apply

    def counting_apply(self, ctx, op):
        calls.append(1)
        return real_apply(self, ctx, op)

    monkeypatch.setattr(MPSGraphLegalize, "apply", counting_apply)
    yield calls
    assert calls, "nothing went through the mpsgraph-reference backend"


def close(got, want, tol=2e-4):
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _data(name, seed=0):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if name == "mlp":
        return lucid.tensor(rng.standard_normal((8, 16)).astype(f32)), lucid.tensor(
            rng.integers(0, 4, 8)
        )
    if name == "cnn_bn":
        x = lucid.tensor(rng.standard_normal((4, 1, 12, 12)).astype(f32))
        return x, lucid.tensor(rng.integers(0, 10, 4))
    if name == "transformer":
        return lucid.tensor(rng.integers(0, 20, (2, 8))), lucid.tensor(rng.integers(0, 20, (2, 8)))
    x = lucid.tensor(rng.standard_normal((3, 5, 6)).astype(f32))
    return x, lucid.tensor(rng.standard_normal((3, 3)).astype(f32))


def _gpt_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


MODELS = {
    "mlp": (models.MLP, F.cross_entropy),
    "cnn_bn": (models.LeNet, F.cross_entropy),
    "transformer": (models.TinyGPT, _gpt_loss),
    "lstm": (models.LSTMModel, F.mse_loss),
}


def _pair(name, seed=0):
    lucid.manual_seed(seed)
    model = MODELS[name][0]()
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_compiled_forward_matches_eager(name, train):
    model, twin = _pair(name)
    model.train(train)
    twin.train(train)
    x, _ = _data(name)
    cm = lucid.compile(twin, backend=REF)
    for _ in range(2):  # the second call is a cache hit; BatchNorm statistics move twice
        close(cm(x).detach().numpy(), model(x).detach().numpy())
    for (_k, a), (_, b) in zip(model.named_buffers(), twin.named_buffers(), strict=True):
        close(b.numpy(), a.numpy(), 1e-5)
    if name == "cnn_bn" and train:
        assert not np.allclose(dict(twin.named_buffers())["bn1.running_mean"].numpy(), 0.0)


@pytest.mark.parametrize("name", ["mlp", "cnn_bn"])
def test_gradients_through_a_compiled_call(name):
    model, twin = _pair(name)
    x, y = _data(name)
    loss_fn = MODELS[name][1]
    loss_fn(model(x), y).backward()
    loss_fn(lucid.compile(twin, backend=REF)(x), y).backward()
    for (_n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        close(b.grad.numpy(), a.grad.numpy(), 5e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_make_step_loss_and_gradients_match_eager(name):
    model, twin = _pair(name)
    x, y = _data(name)
    loss_fn = MODELS[name][1]
    want = loss_fn(model(x), y)
    want.backward()
    got = make_step(twin, loss_fn, backend=REF)(x, y)
    got.backward()
    close(got.detach().numpy(), want.detach().numpy())
    for (_n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        close(b.grad.numpy(), a.grad.numpy(), 5e-4)


NINE = {
    "SGD": dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
    "Adam": dict(lr=0.01, amsgrad=True),
    "AdamW": dict(lr=0.01, weight_decay=0.05),
    "RMSprop": dict(lr=0.01, centered=True, momentum=0.5),
    "Adagrad": dict(lr=0.1, lr_decay=0.01),
    "Adadelta": dict(lr=1.0, rho=0.8),
    "Adamax": dict(lr=0.01),
    "NAdam": dict(lr=0.01, weight_decay=0.01),
    "RAdam": dict(lr=0.01),
}


@pytest.mark.parametrize("opt_name", list(NINE))
def test_fused_step_with_each_optimizer_matches_eager(opt_name):
    cls, kw = getattr(optim, opt_name), NINE[opt_name]
    model, twin = _pair("mlp")
    x, y = _data("mlp")
    ref_opt, opt = cls(model.parameters(), **kw), cls(twin.parameters(), **kw)
    step = fused_step(twin, F.cross_entropy, opt, backend=REF)
    for _ in range(3):
        ref_opt.zero_grad()
        want = F.cross_entropy(model(x), y)
        want.backward()
        ref_opt.step()
        close(step(x, y).numpy(), want.detach().numpy(), 5e-4)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        close(b.detach().numpy(), a.detach().numpy(), 5e-4)
    assert step.cache_info()["entries"] == 1


def test_fused_step_trains_the_cnn_with_batchnorm():
    model, twin = _pair("cnn_bn")
    x, y = _data("cnn_bn")
    ref_opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    step = fused_step(twin, F.cross_entropy, opt, backend=REF)
    for _ in range(3):
        ref_opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        ref_opt.step()
        step(x, y)
    for (_k, a), (_, b) in zip(model.named_buffers(), twin.named_buffers(), strict=True):
        close(b.numpy(), a.numpy(), 5e-4)
    assert float(dict(twin.named_buffers())["bn1.num_batches_tracked"].item()) == 3


def test_compile_optimizer_follows_a_scheduler():
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,)]
    ref = [
        lucid.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in shapes
    ]
    got = [lucid.tensor(p.detach().numpy().copy(), requires_grad=True) for p in ref]
    ref_opt, opt = optim.Adam(ref, lr=0.05), optim.Adam(got, lr=0.05)
    ref_sched = optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    compile_optimizer(opt, backend=REF)
    for _i in range(5):
        g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, q, gi in zip(ref, got, g, strict=True):
            p.grad, q.grad = lucid.tensor(gi), lucid.tensor(gi.copy())
        ref_opt.step()
        opt.step()
        ref_sched.step()
        sched.step()
    for p, q in zip(ref, got, strict=True):
        close(q.detach().numpy(), p.detach().numpy(), 1e-5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.25)


def test_dropout_in_a_compiled_model_draws_eagers_numbers():
    model = nn.Sequential(nn.Linear(6, 32), nn.Dropout(0.5), nn.Linear(32, 2))
    twin = copy.deepcopy(model)
    x = lucid.tensor(np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32))
    assert twin.training
    cm = lucid.compile(twin, backend=REF)
    draws = []
    for seed in (5, 6):
        lucid.manual_seed(seed)
        want = model(x).detach().numpy()
        lucid.manual_seed(seed)
        draws.append(cm(x).detach().numpy())
        close(draws[-1], want, 1e-5)
    assert not np.allclose(draws[0], draws[1])  # the masks follow the seed


def test_a_float64_model_falls_back_with_the_reason():
    model = nn.Linear(3, 2).double()
    cm = lucid.compile(model, backend=REF)
    x = lucid.tensor(np.ones((2, 3)))
    close(cm(x).detach().numpy(), model(x).detach().numpy(), 1e-12)
    reasons = " ".join(str(v) for v in cm.cache_info().values())
    assert "float64" in reasons


def _symbolic_calls(monkeypatch) -> list:
    calls: list = []
    real = MPSGraphReferenceBackend.compile_symbolic

    def counting(self, module, probe, **kw):
        calls.append(1)
        return real(self, module, probe, **kw)

    monkeypatch.setattr(MPSGraphReferenceBackend, "compile_symbolic", counting)
    return calls


def test_symbolic_batch_shares_one_program_and_unsafe_graphs_fall_back(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_DYNAMIC", "1")
    symbolic = _symbolic_calls(monkeypatch)
    model, twin = _pair("mlp")
    model.eval()
    twin.eval()
    cm = lucid.compile(twin, dynamic=True, backend=REF)
    rng = np.random.default_rng(0)
    # Under no_grad: grad-mode calls do not take the symbolic entry yet (issue 12, item 3).
    with lucid.no_grad():
        for n in (3, 5, 8):
            x = lucid.tensor(rng.standard_normal((n, 16)).astype(np.float32))
            close(cm(x).numpy(), model(x).numpy())
    assert len(symbolic) == 1, "one program for every batch size"

    def unsafe(x):
        return x * lucid.ones_like(x).sum()  # a batch-shaped constant

    cu = lucid.compile(unsafe, dynamic=True, backend=REF)
    for n in (3, 5):
        x = lucid.tensor(rng.standard_normal((n, 4)).astype(np.float32))
        close(cu(x).numpy(), unsafe(x).numpy())
    assert "batch" in str(cu.cache_info()["not_symbolic"])


def test_the_final_stage_shows_the_mpsgraph_program():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    cm = lucid.compile(model, backend=REF)
    cm(lucid.tensor(np.ones((2, 4), np.float32)))
    text = cm.ir(stage="final")
    assert "prim.matmul" in text and "// MPSGraph program (lucid.mpsgraph/v1)" in text
    assert "matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:(" in text
