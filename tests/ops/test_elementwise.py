"""Elementwise ops: values against numpy, gradients against finite differences, dtype promotion,
operators, in-place forms and PyTorch's gradient conventions at kinks."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import lucid
from lucid.testing import assert_close, gradcheck

RNG = np.random.default_rng(1234)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def rand(shape, lo=-2.0, hi=2.0, dtype=np.float64, seed=None):
    rng = np.random.default_rng(seed) if seed is not None else RNG
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def t64(arr, requires_grad=True):
    return lucid.tensor(np.asarray(arr, dtype=np.float64), requires_grad=requires_grad)


# (name, lucid function, numpy reference, input domain (lo, hi))
UNARY = [
    ("neg", lucid.neg, np.negative, (-3, 3)),
    ("abs", lucid.abs, np.abs, (-3, 3)),
    ("sign", lucid.sign, np.sign, (-3, 3)),
    ("exp", lucid.exp, np.exp, (-3, 3)),
    ("log", lucid.log, np.log, (0.1, 5)),
    ("log1p", lucid.log1p, np.log1p, (-0.9, 5)),
    ("expm1", lucid.expm1, np.expm1, (-3, 3)),
    ("sqrt", lucid.sqrt, np.sqrt, (0.1, 5)),
    ("rsqrt", lucid.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 5)),
    ("reciprocal", lucid.reciprocal, np.reciprocal, (0.2, 5)),
    ("square", lucid.square, np.square, (-3, 3)),
    ("sin", lucid.sin, np.sin, (-3, 3)),
    ("cos", lucid.cos, np.cos, (-3, 3)),
    ("tan", lucid.tan, np.tan, (-1.2, 1.2)),
    ("tanh", lucid.tanh, np.tanh, (-3, 3)),
    ("sigmoid", lucid.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    ("erf", lucid.erf, _erf, (-3, 3)),
    ("floor", lucid.floor, np.floor, (-3, 3)),
    ("ceil", lucid.ceil, np.ceil, (-3, 3)),
    ("trunc", lucid.trunc, np.trunc, (-3, 3)),
    ("round", lucid.round, np.round, (-3, 3)),
]
# Differentiable with a nonzero gradient away from kinks (rounding ops have zero gradients).
SMOOTH_UNARY = [u for u in UNARY if u[0] not in ("sign", "floor", "ceil", "trunc", "round")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_values_match_numpy(name, fn, ref, domain, dtype):
    x = rand((3, 4), *domain, dtype=dtype)
    out = fn(lucid.tensor(x))
    assert out.dtype == lucid._dtype.from_numpy(dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert_close(out, ref(x.astype(np.float64)).astype(dtype), rtol=tol * 10, atol=tol)


@settings(max_examples=8)
@given(shape=array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3))
@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_any_shape_including_empty_and_size_one(name, fn, ref, domain, shape):
    x = rand(shape, *domain, dtype=np.float32, seed=0)
    out = fn(lucid.tensor(x))
    assert out.shape == shape
    assert_close(out, ref(x.astype(np.float64)).astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,fn,ref,domain", SMOOTH_UNARY, ids=[u[0] for u in SMOOTH_UNARY])
def test_unary_gradients_match_finite_differences(name, fn, ref, domain):
    x = t64(rand((2, 3), *domain))
    gradcheck(fn, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_method_form_and_zero_dim(name, fn, ref, domain, dtype):
    x = rand((), *domain, dtype=dtype)
    out = getattr(lucid.tensor(x), name)()
    assert out.shape == () and out.dtype == lucid._dtype.from_numpy(dtype)
    np.testing.assert_allclose(out.item(), ref(np.float64(x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fn,ref",
    [
        (lucid.exp, np.exp),
        (lucid.sqrt, np.sqrt),
        (lucid.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
        (lucid.erf, _erf),
        (lucid.reciprocal, lambda x: 1 / x),
    ],
)
def test_float_math_on_integers_gives_float32(fn, ref):
    x = np.array([1, 2, 3, 4])
    out = fn(lucid.tensor(x))
    assert out.dtype == lucid.float32
    assert_close(out, ref(x.astype(np.float64)).astype(np.float32))


def test_float16_math_stays_float16():
    x = lucid.tensor([0.5, 1.0, 2.0], dtype=lucid.float16)
    for out in (x.exp(), x.sqrt(), x * 2.5, x + x, x.sigmoid(), x / 3):
        assert out.dtype == lucid.float16


def test_sigmoid_does_not_overflow_at_extremes():
    out = lucid.sigmoid(lucid.tensor([-1000.0, 1000.0]))
    np.testing.assert_array_equal(out.numpy(), [0.0, 1.0])


def test_erf_float32_is_accurate_near_zero_and_in_tails():
    x = np.concatenate([np.geomspace(1e-6, 6, 200), -np.geomspace(1e-6, 6, 200)])
    out = lucid.erf(lucid.tensor(x.astype(np.float32))).numpy().astype(np.float64)
    ref = _erf(x.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=5e-7, atol=1e-7)


# --- binary ops


# (name, lucid function, numpy reference, domain of y avoiding singularities)
BINARY = [
    ("add", lucid.add, np.add, (-2, 2)),
    ("sub", lucid.sub, np.subtract, (-2, 2)),
    ("mul", lucid.mul, np.multiply, (-2, 2)),
    ("div", lucid.div, np.true_divide, (0.5, 2)),
    ("maximum", lucid.maximum, np.maximum, (-2, 2)),
    ("minimum", lucid.minimum, np.minimum, (-2, 2)),
    ("pow", lucid.pow, np.power, (-2, 2)),
    ("remainder", lucid.remainder, np.remainder, (0.5, 2)),
    ("floor_divide", lucid.floor_divide, np.floor_divide, (0.5, 2)),
]


@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3))
@pytest.mark.parametrize("name,fn,ref,ydomain", BINARY, ids=[b[0] for b in BINARY])
def test_binary_values_broadcast_like_numpy(name, fn, ref, ydomain, shapes):
    (sx, sy), _ = shapes
    x = rand(sx, 0.5 if name == "pow" else -2, 2, dtype=np.float32, seed=1)
    y = rand(sy, *ydomain, dtype=np.float32, seed=2)
    out = fn(lucid.tensor(x), lucid.tensor(y))
    expected = ref(x, y)
    assert out.shape == expected.shape
    assert_close(out, expected.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [lucid.add, lucid.sub, lucid.mul, lucid.div, lucid.pow, lucid.remainder],
    ids=["add", "sub", "mul", "div", "pow", "remainder"],
)
def test_binary_gradients_with_broadcasting(fn):
    # x in (0.5, 2) keeps pow's log(x) defined; y in (0.6, 1.9) keeps remainder away from jumps.
    x = t64(rand((2, 3), 0.5, 2, seed=3))
    y = t64(rand((3,), 0.6, 1.9, seed=4))
    gradcheck(fn, x, y)


def test_remainder_gradient_away_from_jumps():
    x = t64([[0.3, 1.7, 2.5], [-0.4, -1.3, 3.1]])
    y = t64([0.7, 0.9, 1.1])
    gradcheck(lucid.remainder, x, y)


def test_maximum_minimum_gradients_without_ties():
    x, y = t64(rand((2, 3), seed=5)), t64(rand((2, 3), seed=6))
    gradcheck(lucid.maximum, x, y)
    gradcheck(lucid.minimum, x, y)


def test_scalar_operands_on_either_side():
    x = np.array([0.5, 1.5, 2.5], dtype=np.float32)
    t = lucid.tensor(x)
    cases = [
        (t + 2, x + 2),
        (2 + t, 2 + x),
        (t - 1.5, x - 1.5),
        (1.5 - t, 1.5 - x),
        (t * 3, x * 3),
        (3 * t, 3 * x),
        (t / 2, x / 2),
        (2 / t, 2 / x),
        (t**2, x**2),
        (2**t, 2**x),
        (t // 0.7, x // 0.7),
        (t % 0.7, x % 0.7),
        (-t, -x),
        (abs(-t), x),
    ]
    for out, ref in cases:
        assert out.dtype == lucid.float32
        assert_close(out, ref.astype(np.float32), rtol=1e-6)


def test_pow_with_tensor_exponent_and_scalar_base_gradients():
    x = t64([0.5, 1.2, 2.0])
    gradcheck(lambda e: 2.0**e, x)
    gradcheck(lambda b: b**3, x)
    exponent = t64([1.5, -0.5, 2.5], requires_grad=False)
    gradcheck(lambda b: b**exponent, x)


def test_pow_gradient_at_zero_base_is_finite():
    # PyTorch: d(x**y)/dy is 0 at x == 0 for y >= 0, and d/dx x**0 is 0 even at x == 0.
    x = t64([0.0, 0.0, 1.0])
    y = t64([2.0, 0.0, 3.0])
    (x**y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 3.0])


# --- dtype promotion


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda: lucid.tensor([1, 2]) / lucid.tensor([2, 4]), lucid.float32),
        (lambda: lucid.tensor([1, 2]) + 2.5, lucid.float32),
        (lambda: lucid.tensor([1, 2]) + 2, lucid.int64),
        (lambda: lucid.tensor([1, 2], dtype=lucid.int32) + 2, lucid.int32),
        (lambda: lucid.tensor([1.0], dtype=lucid.float16) + 1.0, lucid.float16),
        (lambda: lucid.tensor([1.0], dtype=lucid.float16) * lucid.tensor(2.0), lucid.float16),
        (lambda: lucid.tensor([1.0]) + lucid.tensor([1.0], dtype=lucid.float64), lucid.float64),
        (lambda: lucid.tensor([True]) + lucid.tensor([True]), lucid.bool_),
        (lambda: lucid.tensor([True]) + 1, lucid.int64),
        (
            lambda: lucid.tensor([1], dtype=lucid.uint8) + lucid.tensor([1], dtype=lucid.int8),
            lucid.int16,
        ),
        (lambda: lucid.tensor([1, 2]) // lucid.tensor([2, 2]), lucid.int64),
        (lambda: lucid.tensor([1, 2]) ** 2, lucid.int64),
        (lambda: 2 ** lucid.tensor([1, 2]), lucid.int64),
        (lambda: lucid.tensor([1, 2]) ** 0.5, lucid.float32),
        (lambda: lucid.tensor([1, 2]) < 1.5, lucid.bool_),
        (lambda: lucid.clamp(lucid.tensor([1, 5]), 0, 3), lucid.int64),
        (lambda: lucid.where(lucid.tensor([True, False]), 1, 0), lucid.int64),
        (
            lambda: lucid.where(lucid.tensor([True, False]), lucid.tensor([1, 2]), 0.5),
            lucid.float32,
        ),
    ],
)
def test_type_promotion_follows_pytorch(make, expected):
    assert make().dtype == expected


def test_bool_plus_bool_is_logical_or():
    a, b = lucid.tensor([True, True, False]), lucid.tensor([True, False, False])
    np.testing.assert_array_equal((a + b).numpy(), [True, True, False])


def test_integer_division_values():
    a = np.array([7, -7, 7, -7])
    b = np.array([2, 2, -2, -2])
    ta, tb = lucid.tensor(a), lucid.tensor(b)
    np.testing.assert_allclose((ta / tb).numpy(), a / b)
    np.testing.assert_array_equal((ta // tb).numpy(), np.floor_divide(a, b))
    np.testing.assert_array_equal((ta % tb).numpy(), np.remainder(a, b))
    np.testing.assert_array_equal(lucid.div(ta, tb, rounding_mode="trunc").numpy(), [3, -3, -3, 3])
    np.testing.assert_array_equal(lucid.div(ta, tb, rounding_mode="floor").numpy(), a // b)


def test_integer_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError, match="floor_divide"):
        lucid.tensor([1, 2]) // lucid.tensor([1, 0])


def test_float_division_by_zero_follows_ieee():
    out = lucid.tensor([1.0, -1.0, 0.0]) / 0.0
    assert np.isposinf(out.numpy()[0]) and np.isneginf(out.numpy()[1]) and np.isnan(out.numpy()[2])


def test_unknown_rounding_mode_raises():
    with pytest.raises(ValueError, match="rounding_mode"):
        lucid.div(lucid.tensor([1.0]), 2, rounding_mode="ceil")


def test_unknown_dtype_string_raises():
    with pytest.raises(TypeError, match="unknown dtype"):
        lucid.tensor([1.0]).type("float99")
    with pytest.raises(TypeError, match="unknown dtype"):
        lucid.zeros(2, dtype="floaty")


def test_mismatched_shapes_raise_naming_the_shapes():
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        lucid.tensor([1.0, 2.0]) + lucid.tensor([1.0, 2.0, 3.0])


# --- comparisons and logic


@pytest.mark.parametrize(
    "op,ref",
    [
        (lambda a, b: a == b, np.equal),
        (lambda a, b: a != b, np.not_equal),
        (lambda a, b: a < b, np.less),
        (lambda a, b: a <= b, np.less_equal),
        (lambda a, b: a > b, np.greater),
        (lambda a, b: a >= b, np.greater_equal),
        (lucid.eq, np.equal),
        (lucid.ne, np.not_equal),
        (lucid.lt, np.less),
        (lucid.le, np.less_equal),
        (lucid.gt, np.greater),
        (lucid.ge, np.greater_equal),
    ],
)
def test_comparisons_give_bool_without_gradient(op, ref):
    a = np.array([[1.0, 2.0, 3.0]])
    b = np.array([[2.0], [2.0], [1.0]])
    ta = lucid.tensor(a, requires_grad=True)
    out = op(ta, lucid.tensor(b))
    assert out.dtype == lucid.bool_
    assert not out.requires_grad and out.grad_fn is None
    np.testing.assert_array_equal(out.numpy(), ref(a, b))
    np.testing.assert_array_equal(op(ta, 2.0).numpy(), ref(a, 2.0))


def test_eq_with_non_tensor_falls_back_to_identity():
    t = lucid.tensor([1.0])
    assert (t == None) is False  # noqa: E711
    assert (t == "a") is False


def test_logical_ops_and_bool_operators():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    ta, tb = lucid.tensor(a), lucid.tensor(b)
    pairs = [
        (ta & tb, a & b),
        (ta | tb, a | b),
        (ta ^ tb, a ^ b),
        (~ta, ~a),
        (lucid.logical_and(ta, tb), a & b),
        (lucid.logical_or(ta, tb), a | b),
        (lucid.logical_xor(ta, tb), a ^ b),
        (lucid.logical_not(ta), ~a),
    ]
    for out, ref in pairs:
        assert out.dtype == lucid.bool_
        np.testing.assert_array_equal(out.numpy(), ref)


def test_logical_ops_treat_nonzero_as_true():
    out = lucid.logical_and(lucid.tensor([0.0, 2.0, -1.0]), lucid.tensor([1, 1, 0]))
    np.testing.assert_array_equal(out.numpy(), [False, True, False])


def test_bitwise_ops_on_floats_raise():
    with pytest.raises(TypeError, match="bitwise_and"):
        lucid.tensor([1.0]) & lucid.tensor([1.0])


def test_isfinite_isnan_isinf():
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0])
    t = lucid.tensor(x)
    np.testing.assert_array_equal(lucid.isfinite(t).numpy(), np.isfinite(x))
    np.testing.assert_array_equal(t.isnan().numpy(), np.isnan(x))
    np.testing.assert_array_equal(t.isinf().numpy(), np.isinf(x))


def test_nan_to_num_values_and_gradient():
    x = np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    out = lucid.nan_to_num(lucid.tensor(x), nan=0.5, posinf=9.0)
    np.testing.assert_array_equal(out.numpy(), [1.0, 0.5, 9.0, np.finfo(np.float32).min])
    t = t64([1.0, np.nan, 2.0])
    t.nan_to_num().sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [1.0, 0.0, 1.0])


# --- clamp, where, composites


def test_clamp_values_with_scalar_and_tensor_bounds():
    x = rand((4, 5), -3, 3, dtype=np.float32)
    t = lucid.tensor(x)
    assert_close(lucid.clamp(t, -1, 1), np.clip(x, -1, 1))
    assert_close(t.clamp(min=0.5), np.maximum(x, 0.5))
    assert_close(t.clip(max=0.5), np.minimum(x, 0.5))
    lo = rand((5,), -2, 0, dtype=np.float32)
    hi = rand((4, 1), 0, 2, dtype=np.float32)
    assert_close(
        lucid.clamp(t, lucid.tensor(lo), lucid.tensor(hi)), np.minimum(np.maximum(x, lo), hi)
    )


def test_clamp_with_min_above_max_gives_max_like_torch():
    out = lucid.clamp(lucid.tensor([-5.0, 0.0, 5.0]), min=2.0, max=1.0)
    np.testing.assert_array_equal(out.numpy(), [1.0, 1.0, 1.0])


def test_clamp_without_bounds_raises():
    with pytest.raises(ValueError, match="min.*max"):
        lucid.clamp(lucid.tensor([1.0]))


def test_clamp_gradient_passes_inside_inclusive_bounds():
    x = t64([-2.0, -1.0, 0.0, 1.0, 2.0])
    lucid.clamp(x, -1.0, 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 1.0, 1.0, 0.0])


def test_clamp_gradient_to_tensor_bounds():
    x = t64(rand((2, 3), -3, 3, seed=7))
    lo, hi = t64(rand((3,), -1.5, -0.5, seed=8)), t64(rand((2, 1), 0.5, 1.5, seed=9))
    gradcheck(lambda a, b, c: lucid.clamp(a, b, c), x, lo, hi)
    gradcheck(lambda a, b: lucid.clamp(a, min=b), x, lo)
    gradcheck(lambda a, c: lucid.clamp(a, max=c), x, hi)


def test_maximum_minimum_split_ties_evenly():
    x, y = t64([1.0, 2.0, 3.0]), t64([1.0, 1.0, 4.0])
    lucid.maximum(x, y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(y.grad.numpy(), [0.5, 0.0, 1.0])
    x.grad = y.grad = None
    lucid.minimum(x, y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.5, 0.0, 1.0])


def test_maximum_propagates_nan():
    out = lucid.maximum(lucid.tensor([np.nan, 1.0]), lucid.tensor([0.0, np.nan]))
    assert np.isnan(out.numpy()).all()


def test_abs_gradient_at_zero_is_zero_and_sqrt_at_zero_is_inf():
    x = t64([0.0, -2.0, 3.0])
    x.abs().sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, -1.0, 1.0])
    z = t64([0.0, 4.0])
    z.sqrt().sum().backward()
    assert np.isposinf(z.grad.numpy()[0]) and z.grad.numpy()[1] == pytest.approx(0.25)


@given(shapes=mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
def test_where_broadcasts_and_routes_gradient(shapes):
    (sc, sx, sy), out_shape = shapes
    cond = np.random.default_rng(0).random(sc) > 0.5
    x, y = t64(rand(sx, seed=10)), t64(rand(sy, seed=11))
    out = lucid.where(lucid.tensor(cond), x, y)
    expected = np.where(cond, x.detach().numpy(), y.detach().numpy())
    assert_close(out, expected)
    out.sum().backward()
    gx = np.broadcast_to(np.where(cond, 1.0, 0.0), out_shape)
    gy = 1.0 - gx
    lead_x, lead_y = len(out_shape) - len(sx), len(out_shape) - len(sy)

    def reduce(g, shape, lead):
        g = g.sum(axis=tuple(range(lead)))
        axes = tuple(i for i, d in enumerate(shape) if d == 1)
        return g.sum(axis=axes, keepdims=True).reshape(shape)

    np.testing.assert_allclose(x.grad.numpy(), reduce(gx, sx, lead_x))
    np.testing.assert_allclose(y.grad.numpy(), reduce(gy, sy, lead_y))


def test_where_needs_bool_condition():
    with pytest.raises(TypeError, match="condition must be a bool"):
        lucid.where(lucid.tensor([1.0, 0.0]), lucid.tensor([1.0, 2.0]), 0.0)


def test_where_method_form():
    x = lucid.tensor([1.0, -1.0])
    np.testing.assert_array_equal(x.where(x > 0, 0.0).numpy(), [1.0, 0.0])


def test_addcmul_addcdiv_lerp_values_and_gradients():
    x, a, b = (t64(rand((2, 3), 0.5, 2, seed=s)) for s in (12, 13, 14))
    xn, an, bn = (v.detach().numpy() for v in (x, a, b))
    assert_close(lucid.addcmul(x, a, b, value=0.5), xn + 0.5 * an * bn)
    assert_close(lucid.addcdiv(x, a, b, value=2), xn + 2 * an / bn)
    assert_close(lucid.lerp(x, a, 0.3), xn + 0.3 * (an - xn))
    assert_close(x.lerp(a, b), xn + bn * (an - xn))
    gradcheck(lambda p, q, r: lucid.addcmul(p, q, r, value=0.5), x, a, b)
    gradcheck(lambda p, q, r: lucid.addcdiv(p, q, r, value=2), x, a, b)
    gradcheck(lambda p, q, r: lucid.lerp(p, q, r), x, a, b)


def test_add_sub_alpha():
    x, y = lucid.tensor([1.0, 2.0]), lucid.tensor([10.0, 20.0])
    np.testing.assert_allclose(lucid.add(x, y, alpha=2).numpy(), [21.0, 42.0])
    np.testing.assert_allclose(x.sub(y, alpha=0.5).numpy(), [-4.0, -8.0])


# --- in place


@pytest.mark.parametrize(
    "method,args,ref",
    [
        ("add_", (2.0,), lambda x: x + 2),
        ("sub_", (2.0,), lambda x: x - 2),
        ("mul_", (3.0,), lambda x: x * 3),
        ("div_", (4.0,), lambda x: x / 4),
        ("pow_", (2,), lambda x: x**2),
        ("clamp_", (-0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5)),
        ("neg_", (), np.negative),
        ("exp_", (), np.exp),
        ("sqrt_", (), np.sqrt),
        ("zero_", (), np.zeros_like),
        ("fill_", (1.5,), lambda x: np.full_like(x, 1.5)),
    ],
)
def test_inplace_keeps_identity_and_bumps_version(method, args, ref):
    x0 = rand((2, 3), 0.1, 2, dtype=np.float32)
    t = lucid.tensor(x0)
    version = t._version_count
    out = getattr(t, method)(*args)
    assert out is t
    assert t._version_count == version + 1
    assert_close(t, ref(x0.astype(np.float64)).astype(np.float32), rtol=1e-6)


def test_inplace_operators():
    t = lucid.tensor([1.0, 2.0])
    ident = id(t)
    t += 1
    t *= 2
    t -= 1
    t /= 2
    assert id(t) == ident
    np.testing.assert_allclose(t.numpy(), [1.5, 2.5])


def test_inplace_on_non_leaf_rebases_autograd():
    x = t64([1.0, 2.0, 3.0])
    y = x * 2.0
    y.pow_(2).add_(1.0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 8 * x.detach().numpy())


def test_inplace_on_leaf_requiring_grad_raises():
    x = t64([1.0])
    with pytest.raises(RuntimeError, match="leaf"):
        x.add_(1.0)


def test_inplace_float_result_into_int_tensor_raises():
    t = lucid.tensor([1, 2])
    with pytest.raises(RuntimeError, match="can't be cast"):
        t.div_(2)


def test_fill_with_zero_dim_tensor_routes_gradient_to_value():
    v = lucid.tensor(2.0, dtype=lucid.float64, requires_grad=True)
    x = t64([1.0, 2.0, 3.0])
    y = x * 1.0
    y.fill_(v)
    (y * t64([1.0, 2.0, 3.0], requires_grad=False)).sum().backward()
    assert v.grad.item() == pytest.approx(6.0)
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(y.numpy() if not y.requires_grad else y.detach().numpy(), 2.0)


def test_fill_rejects_non_scalar_tensor():
    with pytest.raises(RuntimeError, match="0-d"):
        lucid.zeros(3).fill_(lucid.tensor([1.0, 2.0]))


def test_zero_on_non_leaf_cuts_the_old_history():
    x = t64([1.0, 2.0])
    y = x * 3.0
    y.zero_()
    (y + x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_copy_broadcasts_casts_and_keeps_identity():
    t = lucid.zeros(2, 3, dtype=lucid.int32)
    ident = id(t)
    t.copy_(lucid.tensor([1.7, 2.2, -3.9]))
    assert id(t) == ident and t.dtype == lucid.int32
    np.testing.assert_array_equal(t.numpy(), [[1, 2, -3], [1, 2, -3]])


def test_copy_gradient_flows_to_source():
    src = t64([[1.0, 2.0, 3.0]])
    dst = lucid.zeros(2, 3, dtype=lucid.float64)
    dst.copy_(src)
    (dst * t64(np.arange(6.0).reshape(2, 3), requires_grad=False)).sum().backward()
    np.testing.assert_allclose(src.grad.numpy(), [[3.0, 5.0, 7.0]])


def test_copy_rejects_unbroadcastable_source():
    with pytest.raises((RuntimeError, ValueError), match="copy_"):
        lucid.zeros(2, 3).copy_(lucid.zeros(4))


def test_saved_tensor_modified_in_place_is_detected():
    x = t64([1.0, 2.0])
    y = x * 1.0
    z = y.sin()  # sin saves its input
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place"):
        z.sum().backward()


@given(st.sampled_from([lucid.float16, lucid.float32, lucid.float64, lucid.int32, lucid.int64]))
def test_abs_neg_keep_dtype(dtype):
    t = lucid.tensor([-1, 2, -3], dtype=dtype)
    assert t.abs().dtype == dtype and (-t).dtype == dtype
    np.testing.assert_array_equal(t.abs().numpy(), [1, 2, 3])


def test_clone_copies_storage_and_passes_gradient():
    x = t64([1.0, 2.0])
    y = x.clone()
    assert y.dtype == x.dtype and y._data is not x._data
    (y * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    ints = lucid.tensor([1, 2])
    copy = lucid.clone(ints)
    copy.add_(1)
    np.testing.assert_array_equal(ints.numpy(), [1, 2])


def test_isclose_matches_numpy():
    a = np.array([1.0, 1.0, np.inf, np.nan, 0.0, -np.inf], dtype=np.float64)
    b = np.array([1.0 + 1e-9, 1.1, np.inf, np.nan, 1e-9, np.inf], dtype=np.float64)
    ta, tb = lucid.tensor(a), lucid.tensor(b)
    np.testing.assert_array_equal(lucid.isclose(ta, tb).numpy(), np.isclose(a, b))
    np.testing.assert_array_equal(
        ta.isclose(tb, rtol=0.2, equal_nan=True).numpy(), np.isclose(a, b, rtol=0.2, equal_nan=True)
    )


def test_type_as():
    assert lucid.tensor([1.5]).type_as(lucid.tensor([1])).dtype == lucid.int64


INT_BINARY = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("floor_divide", lambda a, b: a // b, np.floor_divide),
    ("remainder", lambda a, b: a % b, np.remainder),
    ("maximum", lucid.maximum, np.maximum),
    ("minimum", lucid.minimum, np.minimum),
    ("pow", lambda a, b: a ** lucid.abs(b), lambda a, b: a ** np.abs(b)),
]


@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
    dtype=st.sampled_from([np.int8, np.int16, np.int32, np.int64]),
)
@pytest.mark.parametrize("name,fn,ref", INT_BINARY, ids=[b[0] for b in INT_BINARY])
def test_integer_binary_values_and_dtype(name, fn, ref, shapes, dtype):
    (sx, sy), _ = shapes
    rng = np.random.default_rng(21)
    x = rng.integers(-5, 6, size=sx).astype(dtype)
    y = rng.integers(1, 4, size=sy).astype(dtype) * rng.choice([-1, 1], size=sy).astype(dtype)
    out = fn(lucid.tensor(x), lucid.tensor(y))
    expected = ref(x, y)
    assert out.dtype == lucid._dtype.from_numpy(dtype)
    np.testing.assert_array_equal(out.numpy(), expected)
