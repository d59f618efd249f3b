"""What would break on the first run on a Mac (issue 24), caught on Linux through the recorded
program and the reference builder, which models Apple where Apple's documentation or PyTorch's
MPS backend contradicts a guess. Each test names its item; the Mac half of each item is in
test_macos_native.py."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid._tensor import Tensor
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.backends.mpsgraph.program import ProgramError, RecordingBuilder
from lucid.ir import import_trace
from lucid.ir import prim as P
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace
from tests.backends.mpsgraph.test_emit import emit_and_run

BACKEND = MPSGraphReferenceBackend()


def lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("canonicalize,cse,dce,lower-to-prim,prim-simplify").run(module)
    return module


def compiled_and_interpreted(fn, *arrays):
    """(the program, the executable's results, the prim interpreter's results)."""
    want = interpret_prim(lowered(fn, *arrays), list(arrays))
    exe = BACKEND.compile(lowered(fn, *arrays))
    return exe.program, exe.run(list(arrays)), want


# --- 1. duplicate targets -----------------------------------------------------------------------
def test_1_a_tensor_returned_twice_is_one_target():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def dup(x):
        y = x * 2.0
        return y, y

    program, got, want = compiled_and_interpreted(dup, x)
    assert len(program["targets"]) == len(set(program["targets"])) == 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[0] is not None and got[1].shape == (2, 3)


def test_1_a_checked_index_that_is_also_a_result_is_one_target():
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    idx = np.array([4, 0, 2], np.int64)

    def lookup(t, i):
        j = i + 0  # a computed index: the checked values are a call's result, not a feed
        return t[j], j

    program, got, want = compiled_and_interpreted(lookup, table, idx)
    assert len(program["targets"]) == len(set(program["targets"]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_1_the_program_format_refuses_a_target_named_twice():
    b = RecordingBuilder()
    x = b.placeholder((2,), "f32", "input:0")
    (y,) = b.call("absoluteWithTensor:name:", [{"tensor": x}, {"nil": True}])
    with pytest.raises(ProgramError, match="name a tensor twice"):
        b.program([y, y], [])


# --- 9b. Float32 floor_divide and remainder equal eager's divmod ------------------------------


def _float_division(name: str, a, b) -> None:
    """The emission run by the reference equals eager Lucid bit for bit (signed zeros too; any
    NaN for a NaN)."""
    from lucid.backends.mpsgraph.reference import run_program

    a, b = np.array(a, np.float32), np.array(b, np.float32)
    with np.errstate(all="ignore"):
        (got,) = run_program(_division_program(name, "f32", len(a)), [a, b])
        want = P.evaluate(name, [a, b], {})[0]
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    bad = (np.isnan(got) != nan) | (~nan & (got.view(np.uint32) != want.view(np.uint32)))
    wrong = zip(a[bad][:5], b[bad][:5], got[bad][:5], want[bad][:5], strict=True)
    assert not bad.any(), list(wrong)


_FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 3.0, 1e-45, 1.1754944e-38, 3.4028235e38,
                -3.4028235e38, float("inf"), float("-inf"), float("nan")]  # fmt: skip


@pytest.mark.parametrize("name", ["floor_divide", "remainder"])
def test_9b_float_division_is_eager_divmod_at_the_edges(name):
    # 1.0 // 0.1 == 9 and 1.0 % 0.1 == 0.0999... (floor(1.0 / 0.1) is 10), b's sign on the
    # remainder, signed zeros, zero divisors, infinities, NaN, subnormals, the largest values.
    a, b = np.meshgrid(np.float32(_FLOAT_EDGES), np.float32(_FLOAT_EDGES))
    _float_division(name, a.ravel(), b.ravel())
    tenths = np.float32(np.arange(-40, 41)) * np.float32(0.1)
    for divisor in (0.1, -0.1, 0.3, -0.7):
        _float_division(name, tenths, np.full_like(tenths, divisor))
    # The widest ratios (the largest values over subnormals of every width) take all 12 rounds
    # of 23 bits, the first with a ratio up to 2**24.
    rng = np.random.default_rng(9)
    tiny = rng.integers(1, 2**23, 256, dtype=np.uint32).view(np.float32)
    huge = np.float32([3.4028235e38, -3.4028235e38, 2.0**127, 1.7e38, -2.5e38])
    a, b = np.meshgrid(huge, np.concatenate([tiny, -tiny]))
    _float_division(name, a.ravel(), b.ravel())
    assert len(_division_program(name, "f32", 4)["calls"]) <= 445  # 474 with 13 rounds of 22


_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
_f32_bits = st.integers(0, 2**32 - 1).map(lambda v: float(np.uint32(v).view(np.float32)))
_tenths = st.integers(-1000, 1000).map(lambda k: float(np.float32(k) * np.float32(0.1)))
_float_operand = st.one_of(_f32, _f32_bits, _tenths, st.sampled_from(_FLOAT_EDGES))


@pytest.mark.parametrize("name", ["floor_divide", "remainder"])
@settings(deadline=None)  # the profile's examples: a few by default, more in .ci/run
@given(data=st.data())
def test_9b_float_division_is_eager_divmod_everywhere(name, data):
    pairs = data.draw(st.lists(st.tuples(_float_operand, _float_operand), min_size=_N,
                               max_size=_N))  # fmt: skip
    a, b = zip(*pairs, strict=True)
    _float_division(name, a, b)


# --- 10. rank-0 shapes --------------------------------------------------------------------------
def _shape_args(program):
    for p in program["placeholders"]:
        yield p["shape"]
    for c in program["calls"]:
        for a in c["args"]:
            if "shape" in a and c["selector"].startswith(("constant", "reshape", "broadcast")):
                yield a["shape"]
            if "constant" in a:
                yield a["constant"]["shape"]


def test_10_rank0_feeds_results_and_constants_are_shape_1_in_the_program():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array(1.5, np.float32)

    def loss(x, s):
        return (x * x).sum() * s, s * 2.0

    program, got, want = compiled_and_interpreted(loss, x, s)
    assert all(len(shape) > 0 for shape in _shape_args(program)), "an @[] shape was emitted"
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape == ()
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_10_a_rank0_index_and_a_rank0_one_hot_keep_their_prim_shapes():
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    i = np.array(3, np.int64)

    def pick(t, i):
        return t[i], lucid.nn.functional.one_hot(i, 5)

    program, got, want = compiled_and_interpreted(pick, table, i)
    assert all(len(shape) > 0 for shape in _shape_args(program))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


# --- 11. unused placeholders --------------------------------------------------------------------
def test_11_a_passed_through_feed_gets_no_placeholder():
    x, z = np.float32([1, 2, 3]), np.float32([4, 5, 6])

    def passthrough(x, z):
        return x, z + 1.0

    program, got, want = compiled_and_interpreted(passthrough, x, z)
    assert [p["role"] for p in program["placeholders"]] == ["input:1"]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert not np.shares_memory(got[0], x), "a returned feed is a copy, as a result would be"


def test_11_a_program_of_feeds_only_compiles_nothing():
    x = np.float32([1, 2])
    exe = BACKEND.compile(lowered(lambda x: x, x))
    assert exe.program["targets"] == [] and exe.program["placeholders"] == []
    (got,) = exe.run([x])
    np.testing.assert_array_equal(got, x)


# --- 2. argmax/argmin with NaN ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, row, want",
    [
        ("argmax", [1.0, np.nan, 3.0], 1),
        ("argmin", [2.0, np.nan, 0.0], 1),
        ("argmax", [np.nan, np.nan], 0),
        ("argmax", [5.0, np.inf, np.nan, np.nan], 2),
        ("argmin", [-np.inf, 1.0], 0),
        ("argmax", [1.0, 7.0, 7.0], 1),
    ],
)  # fmt: skip
def test_2_the_first_nan_wins_although_mpsgraph_skips_nan(name, row, want):
    x = np.array(row, np.float32)
    (got,), _, _ = emit_and_run(name, [x], {"axis": 0})
    assert got == want == P.evaluate(name, [x], {"axis": 0})[0]
    # Along an axis of a 2-D tensor, keeping it.
    grid = np.stack([x, x[::-1]], axis=1)
    (got,), _, _ = emit_and_run(name, [grid], {"axis": 0, "keepdims": True})
    np.testing.assert_array_equal(got, P.evaluate(name, [grid], {"axis": 0, "keepdims": True})[0])


# --- 3. argsort: Int64 keys, ties and NaN -------------------------------------------------------
_I64 = np.iinfo(np.int64)
ARGSORT_ROWS = {
    "int64_reversed_300": np.arange(300, dtype=np.int64)[::-1].copy(),
    "int64_extremes": np.array(
        [_I64.max, -1, 0, _I64.min, 2**32, 2**32 - 1, -(2**32), 2**31, -(2**31) - 1, 5, -1, 0],
        np.int64,
    ),
    "int64_low_bits_only": np.array([2**40 + 3, 2**40 + 1, 2**40 + 2, 2**40 + 1], np.int64),
    "int32_ties": np.array([1, 1, 0, 1, 0, 2, 1], np.int32),
    "float_nan_inf_ties": np.array(
        [np.nan, 1.0, 0.0, np.inf, -0.0, np.nan, -np.inf, 1.0, np.inf], np.float32
    ),
    "bool": np.array([True, False, True, False, False]),
}


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("row", ARGSORT_ROWS, ids=list(ARGSORT_ROWS))
def test_3_argsort_is_exact_and_stable_without_int64_or_nan_in_argsort(row, descending):
    x = ARGSORT_ROWS[row]
    attrs = {"axis": 0, "descending": descending}
    (got,), _, prog = emit_and_run("argsort", [x], attrs)
    np.testing.assert_array_equal(got, P.evaluate("argsort", [x], attrs)[0])
    grid = np.stack([x, x[::-1], x], axis=0)  # along the last axis of a 2-D tensor too
    attrs = {"axis": -1, "descending": descending}
    (got,), _, _ = emit_and_run("argsort", [grid], attrs)
    np.testing.assert_array_equal(got, P.evaluate("argsort", [grid], attrs)[0])


def test_3_the_reference_refuses_what_argsort_does_not_document():
    from lucid.backends.mpsgraph.reference import UndefinedBehavior, run_program

    b = RecordingBuilder()
    x = b.placeholder((3,), "i64", "input:0")
    sel = "argSortWithTensor:axis:descending:name:"
    (y,) = b.call(sel, [{"tensor": x}, {"int": 0}, {"bool": False}, {"nil": True}])
    with pytest.raises(UndefinedBehavior, match="int64"):
        run_program(b.program([y], []), [np.array([3, 1, 2], np.int64)])


def test_3_rows_too_long_for_int32_ranks_are_refused_with_a_reason():
    from lucid.backends.mpsgraph.emit import ARGSORT_MAX_ROW, EmitError

    x = np.zeros(ARGSORT_MAX_ROW + 1, np.float32)
    with pytest.raises(EmitError, match="rows of at most"):
        emit_and_run("argsort", [x], {"axis": 0})


# --- 4. integer matmul --------------------------------------------------------------------------
def test_4_integer_matmul_is_refused_so_the_call_falls_back():
    from lucid.backends.mpsgraph.legalize import legalize_refusal

    a = np.ones((2, 3), np.int32)
    reason = legalize_refusal(lowered(lambda a, b: a @ b, a, a.T.copy()))
    assert reason is not None and "prim.matmul on i32" in reason
    f = np.ones((2, 3), np.float32)
    assert legalize_refusal(lowered(lambda a, b: a @ b, f, f.T.copy())) is None
    cm = lucid.compile(lambda a, b: a @ b, backend="mpsgraph-reference")
    got = cm(lucid.tensor(a), lucid.tensor(a.T.copy())).numpy()
    np.testing.assert_array_equal(got, np.full((2, 2), 3))
    assert "matmul on i32" in " ".join(str(v) for v in cm.cache_info().values())


def test_4_wide_matmul_is_refused_before_macos_14_4():
    from lucid.backends.mpsgraph.legalize import legalize_refusal

    module = lowered(
        lambda a, b: a @ b, np.ones((2, 1), np.float32), np.ones((1, 32769), np.float32)
    )
    assert "above 32768 on macOS 14.3" in legalize_refusal(module, (14, 3))
    assert legalize_refusal(module, (14, 4)) is None and legalize_refusal(module) is None


# --- 8. integer sign and relu -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("name", ["sign", "relu"])
def test_8_integer_sign_and_relu_avoid_the_integer_kernels(name, dtype):
    info = np.iinfo(dtype)
    x = np.array([-3, 0, 5, info.min, info.max, -1, 1], dtype)
    (got,), _, prog = emit_and_run(name, [x], {})
    np.testing.assert_array_equal(got, P.evaluate(name, [x], {})[0])
    used = {c["selector"] for c in prog["calls"]}
    assert not used & {"signWithTensor:name:", "reLUWithTensor:name:"}, used


# --- 7. the Philox stream in 32-bit halves ------------------------------------------------------
@pytest.mark.parametrize(
    "state",
    [[-1, 2**63 - 1], [0, 0], [-(2**63), -1], [0x0123456789ABCDEF, 2**32 - 1]],
    ids=["all_ones_key", "zeros", "extremes", "mixed"],
)
@pytest.mark.parametrize("name", ["random_uniform", "random_normal"])
def test_7_philox_never_wraps_and_equals_eagers_stream_bit_for_bit(name, state):
    from lucid.backends.mpsgraph.emit import Val, emit_op
    from lucid.backends.mpsgraph.reference import ReferenceBuilder, run_program

    attrs = {"shape": [4096]} if name == "random_uniform" else {"shape": [33]}
    b = ReferenceBuilder()
    key = Val(b.placeholder((2,), "i64", "input:0"), (2,), "i64")
    (out,), _ = emit_op(b, name, [key], attrs)
    prog = b.program([out.id], [])
    state = np.array(state, np.int64)
    # exact_integers: any Int32/Int64 addition, subtraction or multiplication that wraps raises.
    (got,) = run_program(prog, [state], exact_integers=True)
    want = P.evaluate(name, [state], attrs)[0]
    if name == "random_uniform":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The program size: 20 multiply-highs of byte x limb products (the products half a limb up
    # summed before they are split, no mask on the top limb), the ten round keys in one addition
    # (1,050 calls when each product was split on its own and each key bumped separately).
    assert len(prog["calls"]) <= (880 if name == "random_uniform" else 900), len(prog["calls"])


# --- 9. exact integer floor_divide and remainder ------------------------------------------------
_INT = {"i32": np.int32, "i64": np.int64}
_N = 64  # operand pairs per hypothesis example


@functools.cache
def _division_program(name: str, dtype: str, n: int) -> dict:
    from lucid.backends.mpsgraph.emit import Val, emit_op
    from lucid.backends.mpsgraph.reference import ReferenceBuilder

    b = ReferenceBuilder()
    a_, b_ = (Val(b.placeholder((n,), dtype, f"input:{i}"), (n,), dtype) for i in (0, 1))
    (out,), _ = emit_op(b, name, [a_, b_], {})
    return b.program([out.id], [])


def _exact_division(name: str, dtype: str, a, b) -> None:
    """The emission run by the reference (Float32 integer division, as PyTorch's MPS backend;
    any Int32/Int64 addition, subtraction or multiplication that wraps raises) equals eager
    Lucid bit for bit."""
    from lucid.backends.mpsgraph.reference import run_program

    a, b = np.array(a, _INT[dtype]), np.array(b, _INT[dtype])
    (got,) = run_program(_division_program(name, dtype, len(a)), [a, b], exact_integers=True)
    want = P.evaluate(name, [a, b], {})[0]
    assert got.dtype == want.dtype
    bad = got != want
    wrong = zip(a[bad][:5], b[bad][:5], got[bad][:5], want[bad][:5], strict=True)
    assert not bad.any(), list(wrong)


def _edges(dtype: str) -> list[int]:
    info = np.iinfo(_INT[dtype])
    bits = info.bits - 1
    around = [2**k + d for k in (bits - 1, bits - 2, 24, 23, 1) for d in (-1, 0, 1)]
    near_max = [info.max - 2 ** (bits - 24), info.max - 2 ** (bits - 25) + 1]  # f32 rounding
    small = [0, 1, 2, 3, 7, 2**16 + 1]
    positive = [info.max, info.max - 1, *near_max, *around, *small]
    return [info.min, info.min + 1, *positive, *(-v for v in positive if v)]


@pytest.mark.parametrize("dtype", ["i32", "i64"])
@pytest.mark.parametrize("name", ["floor_divide", "remainder"])
def test_9_integer_division_is_exact_at_every_edge(name, dtype):
    # Every pair of edge values: INT_MIN // -1 (wraps to INT_MIN, remainder 0, as eager),
    # INT_MIN // 1, x // INT_MIN, divisors near the type's maximum, both signs, zero divisors
    # (0, as eager gives).
    edges = _edges(dtype)
    a, b = np.meshgrid(np.array(edges, object), np.array(edges, object))
    _exact_division(name, dtype, a.ravel(), b.ravel())


def _operand(dtype: str) -> st.SearchStrategy[int]:
    info = np.iinfo(_INT[dtype])
    bits = info.bits - 1
    magnitude = st.integers(0, bits).flatmap(lambda k: st.integers(-(2**k), 2**k - 1))
    return st.one_of(
        st.integers(int(info.min), int(info.max)), magnitude, st.sampled_from(_edges(dtype))
    )


@pytest.mark.parametrize("dtype", ["i32", "i64"])
@pytest.mark.parametrize("name", ["floor_divide", "remainder"])
@settings(deadline=None)  # the profile's examples: a few by default, more in .ci/run
@given(data=st.data())
def test_9_integer_division_is_exact_over_the_whole_range(name, dtype, data):
    pairs = data.draw(st.lists(st.tuples(_operand(dtype), _operand(dtype)), min_size=_N,
                               max_size=_N))  # fmt: skip
    a, b = zip(*pairs, strict=True)
    _exact_division(name, dtype, a, b)


def test_9_integer_division_divides_only_float32_and_stays_small(monkeypatch):
    # Apple's integer division is undocumented (PyTorch goes through Float32): every division
    # the emission makes divides Float32 tensors. The op count stays bounded.
    from lucid.backends.mpsgraph import reference

    selector = "divisionWithPrimaryTensor:secondaryTensor:name:"
    divided: list[str] = []
    division = reference._IMPL[selector]

    def recording(a, b, name):
        divided.append(str(a.dtype))
        return division(a, b, name)

    monkeypatch.setitem(reference._IMPL, selector, recording)
    for dtype, budget in (("i32", 55), ("i64", 70)):
        prog = _division_program("floor_divide", dtype, 4)
        assert len(prog["calls"]) <= budget, len(prog["calls"])
        a = np.array([7, -7, 7, -7], _INT[dtype])
        b = np.array([2, 2, -2, -2], _INT[dtype])
        np.testing.assert_array_equal(reference.run_program(prog, [a, b])[0], [3, -4, -4, 3])
    assert divided and set(divided) == {"float32"}, divided


def test_10_the_program_format_refuses_rank0_and_empty_placeholders():
    for shape in ((), (0, 3)):
        b = RecordingBuilder()
        b.placeholder(shape, "f32", "input:0")
        with pytest.raises(ProgramError, match="rank 0|bad shape"):
            b.program([0], [])
