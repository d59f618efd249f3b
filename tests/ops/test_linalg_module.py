"""lucid.linalg: inv, det, slogdet, solve, cholesky, eigh and the norms against numpy, their
VJP rules against float64 finite differences, bad input, the compile fallback, and torch
parity when installed."""

import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck

RNG = np.random.default_rng(88)
A = RNG.standard_normal((2, 3, 3))
SPD = A @ A.transpose(0, 2, 1) + 3 * np.eye(3)
B = RNG.standard_normal((2, 3, 2))
V = RNG.standard_normal(3)


def _t(a, requires_grad=False):
    return lucid.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def test_values_against_numpy():
    np.testing.assert_allclose(lucid.linalg.inv(_t(A)).numpy(), np.linalg.inv(A))
    np.testing.assert_allclose(lucid.linalg.det(_t(A)).numpy(), np.linalg.det(A))
    sign, logabs = lucid.linalg.slogdet(_t(A))
    want_sign, want_log = np.linalg.slogdet(A)
    np.testing.assert_allclose(sign.numpy(), want_sign)
    np.testing.assert_allclose(logabs.numpy(), want_log)
    np.testing.assert_allclose(lucid.linalg.solve(_t(A), _t(B)).numpy(), np.linalg.solve(A, B))
    np.testing.assert_allclose(
        lucid.linalg.solve(_t(A[0]), _t(V)).numpy(), np.linalg.solve(A[0], V)
    )
    np.testing.assert_allclose(
        lucid.linalg.solve(_t(A), _t(B.transpose(0, 2, 1)), left=False).numpy(),
        np.linalg.solve(A.transpose(0, 2, 1), B).transpose(0, 2, 1),
    )
    np.testing.assert_allclose(lucid.linalg.cholesky(_t(SPD)).numpy(), np.linalg.cholesky(SPD))
    upper = lucid.linalg.cholesky(_t(SPD), upper=True).numpy()
    np.testing.assert_allclose(upper.transpose(0, 2, 1) @ upper, SPD)
    values, vectors = lucid.linalg.eigh(_t(SPD))
    np.testing.assert_allclose(values.numpy(), np.linalg.eigvalsh(SPD))
    np.testing.assert_allclose(
        vectors.numpy() @ (values.numpy()[..., None] * vectors.numpy().transpose(0, 2, 1)), SPD
    )
    np.testing.assert_allclose(lucid.linalg.vector_norm(_t(A), 3, dim=1).numpy(),
                               np.linalg.norm(A, 3, axis=1))  # fmt: skip
    for order in ("fro", 1, -1, float("inf"), float("-inf")):
        got = lucid.linalg.matrix_norm(_t(A), order).numpy()
        want = np.linalg.norm(A, order, axis=(1, 2))
        np.testing.assert_allclose(got, want, err_msg=str(order))
    np.testing.assert_allclose(lucid.linalg.norm(_t(A)).item(), np.linalg.norm(A.ravel()))
    np.testing.assert_allclose(lucid.linalg.norm(_t(A[0]), 1).item(), np.linalg.norm(A[0], 1))


def test_gradients_by_finite_differences():
    gradcheck(lambda a: lucid.linalg.inv(a).sin().sum(), _t(A, True))
    gradcheck(lambda a: lucid.linalg.det(a).sum(), _t(A, True))
    gradcheck(lambda a: lucid.linalg.slogdet(a)[1].sum(), _t(A, True))
    gradcheck(lambda a, b: lucid.linalg.solve(a, b).square().sum(), _t(A, True), _t(B, True))
    gradcheck(lambda a, v: lucid.linalg.solve(a, v).square().sum(), _t(A[0], True), _t(V, True))
    eye = lucid.eye(3, dtype=lucid.float64)
    gradcheck(lambda a: lucid.linalg.cholesky(a @ a.mT + 3 * eye).sin().sum(), _t(A, True))

    def eig_loss(a):
        # Sign-invariant in the eigenvectors: squares of their entries.
        values, vectors = lucid.linalg.eigh(a + a.mT)
        weights = _t(np.arange(9.0).reshape(3, 3))
        return (values * _t([1.0, 2.0, 3.0])).sum() + (vectors**2 * weights).sum()

    gradcheck(eig_loss, _t(A[0], True))
    gradcheck(lambda a: lucid.linalg.matrix_norm(a, 1).sum(), _t(A, True))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="singular"):
        lucid.linalg.inv(lucid.zeros(2, 2))
    with pytest.raises(ValueError, match="not positive-definite"):
        lucid.linalg.cholesky(-lucid.eye(2))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        lucid.linalg.det(lucid.zeros(2, 3))
    with pytest.raises(TypeError, match="floating point"):
        lucid.linalg.inv(lucid.eye(2, dtype=lucid.int64))
    with pytest.raises(ValueError, match="do not match"):
        lucid.linalg.solve(lucid.eye(3), lucid.zeros(2, 1))
    with pytest.raises(ValueError, match="ord"):
        lucid.linalg.matrix_norm(lucid.eye(2), 3)


def test_compile_falls_back_to_eager_with_the_reason():
    class Model(lucid.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lucid.nn.Parameter(lucid.eye(3, dtype=lucid.float64) * 2)

        def forward(self, x):
            return lucid.linalg.inv(self.w) @ x

    model = Model()
    compiled = lucid.compile(model)
    x = lucid.ones(3, 2, dtype=lucid.float64)
    assert lucid.equal(compiled(x), model(x))
    reasons = " ".join(compiled.cache_info()["reasons"].values())
    assert "linalg_inv" in reasons and "factorises a matrix" in reasons


def test_torch_parity_with_gradients():
    torch = pytest.importorskip("torch")
    cases = [
        ("inv", lambda m, a, b: m.linalg.inv(a)),
        ("det", lambda m, a, b: m.linalg.det(a)),
        ("solve", lambda m, a, b: m.linalg.solve(a, b)),
        ("cholesky", lambda m, a, b: m.linalg.cholesky(a @ a.mT + 3 * m.eye(3, dtype=a.dtype))),
        ("eigvalsh", lambda m, a, b: m.linalg.eigvalsh(a + a.mT)),
        ("matrix_norm", lambda m, a, b: m.linalg.matrix_norm(a, float("inf"))),
    ]
    for name, fn in cases:
        ours = [lucid.tensor(v, requires_grad=True) for v in (A, B)]
        theirs = [torch.tensor(v, requires_grad=True) for v in (A, B)]
        out, ref = fn(lucid, *ours), fn(torch, *theirs)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)  # fmt: skip
        (out * out).sum().backward()
        (ref * ref).sum().backward()
        for o, r in zip(ours, theirs, strict=True):
            if r.grad is not None:
                np.testing.assert_allclose(o.grad.numpy(), r.grad.numpy(), rtol=1e-8,
                                           atol=1e-10, err_msg=name)  # fmt: skip
