"""Half precision (float16, bfloat16) in the MPSGraph backend: the data types, the reference
builder's model of Apple's half arithmetic, and what the emitter records for half programs.

The reference computes every call on half tensors in Float32 and rounds once (per op for
elementwise calls; after a Float32 accumulation for matmul, convolution and pooling), and refuses
the calls that accumulate long sums on halves, which the emitter widens to Float32 itself.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid.backends.mpsgraph import program as A
from lucid.backends.mpsgraph.emit import exact_scalar
from lucid.backends.mpsgraph.reference import (
    WIDENED_SELECTORS,
    ReferenceBuilder,
    UndefinedBehavior,
    run_program,
)
from lucid.backends.mpsgraph.selectors import (
    HALF_DTYPES,
    MACOS_FLOOR,
    MPS_DTYPES,
    SELECTORS,
    dtype_introduced,
    macos_key,
)

NUMPY = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
HALVES = sorted(HALF_DTYPES)
BIN = "WithPrimaryTensor:secondaryTensor:name:"


def test_half_types_are_mps_data_types_and_bfloat16_dates_from_macos_14():
    assert MPS_DTYPES["f16"] == ("MPSDataTypeFloat16", 0x10000010)
    assert MPS_DTYPES["bf16"] == ("MPSDataTypeBFloat16", 0x90000010)
    assert dtype_introduced("bf16") == "14.0" and dtype_introduced("f16") == "11.0"
    assert all(macos_key(dtype_introduced(d)) <= macos_key(MACOS_FLOOR) for d in MPS_DTYPES)
    for d in HALVES:
        assert A.numpy_dtype(MPS_DTYPES[d][0]) == NUMPY[d]


@pytest.mark.parametrize("dt", HALVES)
def test_half_constants_round_trip_bit_for_bit(dt):
    values = np.array([1.5, -0.0, np.inf, -65504.0, 2.0**-24, np.nan], NUMPY[dt]).reshape(2, 3)
    back = A.decode_constant(A.constant(values, dt))
    assert back.dtype == NUMPY[dt] and back.shape == (2, 3)
    np.testing.assert_array_equal(back.view(np.uint16), values.view(np.uint16))


def _run(dt, build, *feeds):
    b = ReferenceBuilder()
    ids = [b.placeholder(f.shape, dt, f"input:{i}") for i, f in enumerate(feeds)]
    out = build(b, *ids)
    return run_program(b.program([out], []), list(feeds))[0]


def _halves(dt, n):
    return st.lists(
        st.floats(-300.0, 300.0, allow_nan=False, width=32), min_size=n, max_size=n
    ).map(lambda v: np.array(v, np.float32).astype(NUMPY[dt]))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), dt=st.sampled_from(HALVES))
def test_half_elementwise_calls_round_once_per_call(data, dt):
    a, b, c = (data.draw(_halves(dt, 6)) for _ in range(3))

    def fma_chain(bld, x, y, z):
        (p,) = bld.call(f"multiplication{BIN}", [A.tensor(x), A.tensor(y), A.NIL])
        (s,) = bld.call(f"addition{BIN}", [A.tensor(p), A.tensor(z), A.NIL])
        return s

    got = _run(dt, fma_chain, a, b, c)
    f32 = np.float32
    product = (a.astype(f32) * b.astype(f32)).astype(NUMPY[dt])  # exact in Float32, one rounding
    want = (product.astype(f32) + c.astype(f32)).astype(NUMPY[dt])
    assert got.dtype == NUMPY[dt]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    if dt == "f16":  # numpy's float16 arithmetic rounds each operation the same way
        np.testing.assert_array_equal(got, a * b + c)


@pytest.mark.parametrize("dt", HALVES)
def test_half_matmul_accumulates_in_float32_and_rounds_once(dt):
    # 2048 + 1 + 1 + ... : a half accumulator would stay at 2048 (its spacing there is 2).
    a = np.array([[2048.0] + [1.0] * 15], np.float32).astype(NUMPY[dt])
    b = np.ones((16, 1), NUMPY[dt])

    def matmul(bld, x, y):
        return bld.call(f"matrixMultiplication{BIN}", [A.tensor(x), A.tensor(y), A.NIL])[0]

    got = _run(dt, matmul, a, b)
    assert got.dtype == NUMPY[dt]
    assert float(got[0, 0]) == float(np.float32(2063.0).astype(NUMPY[dt]))


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize(
    "selector, extra",
    [("reductionSumWithTensor:axes:name:", [A.ints([0])]),
     ("meanOfTensor:axes:name:", [A.ints([0])]),
     ("softMaxWithTensor:axis:name:", [A.integer(0)]),
     ("cumulativeSumWithTensor:axis:exclusive:reverse:name:",
      [A.integer(0), A.boolean(False), A.boolean(False)])],
)  # fmt: skip
def test_accumulating_calls_on_halves_are_refused(dt, selector, extra):
    assert selector in WIDENED_SELECTORS and selector in SELECTORS
    x = np.ones(4, NUMPY[dt])
    with pytest.raises(UndefinedBehavior, match="accumulation type"):
        _run(dt, lambda b, v: b.call(selector, [A.tensor(v), *extra, A.NIL])[0], x)

    # The same call on the Float32 widening is fine: what the emitter records.
    def widened(b, v):
        (w,) = b.call("castTensor:toType:name:", [A.tensor(v), A.dtype("f32"), A.NIL])
        (r,) = b.call(selector, [A.tensor(w), *extra, A.NIL])
        return b.call("castTensor:toType:name:", [A.tensor(r), A.dtype(dt), A.NIL])[0]

    assert _run(dt, widened, x).dtype == NUMPY[dt]


@pytest.mark.parametrize("dt", HALVES)
def test_half_scalars_are_written_exactly(dt):
    def scalar(value):
        return lambda b, v: b.call(
            f"addition{BIN}",
            [A.tensor(v), A.tensor(b.call("constantWithScalar:shape:dataType:",
                                          [A.double(value), A.shape([1]), A.dtype(dt)])[0]),
             A.NIL],
        )[0]  # fmt: skip

    x = np.zeros(3, NUMPY[dt])
    with pytest.raises(UndefinedBehavior, match="not exactly"):
        _run(dt, scalar(0.1), x)
    rounded = exact_scalar(0.1, dt)
    assert rounded == float(np.float64(0.1).astype(NUMPY[dt])) != 0.1
    np.testing.assert_array_equal(_run(dt, scalar(rounded), x), np.full(3, rounded, NUMPY[dt]))
    assert exact_scalar(0.1, "f32") == 0.1


@pytest.mark.parametrize("src, dst", [("f32", "f16"), ("f32", "bf16"), ("f16", "bf16"),
                                      ("bf16", "f16"), ("f16", "f32")])  # fmt: skip
def test_casts_between_float_types_round_to_nearest_even(src, dst):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 65520.0, 65519.99, 1e-8, 3e38])
    with np.errstate(all="ignore"):  # overflow to inf and NaN casts are the point
        x = np.concatenate([bits, specials]).astype(NUMPY.get(src, np.float32))
        want = x.astype(np.float32).astype(NUMPY.get(dst, np.float32))
    got = _run(src, lambda b, v: b.call("castTensor:toType:name:",
                                        [A.tensor(v), A.dtype(dst), A.NIL])[0], x)  # fmt: skip
    assert got.dtype == want.dtype
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].astype(np.float32), want[~nan].astype(np.float32))


def test_integers_reach_half_types_through_float32():
    # 2**24 + 2**16 + 1 rounds to 2**24 + 2**16 in Float32, a BFloat16 tie that goes to 2**24;
    # rounded once it would be 2**24 + 2**17. The reference models the GPU's conversion through
    # float (Apple documents no direct one); the device test prints what a Mac does.
    x = np.array([2**24 + 2**16 + 1, -(2**24 + 2**16 + 1), 7], np.int32)
    got = _run("i32", lambda b, v: b.call("castTensor:toType:name:",
                                          [A.tensor(v), A.dtype("bf16"), A.NIL])[0], x)  # fmt: skip
    assert got.dtype == NUMPY["bf16"]
    np.testing.assert_array_equal(got.astype(np.float64), [2.0**24, -(2.0**24), 7.0])
