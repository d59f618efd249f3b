"""Elementwise prim ops: native kernels against the numpy reference over generated shapes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.program import COMPUTE_DTYPES
from lucid.backends.cpu.testing import check, random_array
from lucid.ir import prim as prim_ops

# The dtypes the native kernels compute in (half precision is storage only: casts).
NATIVE_DTYPES = COMPUTE_DTYPES

POSITIVE_DOMAIN = {"log", "sqrt", "rsqrt", "log1p", "reciprocal"}
FEW = settings(max_examples=8)


def _dtypes(allowed):
    return st.sampled_from(sorted(set(allowed) & set(NATIVE_DTYPES)))


@pytest.mark.parametrize("name", sorted(prim_ops.UNARY))
@FEW
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5), data=st.data())
def test_unary_matches_reference(name, shape, data):
    allowed = prim_ops.UNARY[name][0]
    dtype = data.draw(_dtypes(allowed))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = random_array(rng, shape, dtype, positive=name in POSITIVE_DOMAIN)
    check(name, [x])


@pytest.mark.parametrize("name", sorted(prim_ops.BINARY))
@FEW
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4), data=st.data()
)
def test_binary_broadcasting_matches_reference(name, shapes, data):
    dtype = data.draw(_dtypes(prim_ops.BINARY[name][0]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a, b = (random_array(rng, s, dtype, positive=name == "pow") for s in shapes.input_shapes)
    check(name, [a, b], scale=10.0 if name == "pow" else 1.0)


def test_integer_division_by_zero_gives_zero_and_floors():
    a = np.array([7, -7, 7, -7, 5, np.iinfo(np.int32).min], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1], np.int32)
    q = check("floor_divide", [a, b])
    np.testing.assert_array_equal(q[:4], [3, -4, -4, 3])
    assert q[4] == 0
    r = check("remainder", [a, b])
    np.testing.assert_array_equal(r[:5], [1, 1, -1, -1, 0])


def test_float_remainder_follows_the_divisor_sign():
    a = np.array([5.5, -5.5, 5.5, -5.5], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0], np.float32)
    np.testing.assert_allclose(check("remainder", [a, b]), [1.5, 0.5, -0.5, -1.5])


def test_nan_propagates_through_maximum_and_minimum():
    a = np.array([np.nan, 1.0, 2.0], np.float32)
    b = np.array([0.0, np.nan, 1.0], np.float32)
    assert np.isnan(check("maximum", [a, b])[:2]).all()
    assert np.isnan(check("minimum", [a, b])[:2]).all()


@FEW
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4),
    dtype=_dtypes(prim_ops.ANY),
    seed=st.integers(0, 2**32 - 1),
)
def test_select_broadcasts_all_three_operands(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    c = random_array(rng, shapes.input_shapes[0], "bool")
    a = random_array(rng, shapes.input_shapes[1], dtype)
    b = random_array(rng, shapes.input_shapes[2], dtype)
    check("select", [c, a, b])


@settings(max_examples=25)
@given(
    src=_dtypes(prim_ops.ANY),
    dst=_dtypes(prim_ops.ANY),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_cast_between_every_dtype_pair(src, dst, shape, seed):
    x = random_array(np.random.default_rng(seed), shape, src)
    check("cast", [x], {"dtype": dst})


def test_cast_float_to_int_saturates_and_maps_nan_to_zero():
    x = np.array([np.nan, 1e20, -1e20, -2.7, 2.7], np.float32)
    out = check("cast", [x], {"dtype": "i32"})
    np.testing.assert_array_equal(out, [0, 2**31 - 1, -(2**31), -2, 2])


def _documented_float_to_int(value: float, bits: int) -> int:
    """docs/prim.md: truncate toward zero, NaN gives 0, out-of-range values saturate."""
    if math.isnan(value):
        return 0
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if math.isinf(value):
        return hi if value > 0 else lo
    return min(max(math.trunc(value), lo), hi)


@pytest.mark.parametrize("src", ["f32", "f64"])
@pytest.mark.parametrize("dst", sorted(d for d in prim_ops.ANY if d.startswith("i")))
def test_cast_float_to_int_follows_the_documented_rule_at_the_edges(src, dst):
    bits = int(dst[1:])
    edges = [np.inf, -np.inf, np.nan, 1e30, -1e30, 2.0**63, -(2.0**63), 2.0**62, -(2.0**62)]
    edges += [2.0 ** (bits - 1), -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1e9, -0.9, 0.9]
    x = np.array(edges, {"f32": np.float32, "f64": np.float64}[src])
    out = check("cast", [x], {"dtype": dst})  # native kernel == reference
    expected = [_documented_float_to_int(float(v), bits) for v in x]
    assert [int(v) for v in out] == expected


@FEW
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=5),
    dtype=_dtypes(prim_ops.FLOAT),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_normalize_matches_the_batch_norm_formula(shape, dtype, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    stat_shape = tuple(d if i == axis else 1 for i, d in enumerate(shape))
    x = random_array(rng, shape, dtype)
    mean = random_array(rng, stat_shape, dtype)
    var = random_array(rng, stat_shape, dtype, positive=True)
    gamma, beta = random_array(rng, stat_shape, dtype), random_array(rng, stat_shape, dtype)
    out = check("normalize", [x, mean, var, gamma, beta], {"epsilon": 1e-3})
    expect = (x - mean) / np.sqrt(var + 1e-3) * gamma + beta
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-5)


def test_non_contiguous_broadcast_patterns():
    rng = np.random.default_rng(0)
    # size-1 dims in the middle and at both ends exercise the dimension collapsing.
    for sa, sb in [((3, 1, 5), (1, 4, 1)), ((1, 4, 1, 6), (2, 1, 3, 1)), ((7,), ()), ((), (2, 3))]:
        check("add", [random_array(rng, sa, "f32"), random_array(rng, sb, "f32")])


def test_large_input_spans_many_blocks_with_broadcast():
    rng = np.random.default_rng(1)
    a = random_array(rng, (37, 1000), "f32")
    b = random_array(rng, (1000,), "f32")
    c = random_array(rng, (37, 1), "f32")
    check("mul", [a, b])
    check("sub", [c, b])


@pytest.mark.parametrize("name", ["erf", "exp", "sigmoid", "sqrt", "rsqrt", "reciprocal"])
def test_float32_fast_paths_stay_within_a_few_ulp_of_double(name):
    # Dense grid through the interesting range, plus tiny, huge, signed zeros, inf and NaN.
    grid = np.linspace(-9.0, 9.0, 40001)
    special = [0.0, -0.0, 1e-30, -1e-30, 1e-3, 50.0, -50.0, 100.0, np.inf, -np.inf, np.nan]
    x = np.concatenate([grid, special]).astype(np.float32)
    if name in ("sqrt", "rsqrt"):
        x = np.abs(x)
    p = Program()
    p.result(p.op(name, p.feed(x.shape)))
    (got,) = CPUBackend(cache=False).compile(p).run([x])
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = {
            "erf": np.vectorize(math.erf, otypes=[float])(xd),
            "exp": np.exp(xd),
            "sigmoid": 1 / (1 + np.exp(-xd)),
            "sqrt": np.sqrt(xd),
            "rsqrt": 1 / np.sqrt(xd),
            "reciprocal": 1 / xd,
        }[name]
    finite = np.isfinite(ref) & (np.abs(ref) < 3e38) & (np.abs(ref) > 1e-37)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    err = np.abs(got[finite].astype(np.float64) - ref[finite])
    ulp = np.spacing(np.abs(ref[finite]).astype(np.float32)).astype(np.float64)
    assert (err / ulp).max() <= 8, name
    edge = ~finite & ~np.isnan(ref)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got[edge], ref[edge].astype(np.float32), atol=1e-37)
