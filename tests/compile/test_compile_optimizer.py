"""``lucid.compile.compile_optimizer``: ``opt.step()`` as one cached native executable, for every
optimizer and option, against the eager ``step()`` of an identical optimizer fed the same
gradients (float64, so differences are the compiler's, not rounding of float32 models)."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid import optim
from lucid.compile import compile_optimizer
from lucid.compile.training import CompiledOptimizerStep

SHAPES = [(5, 3), (3,), (2, 2, 2)]

CONFIGS = [
    (optim.SGD, dict(lr=0.1)),
    (optim.SGD, dict(lr=0.1, momentum=0.9)),
    (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True)),
    (optim.Adam, dict(lr=0.01)),
    (optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), maximize=True)),
    (optim.AdamW, dict(lr=0.01)),
    (optim.AdamW, dict(lr=0.01, amsgrad=True, weight_decay=0.05)),
    (optim.RMSprop, dict(lr=0.01)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.01)),
    (optim.RMSprop, dict(lr=0.01, momentum=0.9, alpha=0.9, maximize=True)),
    (optim.Adagrad, dict(lr=0.1)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
    (optim.Adadelta, dict(lr=1.0)),
    (optim.Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.01, maximize=True)),
    (optim.Adamax, dict(lr=0.01)),
    (optim.Adamax, dict(lr=0.01, weight_decay=0.01, betas=(0.85, 0.95))),
    (optim.NAdam, dict(lr=0.01)),
    (optim.NAdam, dict(lr=0.01, weight_decay=0.01, momentum_decay=0.01)),
    (optim.NAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True)),
    (optim.RAdam, dict(lr=0.01)),
    (optim.RAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True)),
]
IDS = [f"{cls.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for cls, kw in CONFIGS]
# The long runs of the options-off configs are left to the slow run (the options-on configs
# go through the same code and more).
LONG = [
    pytest.param(cls, kw, id=i, marks=() if len(kw) > 1 else pytest.mark.slow)
    for (cls, kw), i in zip(CONFIGS, IDS, strict=True)
]


def make_params(seed: int = 0) -> list[lucid.Tensor]:
    rng = np.random.default_rng(seed)
    return [lucid.tensor(rng.standard_normal(s), requires_grad=True) for s in SHAPES]


def set_grads(params: list[lucid.Tensor], step: int) -> None:
    """Deterministic gradients that depend on the parameters (so runs diverge if updates do)."""
    rng = np.random.default_rng(1000 + step)
    for p in params:
        noise = rng.standard_normal(p.shape)
        p.grad = lucid.tensor(np.sin(p.numpy() * 3.0) + 0.5 * noise)


def pair(cls, kw, seed: int = 0):
    ref = make_params(seed)
    got = make_params(seed)
    return ref, cls(ref, **kw), got, compile_optimizer(cls(got, **kw))


def run(params, opt, steps: int, start: int = 0) -> None:
    for i in range(start, start + steps):
        set_grads(params, i)
        opt.step()


def assert_rel_close(got, want, rtol):
    """Relative to the tensor's scale, so entries that cancel to ~0 do not demand exactness."""
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def assert_params_close(got, ref, rtol):
    for g, r in zip(got, ref, strict=True):
        assert_rel_close(g.numpy(), r.numpy(), rtol)


@pytest.mark.parametrize(("cls", "kw"), CONFIGS, ids=IDS)
def test_one_step_matches_eager(cls, kw):
    ref, ref_opt, got, opt = pair(cls, kw)
    run(ref, ref_opt, 1)
    run(got, opt, 1)
    assert isinstance(opt.step, CompiledOptimizerStep)
    assert opt.step.cache_info()["entries"] == 1
    assert not np.allclose(got[0].numpy(), make_params()[0].numpy())  # it did move
    assert_params_close(got, ref, 1e-6)


@pytest.mark.parametrize(("cls", "kw"), LONG)
def test_hundred_steps_match_eager_and_state_holds_the_real_buffers(cls, kw):
    ref, ref_opt, got, opt = pair(cls, kw)
    run(ref, ref_opt, 100)
    run(got, opt, 100)
    assert_params_close(got, ref, 1e-4)
    # Per-step scalars never recompile; only RAdam's structure changes (rectification starts
    # once the variance estimate is tractable, a static option of its update).
    assert opt.step.cache_info()["entries"] == (2 if cls is optim.RAdam else 1)
    for p_ref, p_got in zip(ref, got, strict=True):
        st_ref, st_got = ref_opt.state[p_ref], opt.state[p_got]
        assert set(st_ref) == set(st_got)
        for key, v in st_ref.items():
            assert_rel_close(st_got[key].numpy(), v.numpy(), 1e-4)


@pytest.mark.parametrize(
    ("cls", "kw"),
    [(optim.SGD, dict(lr=0.1, momentum=0.9)), (optim.Adam, dict(lr=0.05))],
    ids=["SGD", "Adam"],
)
def test_scheduler_changing_lr_mid_run_is_honoured_without_recompiling(cls, kw):
    ref, ref_opt, got, opt = pair(cls, kw)
    scheds = [optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.1) for o in (ref_opt, opt)]
    for i in range(10):
        set_grads(ref, i)
        ref_opt.step()
        set_grads(got, i)
        opt.step()
        for s in scheds:
            s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(kw["lr"] * 0.001)
    assert_params_close(got, ref, 1e-6)
    assert opt.step.cache_info()["entries"] == 1


@pytest.mark.parametrize(
    ("cls", "kw"),
    [
        (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.2)),
        (optim.Adam, dict(lr=0.01, amsgrad=True)),
        (optim.NAdam, dict(lr=0.01)),
        (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    ],
    ids=["SGD", "Adam", "NAdam", "Adagrad"],
)
def test_state_dict_save_and_load_mid_run_continues_identically(cls, kw):
    params = make_params()
    opt = compile_optimizer(cls(params, **kw))
    run(params, opt, 5)
    saved_params = [p.numpy().copy() for p in params]
    saved = opt.state_dict()
    run(params, opt, 5, start=5)
    want = [p.numpy().copy() for p in params]

    resumed = [lucid.tensor(a, requires_grad=True) for a in saved_params]
    opt2 = compile_optimizer(cls(resumed, **kw))
    opt2.load_state_dict(saved)
    run(resumed, opt2, 5, start=5)
    for r, w in zip(resumed, want, strict=True):
        np.testing.assert_allclose(r.numpy(), w, rtol=1e-12, atol=0)

    # Loading into the same compiled optimizer (new state objects) rebinds, too.
    for p, a in zip(params, saved_params, strict=True):
        p.data = lucid.tensor(a)
    opt.load_state_dict(saved)
    run(params, opt, 5, start=5)
    for p, w in zip(params, want, strict=True):
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-12, atol=0)


def test_parameter_groups_with_their_own_options():
    ref, got = make_params(), make_params()

    def groups(ps):
        return [
            {"params": ps[:2], "lr": 0.01},
            {"params": ps[2:], "lr": 0.1, "weight_decay": 0.1, "amsgrad": True},
        ]

    ref_opt = optim.Adam(groups(ref))
    opt = compile_optimizer(optim.Adam(groups(got)))
    run(ref, ref_opt, 20)
    run(got, opt, 20)
    assert_params_close(got, ref, 1e-6)


def test_parameters_without_a_gradient_are_skipped_like_eager():
    ref, ref_opt, got, opt = pair(optim.Adam, dict(lr=0.01))
    for params, o in ((ref, ref_opt), (got, opt)):
        set_grads(params, 0)
        params[1].grad = None
        o.step()
    np.testing.assert_array_equal(got[1].numpy(), make_params()[1].numpy())
    assert got[1] not in opt.state
    assert_params_close(got, ref, 1e-6)
    # Once every parameter has a gradient, a second executable covers the new set.
    run(ref, ref_opt, 3, start=1)
    run(got, opt, 3, start=1)
    assert_params_close(got, ref, 1e-6)
    assert opt.step.cache_info()["entries"] == 2


def test_no_gradients_is_a_no_op_and_closure_result_is_returned():
    params = make_params()
    opt = compile_optimizer(optim.SGD(params, lr=0.1))
    assert opt.step(lambda: 7.5) == 7.5
    np.testing.assert_array_equal(params[0].numpy(), make_params()[0].numpy())


def test_float32_parameters():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ref = [lucid.tensor(a, requires_grad=True) for a in arrays]
    got = [lucid.tensor(a, requires_grad=True) for a in arrays]
    ref_opt, opt = optim.Adam(ref, lr=0.01), compile_optimizer(optim.Adam(got, lr=0.01))
    for i in range(10):
        for ps, o in ((ref, ref_opt), (got, opt)):
            for p in ps:
                p.grad = lucid.tensor(np.cos(p.numpy() + i).astype(np.float32))
            o.step()
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == lucid.float32
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


def test_compile_optimizer_is_idempotent_and_rejects_non_optimizers():
    opt = optim.SGD(make_params(), lr=0.1)
    assert compile_optimizer(opt) is opt
    step = opt.step
    assert compile_optimizer(opt).step is step
    with pytest.raises(TypeError, match="lucid.optim optimizer"):
        compile_optimizer(object())
