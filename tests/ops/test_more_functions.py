"""More torch functions (issue 26, beyond the list), all compositions of registry ops: values
against numpy, gradients by finite differences, compiled equal to eager, torch parity when
installed."""

import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck

RNG = np.random.default_rng(2026)


def _t(a, requires_grad=False):
    return lucid.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def test_values_against_numpy():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((4, 2))
    np.testing.assert_allclose(lucid.kron(_t(a), _t(b)).numpy(), np.kron(a, b))
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    np.testing.assert_allclose(lucid.cross(_t(x), _t(y), dim=1).numpy(), np.cross(x, y))
    np.testing.assert_allclose(lucid.cross(_t(x), _t(y[0])).numpy(), np.cross(x, y[0]))
    p, q = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((4, 3, 5))
    np.testing.assert_allclose(
        lucid.tensordot(_t(p), _t(q), ([1, 2], [1, 0])).numpy(),
        np.tensordot(p, q, ([1, 2], [1, 0])),
    )
    np.testing.assert_allclose(lucid.inner(_t(p), _t(p[0])).numpy(), np.inner(p, p[0]))
    np.testing.assert_allclose(_t(a @ a.T).trace().item(), np.trace(a @ a.T))
    m = RNG.standard_normal((3, 3))
    np.testing.assert_allclose(
        lucid.addmm(_t(m), _t(a.T), _t(a), beta=0.5, alpha=2).numpy(), 0.5 * m + 2 * a.T @ a
    )
    np.testing.assert_allclose(
        lucid.addmm(_t(np.full((3, 3), np.nan)), _t(a.T), _t(a), beta=0).numpy(), a.T @ a
    )
    u, v = RNG.standard_normal((5, 3)), RNG.standard_normal((2, 3))
    for order in (0, 1, 2, 3.5, float("inf")):
        want = np.linalg.norm(u[:, None] - v[None], ord=order, axis=-1)
        np.testing.assert_allclose(lucid.cdist(_t(u), _t(v), p=order).numpy(), want, atol=1e-12)
    np.testing.assert_allclose(lucid.dist(_t(u), _t(u[0]), 3).item(),
                               np.linalg.norm((u - u[0]).ravel(), 3))  # fmt: skip
    blocks = lucid.block_diag(_t(np.ones((2, 2))), _t([3.0, 4.0]), _t(5.0))
    assert blocks.tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 3, 4, 0], [0, 0, 0, 0, 5]]
    grids = lucid.meshgrid(_t([1, 2]), _t([3, 4, 5]), indexing="xy")
    for got, want in zip(grids, np.meshgrid([1, 2], [3, 4, 5], indexing="xy"), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    assert lucid.cartesian_prod(_t([1, 2]), _t([3, 4])).tolist() == [[1, 3], [1, 4], [2, 3],
                                                                      [2, 4]]  # fmt: skip
    pieces = lucid.tensor_split(lucid.arange(7), 3)
    assert [t.tolist() for t in pieces] == [a.tolist() for a in np.array_split(np.arange(7), 3)]
    cut = lucid.tensor_split(lucid.arange(7), [1, 5, -1])
    assert [t.tolist() for t in cut] == [[0], [1, 2, 3, 4], [5], [6]]
    rep = lucid.repeat_interleave(_t([[1, 2], [3, 4]]), lucid.tensor([1, 2]), dim=0)
    np.testing.assert_array_equal(rep.numpy(), np.repeat([[1, 2], [3, 4]], [1, 2], axis=0))
    assert lucid.repeat_interleave(lucid.tensor([2, 0, 1])).tolist() == [0, 0, 2]
    for k in range(-2, 5):
        np.testing.assert_array_equal(lucid.rot90(_t(a), k).numpy(), np.rot90(a, k))
    np.testing.assert_array_equal(lucid.diff(_t(b), n=2, dim=0).numpy(), np.diff(b, 2, axis=0))
    np.testing.assert_array_equal(lucid.tril_indices(3, 4, -1).numpy(),
                                  np.stack(np.tril_indices(3, -1, 4)))  # fmt: skip
    np.testing.assert_array_equal(lucid.triu_indices(4, 3, 1).numpy(),
                                  np.stack(np.triu_indices(4, 1, 3)))  # fmt: skip
    assert lucid.atleast_3d(_t([1, 2])).shape == (1, 2, 1) and lucid.atleast_2d(_t(1)).shape == (
        1,
        1,
    )
    big = np.array([1.0, -np.inf, np.inf, 3.0, 800.0])
    np.testing.assert_allclose(lucid.logaddexp(_t(big), _t([2.0, -np.inf, 1, -1000, 800])).numpy(),
                               np.logaddexp(big, [2.0, -np.inf, 1, -1000, 800]))  # fmt: skip
    np.testing.assert_allclose(lucid.hypot(_t([3.0, 0.0]), _t([4.0, 0.0])).numpy(), [5.0, 0.0])


def test_bad_input():
    with pytest.raises(ValueError, match="size 3"):
        lucid.cross(lucid.zeros(2, 2), lucid.zeros(2, 2))
    with pytest.raises(ValueError, match="contracted dims differ"):
        lucid.tensordot(lucid.zeros(2, 3), lucid.zeros(4, 2), 1)
    with pytest.raises(ValueError, match="must be positive"):
        lucid.tensor_split(lucid.zeros(3), 0)
    with pytest.raises(ValueError, match="non-negative"):
        lucid.repeat_interleave(lucid.zeros(2), lucid.tensor([1, -1]))


def test_gradients_by_finite_differences():
    x, y = _t(RNG.standard_normal((2, 3)), True), _t(RNG.standard_normal((3, 2)), True)
    gradcheck(lambda a, b: lucid.kron(a, b).sin().sum(), x, y)
    gradcheck(lambda a, b: lucid.cross(a, b.t(), dim=1).square().sum(), x, y)
    gradcheck(lambda a, b: lucid.cdist(a, b.t(), p=2).sum() + lucid.cdist(a, a).sum(), x, y)
    gradcheck(lambda a: lucid.repeat_interleave(a, 2, dim=1).square().sum(), x)
    gradcheck(lambda a, b: lucid.tensordot(a, b, 1).exp().sum(), x, y)
    gradcheck(lambda a: lucid.rot90(a, 1).cumsum(0).square().sum(), x)
    gradcheck(lambda a, b: lucid.logaddexp(a, b.t()).sum() + lucid.hypot(a, b.t()).sum(), x, y)
    gradcheck(lambda a: lucid.diff(a, dim=1).square().sum() + (a @ a.t()).trace(), x)
    gradcheck(lambda a, b: lucid.block_diag(a, b).square().sum(), x, y)


def test_compiled_equals_eager():
    class Model(lucid.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lucid.nn.Parameter(lucid.randn(3, 3, dtype=lucid.float64))

        def forward(self, x):
            k = lucid.kron(self.w, lucid.ones(2, 1, dtype=lucid.float64))  # (6, 3)
            c = lucid.cross(x, self.w, dim=1)
            d = lucid.cdist(x, self.w)
            r = lucid.repeat_interleave(x, 2, dim=0)  # (6, 3)
            return (k * r).sum() + c.sum() + d.sum() + lucid.rot90(d).diff().sum()

    model = Model()
    x = lucid.randn(3, 3, dtype=lucid.float64)
    compiled = lucid.compile(model, strict=True)
    np.testing.assert_allclose(compiled(x).item(), model(x).item(), rtol=1e-12)
    model(x).backward()
    want = model.w.grad.numpy().copy()
    model.zero_grad()
    compiled(x).backward()
    np.testing.assert_allclose(model.w.grad.numpy(), want, rtol=1e-10, atol=1e-12)


def test_torch_parity_with_gradients():
    torch = pytest.importorskip("torch")
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 3))
    cases = [
        ("kron", lambda m, x, y: m.kron(x, y)),
        ("cross", lambda m, x, y: m.cross(x[:3], y[:3], dim=1)),
        ("cdist", lambda m, x, y: m.cdist(x, y)),
        ("cdist_p1", lambda m, x, y: m.cdist(x, y, p=1)),
        ("tensordot", lambda m, x, y: m.tensordot(x, y.T, 1)),
        ("inner", lambda m, x, y: m.inner(x, y)),
        ("repeat_interleave", lambda m, x, y: m.repeat_interleave(x, 3, dim=0)),
        ("logaddexp", lambda m, x, y: m.logaddexp(x, y[:4])),
        ("hypot", lambda m, x, y: m.hypot(x, y[:4])),
        ("diff", lambda m, x, y: m.diff(x, n=2, dim=0)),
        ("rot90", lambda m, x, y: m.rot90(x, 3, (0, 1))),
        ("dist", lambda m, x, y: m.dist(x, y[:4], 3)),
        ("addmm", lambda m, x, y: m.addmm(x @ y.T, x, y.T, beta=0.3, alpha=1.7)),
    ]
    for name, fn in cases:
        ours = [lucid.tensor(v, requires_grad=True) for v in (a, b)]
        theirs = [torch.tensor(v, requires_grad=True) for v in (a, b)]
        out, ref = fn(lucid, *ours), fn(torch, *theirs)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12,
                                   atol=1e-12, err_msg=name)  # fmt: skip
        (out * out).sum().backward()
        (ref * ref).sum().backward()
        for o, r in zip(ours, theirs, strict=True):
            if r.grad is not None:
                np.testing.assert_allclose(o.grad.numpy(), r.grad.numpy(), rtol=1e-10,
                                           atol=1e-12, err_msg=name)  # fmt: skip


def test_searchsorted_bucketize_bincount_unique_against_numpy():
    seq = np.array([1.0, 3.0, 5.0, 7.0])
    vals = np.array([[0.0, 3.0, 6.0], [7.0, 8.0, 1.0]])
    for right in (False, True):
        side = "right" if right else "left"
        got = lucid.searchsorted(_t(seq), _t(vals), right=right)
        assert got.dtype == lucid.int64
        np.testing.assert_array_equal(got.numpy(), np.searchsorted(seq, vals, side=side))
        np.testing.assert_array_equal(lucid.bucketize(_t(vals), _t(seq), right=right).numpy(),
                                      np.searchsorted(seq, vals, side=side))  # fmt: skip
    rows = np.array([[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]])
    queries = np.array([[3.0, 6.0], [1.0, 5.0]])
    want = [np.searchsorted(r, q) for r, q in zip(rows, queries, strict=True)]
    np.testing.assert_array_equal(lucid.searchsorted(_t(rows), _t(queries)).numpy(), want)
    assert lucid.searchsorted(_t(seq), 4.0).item() == 2
    assert lucid.searchsorted(_t(seq), _t(vals), side="right", out_int32=True).dtype == lucid.int32
    counts = lucid.tensor([1, 1, 3, 0, 3, 3])
    assert lucid.bincount(counts).tolist() == [1, 2, 0, 3]
    assert lucid.bincount(counts, minlength=6).tolist() == [1, 2, 0, 3, 0, 0]
    weighted = lucid.bincount(counts, weights=_t([0.5, 0.5, 1, 1, 1, 2]))
    assert weighted.tolist() == [1.0, 1.0, 0.0, 4.0] and weighted.dtype == lucid.float64
    data = np.array([[3, 1], [1, 2]])
    values, inverse, n = lucid.unique(lucid.tensor(data), return_inverse=True, return_counts=True)
    want_values, want_inverse, want_counts = np.unique(data, return_inverse=True,
                                                       return_counts=True)  # fmt: skip
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(inverse.numpy(), want_inverse.reshape(data.shape))
    np.testing.assert_array_equal(n.numpy(), want_counts)
    slices = lucid.unique(lucid.tensor([[1, 2], [1, 2], [0, 5]]), dim=0)
    assert slices.tolist() == [[0, 5], [1, 2]]
    columns = lucid.unique(lucid.tensor([[1, 1, 0], [2, 2, 5]]), dim=1)
    assert columns.tolist() == [[0, 1], [5, 2]]
    with pytest.raises(ValueError, match="non-negative"):
        lucid.bincount(lucid.tensor([-1, 2]))
    with pytest.raises(ValueError, match="side"):
        lucid.searchsorted(_t(seq), _t(vals), side="middle")


def test_data_dependent_ops_break_the_graph_with_a_reason():
    compiled = lucid.compile(lambda v: lucid.bincount(v) * 2)
    assert compiled(lucid.tensor([1, 1, 3])).tolist() == [0, 4, 0, 2]
    assert "bincount" in " ".join(compiled.cache_info()["reasons"].values())


def test_searchsorted_compiles_without_a_fallback_and_matches_eager():
    def bucket(seq, v):
        return lucid.bucketize(v, seq) + lucid.searchsorted(seq, v, right=True) * 10

    compiled = lucid.compile(bucket)
    seq = _t([-1.0, 0.5, 0.5, 2.0, float("nan")])
    vals = _t([[0.5, float("nan")], [-3.0, 2.0], [float("inf"), 1.0]])
    assert lucid.equal(compiled(seq, vals), bucket(seq, vals))
    assert not compiled.cache_info()["reasons"]
