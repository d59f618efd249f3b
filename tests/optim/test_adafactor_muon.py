"""Adafactor and Muon against numpy references written from PyTorch's documented algorithms
(float64), against torch itself when importable, and compiled (``fused_step``) equal to eager."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid import nn, optim

N_STEPS = 6


def ref_adafactor(
    p, grads, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, maximize=False
):
    eps1 = np.finfo(np.float64).eps if eps[0] is None else eps[0]
    row = col = var = None
    for t, g in enumerate(grads, 1):
        g = -g if maximize else g
        beta2_complement = t**beta2_decay
        rho = min(lr, 1 / math.sqrt(t))
        alpha = max(eps[1], np.sqrt(np.mean(p * p))) * rho
        p = p * (1 - lr * weight_decay)
        if g.ndim > 1:
            row = np.zeros(g.shape[:-1] + (1,)) if row is None else row
            col = np.zeros(g.shape[:-2] + (1, g.shape[-1])) if col is None else col
            row = row + (np.mean(g * g, -1, keepdims=True) - row) * beta2_complement
            col = col + (np.mean(g * g, -2, keepdims=True) - col) * beta2_complement
            v = row @ col / np.maximum(row.mean(-2, keepdims=True), eps1)
        else:
            var = np.zeros_like(g) if var is None else var
            var = var + (g * g - var) * beta2_complement
            v = var
        u = g / np.sqrt(np.maximum(v, eps1 * eps1))
        denom = max(1.0, np.sqrt(np.mean(u * u)) / d)
        p = p - alpha / denom * u
    return p


def ref_muon(
    p,
    grads,
    lr=1e-3,
    weight_decay=0.1,
    momentum=0.95,
    nesterov=True,
    ns_coefficients=(3.4445, -4.775, 2.0315),
    eps=1e-7,
    ns_steps=5,
    adjust_lr_fn=None,
):
    a, b, c = ns_coefficients
    buf = np.zeros_like(p)
    rows, cols = p.shape
    ratio = (
        0.2 * math.sqrt(max(rows, cols))
        if adjust_lr_fn == "match_rms_adamw"
        else (math.sqrt(max(1, rows / cols)))
    )
    for g in grads:
        buf = momentum * buf + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * buf if nesterov else buf
        x = u.T if rows > cols else u
        x = x / max(np.linalg.norm(x), eps)
        for _ in range(ns_steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        x = x.T if rows > cols else x
        p = p * (1 - lr * weight_decay) - lr * ratio * x
    return p


CASES = [
    ("adafactor", optim.Adafactor, dict(), ref_adafactor),
    (
        "adafactor-options",
        optim.Adafactor,
        dict(lr=0.05, beta2_decay=-0.5, eps=(1e-20, 1e-2), d=0.5, weight_decay=0.1),
        ref_adafactor,
    ),
    ("adafactor-maximize", optim.Adafactor, dict(maximize=True), ref_adafactor),
    ("muon", optim.Muon, dict(lr=0.02), ref_muon),
    ("muon-plain-momentum", optim.Muon, dict(lr=0.02, nesterov=False, momentum=0.8), ref_muon),
    (
        "muon-adamw-lr",
        optim.Muon,
        dict(lr=0.02, adjust_lr_fn="match_rms_adamw", ns_steps=3, weight_decay=0.0),
        ref_muon,
    ),
]


def _problem(cls, seed):
    rng = np.random.default_rng(seed)
    shapes = [(4, 3), (2, 5)] if cls is optim.Muon else [(4, 3), (2, 3, 2), (5,), ()]
    params = [rng.standard_normal(s) for s in shapes]
    grads = [
        [rng.standard_normal(s) * rng.uniform(0.1, 3.0) for s in shapes] for _ in range(N_STEPS)
    ]
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
    params0, grads = _problem(cls, seed=3)
    params, _ = _run(cls, options, params0, grads)
    for i, (p, p0) in enumerate(zip(params, params0, strict=True)):
        expected = reference(p0, [g[i] for g in grads], **options)
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
        assert not np.allclose(expected, p0)


def test_state_names_and_float32():
    params0, grads = _problem(optim.Adafactor, seed=4)
    params, opt = _run(optim.Adafactor, {}, params0, grads, dtype=lucid.float32)
    assert set(opt.state[params[0]]) == {"step", "row_var", "col_var"}
    assert opt.state[params[0]]["row_var"].shape == (4, 1)
    assert opt.state[params[0]]["col_var"].shape == (1, 3)
    assert set(opt.state[params[2]]) == {"step", "variance"}
    assert all(p.dtype == lucid.float32 for p in params)
    # eps1 None is float32's epsilon for float32 parameters
    want = ref_adafactor(
        params0[2].astype(np.float32).astype(np.float64),
        [g[2].astype(np.float32).astype(np.float64) for g in grads],
        eps=(float(np.finfo(np.float32).eps), 1e-3),
    )
    np.testing.assert_allclose(params[2].detach().numpy(), want, rtol=2e-4, atol=2e-5)
    _, muon = _run(optim.Muon, {}, *_problem(optim.Muon, 5))
    assert set(next(iter(muon.state.values()))) == {"momentum_buffer"}


def test_bad_options():
    w = lucid.zeros(2, 2, requires_grad=True)
    with pytest.raises(ValueError, match="beta2_decay"):
        optim.Adafactor([w], beta2_decay=0.5)
    with pytest.raises(ValueError, match="epsilon1"):
        optim.Adafactor([w], eps=(-1.0, 1e-3))
    with pytest.raises(ValueError, match="learning rate"):
        optim.Adafactor([w], lr=-1.0)
    with pytest.raises(ValueError, match="2D parameters"):
        optim.Muon([lucid.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="not supported"):
        optim.Muon([w], adjust_lr_fn="spectral")


@pytest.mark.parametrize(
    "cls, options", [(optim.Adafactor, dict(lr=0.05)), (optim.Muon, dict(lr=0.02))]
)
def test_fused_step_matches_eager(cls, options):
    from lucid.compile import fused_step

    def build():
        lucid.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(4, 6, bias=cls is not optim.Muon),
            nn.Tanh(),
            nn.Linear(6, 3, bias=cls is not optim.Muon),
        ).double()
        return model, cls(model.parameters(), **options)

    rng = np.random.default_rng(6)
    batches = [
        (lucid.tensor(rng.standard_normal((5, 4))), lucid.tensor(rng.integers(0, 3, 5)))
        for _ in range(3)
    ]
    eager_model, eager_opt = build()
    for x, y in batches:
        eager_opt.zero_grad()
        F.cross_entropy(eager_model(x), y).backward()
        eager_opt.step()
    model, opt = build()
    step = fused_step(model, F.cross_entropy, opt, backend="cpu")
    for x, y in batches:
        step(x, y)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(case):
    torch = pytest.importorskip("torch")
    _, cls, options, _ = case
    params0, grads = _problem(cls, seed=7)
    params, _ = _run(cls, options, params0, grads)
    tparams = [torch.tensor(p, requires_grad=True) for p in params0]
    topt = getattr(torch.optim, cls.__name__)(tparams, **options)
    for step_grads in grads:
        for p, g in zip(tparams, step_grads, strict=True):
            p.grad = torch.tensor(g)
        topt.step()
    # torch's Muon iterates in bfloat16: agreement to bfloat16's precision only.
    rtol = 3e-2 if cls is optim.Muon else 1e-9
    for p, t in zip(params, tparams, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=rtol, atol=rtol)
