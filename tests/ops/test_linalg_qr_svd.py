"""lucid.linalg.qr / svd / svdvals: factors against their definitions, gradients against float64
finite differences and PyTorch, refusals of the undefined gradients, the compiled fallback."""

import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck

SHAPES = [(4, 3), (3, 3), (3, 5), (2, 4, 3), (2, 3, 4)]


def _matrix(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _identity_like(k, batch):
    return np.broadcast_to(np.eye(k), batch + (k, k))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr_factors(shape, mode):
    a = _matrix(shape)
    q, r = lucid.linalg.qr(lucid.tensor(a), mode)
    m, n = shape[-2:]
    k = m if mode == "complete" else min(m, n)
    assert q.shape == shape[:-2] + (m, k) and r.shape == shape[:-2] + (k, n)
    np.testing.assert_allclose((q @ r).numpy(), a, atol=1e-12)
    np.testing.assert_allclose((q.mT @ q).numpy(), _identity_like(k, shape[:-2]), atol=1e-12)
    np.testing.assert_array_equal(np.tril(r.numpy(), -1), 0)


def test_qr_mode_r_and_bad_input():
    q, r = lucid.linalg.qr(lucid.tensor(_matrix((4, 3))), mode="r")
    assert q.numel() == 0 and r.shape == (3, 3)
    with pytest.raises(ValueError, match="mode"):
        lucid.linalg.qr(lucid.tensor(_matrix((3, 3))), mode="full")
    with pytest.raises(ValueError, match="matrix"):
        lucid.linalg.qr(lucid.ones(3))
    with pytest.raises(TypeError, match="floating point"):
        lucid.linalg.svd(lucid.ones(3, 3, dtype=lucid.int64))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr_gradients_against_finite_differences(shape, mode):
    if mode == "complete" and shape[-2] > shape[-1]:
        pytest.skip("no gradient: the extra columns of Q are arbitrary")
    a = _matrix(shape, seed=1)
    for index in (0, 1):
        gradcheck(
            lambda t, i=index: lucid.linalg.qr(t, mode)[i], lucid.tensor(a, requires_grad=True)
        )


def test_complete_qr_of_a_tall_matrix_refuses_its_gradient():
    a = lucid.tensor(_matrix((4, 2)), requires_grad=True)
    q, _ = lucid.linalg.qr(a, "complete")
    with pytest.raises(ValueError, match="complete"):
        q.sum().backward()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd_factors(shape, full_matrices):
    a = _matrix(shape, seed=2)
    u, s, vh = lucid.linalg.svd(lucid.tensor(a), full_matrices)
    m, n = shape[-2:]
    k = min(m, n)
    assert u.shape[-2:] == ((m, m) if full_matrices else (m, k)) and s.shape == shape[:-2] + (k,)
    np.testing.assert_allclose(s.numpy(), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    assert np.all(np.diff(s.numpy(), axis=-1) <= 0)
    recon = (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :]
    np.testing.assert_allclose(recon.numpy(), a, atol=1e-12)
    np.testing.assert_allclose((u.mT @ u).numpy(), _identity_like(u.shape[-1], shape[:-2]),
                               atol=1e-12)  # fmt: skip
    assert lucid.allclose(lucid.linalg.svdvals(lucid.tensor(a)), s)


@pytest.mark.parametrize("shape", SHAPES)
def test_svd_gradients_against_finite_differences(shape):
    # Real singular vectors are unique up to a locally constant sign when the singular values
    # are distinct, so each factor is differentiable on its own.
    a = _matrix(shape, seed=3)
    for index in range(3):
        gradcheck(
            lambda t, i=index: lucid.linalg.svd(t, False)[i], lucid.tensor(a, requires_grad=True)
        )
    gradcheck(lucid.linalg.svdvals, lucid.tensor(a, requires_grad=True))


def test_svdvals_gradient_with_repeated_singular_values_is_finite():
    a = lucid.tensor(np.eye(3) * 2.0, requires_grad=True)
    lucid.linalg.svdvals(a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.eye(3))


def _svd_invariant_loss(mod, u, s, vh, weights):
    # Unchanged when a singular pair (u_j, v_j) flips sign: LAPACK builds may pick either.
    k = s.shape[-1]
    u, vh = u[..., :k], vh[..., :k, :]
    parts = (s, u * u, vh * vh, u @ vh)
    return sum((p * mod.tensor(w)).sum() for p, w in zip(parts, weights, strict=True))


@pytest.mark.parametrize("shape", SHAPES)
def test_torch_parity_values_and_gradients(shape):
    torch = pytest.importorskip("torch")
    a = _matrix(shape, seed=4)
    rng = np.random.default_rng(5)
    for mode in ("reduced", "complete"):
        if mode == "complete" and shape[-2] > shape[-1]:
            continue
        ours, theirs = lucid.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        q, r = lucid.linalg.qr(ours, mode)
        tq, tr = torch.linalg.qr(theirs, mode)
        np.testing.assert_allclose(q.detach().numpy(), tq.detach().numpy(), atol=1e-12)
        np.testing.assert_allclose(r.detach().numpy(), tr.detach().numpy(), atol=1e-12)
        wq, wr = rng.standard_normal(q.shape), rng.standard_normal(r.shape)
        ((q * lucid.tensor(wq)).sum() + (r * lucid.tensor(wr)).sum()).backward()
        ((tq * torch.tensor(wq)).sum() + (tr * torch.tensor(wr)).sum()).backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-10)
    for full_matrices in (False, True):
        ours, theirs = lucid.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        u, s, vh = lucid.linalg.svd(ours, full_matrices)
        tu, ts, tvh = torch.linalg.svd(theirs, full_matrices)
        np.testing.assert_allclose(s.detach().numpy(), ts.detach().numpy(), rtol=1e-12)
        k = s.shape[-1]
        shapes = [s.shape, u.shape[:-1] + (k,), vh.shape[:-2] + (k, vh.shape[-1]), a.shape]
        weights = [rng.standard_normal(sh) for sh in shapes]
        _svd_invariant_loss(lucid, u, s, vh, weights).backward()
        _svd_invariant_loss(torch, tu, ts, tvh, weights).backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-10)
    ours, theirs = lucid.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    w = rng.standard_normal(min(shape[-2:]))
    (lucid.linalg.svdvals(ours) * lucid.tensor(w)).sum().backward()
    (torch.linalg.svdvals(theirs) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-12)


def test_compiled_calls_fall_back_to_eager_with_the_reason():
    def fn(a):
        q, r = lucid.linalg.qr(a)
        return q.sum() + r.sum() + lucid.linalg.svdvals(a).sum()

    compiled = lucid.compile(fn)
    a = lucid.tensor(_matrix((4, 3), seed=6))
    np.testing.assert_allclose(compiled(a).numpy(), fn(a).numpy(), rtol=1e-12)
    reasons = " ".join(compiled.cache_info()["reasons"].values())
    assert "factorises a matrix" in reasons
