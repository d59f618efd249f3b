"""The real MPSGraph backend on a Mac: the zoo compiled natively, compared with the reference
builder and with eager, and the time of a cache hit. Runs only on macOS with Metal and the native
MPSGraph part built; skipped elsewhere with the reason. Run it with::

    .venv/bin/python -m pytest tests/backends/mpsgraph/test_macos_native.py -v -rs
"""

from __future__ import annotations

import importlib.util
import pathlib
import time

import numpy as np
import pytest

from lucid.backends.mpsgraph.backend import MPSGraphBackend, MPSGraphReferenceBackend
from lucid.backends.mpsgraph.native import NativeBuilder, native_status

_ok, _reason = native_status()
pytestmark = pytest.mark.skipif(not _ok, reason=f"needs the native MPSGraph backend: {_reason}")

_spec = importlib.util.spec_from_file_location(
    "mpsgraph_zoo_native", pathlib.Path(__file__).with_name("_zoo.py")
)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

# MPSGraph may run float32 math with reduced-precision paths; calibrate on real hardware.
TOL = {"rtol": 2e-3, "atol": 2e-4}


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_native_zoo_matches_reference_and_eager(name, train):
    eager, native, model, twin = zoo.eager_and_compiled(MPSGraphBackend(), name, train)
    _, reference, _, _ = zoo.eager_and_compiled(MPSGraphReferenceBackend(), name, train)
    for n, r, e in zip(native, reference, eager, strict=True):
        np.testing.assert_allclose(n, r, **TOL)
        np.testing.assert_allclose(n, e, **TOL)
    for k, v in zoo.buffers(model).items():
        np.testing.assert_allclose(zoo.buffers(twin)[k], v, **TOL, err_msg=k)


def test_a_cache_hit_is_much_faster_than_a_compile():
    make, inputs = zoo.zoo()["cnn"]
    model = make()
    model.eval()
    x = [zoo.Tensor._wrap(a) for a in inputs(np.random.default_rng(0))]
    module, _ = zoo.lowered(model, model, x)
    program, _ = MPSGraphReferenceBackend().record(module)
    t0 = time.perf_counter()
    NativeBuilder().compile(program, cache=True)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    NativeBuilder().compile(program, cache=True)
    hit = time.perf_counter() - t0
    print(f"MPSGraph compile {first * 1e3:.1f} ms, cache hit {hit * 1e3:.3f} ms")
    assert hit < first / 10


def test_native_index_error_and_random_stream():
    zoo.check_index_error_and_random_stream(MPSGraphBackend())


def test_lucid_compile_on_mpsgraph_matches_the_reference_and_eager():
    zoo.compare_backends("mpsgraph", "mpsgraph-reference", TOL)


# --- issue 24: what the first run on a Mac must show (each MPS test in its own process with
# tests/backends/mpsgraph/run_macos_tests.py; the Linux half is test_first_run.py) -------------
import os  # noqa: E402
import tempfile  # noqa: E402

import lucid  # noqa: E402
from lucid.backends.mpsgraph import selfcheck  # noqa: E402
from lucid.ir import prim as P  # noqa: E402
from tests.backends.mpsgraph.test_first_run import _edges  # noqa: E402

NATIVE = "mpsgraph"


def on_device(op, arrays, attrs=None):
    """The prim op's emission run on the GPU, and prim's own result."""
    attrs = attrs or {}
    got = selfcheck.run_emission(op, [np.asarray(a) for a in arrays], attrs, device=True)
    return got, P.evaluate(op, [np.asarray(a) for a in arrays], attrs)


def same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_1_duplicate_targets():
    def dup(x):
        y = x * 2.0
        return y, y, y.sum()

    x = lucid.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    for got, want in zip(lucid.compile(dup, backend=NATIVE)(x), dup(x), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)


@pytest.mark.parametrize(
    "op, row",
    [("argmax", [1.0, np.nan, 3.0]), ("argmin", [2.0, np.nan, 0.0]), ("argmax", [np.nan] * 3),
     ("argmax", [1.0, 7.0, 7.0, 2.0]), ("argmin", [3.0, -1.0, -1.0])],
)  # fmt: skip
def test_2_argmax_argmin_nan_and_ties(op, row):
    same(*on_device(op, [np.array(row, np.float32)], {"axis": 0}))


@pytest.mark.parametrize(
    "x",
    [np.arange(300, dtype=np.int64)[::-1].copy(), np.ones(300, np.int64),
     np.array([np.nan, 1, 0, np.nan, 1], np.float32), np.ones(1000, np.float32)],
    ids=["int64_reversed_300", "int64_ties_300", "nan", "float_ties_1000"],
)  # fmt: skip
@pytest.mark.parametrize("descending", [False, True])
def test_3_argsort_int64_ties_nan(x, descending):
    same(*on_device("argsort", [x], {"axis": 0, "descending": descending}))


def test_4_integer_matmul_falls_back_and_wide_matmul_is_right():
    a = lucid.tensor(np.ones((2, 3), np.int32))
    b = lucid.tensor(np.ones((3, 2), np.int32))
    np.testing.assert_array_equal(lucid.compile(lambda a, b: a @ b, backend=NATIVE)(a, b).numpy(),
                                  np.full((2, 2), 3))  # fmt: skip
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1025, 1)).astype(np.float32)
    y = rng.standard_normal((1, 32769)).astype(np.float32)
    got = lucid.compile(lambda a, b: a @ b, backend=NATIVE)(lucid.tensor(x), lucid.tensor(y))
    np.testing.assert_allclose(got.numpy(), x @ y, **TOL)


def test_5_serialize_load_run():
    from lucid._native_loader import _native

    b = NativeBuilder()
    x = b.placeholder((3,), "f32", "input:0")
    (y,) = b.call("additionWithPrimaryTensor:secondaryTensor:name:",
                  [{"tensor": x}, {"tensor": x}, {"nil": True}])  # fmt: skip
    program = b.program([y], [])
    exe = b.compile(program, cache=False)
    feed = np.float32([1, 2, 3])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "double.mpsgraphpackage")
        exe.serialize(path)
        exe.serialize(path)  # over a stale package: replaced, not trusted
        loaded = _native.mpsgraph_load(path, program)
        np.testing.assert_array_equal(loaded.run([feed])[0], exe.run([feed])[0])
        with pytest.raises(ValueError, match="mpsgraphpackage"):
            exe.serialize(os.path.join(folder, "double.bin"))


@pytest.mark.skipif(not os.environ.get("LUCID_MPS_BIG_TESTS"), reason="set LUCID_MPS_BIG_TESTS=1")
def test_6_a_gpu_failure_raises_naming_the_executable():
    from lucid._native_loader import _native

    # A feed beyond the device's working set: the run must raise, not return zeros.
    b = NativeBuilder()
    x = b.placeholder((-1,), "f32", "input:0")
    (y,) = b.call("multiplicationWithPrimaryTensor:secondaryTensor:name:",
                  [{"tensor": x}, {"tensor": x}, {"nil": True}])  # fmt: skip
    exe = _native.mpsgraph_compile(b.program([y], []), False)
    huge = np.ones(int(os.environ.get("LUCID_MPS_HUGE_ELEMENTS", 6 * 2**30)), np.float32)
    try:
        (out,) = exe.run([huge])
    except RuntimeError as e:
        assert "MPSGraph executable" in str(e)
    else:
        assert out[0] == 1 and out[-1] == 1


def test_6_what_mpsgraph_aborts_on_is_refused_before_compiling():
    from lucid._native_loader import _native

    b = NativeBuilder()
    x = b.placeholder((3,), "f32", "input:0")
    program = b.program([x], [])
    program["targets"] = [x, x]
    with pytest.raises(ValueError, match="named twice"):
        _native.mpsgraph_compile(program, False)


@pytest.mark.parametrize("state", [[-1, 2**63 - 1], [-(2**63), -1], [0, 0]])
def test_7_philox_bit_exact_at_extreme_states(state):
    got, want = on_device("random_uniform", [np.array(state, np.int64)], {"shape": [4096]})
    same(got, want)


@pytest.mark.parametrize("op", ["sign", "relu"])
def test_8_int64_sign_relu(op):
    same(*on_device(op, [np.array([-3, 0, 5, -(2**62), 2**62], np.int64)]))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_9_integer_division_exact_over_the_whole_range(op, dtype):
    # Every pair of edge values (INT_MIN // -1, x // INT_MIN, divisors near the maximum, zero
    # divisors), then random pairs over the whole range, with divisors of every magnitude.
    edges = np.array(_edges("i32" if dtype == np.int32 else "i64"), object)
    a, b = (g.ravel().astype(dtype) for g in np.meshgrid(edges, edges))
    same(*on_device(op, [a, b]))
    rng = np.random.default_rng(24)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, 4096, dtype, endpoint=True)
    shifts = rng.integers(0, info.bits - 1, 4096)
    b = (rng.integers(info.min, info.max, 4096, dtype, endpoint=True) >> shifts).astype(dtype)
    same(*on_device(op, [a, b]))


@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_9_float_division_matches_eager_bit_for_bit(op):
    # 1.0 // 0.1 is 9 (fmod gives 0.0999...), signed zeros, infinities, NaN, subnormals, and
    # random Float32 bit patterns (every magnitude ratio, so every fmod round is used).
    edges = np.float32([0, -0.0, 1, -1, 0.1, -0.1, 3, np.inf, -np.inf, np.nan, 1e-45, 3.4e38])
    a, b = (g.ravel() for g in np.meshgrid(edges, edges))
    bits = np.random.default_rng(25).integers(0, 2**32, (2, 4096), dtype=np.uint64)
    a, b = (
        np.concatenate([v, w.astype(np.uint32).view(np.float32)])
        for v, w in zip((a, b), bits, strict=True)
    )
    (got,), (want,) = on_device(op, [a, b])
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_10_rank0_feeds_and_results():
    def loss(x, s):
        return (x * x).sum() * s

    x = lucid.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    s = lucid.tensor(np.array(0.5, np.float32))
    got = lucid.compile(loss, backend=NATIVE)(x, s).numpy()
    assert got.shape == () and np.isclose(got, loss(x, s).numpy())


def test_11_a_passed_through_feed():
    def passthrough(x, z):
        return x, z + 1.0

    x, z = lucid.tensor(np.float32([1, 2])), lucid.tensor(np.float32([3, 4]))
    a, b = lucid.compile(passthrough, backend=NATIVE)(x, z)
    np.testing.assert_array_equal(a.numpy(), [1, 2])
    np.testing.assert_array_equal(b.numpy(), [4, 5])


def test_12_copy_free_wrapping_of_memmaps_views_and_read_only_buffers():
    page = os.sysconf("SC_PAGE_SIZE")
    b = NativeBuilder()
    x = b.placeholder((-1,), "f32", "input:0")
    (y,) = b.call("additionWithPrimaryTensor:secondaryTensor:name:",
                  [{"tensor": x}, {"tensor": x}, {"nil": True}])  # fmt: skip
    exe = b.compile(b.program([y], []), cache=False)

    def run(feed):
        (out,) = exe.run([feed])
        np.testing.assert_array_equal(out, feed + feed)
        return exe.last_run_stats["wrapped_inputs"], exe.last_run_stats["copied_inputs"]

    raw = np.arange(3 * page, dtype=np.float32)
    start = (-raw.ctypes.data % page) // 4
    assert run(raw[start : start + page // 4]) == (1, 0)  # page-aligned view
    assert run(raw[start : start + 1]) == (1, 0)  # one element on a page boundary
    assert run(raw[start + 1 : start + 9]) == (0, 1)  # off the boundary: copied
    frozen = raw[start : start + 8].copy()
    frozen.flags.writeable = False
    assert run(frozen)[0] == 0  # read-only: never wrapped
    with tempfile.TemporaryDirectory() as folder:
        mapped = np.memmap(os.path.join(folder, "f.bin"), np.float32, "w+", shape=(page,))
        mapped[:] = 2.0
        run(mapped)  # wrapped or copied, the numbers are right
        tail = mapped[page // 4 * 3 :]  # a view near the end of the mapping
        run(tail)


def test_13_a_symbolic_executable_serves_many_batch_sizes():
    make, _ = zoo.zoo()["mlp"]
    model = make()
    model.eval()
    cm = lucid.compile(model, backend=NATIVE, dynamic=True)
    rng = np.random.default_rng(0)
    with lucid.no_grad():
        for n in range(1, 80):  # beyond the 64 per-shape result types kept
            x = lucid.tensor(rng.standard_normal((n, 16)).astype(np.float32))
            np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), **TOL)


@pytest.mark.parametrize("name", sorted(selfcheck.CASES))
def test_14_selfcheck_case(name):
    row = selfcheck.check_case(name, device=True)
    print(row)
    if selfcheck.CASES[name].note.startswith("undocumented"):
        return  # calibration: printed, not asserted (see docs, "Calibrating on a Mac")
    assert "DIFFERS" not in row["reference"] + row["prim"], row


# --- half precision: float16 and bfloat16 on the device (the Linux half is test_half.py) -------
import ml_dtypes  # noqa: E402

from tests.backends.mpsgraph.test_half import (  # noqa: E402
    CASES_HALF,
    NUMPY,
    assert_within_half_precision,
)


@pytest.mark.parametrize(
    "dt, name, arrays, attrs", CASES_HALF, ids=[f"{c[0]}-{c[1]}" for c in CASES_HALF]
)
def test_15_half_op_on_the_device_matches_the_reference_and_prim(dt, name, arrays, attrs):
    # Every prim op's half emission: Apple's half arithmetic against the reference's model of it
    # (per-call rounding, Float32 accumulation in matmul/conv/pooling) and against prim (eager).
    got, want = on_device(name, arrays, attrs)
    reference = selfcheck.run_emission(name, [np.asarray(a) for a in arrays], attrs, device=False)
    for k, (g, r, w) in enumerate(zip(got, reference, want, strict=True)):
        assert_within_half_precision(g, r, dt, f"{dt} {name} output {k}: device vs reference")
        assert_within_half_precision(g, w, dt, f"{dt} {name} output {k}: device vs prim")


@pytest.mark.parametrize("dt", sorted(NUMPY))
def test_15_half_matmul_accumulates_as_the_reference_says(dt):
    # 2048 + fifteen ones: a half accumulator stays at 2048 (its spacing there is 2); Float32
    # accumulation gives 2063 rounded once. Calibrates the reference's undocumented assumption.
    a = np.array([[2048.0] + [1.0] * 15], np.float32).astype(NUMPY[dt])
    b = np.ones((16, 1), NUMPY[dt])
    got, _ = on_device("matmul", [a, b])
    reference = selfcheck.run_emission("matmul", [a, b], {}, device=False)
    print(f"{dt} matmul 2048 + 15 x 1 on the device: {float(got[0][0, 0])}")
    np.testing.assert_array_equal(got[0].astype(np.float32), reference[0].astype(np.float32))


@pytest.mark.parametrize("dt", sorted(NUMPY))
def test_15_half_feeds_and_results_are_copy_free_and_unconverted(dt):
    page = os.sysconf("SC_PAGE_SIZE")
    b = NativeBuilder()
    x = b.placeholder((-1,), dt, "input:0")
    (y,) = b.call("additionWithPrimaryTensor:secondaryTensor:name:",
                  [{"tensor": x}, {"tensor": x}, {"nil": True}])  # fmt: skip
    exe = b.compile(b.program([y], []), cache=False)
    raw = np.zeros(2 * page, NUMPY[dt])
    start = (-raw.ctypes.data % page) // 2
    feed = raw[start : start + 256]
    feed[:] = np.linspace(-8, 8, 256).astype(NUMPY[dt])
    (out,) = exe.run([feed])
    assert out.dtype == NUMPY[dt]
    np.testing.assert_array_equal(out.astype(np.float32), (feed + feed).astype(np.float32))
    assert exe.last_run_stats["wrapped_inputs"] == 1 and exe.last_run_stats["copied_inputs"] == 0


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_15_a_half_model_through_lucid_compile(dt):
    # A small MLP's forward in half precision compiled natively, against eager in half (within
    # the format's precision: the device may order its sums differently).
    rng = np.random.default_rng(15)
    np_dt = np.float16 if dt == "float16" else ml_dtypes.bfloat16
    try:
        lucid.tensor(np.zeros(2, np_dt)) + 1
    except (TypeError, KeyError) as e:
        pytest.skip(f"eager Lucid has no {dt} tensors here: {e}")
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32).astype(np_dt)
                 for s in ((8, 16), (16, 32), (32, 4)))  # fmt: skip

    def mlp(x, w1, w2):
        return lucid.softmax((x @ w1).relu() @ w2, -1).sum(0)

    args = [lucid.tensor(a) for a in (x, w1, w2)]
    got = lucid.compile(mlp, backend=NATIVE)(*args).numpy()
    want = mlp(*args).numpy()
    assert got.dtype == want.dtype == np.dtype(np_dt)
    eps = float(ml_dtypes.finfo(np_dt).eps)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=8 * eps,
                               atol=8 * eps)  # fmt: skip
