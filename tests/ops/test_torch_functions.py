"""The torch.* functions of ``lucid.ops.torch_functions``: values against numpy references
(PyTorch's documented formulas), gradients against float64 finite differences, compiled equal to
eager where they compose lowerable ops, and torch itself when importable."""

import itertools
import math

import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck

RNG = np.random.default_rng(0)


def _t(a, grad=False):
    return lucid.tensor(np.asarray(a), requires_grad=grad)


WIDE = np.concatenate([RNG.uniform(-60, 60, 8), RNG.uniform(-2, 2, 8), [0.0, 1.0, -1.0, 0.5]])
UNIT = RNG.uniform(-0.95, 0.95, 12)
POS = RNG.uniform(0.1, 5.0, 12)
PROB = RNG.uniform(0.05, 0.95, 12)

UNARY = [
    ("atan", np.arctan, WIDE),
    ("arctan", np.arctan, WIDE),
    ("asin", np.arcsin, UNIT),
    ("arcsin", np.arcsin, UNIT),
    ("acos", np.arccos, UNIT),
    ("arccos", np.arccos, UNIT),
    ("asinh", np.arcsinh, WIDE),
    ("arcsinh", np.arcsinh, WIDE),
    ("acosh", np.arccosh, POS + 1.0),
    ("arccosh", np.arccosh, POS + 1.0),
    ("atanh", np.arctanh, UNIT),
    ("arctanh", np.arctanh, UNIT),
    ("sinh", np.sinh, np.concatenate([UNIT * 1e-6, WIDE / 10])),
    ("cosh", np.cosh, WIDE / 10),
    ("exp2", np.exp2, WIDE / 10),
    ("log2", np.log2, POS),
    ("log10", np.log10, POS),
    ("sinc", np.sinc, np.concatenate([UNIT, [0.0, 2.0]])),
    ("logit", lambda p: np.log(p / (1 - p)), PROB),
    ("deg2rad", np.deg2rad, WIDE),
    ("rad2deg", np.rad2deg, WIDE),
    ("frac", lambda x: x - np.trunc(x), WIDE),
    ("fix", np.trunc, WIDE),
    ("sgn", np.sign, WIDE),
    ("positive", lambda x: x, WIDE),
    ("angle", np.angle, WIDE),
    ("real", np.real, WIDE),
    ("conj", np.conj, WIDE),
    ("conj_physical", np.conj, WIDE),
    ("resolve_conj", lambda x: x, WIDE),
    ("resolve_neg", lambda x: x, WIDE),
]
SMOOTH = {
    "atan",
    "arctan",
    "asin",
    "arcsin",
    "acos",
    "arccos",
    "asinh",
    "arcsinh",
    "acosh",
    "arccosh",
    "atanh",
    "arctanh",
    "sinh",
    "cosh",
    "exp2",
    "log2",
    "log10",
    "sinc",
    "logit",
    "deg2rad",
    "rad2deg",
    "positive",
    "real",
    "conj",
    "conj_physical",
}


@pytest.mark.parametrize("name, ref, x", UNARY, ids=[u[0] for u in UNARY])
def test_unary_values_and_gradients(name, ref, x):
    fn = getattr(lucid, name)
    np.testing.assert_allclose(fn(_t(x)).numpy(), ref(x), rtol=1e-13, atol=1e-15)
    assert fn(_t(x.astype(np.float32))).dtype == lucid.float32
    if name in SMOOTH:
        gradcheck(fn, _t(x[x != 0] if name == "sinc" else x, True))


def test_sinc_gradient_at_zero_and_integer_promotion():
    x = _t([0.0, 0.3], True)
    lucid.sinc(x).sum().backward()
    assert x.grad.numpy()[0] == 0.0
    assert lucid.atan(lucid.tensor([1, 2])).dtype == lucid.float32
    np.testing.assert_allclose(
        lucid.logit(_t([0.0, 1.0, 0.5]), eps=0.1).numpy(),
        np.log(np.array([0.1, 0.9, 0.5]) / (1 - np.array([0.1, 0.9, 0.5]))),
    )


def test_predicates():
    x = np.array([-0.0, 0.0, -1.0, 2.0, np.inf, -np.inf, np.nan])
    np.testing.assert_array_equal(
        lucid.signbit(_t(x)).numpy(), np.signbit(x)[:6].tolist() + [False]
    )
    np.testing.assert_array_equal(lucid.isposinf(_t(x)).numpy(), np.isposinf(x))
    np.testing.assert_array_equal(lucid.isneginf(_t(x)).numpy(), np.isneginf(x))
    assert lucid.isreal(_t(x)).numpy().all()
    np.testing.assert_array_equal(
        lucid.signbit(lucid.tensor([-2, 0, 3])).numpy(), [True, False, False]
    )


BINARY = [
    (
        "atan2",
        np.arctan2,
        RNG.uniform(-3, 3, 12),
        np.concatenate([RNG.uniform(-3, 3, 9), [0.0, 0, 0]]),
    ),
    ("arctan2", np.arctan2, RNG.uniform(-3, 3, 6), RNG.uniform(-3, 3, 6)),
    ("logaddexp2", np.logaddexp2, WIDE, WIDE[::-1]),
    (
        "xlogy",
        lambda x, y: np.where(x == 0, 0.0, x * np.log(y)),
        np.concatenate([[0.0], POS[1:]]),
        POS,
    ),
    ("copysign", np.copysign, WIDE, WIDE[::-1]),
    ("fmod", np.fmod, WIDE, np.where(np.abs(WIDE[::-1]) < 0.3, 0.7, WIDE[::-1])),
    ("float_power", np.float_power, POS, UNIT),
    ("fmax", np.fmax, np.array([1.0, np.nan, 3.0, np.nan]), np.array([2.0, 1.0, np.nan, np.nan])),
    ("fmin", np.fmin, np.array([1.0, np.nan, 3.0, np.nan]), np.array([2.0, 1.0, np.nan, np.nan])),
    ("heaviside", np.heaviside, np.array([-1.0, 0.0, 2.0, 0.0]), np.array([0.5, 0.25, 0.5, 0.75])),
]


@pytest.mark.parametrize("name, ref, x, y", BINARY, ids=[b[0] for b in BINARY])
def test_binary_values(name, ref, x, y):
    got = getattr(lucid, name)(_t(x), _t(y)).numpy()
    np.testing.assert_allclose(got, ref(x, y), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("name", ["atan2", "logaddexp2", "xlogy", "copysign", "float_power"])
def test_binary_gradients(name):
    x = POS[:5] if name in ("xlogy", "float_power") else RNG.uniform(0.5, 2, 5) * [1, -1, 1, -1, 1]
    y = POS[5:10] if name in ("xlogy", "float_power", "atan2") else RNG.uniform(-2, 2, 5)
    if name == "atan2":
        y = y * [1, -1, 1, -1, -1]
    gradcheck(lambda a, b: getattr(lucid, name)(a, b), _t(x, True), _t(y, True))


def test_integer_functions():
    a, b = np.array([12, -18, 7, 0]), np.array([8, 12, 0, 5])
    np.testing.assert_array_equal(lucid.gcd(_t(a), _t(b)).numpy(), np.gcd(a, b))
    np.testing.assert_array_equal(lucid.lcm(_t(a), _t(b)).numpy(), np.lcm(a, b))
    np.testing.assert_array_equal(lucid.fmod(_t([7, -7]), _t([3, 3])).numpy(), [1, -1])
    np.testing.assert_allclose(
        lucid.ldexp(_t([1.5, 3.0]), _t([2, -1])).numpy(), np.ldexp([1.5, 3.0], [2, -1])
    )
    np.testing.assert_array_equal(
        lucid.isin(_t([1, 2, 3, 4]), _t([2, 4, 9])).numpy(), np.isin([1, 2, 3, 4], [2, 4, 9])
    )
    np.testing.assert_array_equal(
        lucid.isin(_t([1, 2]), _t([2]), invert=True).numpy(), [True, False]
    )
    with pytest.raises(TypeError, match="integer"):
        lucid.gcd(_t([1.0]), _t([2.0]))


def test_pointwise_composites_compile_equal_to_eager():
    x, y = _t(WIDE / 30), _t(POS[:1].repeat(20))

    def fn(a, b):
        return (
            lucid.atan(a * 40),
            lucid.asin(a),
            lucid.acos(a),
            lucid.atanh(a),
            lucid.asinh(a),
            lucid.sinh(a),
            lucid.cosh(a),
            lucid.sinc(a),
            lucid.atan2(a, a.flip(0)),
            lucid.logaddexp2(a, b),
            lucid.copysign(b, a),
            lucid.fmod(a * 9, b),
            lucid.exp2(a),
            lucid.log2(b),
            lucid.xlogy(a.abs(), b),
            lucid.fmax(a, b),
        )

    compiled = lucid.compile(fn, strict=True)
    for got, want in zip(compiled(x, y), fn(x, y), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)


# --- creation -------------------------------------------------------------------------------


def test_creation_functions():
    assert not hasattr(lucid, "range"), "would shadow Python's range under a star import"
    np.testing.assert_allclose(lucid.logspace(0, 2, 3).numpy(), [1, 10, 100], rtol=1e-6)
    np.testing.assert_allclose(
        lucid.logspace(0, 3, 4, base=2, dtype=lucid.float64).numpy(), [1, 2, 4, 8]
    )
    assert lucid.empty_strided((2, 3), (3, 1)).shape == (2, 3)
    buf = bytearray(np.arange(4, dtype=np.float32).tobytes())
    np.testing.assert_array_equal(lucid.frombuffer(buf, dtype=lucid.float32).numpy(), [0, 1, 2, 3])
    arr = np.arange(3.0)
    shared = lucid.as_tensor(arr)
    arr[0] = 7.0
    assert shared.numpy()[0] == 7.0
    assert lucid.asarray([1, 2], dtype=lucid.float64).dtype == lucid.float64
    t = lucid.ones(2)
    assert lucid.asarray(t) is t and lucid.asarray(t, copy=True) is not t
    np.testing.assert_array_equal(lucid.from_dlpack(np.arange(3)).numpy(), [0, 1, 2])


@pytest.mark.parametrize(
    "name, ref",
    [
        ("hann_window", np.hanning),
        ("hamming_window", np.hamming),
        ("blackman_window", np.blackman),
        ("bartlett_window", np.bartlett),
        ("kaiser_window", lambda n: np.kaiser(n, 12.0)),
    ],
)
def test_windows(name, ref):
    fn = getattr(lucid, name)
    np.testing.assert_allclose(
        fn(7, periodic=False, dtype=lucid.float64).numpy(), ref(7), atol=1e-12
    )
    np.testing.assert_allclose(fn(7, dtype=lucid.float64).numpy(), ref(8)[:7], atol=1e-12)
    assert fn(0).shape == (0,) and fn(1).numpy().tolist() == [1.0]


# --- indexing, joining, splitting ----------------------------------------------------------


def test_joining_and_splitting():
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 4))
    for name in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
        ref = getattr(np, name if name != "row_stack" else "vstack")
        np.testing.assert_array_equal(
            getattr(lucid, name)([_t(a[0]), _t(b[0])]).numpy(), ref([a[0], b[0]])
        )
    np.testing.assert_array_equal(
        lucid.column_stack([_t(a[0, 0]), _t(b[0, 0])]).numpy(), np.column_stack([a[0, 0], b[0, 0]])
    )
    np.testing.assert_array_equal(
        lucid.hstack([_t(a[0, 0]), _t(b[0, 0])]).numpy(), np.hstack([a[0, 0], b[0, 0]])
    )
    for name, sections in (("hsplit", 3), ("vsplit", 2), ("dsplit", [1, 3])):
        got = getattr(lucid, name)(_t(a), sections)
        for g, w in zip(got, getattr(np, name)(a, sections), strict=True):
            np.testing.assert_array_equal(g.numpy(), w)
    with pytest.raises(ValueError, match="equal"):
        lucid.hsplit(_t(a), 2)
    np.testing.assert_array_equal(lucid.adjoint(_t(a)).numpy(), np.swapaxes(a, -1, -2))
    np.testing.assert_array_equal(lucid.moveaxis(_t(a), 0, -1).numpy(), np.moveaxis(a, 0, -1))
    mask = np.array([[0, 1, 0], [2, 0, 3]])
    np.testing.assert_array_equal(lucid.argwhere(_t(mask)).numpy(), np.argwhere(mask))
    idx = np.array([[0, -1], [5, 7]])
    np.testing.assert_array_equal(lucid.take(_t(a[0]), _t(idx)).numpy(), np.take(a[0], idx))
    np.testing.assert_array_equal(lucid.narrow_copy(_t(a), 2, 1, 2).numpy(), a[:, :, 1:3])
    got = lucid.unravel_index(_t([0, 5, 23, -1]), (2, 3, 4))
    for g, w in zip(got, np.unravel_index([0, 5, 23, 23], (2, 3, 4)), strict=True):
        np.testing.assert_array_equal(g.numpy(), w)
    with pytest.raises(ValueError, match="out of bounds"):
        lucid.unravel_index(_t([24]), (2, 3, 4))
    np.testing.assert_array_equal(lucid.ravel(_t(a)).numpy(), a.ravel())
    np.testing.assert_array_equal(lucid.fliplr(_t(a)).numpy(), np.fliplr(a))
    np.testing.assert_array_equal(lucid.flipud(_t(a)).numpy(), np.flipud(a))
    np.testing.assert_array_equal(lucid.diagflat(_t(a[0, 0]), 1).numpy(), np.diagflat(a[0, 0], 1))
    x, y = lucid.broadcast_tensors(_t(a[:, :1]), _t(b[0]))
    assert x.shape == y.shape == (2, 3, 4)
    assert lucid.broadcast_shapes((2, 1), (3,), 1) == (2, 3)
    with pytest.raises(ValueError, match="broadcast"):
        lucid.broadcast_shapes((2,), (3,))
    v = np.array([1.0, 2.0, 3.0, 4.0])
    for r, rep in ((2, False), (3, False), (2, True)):
        pick = itertools.combinations_with_replacement if rep else itertools.combinations
        want = np.array(list(pick(v, r)))
        np.testing.assert_array_equal(lucid.combinations(_t(v), r, rep).numpy(), want)


def test_scatters_values_and_gradients():
    a, src = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 2))
    want = a.copy()
    want[:, 1:4:2] = src
    np.testing.assert_array_equal(lucid.slice_scatter(_t(a), _t(src), 1, 1, 4, 2).numpy(), want)
    want = a.copy()
    want[:, 2] = src[:, 0]
    np.testing.assert_array_equal(lucid.select_scatter(_t(a), _t(src[:, 0]), 1, 2).numpy(), want)
    want = a.copy()
    want[[0, 1, 2], [1, 2, 3]] = src[:, 0]
    np.testing.assert_array_equal(lucid.diagonal_scatter(_t(a), _t(src[:, 0]), 1).numpy(), want)
    gradcheck(lambda x, s: lucid.slice_scatter(x, s, 1, 1, 4, 2), _t(a, True), _t(src, True))
    gradcheck(lambda x, s: lucid.diagonal_scatter(x, s, 1), _t(a, True), _t(src[:, 0], True))


# --- reductions and order statistics ------------------------------------------------------


def test_nan_reductions_median_kthvalue():
    x = RNG.standard_normal((3, 5))
    nanx = x.copy()
    nanx[0, 1] = nanx[2, 4] = np.nan
    np.testing.assert_allclose(lucid.nansum(_t(nanx)).numpy(), np.nansum(nanx))
    np.testing.assert_allclose(lucid.nansum(_t(nanx), 1).numpy(), np.nansum(nanx, 1))
    np.testing.assert_allclose(
        lucid.nanmean(_t(nanx), 0, keepdim=True).numpy(), np.nanmean(nanx, 0, keepdims=True)
    )
    lo, hi = lucid.aminmax(_t(x), dim=1)
    np.testing.assert_array_equal(lo.numpy(), x.min(1))
    np.testing.assert_array_equal(hi.numpy(), x.max(1))
    even = RNG.standard_normal((3, 4))
    for arr in (x, even):
        med = lucid.median(_t(arr), 1)
        lower = np.sort(arr, 1)[:, (arr.shape[1] - 1) // 2]
        np.testing.assert_array_equal(med.values.numpy(), lower)
        np.testing.assert_array_equal(arr[np.arange(3), med.indices.numpy()], lower)
    assert float(lucid.median(_t(even)).numpy()) == np.sort(even.ravel())[(even.size - 1) // 2]
    assert np.isnan(lucid.median(_t(nanx), 1).values.numpy()[[0, 2]]).all()
    nm = lucid.nanmedian(_t(nanx), 1).values.numpy()
    np.testing.assert_array_equal(
        nm, [np.sort(r[~np.isnan(r)])[(np.sum(~np.isnan(r)) - 1) // 2] for r in nanx]
    )
    kth = lucid.kthvalue(_t(x), 2, 0)
    np.testing.assert_array_equal(kth.values.numpy(), np.sort(x, 0)[1])
    np.testing.assert_array_equal(x[kth.indices.numpy(), np.arange(5)], np.sort(x, 0)[1])
    gradcheck(lambda t: lucid.median(t, 1).values, _t(x, True))
    gradcheck(lambda t: lucid.nanmean(t, 1), _t(x, True))
    with pytest.raises(ValueError, match="out of range"):
        lucid.kthvalue(_t(x), 6, 1)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile(interpolation):
    x = RNG.standard_normal((4, 7))
    q = [0.0, 0.3, 0.5, 0.9, 1.0]
    got = lucid.quantile(_t(x), _t(q), 1, interpolation=interpolation).numpy()
    np.testing.assert_allclose(got, np.quantile(x, q, axis=1, method=interpolation), rtol=1e-13)
    got = lucid.quantile(_t(x), 0.3, interpolation=interpolation).numpy()
    np.testing.assert_allclose(got, np.quantile(x, 0.3, method=interpolation), rtol=1e-13)
    nanx = x.copy()
    nanx[1, 2] = np.nan
    got = lucid.nanquantile(_t(nanx), 0.4, 1, keepdim=True, interpolation=interpolation).numpy()
    np.testing.assert_allclose(
        got, np.nanquantile(nanx, 0.4, axis=1, keepdims=True, method=interpolation)
    )
    assert np.isnan(lucid.quantile(_t(nanx), 0.4, 1).numpy()[1])
    if interpolation == "linear":
        gradcheck(lambda t: lucid.quantile(t, 0.3, 1), _t(x, True))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        lucid.quantile(_t(x), 1.5)


def test_cumulative_functions():
    x = np.array([[1.0, 3.0, 2.0, 3.0, 5.0], [0.0, -1.0, -1.0, 4.0, 2.0]])
    values, indices = lucid.cummax(_t(x), 1)
    np.testing.assert_array_equal(values.numpy(), np.maximum.accumulate(x, 1))
    np.testing.assert_array_equal(indices.numpy(), [[0, 1, 1, 3, 4], [0, 0, 0, 3, 3]])
    values, indices = lucid.cummin(_t(x), 1)
    np.testing.assert_array_equal(values.numpy(), np.minimum.accumulate(x, 1))
    np.testing.assert_array_equal(indices.numpy(), [[0, 0, 0, 0, 0], [0, 1, 2, 2, 2]])
    wide = np.array([-1000.0, 0.0, 1000.0, 1.0])
    np.testing.assert_allclose(
        lucid.logcumsumexp(_t(wide), 0).numpy(), np.logaddexp.accumulate(wide)
    )
    y = RNG.standard_normal((3, 4))
    gradcheck(lambda t: lucid.logcumsumexp(t, 1), _t(y, True))
    gradcheck(lambda t: lucid.cummax(t, 0).values, _t(y, True))


def test_unique_consecutive_and_histograms():
    x = np.array([1, 1, 2, 2, 3, 1, 1, 2])
    out, inverse, counts = lucid.unique_consecutive(_t(x), return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(out.numpy(), [1, 2, 3, 1, 2])
    np.testing.assert_array_equal(inverse.numpy(), [0, 0, 1, 1, 2, 3, 3, 4])
    np.testing.assert_array_equal(counts.numpy(), [2, 2, 1, 2, 1])
    rows = np.array([[1, 1], [1, 1], [2, 0]])
    np.testing.assert_array_equal(
        lucid.unique_consecutive(_t(rows), dim=0).numpy(), [[1, 1], [2, 0]]
    )
    data = RNG.standard_normal(50)
    np.testing.assert_array_equal(
        lucid.histc(_t(data), 5, -1, 1).numpy(), np.histogram(data, 5, (-1, 1))[0]
    )
    np.testing.assert_array_equal(lucid.histc(_t(data), 4).numpy(), np.histogram(data, 4)[0])
    hist, edges = lucid.histogram(_t(data), 6)
    want_hist, want_edges = np.histogram(data, 6)
    np.testing.assert_array_equal(hist.numpy(), want_hist)
    np.testing.assert_allclose(edges.numpy(), want_edges)


def test_cov_corrcoef_renorm():
    x = RNG.standard_normal((3, 6))
    fw, aw = np.array([1, 2, 1, 3, 1, 1]), RNG.uniform(0.5, 2, 6)
    np.testing.assert_allclose(lucid.cov(_t(x)).numpy(), np.cov(x), rtol=1e-12)
    np.testing.assert_allclose(
        lucid.cov(_t(x), correction=0).numpy(), np.cov(x, ddof=0), rtol=1e-12
    )
    np.testing.assert_allclose(
        lucid.cov(_t(x), fweights=_t(fw), aweights=_t(aw)).numpy(),
        np.cov(x, fweights=fw, aweights=aw),
        rtol=1e-12,
    )
    np.testing.assert_allclose(lucid.corrcoef(_t(x)).numpy(), np.corrcoef(x), rtol=1e-12)
    gradcheck(lucid.cov, _t(x, True))
    gradcheck(lucid.corrcoef, _t(x, True))
    w = RNG.standard_normal((3, 4)) * 3
    norms = np.linalg.norm(w, axis=1, keepdims=True)
    want = w * np.where(norms > 2.0, 2.0 / (norms + 1e-7), 1.0)
    np.testing.assert_allclose(lucid.renorm(_t(w), 2, 0, 2.0).numpy(), want, rtol=1e-12)
    gradcheck(lambda t: lucid.renorm(t, 2, 0, 2.0), _t(w, True))


# --- BLAS and LAPACK ------------------------------------------------------------------------


def test_blas_functions():
    inp, b1, b2 = (
        RNG.standard_normal((2, 4)),
        RNG.standard_normal((3, 2, 5)),
        RNG.standard_normal((3, 5, 4)),
    )
    np.testing.assert_allclose(
        lucid.addbmm(_t(inp), _t(b1), _t(b2), beta=0.5, alpha=2).numpy(),
        0.5 * inp + 2 * np.einsum("bij,bjk->ik", b1, b2),
        rtol=1e-12,
    )
    v1, v2 = RNG.standard_normal(2), RNG.standard_normal(4)
    np.testing.assert_allclose(
        lucid.addr(_t(inp), _t(v1), _t(v2), alpha=3).numpy(), inp + 3 * np.outer(v1, v2)
    )
    np.testing.assert_allclose(lucid.ger(_t(v1), _t(v2)).numpy(), np.outer(v1, v2))
    m = RNG.standard_normal((4, 3))
    np.testing.assert_allclose(lucid.mv(_t(m), _t(v2[:3])).numpy(), m @ v2[:3])
    np.testing.assert_allclose(lucid.vdot(_t(v2), _t(v2)).numpy(), v2 @ v2)
    np.testing.assert_allclose(lucid.chain_matmul(_t(inp), _t(m), _t(m.T)).numpy(), inp @ m @ m.T)
    gradcheck(lambda a, b, c: lucid.addbmm(a, b, c), _t(inp, True), _t(b1, True), _t(b2, True))
    x = np.linspace(0, 2, 7)
    y = np.sin(x)[None, :] * [[1.0], [2.0]]
    np.testing.assert_allclose(
        lucid.trapezoid(_t(y), _t(x)).numpy(), np.trapezoid(y, x), rtol=1e-12
    )
    np.testing.assert_allclose(
        lucid.trapz(_t(y), dx=0.5).numpy(), np.trapezoid(y, dx=0.5), rtol=1e-12
    )
    cum = lucid.cumulative_trapezoid(_t(y), _t(x)).numpy()
    want = np.cumsum((y[:, 1:] + y[:, :-1]) / 2 * np.diff(x), 1)
    np.testing.assert_allclose(cum, want, rtol=1e-12)
    gradcheck(lambda t: lucid.trapezoid(t, _t(x)), _t(y, True))


def test_lapack_functions():
    a = RNG.standard_normal((3, 3)) + 3 * np.eye(3)
    spd = a @ a.T
    low = np.linalg.cholesky(spd)
    np.testing.assert_allclose(lucid.cholesky(_t(spd)).numpy(), low, rtol=1e-12)
    np.testing.assert_allclose(lucid.cholesky(_t(spd), upper=True).numpy(), low.T, rtol=1e-12)
    np.testing.assert_allclose(
        lucid.cholesky_inverse(_t(low)).numpy(), np.linalg.inv(spd), rtol=1e-10
    )
    np.testing.assert_allclose(
        lucid.cholesky_inverse(_t(low.T), upper=True).numpy(), np.linalg.inv(spd), rtol=1e-10
    )
    rhs = RNG.standard_normal((3, 2))
    np.testing.assert_allclose(
        lucid.cholesky_solve(_t(rhs), _t(low)).numpy(), np.linalg.solve(spd, rhs), rtol=1e-10
    )
    np.testing.assert_allclose(lucid.inverse(_t(a)).numpy(), np.linalg.inv(a), rtol=1e-12)
    np.testing.assert_allclose(lucid.det(_t(a)).numpy(), np.linalg.det(a), rtol=1e-12)
    np.testing.assert_allclose(
        lucid.logdet(_t(spd)).numpy(), np.log(np.linalg.det(spd)), rtol=1e-12
    )
    assert np.isnan(lucid.logdet(_t(-np.eye(3))).numpy())
    sign, logabs = lucid.slogdet(_t(-a))
    np.testing.assert_allclose((sign.numpy(), logabs.numpy()), np.linalg.slogdet(-a), rtol=1e-12)
    packed, pivots = lucid.lu(_t(a))
    p, lo, up = lucid.lu_unpack(packed, pivots)
    np.testing.assert_allclose((p @ lo @ up).numpy(), a, atol=1e-12)
    np.testing.assert_allclose(
        lucid.lu_solve(_t(rhs), packed, pivots).numpy(), np.linalg.solve(a, rhs), rtol=1e-10
    )
    assert len(lucid.lu(_t(a), get_infos=True)) == 3
    np.testing.assert_allclose(
        lucid.matrix_power(_t(a), 3).numpy(), np.linalg.matrix_power(a, 3), rtol=1e-12
    )
    np.testing.assert_allclose(
        lucid.pinverse(_t(m := RNG.standard_normal((4, 2)))).numpy(), np.linalg.pinv(m), atol=1e-12
    )
    q, r = lucid.qr(_t(m), some=False)
    assert q.shape == (4, 4) and r.shape == (4, 2)
    np.testing.assert_allclose((q @ r).numpy(), m, atol=1e-12)
    u, s, v = lucid.svd(_t(m))
    np.testing.assert_allclose(((u * s) @ v.mT).numpy(), m, atol=1e-12)
    _, s_only, v_zero = lucid.svd(_t(m), compute_uv=False)
    np.testing.assert_allclose(s_only.numpy(), s.numpy())
    assert not v_zero.numpy().any()
    sol, coeff = lucid.triangular_solve(_t(rhs), _t(a), upper=True)
    np.testing.assert_allclose(sol.numpy(), np.linalg.solve(np.triu(a), rhs), rtol=1e-10)
    np.testing.assert_array_equal(coeff.numpy(), a)
    sol_t, _ = lucid.triangular_solve(_t(rhs), _t(a), upper=False, transpose=True)
    np.testing.assert_allclose(sol_t.numpy(), np.linalg.solve(np.tril(a).T, rhs), rtol=1e-10)
    xs = np.array([2.0, 3.0, 0.5])
    np.testing.assert_allclose(lucid.vander(_t(xs)).numpy(), np.vander(xs))
    np.testing.assert_allclose(
        lucid.vander(_t(xs), 4, increasing=True).numpy(), np.vander(xs, 4, increasing=True)
    )
    q_full = lucid.orgqr(_t(np.tril(m, -1)), _t([0.0, 0.0]))
    np.testing.assert_allclose(q_full.numpy(), np.eye(4, 2))
    gradcheck(lambda t: lucid.logdet(t @ t.mT), _t(a, True))
    gradcheck(lambda t: lucid.cholesky_solve(_t(rhs), t), _t(low, True))


# --- PyTorch --------------------------------------------------------------------------------

TORCH_CASES = [
    "atan",
    "asin",
    "acos",
    "asinh",
    "acosh",
    "atanh",
    "sinh",
    "cosh",
    "sinc",
    "logit",
    "exp2",
    "log2",
    "log10",
    "deg2rad",
    "frac",
    "logcumsumexp",
    "nansum",
    "nanmean",
    "lgamma",
    "digamma",
    "erfc",
    "i0",
    "erfinv",
]


@pytest.mark.parametrize("name", TORCH_CASES)
def test_against_torch(name):
    torch = pytest.importorskip("torch")
    x = PROB.reshape(3, 4) * 0.9 + (1.0 if name == "acosh" else 0.0)
    args = (0,) if name == "logcumsumexp" else ()
    ours = _t(x, True)
    theirs = torch.tensor(x, requires_grad=True)
    got, want = getattr(lucid, name)(ours, *args), getattr(torch, name)(theirs, *args)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10)


def test_math_constants_sanity():
    assert math.isclose(float(lucid.atan(_t(1.0)).numpy()), math.pi / 4, rel_tol=1e-15)


def test_frexp_nextafter_shifts():
    x = np.array([8.0, -0.3, 0.0, 1e-300, 3.5e10])
    mantissa, exponent = lucid.frexp(_t(x))
    want_m, want_e = np.frexp(x)
    np.testing.assert_array_equal(mantissa.numpy(), want_m)
    np.testing.assert_array_equal(exponent.numpy(), want_e)
    gradcheck(lambda t: lucid.frexp(t).mantissa, _t(x[:2] + 0.01, True))
    y = np.array([1.0, 0.0, -1.0])
    np.testing.assert_array_equal(
        lucid.nextafter(_t(y), _t([2.0, -1.0, -2.0])).numpy(), np.nextafter(y, [2.0, -1.0, -2.0])
    )
    a = np.array([1, -3, 40])
    np.testing.assert_array_equal(lucid.bitwise_left_shift(_t(a), 2).numpy(), np.left_shift(a, 2))
    np.testing.assert_array_equal(
        lucid.bitwise_right_shift(_t(a), _t([0, 1, 3])).numpy(), np.right_shift(a, [0, 1, 3])
    )
    with pytest.raises(TypeError, match="integer"):
        lucid.bitwise_left_shift(_t([1.0]), 1)


@pytest.mark.parametrize("edge_order", [1, 2])
def test_gradient(edge_order):
    f = RNG.standard_normal((5, 6))
    coords = np.array([0.0, 0.4, 1.1, 1.5, 2.6, 3.0])
    for got, want in zip(
        lucid.gradient(_t(f), edge_order=edge_order),
        np.gradient(f, edge_order=edge_order),
        strict=True,
    ):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    got = lucid.gradient(_t(f), spacing=[0.5, _t(coords)], edge_order=edge_order)
    for g, w in zip(got, np.gradient(f, 0.5, coords, edge_order=edge_order), strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-12, atol=1e-12)
    (only,) = lucid.gradient(_t(f), spacing=2.0, dim=1, edge_order=edge_order)
    np.testing.assert_allclose(only.numpy(), np.gradient(f, 2.0, axis=1, edge_order=edge_order))
    gradcheck(lambda t: lucid.gradient(t, dim=0, edge_order=edge_order)[0], _t(f, True))
    compiled = lucid.compile(
        lambda t: lucid.gradient(t, dim=1, edge_order=edge_order)[0], strict=True
    )
    np.testing.assert_allclose(
        compiled(_t(f)).numpy(), np.gradient(f, axis=1, edge_order=edge_order), rtol=1e-12
    )
    with pytest.raises(ValueError, match="edge_order"):
        lucid.gradient(_t(f), edge_order=3)


def test_histogramdd():
    pts = RNG.standard_normal((40, 2))
    w = RNG.uniform(0.5, 1.5, 40)
    hist, edges = lucid.histogramdd(
        _t(pts), bins=[3, 4], range=[-2.0, 2.0, -1.0, 1.0], weight=_t(w)
    )
    want, want_edges = np.histogramdd(pts, bins=[3, 4], range=[(-2, 2), (-1, 1)], weights=w)
    np.testing.assert_allclose(hist.numpy(), want)
    for e, we in zip(edges, want_edges, strict=True):
        np.testing.assert_allclose(e.numpy(), we)


def _ref_scatter_reduce(x, dim, index, src, reduce, include_self):
    """torch's documented loop: self[index[i][j]][j] (dim 0) reduced with src[i][j], and so on."""
    out = x.copy()
    hits = {}
    for pos in np.ndindex(index.shape):
        target = list(pos)
        target[dim] = index[pos]
        hits.setdefault(tuple(target), []).append(src[pos])
    for target, vals in hits.items():
        vals = ([x[target]] if include_self else []) + vals
        fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}
        out[target] = fn[reduce](vals)
    return out


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = RNG.standard_normal((3, 4))
    src = RNG.standard_normal((3, 5))
    index = RNG.integers(0, 4, (2, 5))
    for dim, idx in ((1, index), (0, RNG.integers(0, 3, (2, 4)))):
        got = lucid.scatter_reduce(_t(x), dim, _t(idx), _t(src), reduce, include_self=include_self)
        want = _ref_scatter_reduce(x, dim, idx, src, reduce, include_self)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    gradcheck(
        lambda a, s: lucid.scatter_reduce(a, 1, _t(index), s, reduce, include_self=include_self),
        _t(x, True),
        _t(src, True),
    )
    fn = lucid.compile(lambda a, s: lucid.scatter_reduce(a, 1, _t(index), s, reduce), strict=True)
    np.testing.assert_allclose(
        fn(_t(x), _t(src)).numpy(),
        lucid.scatter_reduce(_t(x), 1, _t(index), _t(src), reduce).numpy(),
        rtol=1e-12,
    )


def test_index_reduce_and_errors():
    x = RNG.standard_normal((4, 3))
    source = RNG.standard_normal((5, 3))
    index = np.array([0, 2, 0, 3, 3])
    got = lucid.index_reduce(_t(x), 0, _t(index), _t(source), "amax")
    want = x.copy()
    for i, j in enumerate(index):
        want[j] = np.maximum(want[j], source[i])
    np.testing.assert_allclose(got.numpy(), want)
    ints = lucid.scatter_reduce(_t([[10, 20]]), 1, _t([[0, 0]]), _t([[1, 2]]), "mean")
    np.testing.assert_array_equal(ints.numpy(), [[4, 20]])  # floor((10 + 1 + 2) / 3)
    with pytest.raises(ValueError, match="reduce"):
        lucid.scatter_reduce(_t(x), 0, _t(np.zeros((1, 3), int)), _t(x), "max")
    with pytest.raises(ValueError, match="1-d"):
        lucid.index_reduce(_t(x), 0, _t(index[:2]), _t(source), "prod")


SPECIAL_X = np.concatenate([np.linspace(-5.3, 0.4, 23), np.linspace(0.5, 60.0, 31), [1.0, 2.0]])


def test_lgamma_digamma_mvlgamma_erfc_values():
    got = lucid.lgamma(_t(SPECIAL_X)).numpy()
    want = np.array([math.lgamma(v) for v in SPECIAL_X])
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    assert np.isinf(lucid.lgamma(_t([0.0, -3.0])).numpy()).all()
    psi = lucid.digamma(_t(SPECIAL_X)).numpy()
    np.testing.assert_allclose(
        lucid.digamma(_t(SPECIAL_X + 1)).numpy() - psi, 1 / SPECIAL_X, rtol=1e-11, atol=1e-11
    )
    euler = 0.57721566490153286
    np.testing.assert_allclose(
        lucid.digamma(_t([1.0, 0.5])).numpy(), [-euler, -euler - 2 * math.log(2)], rtol=1e-14
    )
    h = 1e-5
    smooth = np.abs(SPECIAL_X - np.round(SPECIAL_X)) > 0.1  # finite differences near poles
    slope = [(math.lgamma(v + h) - math.lgamma(v - h)) / (2 * h) for v in SPECIAL_X[smooth]]
    np.testing.assert_allclose(psi[smooth], slope, rtol=1e-7, atol=1e-7)
    special = lucid.digamma(_t([0.0, -2.0])).numpy()
    assert special[0] == -np.inf and np.isnan(special[1])
    x = np.array([2.5, 4.0, 7.25])
    want = 3 * 2 / 4 * math.log(math.pi) + sum(
        np.array([math.lgamma(v - i / 2) for v in x]) for i in range(3)
    )
    np.testing.assert_allclose(lucid.mvlgamma(_t(x), 3).numpy(), want, rtol=1e-13)
    with pytest.raises(ValueError, match=r"\(p-1\)/2"):
        lucid.mvlgamma(_t([0.9]), 3)
    z = np.linspace(-6, 27, 100)
    np.testing.assert_allclose(lucid.erfc(_t(z)).numpy(), [math.erfc(v) for v in z], rtol=1e-13)


def test_special_function_gradients_and_compiled():
    x = _t(np.array([-2.7, -0.4, 0.3, 1.7, 8.0]), True)
    lucid.lgamma(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), lucid.digamma(x.detach()).numpy(), rtol=1e-9)
    gradcheck(lucid.digamma, _t([-2.7, 0.3, 1.7, 8.0], True))
    z = _t(np.array([-1.0, 0.4, 1.6, 3.0, 6.0]), True)
    lucid.erfc(z).sum().backward()
    want = -2 / math.sqrt(math.pi) * np.exp(-(z.detach().numpy() ** 2))
    np.testing.assert_allclose(z.grad.numpy(), want, rtol=1e-10, atol=1e-300)
    fn = lucid.compile(lambda t: (lucid.lgamma(t), lucid.digamma(t), lucid.erfc(t)), strict=True)
    v = _t(np.array([-2.7, 0.3, 1.7, 8.0]))
    for got, want in zip(fn(v), (lucid.lgamma(v), lucid.digamma(v), lucid.erfc(v)), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_polygamma(n):
    x = np.linspace(0.2, 40.0, 30)
    got = lucid.polygamma(n, _t(x)).numpy()
    step = lucid.polygamma(n, _t(x + 1)).numpy() - got
    np.testing.assert_allclose(step, (-1) ** n * math.factorial(n) / x ** (n + 1), rtol=1e-12)
    zeta = {1: math.pi**2 / 6, 2: -2 * 1.2020569031595942, 3: math.pi**4 / 15}
    np.testing.assert_allclose(lucid.polygamma(n, _t([1.0])).numpy(), [zeta[n]], rtol=1e-14)
    gradcheck(lambda t: lucid.polygamma(n, t), _t([0.7, 2.5, 11.0], True))
    np.testing.assert_allclose(lucid.polygamma(0, _t(x)).numpy(), lucid.digamma(_t(x)).numpy())
    with pytest.raises(ValueError, match="non-negative"):
        lucid.polygamma(-1, _t(x))


def test_i0_and_erfinv():
    z = np.concatenate([np.linspace(-30, 30, 61), [19.9, 20.1, 100.0]])
    np.testing.assert_allclose(lucid.i0(_t(z)).numpy(), np.i0(z), rtol=1e-14)
    gradcheck(lucid.i0, _t([-3.0, 0.5, 7.0], True))
    gradcheck(lambda t: lucid.i0(t) / 1e9, _t([25.0], True))  # the asymptotic branch
    y = np.linspace(-0.999, 0.999, 51)
    x = lucid.erfinv(_t(y)).numpy()
    np.testing.assert_allclose([math.erf(v) for v in x], y, atol=2e-16)
    np.testing.assert_allclose(lucid.erfinv(_t([0.5])).numpy(), [0.4769362762044699], rtol=1e-15)
    edges = lucid.erfinv(_t([1.0, -1.0, 1.5])).numpy()
    assert edges[0] == np.inf and edges[1] == -np.inf and np.isnan(edges[2])
    t = _t(y[10:-10], True)
    lucid.erfinv(t).sum().backward()
    want = math.sqrt(math.pi) / 2 * np.exp(lucid.erfinv(t.detach()).numpy() ** 2)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-10)
    fn = lucid.compile(lambda v: (lucid.i0(v * 30), lucid.erfinv(v * 0.9)), strict=True)
    v = _t(np.linspace(-1, 1, 9))
    for got, want in zip(fn(v), (lucid.i0(v * 30), lucid.erfinv(v * 0.9)), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def _ref_householder_qr(a):
    """LAPACK's documented geqrf: reflectors H_i = I - tau v v^T with v[i] = 1, beta =
    -sign(alpha) ||(alpha, x)||, tau = (beta - alpha) / beta, v = x / (alpha - beta)."""
    a = a.copy()
    m, n = a.shape
    taus = []
    for i in range(min(m, n)):
        alpha, x = a[i, i], a[i + 1 :, i].copy()
        if not np.any(x):
            taus.append(0.0)
            continue
        beta = -np.sign(alpha if alpha != 0 else 1.0) * np.hypot(alpha, np.linalg.norm(x))
        tau = (beta - alpha) / beta
        v = np.concatenate([[1.0], x / (alpha - beta)])
        a[i:, i:] -= tau * np.outer(v, v @ a[i:, i:])
        a[i + 1 :, i] = v[1:]
        taus.append(tau)
    return a, np.array(taus)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_geqrf_ormqr(shape):
    a = RNG.standard_normal(shape)
    packed, tau = lucid.geqrf(_t(a))
    want_packed, want_tau = _ref_householder_qr(a)
    np.testing.assert_allclose(packed.numpy(), want_packed, atol=1e-12)
    np.testing.assert_allclose(tau.numpy(), want_tau, atol=1e-12)
    q = lucid.ormqr(packed, tau, lucid.eye(shape[0], dtype=lucid.float64)).numpy()
    np.testing.assert_allclose(q @ np.triu(packed.numpy())[: shape[0]], a, atol=1e-12)
    np.testing.assert_allclose(q.T @ q, np.eye(shape[0]), atol=1e-12)
    c = RNG.standard_normal((shape[0], 2))
    for left, transpose, want in (
        (True, True, q.T @ c),
        (False, False, c.T @ q),
        (False, True, c.T @ q.T),
    ):
        other = c if left else c.T
        got = lucid.ormqr(packed, tau, _t(other), left=left, transpose=transpose)
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    gradcheck(
        lambda p, t, o: lucid.ormqr(p, t, o),
        _t(packed.numpy(), True),
        _t(tau.numpy(), True),
        _t(c, True),
    )
    if shape[0] >= shape[1]:
        np.testing.assert_allclose(lucid.orgqr(packed, tau).numpy(), q[:, : shape[1]], atol=1e-12)


def test_svd_and_pca_lowrank():
    a = RNG.standard_normal((8, 5))
    u, s, v = lucid.svd_lowrank(_t(a), q=3)
    want_u, want_s, want_vh = np.linalg.svd(a, full_matrices=False)
    np.testing.assert_allclose(s.numpy(), want_s[:3], rtol=1e-12)
    np.testing.assert_allclose(
        ((u * s) @ v.mT).numpy(), (want_u[:, :3] * want_s[:3]) @ want_vh[:3], atol=1e-12
    )
    m = RNG.standard_normal((8, 5))
    _, s_shift, _ = lucid.svd_lowrank(_t(a + m), q=2, M=_t(m))
    np.testing.assert_allclose(s_shift.numpy(), want_s[:2], rtol=1e-12)
    _, s_pca, v_pca = lucid.pca_lowrank(_t(a))
    centred = a - a.mean(0)
    np.testing.assert_allclose(s_pca.numpy(), np.linalg.svd(centred, compute_uv=False), rtol=1e-12)
    assert v_pca.shape == (5, 5)
    gradcheck(lambda t: lucid.svd_lowrank(t, q=2)[1], _t(a, True))


def test_igamma_igammac():
    xs = np.array([0.0, 0.01, 0.5, 1.0, 2.0, 3.5, 5.0, 10.0, 30.0, 80.0])
    for a in (1, 2, 5, 20):  # Q(n, x) = e^-x sum_{k < n} x^k / k!
        want_q = np.array(
            [math.exp(-x) * sum(x**k / math.factorial(k) for k in range(a)) for x in xs]
        )
        a_t = _t(np.full(xs.shape, float(a)))
        np.testing.assert_allclose(lucid.igammac(a_t, _t(xs)).numpy(), want_q, rtol=1e-13)
        np.testing.assert_allclose(lucid.igamma(a_t, _t(xs)).numpy(), 1 - want_q, atol=1e-14)
    half = lucid.igammac(_t(np.full(xs.shape, 0.5)), _t(xs)).numpy()
    np.testing.assert_allclose(half, [math.erfc(math.sqrt(x)) for x in xs], rtol=1e-13)
    assert np.isnan(lucid.igamma(_t([-1.0, 1.0]), _t([1.0, -1.0])).numpy()).all()
    a = _t([0.7, 2.5, 6.0, 3.0])
    x = _t([0.3, 4.0, 2.0, 9.0], True)
    lucid.igamma(a, x).sum().backward()
    av, xv = a.numpy(), x.detach().numpy()
    density = np.exp((av - 1) * np.log(xv) - xv - np.array([math.lgamma(v) for v in av]))
    np.testing.assert_allclose(x.grad.numpy(), density, rtol=1e-10)
    fn = lucid.compile(lambda p, q: (lucid.igamma(p, q), lucid.igammac(p, q)), strict=True)
    for got, want in zip(
        fn(a, x.detach()), (lucid.igamma(a, x.detach()), lucid.igammac(a, x.detach())), strict=True
    ):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
