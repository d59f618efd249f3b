"""The torch.linalg functions added beyond the first set: values against numpy written from
PyTorch's definitions, gradients against float64 finite differences, torch itself when importable,
bad input, and the compiled path (falls back to eager with the reason, equal to eager)."""

import numpy as np
import pytest

import lucid
from lucid import linalg
from lucid.testing import gradcheck


def _m(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _t(a, grad=False):
    return lucid.tensor(a, requires_grad=grad)


def _well_conditioned(*shape, seed=0):
    return _m(*shape, seed=seed) + 3 * np.eye(shape[-1])


# --- LU ---------------------------------------------------------------------------------------

LU_SHAPES = [(3, 3), (4, 3), (3, 5), (2, 4, 4), (2, 3, 2)]


def _ref_lu(a):
    """Doolittle elimination with partial pivoting on one matrix: P, L, U and 1-based pivots."""
    m, n = a.shape
    k = min(m, n)
    u, perm, piv = a.copy(), list(range(m)), []
    for j in range(k):
        p = j + int(np.argmax(np.abs(u[j:, j])))
        piv.append(p + 1)
        u[[j, p]] = u[[p, j]]
        perm[j], perm[p] = perm[p], perm[j]
        u[j + 1 :, j] /= u[j, j]
        u[j + 1 :, j + 1 :] -= np.outer(u[j + 1 :, j], u[j, j + 1 :])
    low = np.tril(u[:, :k], -1) + np.eye(m, k)
    p_matrix = np.eye(m)[:, perm]
    return p_matrix, low, np.triu(u[:k]), np.array(piv)


@pytest.mark.parametrize("shape", LU_SHAPES)
def test_lu_factors_match_reference(shape):
    a = _m(*shape)
    p, low, up = linalg.lu(_t(a))
    packed, pivots = linalg.lu_factor(_t(a))
    flat = a.reshape((-1,) + shape[-2:])
    for i, mat in enumerate(flat):
        rp, rl, ru, rpiv = _ref_lu(mat)
        idx = np.unravel_index(i, shape[:-2]) if len(shape) > 2 else ()
        np.testing.assert_allclose(p.numpy()[idx], rp)
        np.testing.assert_allclose(low.numpy()[idx], rl, atol=1e-12)
        np.testing.assert_allclose(up.numpy()[idx], ru, atol=1e-12)
        np.testing.assert_array_equal(pivots.numpy()[idx], rpiv)
    np.testing.assert_allclose((p @ low @ up).numpy(), a, atol=1e-12)
    assert pivots.dtype == lucid.int32
    k = min(shape[-2:])
    np.testing.assert_allclose(np.tril(packed.numpy(), -1)[..., :, :k], np.tril(low.numpy(), -1))
    np.testing.assert_allclose(np.triu(packed.numpy())[..., :k, :], up.numpy())


@pytest.mark.parametrize("shape", LU_SHAPES)
def test_lu_gradients(shape):
    a = _t(_m(*shape, seed=1), grad=True)
    gradcheck(lambda x: linalg.lu(x)[1], a)
    gradcheck(lambda x: linalg.lu(x)[2], a)
    gradcheck(lambda x: linalg.lu_factor(x)[0], a)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(left, adjoint):
    a = _well_conditioned(2, 3, 3, seed=2)
    b = _m(2, 3, 2, seed=3) if left else _m(2, 2, 3, seed=3)
    lu_, piv = linalg.lu_factor(_t(a))
    x = linalg.lu_solve(lu_, piv, _t(b), left=left, adjoint=adjoint)
    mat = np.swapaxes(a, -1, -2) if adjoint else a
    want = (
        np.linalg.solve(mat, b)
        if left
        else np.swapaxes(np.linalg.solve(np.swapaxes(mat, -1, -2), np.swapaxes(b, -1, -2)), -1, -2)
    )
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-10)
    lu_g = _t(lu_.numpy(), grad=True)
    gradcheck(lambda t: linalg.lu_solve(t, piv, _t(b), left=left, adjoint=adjoint), lu_g)
    gradcheck(lambda t: linalg.lu_solve(lu_, piv, t, left=left, adjoint=adjoint), _t(b, True))


def test_lu_without_pivoting_and_ex_info():
    a = _well_conditioned(3, 3)
    p, low, up = linalg.lu(_t(a), pivot=False)
    np.testing.assert_array_equal(p.numpy(), np.eye(3))
    np.testing.assert_allclose((low @ up).numpy(), a, atol=1e-12)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    packed, _, info = linalg.lu_factor_ex(_t(np.stack([a[:2, :2], singular])))
    np.testing.assert_array_equal(info.numpy(), [0, 2])
    with pytest.raises(ValueError, match="singular"):
        linalg.lu_factor_ex(_t(singular), check_errors=True)
    with pytest.raises(ValueError, match="zero pivot"):
        linalg.lu(_t(np.array([[0.0, 1.0], [1.0, 0.0]])), pivot=False)


# --- the *_ex spellings ---------------------------------------------------------------------


def test_inv_solve_cholesky_ex():
    good = _well_conditioned(3, 3)
    spd = good @ good.T
    singular = np.ones((3, 3))
    batch = _t(np.stack([good, singular]), grad=True)
    inverse, info = linalg.inv_ex(batch)
    np.testing.assert_array_equal(info.numpy(), [0, 2])
    assert info.dtype == lucid.int32
    np.testing.assert_allclose(inverse.detach().numpy()[0], np.linalg.inv(good), rtol=1e-10)
    assert np.isnan(inverse.detach().numpy()[1]).all()
    inverse[0].sum().backward()  # the good matrix keeps its gradient
    np.testing.assert_allclose(
        batch.grad.numpy()[0],
        -(np.linalg.inv(good).T @ np.ones((3, 3)) @ np.linalg.inv(good).T),
        rtol=1e-10,
    )
    x, info = linalg.solve_ex(_t(good), _t(np.ones((3, 1))))
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(good, np.ones((3, 1))), rtol=1e-10)
    assert int(info.numpy()) == 0
    not_pd = spd.copy()
    not_pd[1, 1] = -5.0
    low, info = linalg.cholesky_ex(_t(np.stack([spd, not_pd])))
    np.testing.assert_array_equal(info.numpy(), [0, 2])
    np.testing.assert_allclose(low.numpy()[0], np.linalg.cholesky(spd), rtol=1e-10)
    upper, _ = linalg.cholesky_ex(_t(spd), upper=True)
    np.testing.assert_allclose(upper.numpy(), np.linalg.cholesky(spd).T, rtol=1e-10)
    with pytest.raises(ValueError, match="positive-definite"):
        linalg.cholesky_ex(_t(not_pd), check_errors=True)
    with pytest.raises(ValueError, match="singular"):
        linalg.inv_ex(_t(singular), check_errors=True)


# --- pinv, lstsq, ranks, norms, condition numbers --------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
def test_pinv_values_and_gradient(shape):
    a = _m(*shape, seed=4)
    np.testing.assert_allclose(linalg.pinv(_t(a)).numpy(), np.linalg.pinv(a), atol=1e-12)
    gradcheck(linalg.pinv, _t(a, True))


def test_pinv_rank_deficient_hermitian_and_tolerances():
    base = _m(4, 2, seed=5)
    low_rank = base @ base.T  # symmetric, rank 2
    np.testing.assert_allclose(
        linalg.pinv(_t(low_rank)).numpy(), np.linalg.pinv(low_rank), atol=1e-10
    )
    np.testing.assert_allclose(
        linalg.pinv(_t(low_rank), hermitian=True).numpy(),
        np.linalg.pinv(low_rank, hermitian=True),
        atol=1e-10,
    )
    assert int(linalg.matrix_rank(_t(low_rank)).numpy()) == 2
    assert int(linalg.matrix_rank(_t(low_rank), hermitian=True).numpy()) == 2
    s = np.linalg.svd(low_rank, compute_uv=False)
    assert int(linalg.matrix_rank(_t(low_rank), atol=s[1] * 1.01).numpy()) == 1
    assert int(linalg.matrix_rank(_t(low_rank), rtol=s[1] / s[0] * 1.01).numpy()) == 1
    cut = linalg.pinv(_t(low_rank), rtol=s[1] / s[0] * 1.01).numpy()
    np.testing.assert_allclose(cut, np.linalg.pinv(low_rank, rcond=s[1] / s[0] * 1.01), atol=1e-10)
    # the rank-deficient gradient of a fixed-rank family: A(t) = B(t) B(t)^T
    gradcheck(lambda b: linalg.pinv(b @ b.mT), _t(base, True))


@pytest.mark.parametrize("driver", [None, "gels", "gelsd"])
def test_lstsq(driver):
    a, b = _m(5, 3, seed=6), _m(5, 2, seed=7)
    result = linalg.lstsq(_t(a), _t(b), driver=driver)
    want, residuals, rank, values = np.linalg.lstsq(a, b, rcond=None)
    np.testing.assert_allclose(result.solution.numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(result.residuals.numpy(), residuals, rtol=1e-10)
    if driver == "gels":
        assert result.rank.numel() == 0
    else:
        assert int(result.rank.numpy()) == rank
    if driver == "gelsd":
        np.testing.assert_allclose(result.singular_values.numpy(), values, rtol=1e-12)
    else:
        assert result.singular_values.numel() == 0
    gradcheck(lambda x: linalg.lstsq(x, _t(b)).solution, _t(a, True))
    gradcheck(lambda y: linalg.lstsq(_t(a), y).solution, _t(b, True))
    wide = linalg.lstsq(_t(a.T), _t(b[:3]))
    np.testing.assert_allclose(wide.solution.numpy(), np.linalg.pinv(a.T) @ b[:3], rtol=1e-10)
    assert wide.residuals.numel() == 0
    with pytest.raises(ValueError, match="rows"):
        linalg.lstsq(_t(a), _t(b[:4]))


@pytest.mark.parametrize("ord", [2, -2, "nuc"])
def test_spectral_matrix_norms(ord):
    a = _m(2, 4, 3, seed=8)
    got = linalg.matrix_norm(_t(a), ord)
    np.testing.assert_allclose(got.numpy(), np.linalg.norm(a, ord, axis=(-2, -1)), rtol=1e-12)
    kept = linalg.matrix_norm(_t(a), ord, dim=(0, 2), keepdim=True)
    want = np.linalg.norm(a, ord, axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(kept.numpy(), want, rtol=1e-12)
    gradcheck(lambda x: linalg.matrix_norm(x, ord), _t(a, True))


@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", 1, -1, float("inf"), float("-inf")])
def test_cond(p):
    a = _m(2, 3, 3, seed=9)
    np.testing.assert_allclose(linalg.cond(_t(a), p).numpy(), np.linalg.cond(a, p), rtol=1e-10)
    if p not in (1, -1, float("inf"), float("-inf")):  # max/min are not smooth at ties only
        gradcheck(lambda x: linalg.cond(x, p), _t(a, True))


# --- composites of products, solves and inverses ----------------------------------------------


def test_matrix_exp_and_gradient():
    a = _m(2, 3, 3, seed=10) * 2
    got = linalg.matrix_exp(_t(a)).numpy()
    for i in range(2):
        w, v = np.linalg.eig(a[i])
        np.testing.assert_allclose(
            got[i], (v @ np.diag(np.exp(w)) @ np.linalg.inv(v)).real, rtol=1e-10
        )
    np.testing.assert_allclose(linalg.matrix_exp(_t(np.zeros((2, 2)))).numpy(), np.eye(2))
    gradcheck(linalg.matrix_exp, _t(a / 2, True))
    f32 = linalg.matrix_exp(lucid.tensor(a.astype(np.float32)))
    assert f32.dtype == lucid.float32


@pytest.mark.parametrize("n", [-3, -1, 0, 1, 2, 5])
def test_matrix_power(n):
    a = _well_conditioned(2, 3, 3, seed=11) / 3
    np.testing.assert_allclose(
        linalg.matrix_power(_t(a), n).numpy(), np.linalg.matrix_power(a, n), rtol=1e-10
    )
    gradcheck(lambda x: linalg.matrix_power(x, n), _t(a, True))


def test_multi_dot_and_chain_order():
    mats = [_m(1, 5, seed=1)[0], _m(5, 2, seed=2), _m(2, 6, seed=3), _m(6, seed=4)]
    got = linalg.multi_dot([_t(m) for m in mats])
    np.testing.assert_allclose(got.numpy(), np.linalg.multi_dot(mats), rtol=1e-12)
    assert got.shape == ()
    inputs = [_t(m, True) for m in mats[1:3]]
    gradcheck(lambda x, y: linalg.multi_dot([_t(mats[0]), x, y]), *inputs)
    with pytest.raises(ValueError, match="cannot be multiplied"):
        linalg.multi_dot([_t(_m(2, 3)), _t(_m(2, 3))])
    with pytest.raises(ValueError, match="at least 2"):
        linalg.multi_dot([_t(_m(2, 3))])


def test_solve_triangular():
    a, b = _well_conditioned(2, 3, 3, seed=12), _m(2, 3, 2, seed=13)
    for upper in (True, False):
        for unit in (False, True):
            tri = np.triu(a) if upper else np.tril(a)
            if unit:
                tri[..., range(3), range(3)] = 1.0
            got = linalg.solve_triangular(_t(a), _t(b), upper=upper, unitriangular=unit)
            np.testing.assert_allclose(got.numpy(), np.linalg.solve(tri, b), rtol=1e-10)
            right = linalg.solve_triangular(
                _t(a), _t(np.swapaxes(b, -1, -2)), upper=upper, left=False, unitriangular=unit
            )
            np.testing.assert_allclose(right.numpy() @ tri, np.swapaxes(b, -1, -2), atol=1e-10)
    x = _t(a, True)
    linalg.solve_triangular(x, _t(b), upper=True).sum().backward()
    assert np.all(np.tril(x.grad.numpy(), -1) == 0), "the gradient stays in the triangle read"
    gradcheck(lambda t: linalg.solve_triangular(t, _t(b), upper=False), _t(a, True))


def test_tensorinv_and_tensorsolve():
    a = _well_conditioned(6, 6, seed=14).reshape(6, 2, 3)
    np.testing.assert_allclose(
        linalg.tensorinv(_t(a), ind=1).numpy(), np.linalg.tensorinv(a, ind=1), rtol=1e-10
    )
    b4 = _well_conditioned(6, 6, seed=15).reshape(2, 3, 6)
    rhs = _m(2, 3, seed=16)
    np.testing.assert_allclose(
        linalg.tensorsolve(_t(b4), _t(rhs)).numpy(), np.linalg.tensorsolve(b4, rhs), rtol=1e-10
    )
    moved = np.moveaxis(b4, -1, 0)  # (6, 2, 3): dims=(0,) moves the 6 back to the end
    np.testing.assert_allclose(
        linalg.tensorsolve(_t(moved), _t(rhs), dims=(0,)).numpy(),
        np.linalg.tensorsolve(b4, rhs),
        rtol=1e-10,
    )
    gradcheck(lambda t: linalg.tensorinv(t, ind=1), _t(a, True))
    gradcheck(lambda t: linalg.tensorsolve(t, _t(rhs)), _t(b4, True))
    with pytest.raises(ValueError, match="must equal"):
        linalg.tensorinv(_t(_m(2, 3, 4)), ind=1)


def test_householder_product_rebuilds_qr():
    a = _m(5, 3, seed=17)
    # Householder vectors and taus of A, the LAPACK way (v with a unit head, H = I - tau v v^T)
    r, vs, taus = a.copy(), np.zeros_like(a), np.zeros(3)
    for i in range(3):
        x = r[i:, i]
        alpha = -np.sign(x[0]) * np.linalg.norm(x)
        v = x.copy()
        v[0] -= alpha
        v = v / v[0]
        tau = 2.0 / (v @ v)
        r[i:] -= tau * np.outer(v, v @ r[i:])
        vs[i + 1 :, i], taus[i] = v[1:], tau
    q = linalg.householder_product(_t(vs + np.triu(r)), _t(taus))
    np.testing.assert_allclose(q.numpy() @ np.triu(r[:3]), a, atol=1e-12)
    gradcheck(lambda v, t: linalg.householder_product(v, t), _t(vs, True), _t(taus, True))
    with pytest.raises(ValueError, match="m >= n >= k"):
        linalg.householder_product(_t(_m(3, 4)), _t(_m(2)))


def test_vander_vecdot_cross_diagonal_matmul():
    x = np.array([0.0, 1.5, -2.0])
    np.testing.assert_allclose(linalg.vander(_t(x)).numpy(), np.vander(x, increasing=True))
    np.testing.assert_allclose(linalg.vander(_t(x), N=5).numpy(), np.vander(x, 5, increasing=True))
    gradcheck(lambda t: linalg.vander(t, N=4), _t(x, True))  # exact at 0
    a, b = _m(4, 3, seed=18), _m(3, seed=19)
    np.testing.assert_allclose(linalg.vecdot(_t(a), _t(b)).numpy(), a @ b, rtol=1e-12)
    np.testing.assert_allclose(linalg.vecdot(_t(a), _t(a), dim=0).numpy(), (a * a).sum(0))
    np.testing.assert_allclose(linalg.cross(_t(a), _t(b)).numpy(), np.cross(a, b), rtol=1e-12)
    with pytest.raises(ValueError, match="size 3"):
        linalg.cross(_t(a.T), _t(a.T))
    c = _m(2, 3, 4, seed=20)
    np.testing.assert_allclose(linalg.diagonal(_t(c), offset=1).numpy(), np.diagonal(c, 1, -2, -1))
    np.testing.assert_allclose(linalg.matmul(_t(a), _t(b)).numpy(), a @ b)


# --- compiled: the factorising ops fall back to eager with a reason ------------------------


def test_compiled_falls_back_with_reason_and_equals_eager():
    a = _t(_well_conditioned(3, 3, seed=21))

    def fn(x):
        p, low, up = linalg.lu(x)
        return linalg.matrix_exp(x / 4) + linalg.pinv(x) + low @ up + p

    compiled = lucid.compile(fn)
    np.testing.assert_allclose(compiled(a).numpy(), fn(a).numpy(), rtol=1e-12)
    reasons = " ".join(compiled.cache_info()["reasons"].values())
    assert "linalg_" in reasons and "prim has no" in reasons


def test_composites_compile_when_their_ops_lower():
    x, y = _t(_m(4, 3, seed=22)), _t(_m(3, seed=23))

    def fn(a, b):
        return linalg.vecdot(a, b) + linalg.vander(b, N=4).sum() + linalg.multi_dot([a, b])

    compiled = lucid.compile(fn, strict=True)
    np.testing.assert_allclose(compiled(x, y).numpy(), fn(x, y).numpy(), rtol=1e-12)


# --- PyTorch ----------------------------------------------------------------------------------


TORCH_CASES = [
    ("lu", lambda m, a: m.linalg.lu(a)[1] + m.linalg.lu(a)[2]),
    ("lu_factor", lambda m, a: m.linalg.lu_factor(a)[0]),
    ("pinv", lambda m, a: m.linalg.pinv(a)),
    ("matrix_exp", lambda m, a: m.linalg.matrix_exp(a / 3)),
    ("matrix_power", lambda m, a: m.linalg.matrix_power(a, -2)),
    ("matrix_norm_nuc", lambda m, a: m.linalg.matrix_norm(a, "nuc")),
    ("cond", lambda m, a: m.linalg.cond(a)),
    ("solve_triangular", lambda m, a: m.linalg.solve_triangular(a, a.mT, upper=True)),
    ("lstsq", lambda m, a: m.linalg.lstsq(a, a[..., :2]).solution),
    ("tensorinv", lambda m, a: m.linalg.tensorinv(a, ind=1)),
    ("vander", lambda m, a: m.linalg.vander(a[..., 0])),
    ("householder_product", lambda m, a: m.linalg.householder_product(a, a[..., 0, :2] / 5)),
]


@pytest.mark.parametrize("name, fn", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_torch_parity_with_gradients(name, fn):
    torch = pytest.importorskip("torch")
    a = _well_conditioned(3, 3, seed=24)
    ours = _t(a, True)
    theirs = torch.tensor(a, requires_grad=True)
    got, want = fn(lucid, ours), fn(torch, theirs)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-7, atol=1e-10)


# --- LDL ----------------------------------------------------------------------------------------


def _rebuild_from_sytrf(ld, piv):
    """LAPACK's documented meaning of sytrf's lower compact form: A = U D U^T with
    U = P(1) L(1) P(2) L(2) ..., P(k) swapping k (k + 1 for a 2x2 block) with |piv[k]|."""
    n = ld.shape[0]
    u, d, k = np.eye(n), np.zeros((n, n)), 0
    while k < n:
        s = 1 if piv[k] > 0 else 2
        p = np.eye(n)
        i, j = (k if s == 1 else k + 1), abs(piv[k]) - 1
        p[[i, j]] = p[[j, i]]
        block_l = np.eye(n)
        block_l[k + s :, k : k + s] = ld[k + s :, k : k + s]
        block = ld[k : k + s, k : k + s]
        d[k : k + s, k : k + s] = np.tril(block) + np.tril(block, -1).T
        u = u @ p @ block_l
        k += s
    return u @ d @ u.T


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_ldl_factor_rebuilds_the_matrix(n):
    rng = np.random.default_rng(n)
    for trial in range(8):
        a = rng.standard_normal((n, n))
        a = a + a.T
        if trial % 2 and n > 1:
            a[0, 0] = 0.0  # forces a 2x2 pivot or an interchange
        ld, piv = linalg.ldl_factor(_t(a))
        assert piv.dtype == lucid.int32
        assert np.all(np.triu(ld.numpy(), 1) == 0)
        np.testing.assert_allclose(_rebuild_from_sytrf(ld.numpy(), piv.numpy()), a, atol=1e-10)
        b = rng.standard_normal((n, 2))
        x = linalg.ldl_solve(ld, piv, _t(b))
        np.testing.assert_allclose(x.numpy(), np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)


def test_ldl_pivots_batches_and_errors():
    ld, piv = linalg.ldl_factor(_t(np.array([[0.0, 1.0], [1.0, 0.0]])))
    np.testing.assert_array_equal(piv.numpy(), [-2, -2])
    np.testing.assert_allclose(ld.numpy(), [[0.0, 0.0], [1.0, 0.0]])
    a = _m(3, 4, 4, seed=30)
    a = a + np.swapaxes(a, -1, -2)
    ld, piv, info = linalg.ldl_factor_ex(_t(a))
    assert ld.shape == (3, 4, 4) and piv.shape == (3, 4) and not info.numpy().any()
    for i in range(3):
        np.testing.assert_allclose(_rebuild_from_sytrf(ld.numpy()[i], piv.numpy()[i]), a[i],
                                   atol=1e-10)  # fmt: skip
    b = _t(_m(3, 4, 1, seed=31), True)
    gradcheck(lambda t: linalg.ldl_solve(ld, piv, t), b)
    _, _, info = linalg.ldl_factor_ex(_t(np.zeros((2, 2))))
    assert int(info.numpy()) == 1
    with pytest.raises(ValueError, match="singular"):
        linalg.ldl_factor(_t(np.zeros((2, 2))))
    with pytest.raises(ValueError, match="n, n"):
        linalg.ldl_factor(_t(_m(2, 3)))


def test_ldl_matches_torch():
    torch = pytest.importorskip("torch")
    a = _m(5, 5, seed=32)
    a = a + a.T
    a[0, 0] = 0.0
    ld, piv = linalg.ldl_factor(_t(a))
    want_ld, want_piv = torch.linalg.ldl_factor(torch.tensor(a))
    np.testing.assert_array_equal(piv.numpy(), want_piv.numpy())
    np.testing.assert_allclose(np.tril(ld.numpy()), np.tril(want_ld.numpy()), atol=1e-12)
