"""Every optimizer and option against a plain-numpy reference written from PyTorch's documented
algorithm (the "Algorithm" box of each optimizer's documentation page), in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid import optim

N_STEPS = 8


# --- numpy references, one per optimizer, straight from the documented algorithms -------------
# Each takes the initial parameter and the gradient of every step and returns the final parameter.


def ref_sgd(
    p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False
):
    b = None
    for t, g in enumerate(grads, 1):
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + weight_decay * p
        if momentum != 0:
            b = g if t == 1 else momentum * b + (1 - dampening) * g
            g = g + momentum * b if nesterov else b
        p = p - lr * g
    return p


def ref_decay(p, g, lr, weight_decay, decoupled_weight_decay, maximize):
    """The start of an Adam-family step: ``(p, g)`` after maximization and weight decay (L2
    added to the gradient, or decoupled: the parameter shrunk by ``lr * weight_decay``)."""
    g = -g if maximize else g
    if weight_decay != 0:
        if decoupled_weight_decay:
            p = p - lr * weight_decay * p
        else:
            g = g + weight_decay * p
    return p, g


def ref_adam(
    p,
    grads,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    amsgrad=False,
    maximize=False,
    decoupled_weight_decay=False,
):
    b1, b2 = betas
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    v_max = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        p, g = ref_decay(p, g, lr, weight_decay, decoupled_weight_decay, maximize)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        if amsgrad:
            v_max = np.maximum(v_max, v)
            v_hat = v_max / (1 - b2**t)
        else:
            v_hat = v / (1 - b2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


def ref_adamw(p, grads, weight_decay=1e-2, **kw):
    return ref_adam(p, grads, weight_decay=weight_decay, decoupled_weight_decay=True, **kw)


def ref_rmsprop(
    p,
    grads,
    lr=1e-2,
    alpha=0.99,
    eps=1e-8,
    weight_decay=0.0,
    momentum=0.0,
    centered=False,
    maximize=False,
):
    v = np.zeros_like(p)
    b = np.zeros_like(p)
    g_ave = np.zeros_like(p)
    for g in grads:
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g**2
        v_tilde = v
        if centered:
            g_ave = g_ave * alpha + (1 - alpha) * g
            v_tilde = v_tilde - g_ave**2
        if momentum > 0:
            b = momentum * b + g / (np.sqrt(v_tilde) + eps)
            p = p - lr * b
        else:
            p = p - lr * g / (np.sqrt(v_tilde) + eps)
    return p


def ref_adagrad(
    p,
    grads,
    lr=1e-2,
    lr_decay=0.0,
    weight_decay=0.0,
    initial_accumulator_value=0.0,
    eps=1e-10,
    maximize=False,
):
    state_sum = np.full_like(p, initial_accumulator_value)
    for t, g in enumerate(grads, 1):
        g = -g if maximize else g
        lr_t = lr / (1 + (t - 1) * lr_decay)
        if weight_decay != 0:
            g = g + weight_decay * p
        state_sum = state_sum + g**2
        p = p - lr_t * g / (np.sqrt(state_sum) + eps)
    return p


def ref_adadelta(p, grads, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    v = np.zeros_like(p)
    u = np.zeros_like(p)
    for g in grads:
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + weight_decay * p
        v = v * rho + g**2 * (1 - rho)
        dx = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u = u * rho + dx**2 * (1 - rho)
        p = p - lr * dx
    return p


def ref_adamax(p, grads, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False):
    b1, b2 = betas
    m = np.zeros_like(p)
    u = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        u = np.maximum(b2 * u, np.abs(g) + eps)
        p = p - lr * m / ((1 - b1**t) * u)
    return p


def ref_nadam(
    p,
    grads,
    lr=2e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    momentum_decay=4e-3,
    decoupled_weight_decay=False,
    maximize=False,
):
    b1, b2 = betas
    m = np.zeros_like(p)
    v = np.zeros_like(p)

    def mu(t):
        return b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))

    for t, g in enumerate(grads, 1):
        p, g = ref_decay(p, g, lr, weight_decay, decoupled_weight_decay, maximize)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        prod_t = math.prod(mu(i) for i in range(1, t + 1))
        prod_t1 = prod_t * mu(t + 1)
        m_hat = mu(t + 1) * m / (1 - prod_t1) + (1 - mu(t)) * g / (1 - prod_t)
        v_hat = v / (1 - b2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


def ref_radam(
    p,
    grads,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    decoupled_weight_decay=False,
    maximize=False,
):
    b1, b2 = betas
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    rho_inf = 2 / (1 - b2) - 1
    for t, g in enumerate(grads, 1):
        p, g = ref_decay(p, g, lr, weight_decay, decoupled_weight_decay, maximize)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho_t > 5:
            l_t = np.sqrt(1 - b2**t) / (np.sqrt(v) + eps)
            r_t = math.sqrt(
                (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
            )
            p = p - lr * m_hat * r_t * l_t
        else:
            p = p - lr * m_hat
    return p


# (case id, optimizer class, options, reference)
CASES = [
    ("sgd", optim.SGD, dict(lr=0.1), ref_sgd),
    ("sgd-momentum", optim.SGD, dict(lr=0.1, momentum=0.9), ref_sgd),
    ("sgd-dampening", optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3), ref_sgd),
    ("sgd-nesterov", optim.SGD, dict(lr=0.1, momentum=0.8, nesterov=True), ref_sgd),
    ("sgd-weight-decay", optim.SGD, dict(lr=0.1, weight_decay=0.2), ref_sgd),
    ("sgd-maximize", optim.SGD, dict(lr=0.1, momentum=0.5, maximize=True), ref_sgd),
    (
        "sgd-all",
        optim.SGD,
        dict(lr=0.05, momentum=0.7, dampening=0.1, weight_decay=0.3, maximize=True),
        ref_sgd,
    ),
    (
        "sgd-nesterov-wd",
        optim.SGD,
        dict(lr=0.05, momentum=0.7, nesterov=True, weight_decay=0.1),
        ref_sgd,
    ),
    ("adam", optim.Adam, dict(lr=0.01), ref_adam),
    ("adam-betas-eps", optim.Adam, dict(lr=0.02, betas=(0.8, 0.9), eps=1e-3), ref_adam),
    ("adam-amsgrad", optim.Adam, dict(lr=0.01, amsgrad=True), ref_adam),
    ("adam-weight-decay", optim.Adam, dict(lr=0.01, weight_decay=0.1), ref_adam),
    ("adam-maximize", optim.Adam, dict(lr=0.01, maximize=True), ref_adam),
    (
        "adam-decoupled",
        optim.Adam,
        dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
        ref_adam,
    ),
    (
        "adam-all",
        optim.Adam,
        dict(lr=0.01, amsgrad=True, weight_decay=0.1, maximize=True),
        ref_adam,
    ),
    ("adamw", optim.AdamW, dict(lr=0.01), ref_adamw),
    ("adamw-amsgrad", optim.AdamW, dict(lr=0.01, weight_decay=0.3, amsgrad=True), ref_adamw),
    ("adamw-maximize", optim.AdamW, dict(lr=0.01, maximize=True), ref_adamw),
    ("rmsprop", optim.RMSprop, dict(lr=0.01), ref_rmsprop),
    ("rmsprop-alpha", optim.RMSprop, dict(lr=0.01, alpha=0.8, eps=1e-4), ref_rmsprop),
    ("rmsprop-centered", optim.RMSprop, dict(lr=0.01, centered=True), ref_rmsprop),
    ("rmsprop-momentum", optim.RMSprop, dict(lr=0.01, momentum=0.9), ref_rmsprop),
    ("rmsprop-weight-decay", optim.RMSprop, dict(lr=0.01, weight_decay=0.1), ref_rmsprop),
    (
        "rmsprop-all",
        optim.RMSprop,
        dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1, maximize=True),
        ref_rmsprop,
    ),
    ("adagrad", optim.Adagrad, dict(lr=0.1), ref_adagrad),
    ("adagrad-lr-decay", optim.Adagrad, dict(lr=0.1, lr_decay=0.3), ref_adagrad),
    ("adagrad-weight-decay", optim.Adagrad, dict(lr=0.1, weight_decay=0.2), ref_adagrad),
    (
        "adagrad-initial-acc",
        optim.Adagrad,
        dict(lr=0.1, initial_accumulator_value=0.5, eps=1e-3),
        ref_adagrad,
    ),
    ("adagrad-maximize", optim.Adagrad, dict(lr=0.1, maximize=True), ref_adagrad),
    ("adadelta", optim.Adadelta, dict(), ref_adadelta),
    ("adadelta-rho-lr", optim.Adadelta, dict(lr=0.5, rho=0.5, eps=1e-3), ref_adadelta),
    ("adadelta-weight-decay", optim.Adadelta, dict(weight_decay=0.2), ref_adadelta),
    ("adadelta-maximize", optim.Adadelta, dict(maximize=True), ref_adadelta),
    ("adamax", optim.Adamax, dict(lr=0.01), ref_adamax),
    ("adamax-betas", optim.Adamax, dict(lr=0.01, betas=(0.5, 0.6)), ref_adamax),
    ("adamax-weight-decay", optim.Adamax, dict(lr=0.01, weight_decay=0.2), ref_adamax),
    ("adamax-maximize", optim.Adamax, dict(lr=0.01, maximize=True), ref_adamax),
    ("nadam", optim.NAdam, dict(lr=0.01), ref_nadam),
    (
        "nadam-momentum-decay",
        optim.NAdam,
        dict(lr=0.01, momentum_decay=0.5, betas=(0.8, 0.9)),
        ref_nadam,
    ),
    ("nadam-weight-decay", optim.NAdam, dict(lr=0.01, weight_decay=0.1), ref_nadam),
    (
        "nadam-decoupled",
        optim.NAdam,
        dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
        ref_nadam,
    ),
    ("nadam-maximize", optim.NAdam, dict(lr=0.01, maximize=True), ref_nadam),
    ("radam", optim.RAdam, dict(lr=0.01), ref_radam),
    ("radam-rectified-early", optim.RAdam, dict(lr=0.01, betas=(0.9, 0.8)), ref_radam),
    (
        "radam-weight-decay",
        optim.RAdam,
        dict(lr=0.01, weight_decay=0.1, betas=(0.9, 0.8)),
        ref_radam,
    ),
    (
        "radam-decoupled",
        optim.RAdam,
        dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, betas=(0.9, 0.8)),
        ref_radam,
    ),
    ("radam-maximize", optim.RAdam, dict(lr=0.01, maximize=True, betas=(0.9, 0.8)), ref_radam),
]


def _rtol(cls) -> float:
    # NAdam keeps its momentum product in a float32 0-d tensor, as torch does.
    return 1e-6 if cls is optim.NAdam else 1e-10


def _problem(seed: int, shapes=((3, 4), (5,), ())):
    """Initial parameters and per-step gradients whose scale changes a lot from step to step (so
    AMSGrad's running maximum and Adamax's infinity norm both matter)."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in shapes]
    scales = rng.uniform(0.1, 3.0, size=N_STEPS)
    grads = [[rng.standard_normal(s) * scales[t] for s in shapes] for t in range(N_STEPS)]
    return params, grads


def _run(cls, options, params0, grads, dtype=lucid.float64):
    params = [lucid.tensor(p, dtype=dtype, requires_grad=True) for p in params0]
    opt = cls(params, **options)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = lucid.tensor(g, dtype=dtype)
        opt.step()
    return params, opt


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_documented_algorithm(case):
    _, cls, options, reference = case
    params0, grads = _problem(seed=len(case[0]))
    params, _ = _run(cls, options, params0, grads)
    for i, (p, p0) in enumerate(zip(params, params0, strict=True)):
        expected = reference(p0, [g[i] for g in grads], **options)
        np.testing.assert_allclose(p.numpy(), expected, rtol=_rtol(cls), atol=1e-12)
        assert not np.allclose(expected, p0), "the reference did not move: a vacuous case"


@pytest.mark.parametrize("case", CASES[::4], ids=[c[0] for c in CASES[::4]])
def test_float32_parameters_stay_float32(case):
    _, cls, options, reference = case
    params0, grads = _problem(seed=7)
    params, opt = _run(cls, options, params0, grads, dtype=lucid.float32)
    for i, (p, p0) in enumerate(zip(params, params0, strict=True)):
        assert p.dtype == lucid.float32
        for name, value in opt.state[p].items():
            expected_dtype = lucid.float32 if name in ("step", "mu_product") else p.dtype
            assert value.dtype == expected_dtype, name
        p0_32 = p0.astype(np.float32).astype(np.float64)
        grads32 = [g[i].astype(np.float32).astype(np.float64) for g in grads]
        expected = reference(p0_32, grads32, **options)
        np.testing.assert_allclose(p.numpy(), expected, rtol=2e-4, atol=2e-5)


@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    seed=st.integers(0, 2**16),
    case_index=st.integers(0, len(CASES) - 1),
)
def test_any_shape(shape, seed, case_index):
    _, cls, options, reference = CASES[case_index]
    params0, grads = _problem(seed, shapes=(shape,))
    params, _ = _run(cls, options, params0, grads)
    expected = reference(params0[0], [g[0] for g in grads], **options)
    assert params[0].shape == shape
    np.testing.assert_allclose(params[0].numpy(), expected, rtol=_rtol(cls), atol=1e-12)


def test_param_groups_use_their_own_options():
    params0, grads = _problem(seed=3, shapes=((4,), (2, 2)))
    a = lucid.tensor(params0[0], requires_grad=True)
    b = lucid.tensor(params0[1], requires_grad=True)
    opt = optim.SGD(
        [{"params": [a]}, {"params": [b], "lr": 0.5, "nesterov": True}], lr=0.1, momentum=0.9
    )
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["lr"] == 0.5
    assert opt.param_groups[1]["momentum"] == 0.9  # filled from the defaults
    for g in grads:
        a.grad, b.grad = lucid.tensor(g[0]), lucid.tensor(g[1])
        opt.step()
    ga = [g[0] for g in grads]
    gb = [g[1] for g in grads]
    np.testing.assert_allclose(a.numpy(), ref_sgd(params0[0], ga, lr=0.1, momentum=0.9))
    np.testing.assert_allclose(
        b.numpy(), ref_sgd(params0[1], gb, lr=0.5, momentum=0.9, nesterov=True)
    )


def test_adam_param_groups_with_different_lrs_and_amsgrad():
    params0, grads = _problem(seed=4, shapes=((3,), (3,)))
    a = lucid.tensor(params0[0], requires_grad=True)
    b = lucid.tensor(params0[1], requires_grad=True)
    opt = optim.Adam([{"params": a, "lr": 0.05, "amsgrad": True}, {"params": [b]}], lr=0.01)
    for g in grads:
        a.grad, b.grad = lucid.tensor(g[0]), lucid.tensor(g[1])
        opt.step()
    ga = [g[0] for g in grads]
    gb = [g[1] for g in grads]
    np.testing.assert_allclose(a.numpy(), ref_adam(params0[0], ga, lr=0.05, amsgrad=True))
    np.testing.assert_allclose(b.numpy(), ref_adam(params0[1], gb, lr=0.01))
    assert "max_exp_avg_sq" in opt.state[a] and "max_exp_avg_sq" not in opt.state[b]


def test_parameters_without_grad_are_skipped():
    a = lucid.tensor([1.0, 2.0], requires_grad=True)
    b = lucid.tensor([3.0, 4.0], requires_grad=True)
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = lucid.tensor([1.0, -1.0])
    opt.step()
    np.testing.assert_array_equal(b.numpy(), [3.0, 4.0])
    assert b not in opt.state
    assert opt.state[a]["step"].item() == 1.0
    np.testing.assert_allclose(a.numpy(), [0.9, 2.1], rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_update_accepts_scalars_as_0d_tensors(case):
    """The compiler feeds per-step scalars as 0-d tensors: the update must give the same result."""
    _, cls, options, _ = case
    params0, grads = _problem(seed=11, shapes=((3,),))

    def run(as_tensors: bool):
        p = lucid.tensor(params0[0], requires_grad=True)
        opt = cls([p], **options)
        for g in grads:
            p.grad = lucid.tensor(g[0])
            with lucid.no_grad():
                for param, grad, state, scalars in opt._param_updates():
                    assert set(cls._static_keys) <= set(scalars)
                    if as_tensors:
                        scalars = {
                            k: v if k in cls._static_keys else lucid.tensor(v, dtype=lucid.float64)
                            for k, v in scalars.items()
                        }
                    opt._update(param, grad, state, **scalars)
        return p.numpy()

    np.testing.assert_allclose(run(True), run(False), rtol=_rtol(cls), atol=1e-14)


@pytest.mark.parametrize("case", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_step_counter_is_a_float32_0d_tensor(case):
    _, cls, options, _ = case
    params, opt = _run(cls, options, *_problem(seed=5, shapes=((2,),)))
    state = opt.state[params[0]]
    if cls is optim.SGD:
        assert "step" not in state
        assert ("momentum_buffer" in state) == (options.get("momentum", 0) != 0)
        return
    assert state["step"].dtype == lucid.float32 and state["step"].shape == ()
    assert state["step"].item() == N_STEPS
