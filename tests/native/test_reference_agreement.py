"""Minimal programs for what the differential program fuzzer (tests/native/program_fuzz.py) found:
each native result must agree with the numpy reference interpreter (``Program.interpret``) on
the same program and feeds, NaN and infinities included."""

import sys
from pathlib import Path

import numpy as np
import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from lucid import _native  # noqa: E402
from tests.native.program_fuzz import (  # noqa: E402
    compare_with_reference,
    reference_program,
)

NUMPY = {"f32": np.float32, "f64": np.float64}


def run_both(desc: dict, feeds: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(native results, reference results) of one description on copies of ``feeds``."""
    native = _native.compile(desc, cache=False).run([f.copy() for f in feeds])
    with np.errstate(all="ignore"):
        reference = reference_program(desc).interpret([f.copy() for f in feeds])
    return native, reference


def assert_agree(desc: dict, feeds: list[np.ndarray]) -> list[np.ndarray]:
    native, reference = run_both(desc, feeds)
    mismatch = compare_with_reference(native, reference)
    assert mismatch is None, mismatch
    return native


# -- gemm / matmul_accumulate with alpha == 0 --------------------------------------------------
# A BLAS skips the product when alpha is 0 (C = beta * C, A and B unread), but 0 times an
# infinite or NaN product is NaN: `gemm{alpha = 0}` is the fold of `mul(matmul(a, b), 0)`.


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [3, 64])  # 64: Lucid's own float32 kernel (sgemm_chosen)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_with_alpha_zero_gives_nan_where_the_product_is_not_finite(dtype, n, bias):
    slots = [((n, n), dtype), ((n, n), dtype), ((n, n), dtype)]
    ins = [0, 1]
    if bias:
        slots.append(((n,), dtype))
        ins.append(3)
    desc = {
        "slots": slots,
        "instrs": [("gemm", ins, [2], {"alpha": 0.0, "transpose_a": False, "transpose_b": False})],
        "feeds": [0, 1] + ([3] if bias else []),
        "results": [2],
        "inplace": {},
    }
    a = np.ones((n, n), NUMPY[dtype])
    a[1, 2] = np.inf  # row 1 of the product is infinite
    a[2, 0] = np.nan  # row 2 NaN
    feeds = [a, np.ones((n, n), NUMPY[dtype])] + ([np.ones(n, NUMPY[dtype])] if bias else [])
    (out,) = assert_agree(desc, feeds)
    assert np.isnan(out[1:3]).all()
    assert (out[0] == (1.0 if bias else 0.0)).all()


def test_pooling_windows_in_the_padding_then_gemm_with_alpha_zero():
    # The shape of program (max_pool2d, avg_pool2d, reshape, gemm): max-pool windows
    # lying wholly in the padding are -inf, and gemm{alpha = 0} of a row holding -inf is NaN,
    # where native gave the bias (finite) and the interpreter NaN everywhere.
    pool = {"kernel": [1, 1], "strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1]}
    avg = {"kernel": [2, 2], "strides": [2, 2], "padding": [0, 0, 0, 0]}
    avg["count_include_pad"] = True
    gemm = {"alpha": 0.0, "transpose_a": False, "transpose_b": False}
    desc = {
        "slots": [
            ((2, 1, 2, 2), "f32"),  # 0: images
            ((2, 1, 4, 4), "f32"),  # 1: max-pooled, a ring of -inf
            ((2, 1, 2, 2), "f32"),  # 2: avg-pooled (each window holds some -inf)
            ((2, 4), "f32"),  # 3: flattened
            ((4, 3), "f32"),  # 4: weight
            ((3,), "f32"),  # 5: bias
            ((2, 3), "f32"),  # 6: gemm
        ],
        "instrs": [
            ("max_pool2d", [0], [1], pool),
            ("avg_pool2d", [1], [2], avg),
            ("reshape", [2], [3], {"shape": [2, 4]}),
            ("gemm", [3, 4, 5], [6], gemm),
        ],
        "feeds": [0, 4, 5],
        "results": [1, 6],
        "inplace": {},
    }
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(s).astype(np.float32) for s in [(2, 1, 2, 2), (4, 3), (3,)]]
    pooled, out = assert_agree(desc, feeds)
    assert np.isneginf(pooled[:, :, 0]).all() and np.isnan(out).all()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_matmul_accumulate_with_alpha_zero_gives_nan_where_the_product_is_not_finite(dtype):
    desc = {
        "slots": [((3, 4), dtype), ((4, 5), dtype), ((3, 5), dtype), ((), dtype), ((3, 5), dtype)],
        "instrs": [
            ("matmul_accumulate", [0, 1, 2, 3], [4], {"transpose_a": False, "transpose_b": False})
        ],
        "feeds": [0, 1, 2, 3],
        "results": [4],
        "inplace": {},
    }
    a = np.ones((3, 4), NUMPY[dtype])
    a[0, 0] = -np.inf
    feeds = [a, np.ones((4, 5), NUMPY[dtype]), np.full((3, 5), 2, NUMPY[dtype])]
    feeds.append(np.zeros((), NUMPY[dtype]))
    (out,) = assert_agree(desc, feeds)
    assert np.isnan(out[0]).all() and (out[1:] == 2).all()


def test_attention_with_alpha_zero_in_float64_gives_nan_for_an_infinite_score():
    # Float64 attention computes the scores with one BLAS call per block of rows.
    b, h, lq, lk, d = 1, 1, 2, 3, 4
    desc = {
        "slots": [((b, h, lq, d), "f64"), ((b, h, lk, d), "f64"), ((b, h, lk, d), "f64")]
        + [((b, h, lq, d), "f64")],
        "instrs": [("attention", [0, 1, 2], [3], {"alpha": 0.0})],
        "feeds": [0, 1, 2],
        "results": [3],
        "inplace": {},
    }
    q = np.ones((b, h, lq, d))
    q[0, 0, 0, 0] = np.inf  # every score of query row 0 is infinite
    (out,) = assert_agree(desc, [q, np.ones((b, h, lk, d)), np.ones((b, h, lk, d))])
    assert np.isnan(out[0, 0, 0]).all() and (out[0, 0, 1] == 1).all()


# -- float floor_divide and remainder ---------------------------------------------------------
# Python's divmod rule (numpy, PyTorch, eager Lucid): floor(a / b) rounded the quotient first.


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_float_floor_divide_and_remainder_follow_pythons_divmod(dtype, op):
    a = [1.0, -1.0, 1.0, -1.0, np.inf, -np.inf, 7.0, 0.0, -0.0, 5.0, np.nan, 3.0, -7.5]
    b = [0.1, 0.1, np.inf, np.inf, 2.0, 3.0, 0.7, -np.inf, 2.0, 0.0, 1.0, np.nan, -2.0]
    n = len(a)
    desc = {
        "slots": [((n,), dtype)] * 3,
        "instrs": [(op, [0, 1], [2], {})],
        "feeds": [0, 1],
        "results": [2],
        "inplace": {},
    }
    (out,) = assert_agree(desc, [np.array(a, NUMPY[dtype]), np.array(b, NUMPY[dtype])])
    if op == "floor_divide":
        assert out[0] == 9 and out[1] == -10 and out[3] == -1 and np.isnan(out[4])
    else:
        assert out[3] == np.inf and np.isnan(out[4]) and out[12] == -1.5


# -- the sign of zero: relu, abs and sign of -0 are +0 ------------------------------------------
# As numpy, PyTorch and eager Lucid give; it shows through a reciprocal (+inf, not -inf).


def test_compiled_relu_abs_and_sign_of_negative_zero_match_eager():
    import lucid

    x = lucid.tensor(np.array([-0.0, 0.0, -1.0, 2.0, np.nan] * 4, np.float32))

    def reciprocals(t):
        return 1 / t.relu(), 1 / t.abs(), 1 / t.sign(), 1 / (t * 2).relu().double()

    with np.errstate(all="ignore"):
        eager = [r.numpy() for r in reciprocals(x)]
        compiled = [r.numpy() for r in lucid.compile(reciprocals)(x)]
    for got, want in zip(compiled, eager, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (compiled[0][:2] == np.inf).all()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("op", ["relu", "abs", "sign"])
def test_relu_abs_and_sign_of_negative_zero_are_positive_zero(dtype, op):
    n = 37  # a vector loop and its tail
    desc = {
        "slots": [((n,), dtype), ((n,), dtype)],
        "instrs": [(op, [0], [1], {})],
        "feeds": [0],
        "results": [1],
        "inplace": {},
    }
    (out,) = assert_agree(desc, [np.full(n, -0.0, NUMPY[dtype])])
    assert not np.signbit(out).any()


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [3, 64])  # BLAS then a pass; float32: Lucid's kernel's epilogue
def test_gemm_relu_of_negative_zero_is_positive_zero(dtype, n):
    attrs = {"alpha": -1.0, "transpose_a": False, "transpose_b": False, "activation": "relu"}
    desc = {
        "slots": [((n, n), dtype)] * 3,
        "instrs": [("gemm", [0, 1], [2], attrs)],
        "feeds": [0, 1],
        "results": [2],
        "inplace": {},
    }
    # -1 * (a product of +0) is -0.
    zeros, ones = np.zeros((n, n), NUMPY[dtype]), np.ones((n, n), NUMPY[dtype])
    (out,) = assert_agree(desc, [zeros, ones])
    assert (out == 0).all() and not np.signbit(out).any()


# -- exclusive cumsum: the sums before each element --------------------------------------------
# The reference computed it as cumsum(x) - x, so an infinite element made its own entry NaN.


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_exclusive_cumsum_does_not_read_the_element_itself(dtype, reverse):
    attrs = {"axis": 1, "exclusive": True, "reverse": reverse}
    desc = {
        "slots": [((3, 4), dtype), ((3, 4), dtype)],
        "instrs": [("cumsum", [0], [1], attrs)],
        "feeds": [0],
        "results": [1],
        "inplace": {},
    }
    x = np.array(
        [[1.0, 2.0, 3.0, -np.inf], [np.nan, 1.0, 1.0, 1.0], [np.inf, 1.0, 2.0, 3.0]], NUMPY[dtype]
    )
    if reverse:
        x = x[:, ::-1].copy()
    (out,) = assert_agree(desc, [x])
    if reverse:
        out = out[:, ::-1]
    np.testing.assert_array_equal(out[0], [0, 1, 3, 6])
    assert out[1, 0] == 0 and out[2, 0] == 0 and np.isnan(out[1, 1:]).all()


# -- layer_norm: mean and variance in float64 --------------------------------------------------
# The kernel accumulates in double; the reference squared the deviations in float32, where
# (3.6e19)^2 overflows, so its variance was inf and every output the bias.


def test_layer_norm_of_a_row_whose_squares_overflow_float32():
    desc = {
        "slots": [((2, 6), "f32"), ((6,), "f32"), ((6,), "f32"), ((2, 6), "f32")],
        "instrs": [("layer_norm", [0, 1, 2], [3], {"epsilon": 1e-5})],
        "feeds": [0, 1, 2],
        "results": [3],
        "inplace": {},
    }
    x = np.array([[0, 0, 3.6e19, 0, 0, 0], [1, 2, 3, 4, 5, 6]], np.float32)
    gamma, beta = np.ones(6, np.float32), np.zeros(6, np.float32)
    (out,) = assert_agree(desc, [x, gamma, beta])
    np.testing.assert_allclose(out[0], [-0.4472136] * 2 + [2.236068] + [-0.4472136] * 3, rtol=1e-5)


# -- reductions of a 0-d value over its axis 0 (or -1) leave it, as in PyTorch ---------------
# The native validator accepts both axes; the reference raised numpy's AxisError for 0 and a
# PrimError for -1.


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_prod", "reduce_mean"])
@pytest.mark.parametrize("axis", [0, -1])
def test_reducing_a_0d_value_over_its_axis_leaves_it(op, axis):
    desc = {
        "slots": [((), "f32"), ((), "f32")],
        "instrs": [(op, [0], [1], {"axes": [axis], "keepdims": False})],
        "feeds": [0],
        "results": [1],
        "inplace": {},
    }
    (out,) = assert_agree(desc, [np.array(2.5, np.float32)])
    assert out == 2.5
