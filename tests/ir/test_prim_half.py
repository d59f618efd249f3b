"""Half precision in the prim table: ``cast`` to and from f16/bf16 bit for bit as numpy (float16)
and ml_dtypes (bfloat16) round, over every half bit pattern and generated float32/float64/int
patterns; half arithmetic as eager's (storage in half, float32 compute); the dialect's types."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid.ir import parse_ir, print_ir
from lucid.ir import prim as P
from lucid.ir.prim.dialect import aval_of_type, make_prim_context, prim_type
from lucid.ir.prim.interpreter import interpret_prim

NUMPY_HALF = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
ALL_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return P.evaluate("cast", [x], {"dtype": dtype})[0]


def reference(x: np.ndarray, dtype: str) -> np.ndarray:
    """What numpy / ml_dtypes give for ``x.astype``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return x.astype(P.NUMPY_DTYPES[dtype])


def assert_same_bits(got: np.ndarray, want: np.ndarray, source: np.ndarray) -> None:
    assert got.dtype == want.dtype
    g, w = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, [(source.flat[i], hex(g.flat[i]), hex(w.flat[i])) for i in bad[:5]]


@pytest.mark.parametrize("src", ["f16", "bf16"])
@pytest.mark.parametrize("dst", ["f16", "bf16", "f32", "f64"])
def test_every_half_pattern_casts_to_floats_as_numpy(src, dst):
    x = ALL_BITS.view(NUMPY_HALF[src])
    assert_same_bits(cast(x, dst), reference(x, dst), x)


@pytest.mark.parametrize("src", ["f16", "bf16"])
@pytest.mark.parametrize("dst", ["i32", "i64", "bool"])
def test_every_half_pattern_casts_to_int_and_bool_as_its_float32_value(src, dst):
    # prim's float -> int rule (truncate, NaN gives 0, saturate) on the exact float32 value.
    x = ALL_BITS.view(NUMPY_HALF[src])
    got = cast(x, dst)
    np.testing.assert_array_equal(got, cast(x.astype(np.float32), dst))
    if dst == "bool":
        np.testing.assert_array_equal(got, x.astype(np.float32) != 0)
    else:
        info = np.iinfo(P.NUMPY_DTYPES[dst])
        wide = reference(x, "f64")
        assert (got[np.isnan(wide)] == 0).all()
        assert (got[wide == np.inf] == info.max).all() and (got[wide == -np.inf] == info.min).all()
        finite = np.isfinite(wide) & (np.abs(wide) < 2.0**31)
        np.testing.assert_array_equal(got[finite], np.trunc(wide[finite]))


def _halfway_points(dtype: str) -> np.ndarray:
    """Every float32 that lies exactly halfway between two neighbouring finite half values, and
    its two float32 neighbours (the ties to even and the nearest non-ties)."""
    values = reference(ALL_BITS.view(NUMPY_HALF[dtype]), "f64")
    values = np.unique(values[np.isfinite(values)])
    middle = ((values[:-1] + values[1:]) / 2).astype(np.float32)  # exact: one more bit
    # Halfway between the largest finite value and the next binade: the overflow ties.
    beyond = np.float32(2.0**128 - 2.0**119) if dtype == "bf16" else np.float32(65520.0)
    middle = np.concatenate([middle, [beyond, -beyond]])
    return np.concatenate([middle, np.nextafter(middle, np.inf), np.nextafter(middle, -np.inf)])


@pytest.mark.parametrize("dst", ["f16", "bf16"])
def test_ties_round_to_even_and_neighbours_to_nearest(dst):
    x = _halfway_points(dst)
    assert_same_bits(cast(x, dst), reference(x, dst), x)
    assert_same_bits(cast(x.astype(np.float64), dst), reference(x.astype(np.float64), dst), x)


@settings(max_examples=30, deadline=None)
@given(bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=256))
def test_float32_patterns_round_to_half_as_numpy(bits):
    x = np.array(bits, np.uint32).view(np.float32)
    for dst in ("f16", "bf16"):
        assert_same_bits(cast(x, dst), reference(x, dst), x)


@settings(max_examples=30, deadline=None)
@given(
    bits=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=256),
    scale=st.integers(-40, 20),
)
def test_float64_patterns_round_to_half_directly_as_numpy(bits, scale):
    # Raw patterns are mostly far outside half's range: scaled copies land inside it, where a
    # rounding through float32 first would differ from the single rounding numpy does.
    raw = np.array(bits, np.uint64).view(np.float64)
    with np.errstate(all="ignore"):
        near = np.ldexp(np.frexp(raw)[0], scale)
    for x in (raw, near):
        for dst in ("f16", "bf16"):
            assert_same_bits(cast(x, dst), reference(x, dst), x)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=64),
    dtype=st.sampled_from(["i32", "i64"]),
)
def test_integers_round_to_half_from_their_exact_value(values, dtype):
    x = np.array(values, np.int64)
    if dtype == "i32":
        x = x.astype(np.int32)  # wraps: any 32-bit pattern
    x = np.concatenate([x, np.array([0, 1, -1, 65504, 65519, 65520, 2**24 + 1], x.dtype)])
    for dst in ("f16", "bf16"):
        assert_same_bits(cast(x, dst), reference(x, dst), x)


def test_bool_casts_to_half_zero_and_one():
    x = np.array([True, False])
    for dst in ("f16", "bf16"):
        np.testing.assert_array_equal(cast(x, dst).astype(np.float32), [1.0, 0.0])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_half_arithmetic_is_float32_arithmetic_rounded_once(dtype, name):
    # numpy's float16 and ml_dtypes' bfloat16 compute +-*/ in float32 and round the result, which
    # is then the correctly rounded half result: prim gives the same bits.
    rng = np.random.default_rng(hash((dtype, name)) % 2**32)
    a, b = (rng.choice(ALL_BITS, 20000).view(NUMPY_HALF[dtype]) for _ in range(2))
    ufunc = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[name]
    with np.errstate(all="ignore"):
        want = ufunc(a, b)
    got = P.evaluate(name, [a, b], {})[0]
    assert got.dtype == NUMPY_HALF[dtype]
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    assert_same_bits(got[~nan], want[~nan], a[~nan])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_reductions_accumulate_wider_than_half(dtype):
    # 4096 ones: a half accumulator stalls at 2048 (float16) or 256 (bfloat16).
    ones = np.ones(4096, NUMPY_HALF[dtype])
    (total,) = P.evaluate("reduce_sum", [ones], {"axes": (0,)})
    assert total.dtype == NUMPY_HALF[dtype] and float(total) == 4096.0
    (mean,) = P.evaluate("reduce_mean", [ones], {"axes": (0,)})
    assert float(mean) == 1.0
    (soft,) = P.evaluate("softmax", [np.zeros((1, 4096), NUMPY_HALF[dtype])], {"axis": 1})
    assert soft.dtype == NUMPY_HALF[dtype]
    np.testing.assert_allclose(soft.astype(np.float32), 1 / 4096, rtol=1e-2)


def test_half_sum_matches_eager_float16():
    x = np.random.default_rng(3).standard_normal((64, 33)).astype(np.float16)
    (got,) = P.evaluate("reduce_sum", [x], {"axes": (1,)})
    want = lucid.sum(lucid.tensor(x), dim=1).numpy()
    assert got.dtype == want.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3)


def test_random_draws_in_half_are_the_float32_draws_rounded():
    state = np.array([7, 9], np.int64)
    attrs = {"shape": (257,), "low": -1.0, "high": 2.0}
    (half,) = P.evaluate("random_uniform", [state], {**attrs, "dtype": "f16"})
    (single,) = P.evaluate("random_uniform", [state], {**attrs, "dtype": "f32"})
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), single, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_constants_round_once_from_their_float64_value(dtype):
    value = 1.0 + 2.0**-11 + 2.0**-40  # just above a float16 tie: through float32 it ties down
    (got,) = P.evaluate("constant", [], {"shape": (2,), "dtype": dtype, "value": (value, 3.0)})
    np.testing.assert_array_equal(got, reference(np.array([value, 3.0]), dtype))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_types_in_the_prim_dialect(dtype):
    t = prim_type((2, 3), dtype)
    assert str(t) == f"tensor<2x3x{dtype}>"
    assert aval_of_type(t) == P.Aval((2, 3), dtype)
    text = f"""builtin.module {{
  func.func @forward(%0 : tensor<3x{dtype}>) -> tensor<3xf32> {{
    %1 = prim.exp %0 : (tensor<3x{dtype}>) -> tensor<3x{dtype}>
    %2 = prim.cast %1 {{dtype = f32}} : (tensor<3x{dtype}>) -> tensor<3xf32>
    func.return %2 : tensor<3xf32>
  }}
}}"""
    module = parse_ir(text, ctx=make_prim_context())
    module.verify()
    assert parse_ir(print_ir(module), ctx=make_prim_context()).is_structurally_equivalent(module)
    x = np.array([0.5, -1.0, 3.0], NUMPY_HALF[dtype])
    (got,) = interpret_prim(module, [x])
    want = reference(np.exp(x.astype(np.float32)), dtype).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_a_float_op_refuses_mixed_half_operands():
    a = np.ones(2, np.float16)
    b = np.ones(2, ml_dtypes.bfloat16)
    with pytest.raises(P.PrimError, match="share one dtype"):
        P.evaluate("add", [a, b], {})
