"""Half-precision storage in the native runtime: every cast to and from f16/bf16 bit for bit
against the prim table's rounding (``lucid.ir.prim.to_half``), numpy's float16 and ml_dtypes'
bfloat16, over all 65,536 half bit patterns and the float32/float64/integer values that round."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.testing import check, random_array
from lucid.ir.prim import NUMPY_DTYPES, PrimError, dtype_of, to_half

HALVES = ("f16", "bf16")
LIBRARY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def native_cast(array: np.ndarray, dtype: str) -> np.ndarray:
    program = Program()
    program.result(program.op("cast", program.feed(array.shape, dtype_of(array)), dtype=dtype))
    return CPUBackend(cache=False).compile(program).run([array])[0]


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(f"u{array.itemsize}")


def all_halves(dtype: str) -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(NUMPY_DTYPES[dtype])


def float32_probes(dtype: str) -> np.ndarray:
    """Every half value widened, the float32 values halfway between neighbours and one float32
    step either side of them (the ties and near-ties rounding decides), then random bits."""
    wide = all_halves(dtype).astype(np.float32).view(np.uint32)
    step = np.uint32(1 << (13 if dtype == "f16" else 16))
    half_step = step >> np.uint32(1)
    near = np.concatenate([wide + half_step + d for d in (np.uint32(0), np.uint32(1))])
    near = np.concatenate([near, wide + half_step - np.uint32(1), wide - np.uint32(1)])
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 1 << 32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([wide, near, noise]).view(np.float32)


@pytest.mark.parametrize("dtype", HALVES)
def test_widening_every_half_pattern_is_exact(dtype):
    halves = all_halves(dtype)
    got = native_cast(halves, "f32")
    with np.errstate(invalid="ignore"):
        want = halves.astype(np.float32)
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("dtype", HALVES)
def test_rounding_float32_matches_prim_and_library_bit_for_bit(dtype):
    values = float32_probes(dtype)
    got = native_cast(values, dtype)
    np.testing.assert_array_equal(bits(got), bits(to_half(values, dtype)))
    with np.errstate(invalid="ignore", over="ignore"):
        library = values.astype(LIBRARY[dtype])
    np.testing.assert_array_equal(bits(got), bits(library))


@pytest.mark.parametrize("dtype", HALVES)
def test_rounding_float64_rounds_once(dtype):
    # Values just off a half tie rounded to float32 first would land on the tie (double rounding).
    with np.errstate(invalid="ignore"):
        wide = np.unique(all_halves(dtype).astype(np.float64))
    wide = wide[np.isfinite(wide)]
    mid = (wide[:-1] + wide[1:]) / 2  # exact in float64: the ties
    probes = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 1 << 63, size=1 << 15, dtype=np.int64).view(np.float64)
    nans = np.array([np.nan, -np.nan, np.float64("inf"), -np.inf, 0.0, -0.0, 1e300, -1e-300])
    probes = np.concatenate([probes, noise, -noise, nans])
    got = native_cast(probes, dtype)
    np.testing.assert_array_equal(bits(got), bits(to_half(probes, dtype)))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("source", ["i32", "i64", "bool"])
def test_rounding_integers_matches_prim(dtype, source):
    rng = np.random.default_rng(2)
    if source == "bool":
        values = np.array([True, False])
    else:
        info = np.iinfo(NUMPY_DTYPES[source])
        edges = [info.min, info.max, 0, -1, 2049, 65519, 65520, 257, 2**53 + 1, 2**60 + 2**52]
        edges = [e for e in edges if info.min <= e <= info.max]
        values = np.concatenate(
            [np.array(edges), rng.integers(info.min, info.max, 4096, dtype=np.int64)]
        ).astype(NUMPY_DTYPES[source])
    got = native_cast(values, dtype)
    np.testing.assert_array_equal(bits(got), bits(to_half(values, dtype)))


@pytest.mark.parametrize(("source", "target"), [("f16", "bf16"), ("bf16", "f16")])
def test_between_half_formats_matches_prim(source, target):
    halves = all_halves(source)
    got = native_cast(halves, target)
    np.testing.assert_array_equal(bits(got), bits(to_half(halves, target)))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("target", ["f64", "i32", "i64", "bool", "f16", "bf16"])
def test_half_to_other_dtypes_matches_reference(dtype, target):
    halves = all_halves(dtype)
    finite = halves[np.isfinite(halves.astype(np.float32))]
    arrays = finite if target in ("i32", "i64") else halves
    program = Program()
    program.result(program.op("cast", program.feed(arrays.shape, dtype), dtype=target))
    got = CPUBackend(cache=False).compile(program).run([arrays])[0]
    (want,) = program.interpret([arrays])
    np.testing.assert_array_equal(bits(got), bits(want))


@settings(max_examples=15, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    dtype=st.sampled_from(HALVES),
    seed=st.integers(0, 2**32 - 1),
)
def test_half_roundtrip_through_float32_ops_over_shapes(shape, dtype, seed):
    """A half feed widened, computed in float32 and rounded back (lowering's pattern, fused by
    the backend), bit for bit as the reference interpreter."""
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    program = Program()
    fa, fb = program.feed(shape, dtype), program.feed(shape, dtype)
    wa, wb = program.op("cast", fa, dtype="f32"), program.op("cast", fb, dtype="f32")
    out = program.op("cast", program.op("mul", program.op("add", wa, wb), wa), dtype=dtype)
    program.result(out, program.op("cast", out, dtype="f32"))
    got = CPUBackend(cache=False).compile(program).run([a, b])
    want = program.interpret([a, b])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(bits(g), bits(w))


@pytest.mark.parametrize("dtype", HALVES)
def test_half_constant_is_rounded_once(dtype):
    value = 1 + 2.0**-11 + 2.0**-30  # just above an f16 tie
    program = Program()
    program.result(program.op("constant", value=(value, -value), shape=(2,), dtype=dtype))
    (got,) = CPUBackend(cache=False).compile(program).run([])
    (want,) = program.interpret([])
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(got), bits(to_half(np.array([value, -value]), dtype)))


@pytest.mark.parametrize("dtype", HALVES)
def test_ops_other_than_cast_refuse_half_operands(dtype):
    program = Program()
    a = program.feed((3,), dtype)
    with pytest.raises(PrimError, match=f"add does not take {dtype} operands"):
        program.op("add", a, a)
    desc = {
        "slots": [((3,), dtype), ((3,), dtype)],
        "instrs": [("neg", [0], [1], {})],
        "feeds": [0],
        "results": [1],
        "inplace": {},
    }
    with pytest.raises(ValueError, match=f"does not take {dtype}"):
        _native.compile(desc, False)


@pytest.mark.parametrize("dtype", HALVES)
def test_half_feed_of_the_wrong_dtype_is_a_type_error(dtype):
    program = Program()
    program.result(program.op("cast", program.feed((2,), dtype), dtype="f32"))
    executable = CPUBackend(cache=False).compile(program)
    with pytest.raises(TypeError, match="dtype"):
        executable.run([np.zeros(2, np.float32)])


def test_random_array_gives_half_arrays():
    rng = np.random.default_rng(3)
    for dtype in HALVES:
        assert random_array(rng, (4,), dtype).dtype == NUMPY_DTYPES[dtype]
    with pytest.raises(ValueError, match="unknown dtype"):
        random_array(rng, (4,), "f8")
    check("cast", [random_array(rng, (5,), "f16")], {"dtype": "f32"})
