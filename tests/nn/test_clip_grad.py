"""clip_grad_norm_ / clip_grad_value_ against torch's documented arithmetic, in numpy."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid.nn.utils import clip_grad_norm_, clip_grad_value_, get_total_norm


def _params(grads, dtype=np.float64):
    ps = []
    for g in grads:
        p = lucid.tensor(np.zeros_like(g, dtype=dtype), requires_grad=True)
        p.grad = lucid.tensor(np.asarray(g, dtype=dtype))
        ps.append(p)
    return ps


def _reference(grads, max_norm, norm_type):
    """torch.nn.utils.clip_grad_norm_: norm of the per-tensor norms, coef clamped at 1."""
    flat = np.concatenate([np.ravel(g) for g in grads])
    if math.isinf(norm_type):
        total = np.max(np.abs(flat)) if norm_type > 0 else np.min(np.abs(flat))
    else:
        total = np.sum(np.abs(flat) ** norm_type) ** (1.0 / norm_type)
    coef = min(max_norm / (total + 1e-6), 1.0)
    return total, [np.asarray(g) * coef for g in grads]


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4),
    norm_type=st.sampled_from([1.0, 2.0, 3.0, 0.5, math.inf]),
    max_norm=st.floats(0.01, 10.0),
    seed=st.integers(0, 2**16),
)
def test_clip_grad_norm_matches_formula_float64(shapes, norm_type, max_norm, seed):
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(s) * 3 for s in shapes]
    ps = _params(grads)
    total = clip_grad_norm_(ps, max_norm, norm_type)
    want_total, want = _reference(grads, max_norm, norm_type)
    assert isinstance(total, lucid.Tensor) and total.ndim == 0 and total.dtype == lucid.float64
    np.testing.assert_allclose(total.item(), want_total, rtol=1e-12)
    for p, w in zip(ps, want, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), w, rtol=1e-12, atol=1e-15)


def test_clip_grad_norm_float32_keeps_dtype_and_coef_in_float32():
    g = np.array([3.0, 4.0], np.float32)
    (p,) = _params([g], np.float32)
    total = clip_grad_norm_(p, 1.0)  # a single tensor is accepted, as torch
    assert total.dtype == lucid.float32 and p.grad.dtype == lucid.float32
    coef = np.float32(1.0) / (np.float32(5.0) + np.float32(1e-6))
    np.testing.assert_array_equal(p.grad.numpy(), g * coef)


def test_under_the_limit_grads_unchanged_and_total_returned():
    ps = _params([np.array([0.3, 0.4])])
    total = clip_grad_norm_(ps, max_norm=10.0)
    assert total.item() == pytest.approx(0.5, rel=1e-15)
    np.testing.assert_array_equal(ps[0].grad.numpy(), [0.3, 0.4])


def test_parameters_without_grad_are_skipped_and_generators_accepted():
    model = nn.Linear(3, 2).double()
    model.weight.grad = lucid.ones(2, 3, dtype=lucid.float64) * 2
    total = clip_grad_norm_(model.parameters(), 1.0)  # bias has no grad
    assert total.item() == pytest.approx(math.sqrt(24), rel=1e-14)
    assert model.bias.grad is None
    np.testing.assert_allclose(model.weight.grad.numpy(), 2 / (math.sqrt(24) + 1e-6))


def test_no_grads_returns_zero():
    p = lucid.zeros(2, requires_grad=True)
    total = clip_grad_norm_([p], 1.0)
    assert total.item() == 0.0 and p.grad is None


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_error_if_nonfinite_raises_and_leaves_grads(bad):
    ps = _params([np.array([1.0, bad]), np.array([2.0])])
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(ps[1].grad.numpy(), [2.0])
    # Without the flag torch scales by the non-finite norm anyway.
    total = clip_grad_norm_(ps, 1.0)
    assert not math.isfinite(total.item())
    if bad == math.inf:  # coef = 1 / inf = 0
        np.testing.assert_array_equal(ps[1].grad.numpy(), [0.0])
    else:
        assert np.isnan(ps[1].grad.numpy()[0])


def test_get_total_norm_and_string_inf():
    ts = [lucid.tensor([1.0, -7.0]), lucid.tensor([[2.0]])]
    assert get_total_norm(ts, "inf").item() == 7.0
    assert get_total_norm(ts, 1).item() == 10.0
    with pytest.raises(TypeError, match="norm_type"):
        get_total_norm(ts, "two")


def test_clip_grad_value_clamps_each_grad():
    ps = _params([np.array([-3.0, 0.5, 2.0]), np.array([[9.0]])])
    assert clip_grad_value_(ps, 1.0) is None
    np.testing.assert_array_equal(ps[0].grad.numpy(), [-1.0, 0.5, 1.0])
    np.testing.assert_array_equal(ps[1].grad.numpy(), [[1.0]])
    with pytest.raises(TypeError, match="clip_value"):
        clip_grad_value_(ps, "1")


def test_training_step_with_clipping_changes_update():
    lucid.manual_seed(0)
    model = nn.Linear(4, 1).double()
    x = lucid.randn(8, 4, dtype=lucid.float64) * 100
    model(x).sum().backward()
    before = model.weight.detach().numpy().copy()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    clip_grad_norm_(model.parameters(), 0.5)
    norm = math.sqrt(sum(float(np.sum(g**2)) for g in model.parameters() for g in [g.grad.numpy()]))
    assert norm == pytest.approx(0.5, rel=1e-5)
    lucid.optim.SGD(model.parameters(), lr=1.0).step()
    want = before - grads[0] * 0.5 / (math.sqrt(sum(np.sum(g**2) for g in grads)) + 1e-6)
    np.testing.assert_allclose(model.weight.detach().numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0])
def test_matches_torch_if_installed(norm_type):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    grads = [rng.standard_normal((3, 2)), rng.standard_normal(5)]
    ours = _params(grads)
    theirs = []
    for g in grads:
        p = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
        p.grad = torch.from_numpy(g.copy())
        theirs.append(p)
    total = clip_grad_norm_(ours, 0.7, norm_type)
    t_total = torch.nn.utils.clip_grad_norm_(theirs, 0.7, norm_type)
    np.testing.assert_allclose(total.item(), t_total.item(), rtol=1e-12)
    for p, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    clip_grad_value_(ours, 0.1)
    torch.nn.utils.clip_grad_value_(theirs, 0.1)
    for p, t in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
