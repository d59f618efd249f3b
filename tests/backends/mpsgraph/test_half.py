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


# --- every prim op in half precision: the recording and the reference against prim (eager) ------
from lucid.ir import prim as P  # noqa: E402
from tests.backends.mpsgraph.test_emit import CASES, emit_and_run  # noqa: E402

# The ops whose half emission casts to Float32 and back (docs/backend-mpsgraph.md, "Half
# precision"): accumulations, and what is exact only through Float32.
WIDENED_OPS = {
    "reduce_sum", "reduce_mean", "reduce_prod", "variance", "softmax", "log_softmax", "cumsum",
    "normalize", "scatter_add", "scatter_add_along_axis", "floor_divide", "remainder", "argsort",
    "cast", "random_uniform", "random_normal",
}  # fmt: skip
# Units in the last place of the half result allowed between the reference and prim: both round
# once from Float32 for most ops; the composites (expm1, log1p) and the accumulations (whose sum
# order differs) take a few more.
ULPS = 4


def _to_half(a: np.ndarray, dt: str) -> np.ndarray:
    return P.to_half(a, dt) if a.dtype == np.float32 else a


def half_cases(dt: str) -> list[tuple[str, list, dict]]:
    """test_emit's cases with every float32 operand and ``dtype`` attribute in ``dt``."""
    out = []
    for name, arrays, attrs in CASES:
        halved = [_to_half(a, dt) for a in arrays]
        new_attrs = {k: dt if k == "dtype" and v == "f32" else v for k, v in attrs.items()}
        if name in ("random_uniform", "random_normal"):
            new_attrs["dtype"] = dt
        if any(h is not a for h, a in zip(halved, arrays, strict=True)) or new_attrs != attrs:
            out.append((name, halved, new_attrs))
    return out


def record(name, arrays, attrs):
    """The outputs of the prim op's emission run by the reference, and its program."""
    got, _, prog = emit_and_run(name, arrays, attrs)
    return got, prog


def casts(prog: dict) -> int:
    return sum(c["selector"] == "castTensor:toType:name:" for c in prog["calls"])


def assert_within_half_precision(got, want, dt, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    if got.dtype != NUMPY[dt]:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=what)
    finite = np.isfinite(w)
    np.testing.assert_array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)])
    eps = float(ml_dtypes.finfo(NUMPY[dt]).eps)
    scale = np.max(np.abs(w[finite]), initial=1.0)
    bound = ULPS * eps * (np.abs(w[finite]) + scale * eps + float(ml_dtypes.finfo(NUMPY[dt]).tiny))
    assert np.all(np.abs(g[finite] - w[finite]) <= bound * 8 ** (w.ndim > 0)), what


CASES_HALF = [(dt, *c) for dt in HALVES for c in half_cases(dt)]


@pytest.mark.parametrize(
    "dt, name, arrays, attrs", CASES_HALF, ids=[f"{c[0]}-{c[1]}" for c in CASES_HALF]
)
def test_every_prim_op_in_half_matches_prim_within_the_format(dt, name, arrays, attrs):
    got, prog = record(name, arrays, attrs)
    want = P.evaluate(name, arrays, attrs)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_within_half_precision(g, w, dt, f"{dt} {name} output {k}")
    # The recorded types: half placeholders are the half MPSDataType.
    for p, a in zip(prog["placeholders"], arrays, strict=True):
        assert p["dtype"] == MPS_DTYPES[P.dtype_of(a)][0]
    # Casts only where intended: the half recording adds none to the float32 one, except for
    # the ops that widen (those must: the reference refuses a half accumulation).
    f32_arrays = [a.astype(np.float32) if a.dtype == NUMPY[dt] else a for a in arrays]
    f32_attrs = {k: "f32" if v == dt else v for k, v in attrs.items()}
    _, f32_prog = record(name, f32_arrays, f32_attrs)
    extra = casts(prog) - casts(f32_prog)
    assert extra == 0 or name in WIDENED_OPS, (name, extra)


# --- whole programs: legalize, emit and run, against the prim interpreter and eager -------------
import lucid  # noqa: E402
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend  # noqa: E402
from lucid.backends.mpsgraph.legalize import MPSGraphUnsupported, legalize_refusal  # noqa: E402


def _needs_eager(dt: str) -> None:
    """Skip unless eager Lucid holds arrays of ``dt`` (bfloat16 arrives with ml_dtypes)."""
    try:
        lucid.tensor(np.zeros(2, NUMPY[dt])) + 1
    except (TypeError, KeyError) as e:
        pytest.skip(f"eager Lucid has no {dt} tensors here: {e}")


def _half_matmul_module(dt: str):
    """A prim module as lower-to-prim writes ``(a @ b).sum()`` on half values: float32 between
    casts."""
    from lucid.ir import _xdsl as xd
    from lucid.ir.prim.dialect import create_prim, prim_type

    block = xd.Block(arg_types=[prim_type((2, 3), dt), prim_type((3, 2), dt)])
    ops = [create_prim("cast", [v], {"dtype": "f32"}) for v in block.args]
    ops.append(create_prim("matmul", [ops[0].results[0], ops[1].results[0]], {}))
    ops.append(create_prim("cast", [ops[-1].results[0]], {"dtype": dt}))
    ops.append(create_prim("cast", [ops[-1].results[0]], {"dtype": "f32"}))
    ops.append(create_prim("reduce_sum", [ops[-1].results[0]], {"axes": [0, 1]}))
    ops.append(create_prim("cast", [ops[-1].results[0]], {"dtype": dt}))
    for op in ops:
        block.add_op(op)
    out = ops[-1].results[0]
    block.add_op(xd.func.ReturnOp(out))
    types = [a.type for a in block.args]
    return xd.ModuleOp([xd.func.FuncOp("forward", (types, [out.type]), xd.Region(block))])


@pytest.mark.parametrize("dt", HALVES)
def test_bfloat16_is_refused_before_macos_14_with_the_version_and_half_matmul_is_native(dt):
    module = _half_matmul_module(dt)
    module.verify()
    assert legalize_refusal(module) is None and legalize_refusal(module, (14, 0)) is None
    old = legalize_refusal(module, (13, 6))
    if dt == "bf16":
        assert "MPSDataTypeBFloat16 needs macOS 14.0" in old and "macOS 13.6" in old
        with pytest.raises(MPSGraphUnsupported, match="BFloat16 needs macOS 14.0"):
            MPSGraphBackendAt((13, 6)).compile(module)
    else:
        assert old is None
    a, b = (np.arange(6, dtype=np.float32).reshape(s).astype(NUMPY[dt]) for s in ((2, 3), (3, 2)))
    executable = MPSGraphReferenceBackend().compile(module)
    (got,) = executable.run([a, b])
    assert got.dtype == NUMPY[dt] and float(got) == float((a.astype(np.float32) @ b).sum())
    program = executable.program
    selectors = [c["selector"] for c in program["calls"]]
    # The matmul reads the half placeholders directly (the casts around it are narrowed away);
    # only the sum is widened, one cast in and one out.
    matmul = selectors.index("matrixMultiplicationWithPrimaryTensor:secondaryTensor:name:")
    assert "castTensor:toType:name:" not in selectors[:matmul]
    assert selectors.count("castTensor:toType:name:") == 2, selectors
    assert {p["dtype"] for p in program["placeholders"]} == {MPS_DTYPES[dt][0]}


def test_a_legalized_module_is_not_rewritten_again_but_still_checked_for_the_running_macos():
    from lucid.backends.mpsgraph.legalize import STAGE, legalize
    from lucid.ir import visits

    module = _half_matmul_module("bf16")
    with visits.counting() as first:
        legalize(module)  # the mpsgraph-legalize pass: no release known
    text = str(module)
    with visits.counting() as again:
        legalize(module)
    assert first[STAGE] > 0 and again[STAGE] == 0 and str(module) == text
    with pytest.raises(MPSGraphUnsupported, match="BFloat16 needs macOS 14.0"):
        legalize(module, (13, 6))  # the backend's compile on an older Mac
    executable = MPSGraphBackendAt((14, 0)).compile(module)
    assert str(module) == text and executable.program["calls"]


class MPSGraphBackendAt(MPSGraphReferenceBackend):
    """The reference backend legalizing for a given macOS (what the native one does on a Mac)."""

    def __init__(self, macos):
        self.macos = macos

    def _macos(self):
        return self.macos


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_a_half_model_compiles_for_mpsgraph_and_matches_eager(dt):
    _needs_eager("f16" if dt == "float16" else "bf16")
    rng = np.random.default_rng(3)
    np_dt = NUMPY["f16" if dt == "float16" else "bf16"]
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32).astype(np_dt)
                 for s in ((8, 16), (16, 32), (32, 4)))  # fmt: skip

    def mlp(x, w1, w2):
        h = (x @ w1).relu()
        return lucid.softmax(h @ w2, -1).sum(0), (h * h).mean()

    args = [lucid.tensor(a) for a in (x, w1, w2)]
    cm = lucid.compile(mlp, backend="mpsgraph-reference")
    got = [t.numpy() for t in cm(*args)]
    info = cm.cache_info()
    assert not info["eager_only"] and not info["reasons"], info  # compiled, no fallback
    want = [t.numpy() for t in mlp(*args)]
    for g, w in zip(got, want, strict=True):
        assert_within_half_precision(g, w, "f16" if dt == "float16" else "bf16", "mlp")


# --- random half programs (hypothesis), written as lower-to-prim writes them ---------------------
from lucid.backends.mpsgraph.legalize import narrow_half  # noqa: E402
from lucid.ir import _xdsl as xd  # noqa: E402
from lucid.ir.prim.dialect import create_prim, prim_type  # noqa: E402
from lucid.ir.prim.interpreter import interpret_prim  # noqa: E402
from tests.backends.mpsgraph.test_random_programs import BINARY, programs  # noqa: E402


def _half_module(shape, steps, dt):
    """The random program with every step computed as lower-to-prim does on half values: the
    operands cast to float32, the op, the result cast back."""
    feed_shapes = [shape]
    cur = P.Aval(shape, dt)
    for name, attrs in steps:
        if name in BINARY:
            feed_shapes.append(cur.shape[1:])
        attrs = {k: v for k, v in attrs.items() if k != "other"}
        (cur,) = P.infer(name, [P.Aval(cur.shape, "f32")] * (2 if name in BINARY else 1), attrs)
    block = xd.Block(arg_types=[prim_type(s, dt) for s in feed_shapes])
    value, k = block.args[0], 1

    def add(name, operands, attrs):
        op = create_prim(name, operands, attrs)
        block.add_op(op)
        return op.results[0]

    for name, attrs in steps:
        attrs = {k2: v for k2, v in attrs.items() if k2 != "other"}
        operands = [add("cast", [value], {"dtype": "f32"})]
        if name in BINARY:
            operands.append(add("cast", [block.args[k]], {"dtype": "f32"}))
            k += 1
        value = add("cast", [add(name, operands, attrs)], {"dtype": dt})
    block.add_op(xd.func.ReturnOp(value))
    types = [a.type for a in block.args]
    fn = xd.func.FuncOp("forward", (types, [value.type]), xd.Region(block))
    return xd.ModuleOp([fn]), feed_shapes


@settings(max_examples=20, deadline=None)
@given(programs(), st.sampled_from(HALVES))
def test_random_half_program_matches_the_prim_interpreter_within_the_format(case, dt):
    shape, steps, seed = case
    module, feed_shapes = _half_module(shape, steps, dt)
    module.verify()
    rng = np.random.default_rng(seed)
    feeds = [np.asarray(P.to_half(rng.standard_normal(s), dt)) for s in feed_shapes]
    (want,) = interpret_prim(module, feeds)
    (got,) = MPSGraphReferenceBackend().compile(module).run(feeds)
    # Each step rounds once in both; the reference rounds in the step's op where prim rounds
    # after it, and a unit of difference grows through later steps (exp, tanh): a few units.
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = float(ml_dtypes.finfo(NUMPY[dt]).eps)
    np.testing.assert_allclose(g, w, rtol=8 * eps, atol=8 * eps * max(1.0, np.abs(w).max()))


def test_narrowing_keeps_float32_where_a_region_needs_it():
    # linear + gelu + softmax as lower-to-prim writes them: the linear's matmul and bias add run
    # in half, gelu's constant 1/sqrt(2) is no half value (its region stays float32), softmax
    # accumulates (float32).
    dt = "f16"
    block = xd.Block(arg_types=[prim_type((2, 3), dt), prim_type((4, 3), dt), prim_type((4,), dt)])
    ops: list = []

    def add(name, operands, attrs=None):
        ops.append(create_prim(name, operands, attrs or {}))
        block.add_op(ops[-1])
        return ops[-1].results[0]

    x, w, b = (add("cast", [a], {"dtype": "f32"}) for a in block.args)
    y = add("cast", [add("add", [add("matmul", [x, w], {"transpose_b": True}), b])], {"dtype": dt})
    yf = add("cast", [y], {"dtype": "f32"})
    k = add("constant", [], {"shape": [], "dtype": "f32", "value": [0.7071067811865476]})
    g = add("cast", [add("mul", [yf, add("erf", [add("mul", [yf, k])])])], {"dtype": dt})
    s = add("cast", [add("softmax", [add("cast", [g], {"dtype": "f32"})], {"axis": -1})],
            {"dtype": dt})  # fmt: skip
    block.add_op(xd.func.ReturnOp(s))
    assert narrow_half(block) == 2
    names = [(op.name, str(op.results[0].type)) for op in block.ops if op.results]
    assert ("prim.matmul", "tensor<2x4xf16>") in names and ("prim.add", "tensor<2x4xf16>") in names
    assert ("prim.erf", "tensor<2x4xf32>") in names
    assert ("prim.softmax", "tensor<2x4xf32>") in names


def _negation_region(n: int, read_back: bool):
    """A half value widened to float32, ``n`` negations in float32, and the last one either cast
    back to half (the region narrows) or read by softmax in float32 (nothing narrows: the
    escape is found at the end and reaches the first op through every other)."""
    block = xd.Block(arg_types=[prim_type((2, 3), "f16")])

    def add(name, operands, attrs=None):
        block.add_op(create_prim(name, operands, attrs or {}))
        return block.last_op.results[0]

    v = add("cast", [block.args[0]], {"dtype": "f32"})
    for _ in range(n):
        v = add("neg", [v])
    v = add("softmax", [v], {"axis": -1}) if not read_back else v
    block.add_op(xd.func.ReturnOp(add("cast", [v], {"dtype": "f16"})))
    return block


@pytest.mark.parametrize("read_back", [True, False])
def test_narrowing_a_long_region_visits_each_op_a_bounded_number_of_times(read_back):
    from lucid.backends.mpsgraph.legalize import STAGE
    from lucid.ir import visits

    counted = []
    for n in (40, 320):
        block = _negation_region(n, read_back)
        with visits.counting() as counts:
            narrowed = narrow_half(block)
        assert narrowed == (n if read_back else 0)
        kinds = {str(op.results[0].type) for op in block.ops if op.name == "prim.neg"}
        assert kinds == {"tensor<2x3xf16>" if read_back else "tensor<2x3xf32>"}
        counted.append(counts[STAGE])
    # Each drop requeues only its neighbours: 8x the ops, about 8x the visits (a fixed point
    # recomputed over every candidate per round would take n rounds: 64x).
    assert counted[1] <= 8 * 1.25 * counted[0]


# --- every registry op in float16 through lower-to-prim and the MPSGraph emission, vs eager -----
# (each op's first sample in the default run, the others under slow)
from hypothesis import HealthCheck  # noqa: E402

from lucid.passes.lower_to_prim import lower_module  # noqa: E402
from tests.passes import test_lower_to_prim_half as half_samples  # noqa: E402

REGISTRY_CASES = half_samples.HALF_CASES


@pytest.mark.parametrize("half", half_samples.HALF_DTYPES)
@pytest.mark.parametrize("name,i", half_samples.one_sample_per_op_by_default(REGISTRY_CASES))
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_registry_op_in_half_through_mpsgraph_matches_eager(name, i, half, seed):
    if not half_samples._valid_in_float32(name, i, seed):
        seed = 1000 + i + sum(map(ord, name))
    module, arrays, eager = half_samples.samples.build(
        name, *half_samples.half_sample(name, i, seed, half)
    )
    if name in half_samples.PYTORCH_REFERENCE:
        eager = half_samples.PYTORCH_REFERENCE[name](arrays, half)
    lower_module(module)
    lowered = interpret_prim(module, arrays)
    try:
        executable = MPSGraphReferenceBackend().compile(module, inplace_updates=False)
    except MPSGraphUnsupported as e:
        # What MPSGraph refuses in float32 too: float64 values and integer matmuls.
        assert "float64" in e.reason or "matmul on i" in e.reason, e
        return
    got = executable.run([np.array(a) for a in arrays])
    for k, (g, ref, want) in enumerate(zip(got, lowered, eager, strict=True)):
        what = f"{name} output {k} in {half}"
        half_samples.assert_close_half(g, ref, half, f"{what}: vs the prim interpreter")
        half_samples.assert_close_half(g, want, half, f"{what}: mpsgraph-reference vs eager")


def test_a_half_module_compiles_for_mpsgraph_without_falling_back():
    model = lucid.nn.Sequential(lucid.nn.Linear(4, 8), lucid.nn.ReLU()).half()
    x = lucid.tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float16))
    compiled = lucid.compile(model, backend="mpsgraph-reference")
    got = compiled(x).detach().numpy()
    assert not compiled.cache_info()["reasons"], compiled.cache_info()["reasons"]
    assert_within_half_precision(got, model(x).detach().numpy(), "f16", "Linear + ReLU")
