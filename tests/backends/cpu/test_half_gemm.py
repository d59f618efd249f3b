"""Half-precision GEMMs on the CPU backend: the kernel (``gemm_mixed``: float16/bfloat16
operands widened while packing, float32 sums, the output rounded once) against Lucid's float32
kernel on the widened operands, bit for bit; the folds of a half model's casts and activations
into the ``gemm`` instruction against the unfolded program (the same float32 kernel, so bit for
bit too) and the numpy reference."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid import _native
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.ir.prim import HALF, NUMPY_DTYPES, dtype_of, to_half, widen_half

TYPES = ("f32", "f16", "bf16")
native_kernel = pytest.mark.skipif(
    not _native.gemm_mixed_native(), reason="the converting kernel needs AVX2, FMA and F16C"
)


def _random(rng, shape, dtype, scale=1.0):
    values = rng.standard_normal(shape) * scale
    return to_half(values, dtype) if dtype in HALF else values.astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.itemsize}")


@contextlib.contextmanager
def _lucid_sgemm():
    """Every float32 GEMM on Lucid's kernel (the half GEMM's), so both sides sum alike."""
    before = _native.sgemm_mode()
    _native.set_sgemm_mode("lucid")
    try:
        yield
    finally:
        _native.set_sgemm_mode(before)


@native_kernel
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 20),
    n=st.integers(1, 40),
    k=st.sampled_from([1, 5, 16, 33, 257, 300]),
    ta=st.booleans(),
    tb=st.booleans(),
    a_type=st.sampled_from(TYPES),
    b_type=st.sampled_from(TYPES),
    c_type=st.sampled_from(TYPES),
    bias_type=st.sampled_from((None, *TYPES)),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    seed=st.integers(0, 2**16),
)
def test_mixed_kernel_is_the_float32_kernel_on_widened_operands_rounded_once(
    m, n, k, ta, tb, a_type, b_type, c_type, bias_type, activation, seed
):
    rng = np.random.default_rng(seed)
    a = _random(rng, (k, m) if ta else (m, k), a_type)
    b = _random(rng, (n, k) if tb else (k, n), b_type)
    bias = None if bias_type is None else _random(rng, (n,), bias_type)
    got = np.zeros((m, n), NUMPY_DTYPES[c_type])
    _native.gemm_mixed(
        a, b, got, transpose_a=ta, transpose_b=tb, alpha=0.5, bias=bias, activation=activation
    )
    want = np.zeros((m, n), np.float32)
    _native.sgemm(
        widen_half(a),
        widen_half(b),
        want,
        transpose_a=ta,
        transpose_b=tb,
        alpha=0.5,
        bias=None if bias is None else widen_half(bias),
        activation=activation,
        kernel="lucid",
    )
    if c_type in HALF:
        want = to_half(want, c_type)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@native_kernel
@pytest.mark.parametrize("half", sorted(HALF))
def test_mixed_kernel_rounds_nan_inf_and_overflow_as_a_cast(half):
    rng = np.random.default_rng(3)
    a, b = _random(rng, (9, 40), half), _random(rng, (40, 21), half)
    a[1, 3], a[2, 5], b[4, 7] = np.nan, np.inf, -np.inf
    a[5] = to_half(np.full(40, 3e4 if half == "f16" else 3e37), half)  # sums overflow the format
    got = np.zeros((9, 21), NUMPY_DTYPES[half])
    _native.gemm_mixed(a, b, got, activation="relu")
    want = np.zeros((9, 21), np.float32)
    _native.sgemm(widen_half(a), widen_half(b), want, activation="relu", kernel="lucid")
    np.testing.assert_array_equal(_bits(got), _bits(to_half(want, half)))
    assert np.isnan(widen_half(got)).any() and np.isinf(widen_half(got)).any()


@pytest.mark.parametrize("half", sorted(HALF))
def test_an_empty_contraction_gives_the_epilogue_of_the_bias_alone(half):
    bias = to_half(np.array([-1.5, 0.25, 3.0, -0.0, 70000.0]), half)
    got = np.full((3, 5), np.nan, NUMPY_DTYPES[half])
    _native.gemm_mixed(
        np.zeros((3, 0), NUMPY_DTYPES[half]), np.zeros((0, 5), np.float32), got, bias=bias,
        activation="relu",
    )  # fmt: skip
    wide = widen_half(bias)
    want = to_half(np.where(wide <= 0, np.float32(0), wide), half)  # relu: -0 becomes +0
    np.testing.assert_array_equal(_bits(got), _bits(np.broadcast_to(want, (3, 5))))


def test_mixed_kernel_rejects_other_dtypes_and_a_rounding_without_a_half_output():
    a, b = np.zeros((2, 3), np.float64), np.zeros((3, 4), np.float16)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        _native.gemm_mixed(a, b, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="round_product"):
        _native.gemm_mixed(b.T.copy(), b, np.zeros((4, 4), np.float32), round_product="f16")


def _half_linear_program(
    half, lead, m, n, k, ta, tb, bias, activation, b_batched
) -> tuple[Program, list[np.ndarray]]:
    """A half model's product as lowering writes it: casts up, matmul (+ bias) in float32, a
    cast down, then (optionally) the activation between a cast up and a cast down."""
    p = Program()
    a_shape = (*lead, k, m) if ta else (*lead, m, k)
    b_shape = (n, k) if tb else (k, n)
    a = p.feed(a_shape, half)
    w = p.feed((*lead, *b_shape) if b_batched else b_shape, half)
    y = p.op("matmul", p.op("cast", a, dtype="f32"), p.op("cast", w, dtype="f32"),
             transpose_a=ta, transpose_b=tb)  # fmt: skip
    if bias:
        y = p.op("add", y, p.op("cast", p.feed((n,), half), dtype="f32"))
    y = p.op("cast", y, dtype=half)
    if activation != "none":
        y = p.op("cast", p.op(activation, p.op("cast", y, dtype="f32")), dtype=half)
    p.result(y)
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    return p, [_random(rng, p.slots[s].shape, half) for s in p.feeds]


@native_kernel
@settings(max_examples=25, deadline=None)
@given(
    half=st.sampled_from(sorted(HALF)),
    lead=st.sampled_from([(), (3,), (2, 2)]),
    m=st.integers(1, 13),
    n=st.integers(1, 37),
    k=st.sampled_from([1, 7, 64, 260]),
    ta=st.booleans(),
    tb=st.booleans(),
    bias=st.booleans(),
    activation=st.sampled_from(["none", "relu", "gelu"]),
    b_batched=st.booleans(),
)
def test_half_linear_folds_into_one_gemm_equal_to_the_unfolded_program(
    half, lead, m, n, k, ta, tb, bias, activation, b_batched
):
    p, feeds = _half_linear_program(half, lead, m, n, k, ta, tb, bias, activation, b_batched)
    (gemm,) = fuse_kernels(p).instrs  # no cast, no bias add, no activation left
    assert gemm.op == "gemm" and gemm.attrs["dtype"] == half
    assert gemm.attrs.get("activation", "none") == activation
    assert all(p.slots[s].dtype == half for s in gemm.inputs)
    with _lucid_sgemm():
        (got,) = CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds])
        (unfolded,) = CPUBackend(fuse=False, cache=False).compile(p).run([f.copy() for f in feeds])
    assert dtype_of(got) == half
    tol = 4 * (2.0**-10 if half == "f16" else 2.0**-7)
    (want,) = p.interpret([f.copy() for f in feeds])
    scale = max(1.0, float(np.abs(widen_half(want)).max()))
    if activation == "gelu":  # the gelu instruction's scalar tail and the epilogue's 8 lanes
        np.testing.assert_allclose(widen_half(got), widen_half(unfolded), atol=tol * scale)
    else:
        np.testing.assert_array_equal(_bits(got), _bits(unfolded))
    np.testing.assert_allclose(widen_half(got), widen_half(want), rtol=tol, atol=tol * scale)


def test_casts_other_instructions_read_stay_and_the_product_reads_the_half_value():
    p = Program()
    a, w = p.feed((6, 8), "bf16"), p.feed((8, 20), "bf16")
    wide = p.op("cast", w, dtype="f32")
    y = p.op("matmul", p.op("cast", a, dtype="f32"), wide)
    p.result(p.op("cast", y, dtype="bf16"), p.op("exp", wide))  # the widened weight is read again
    fused = fuse_kernels(p)
    ops = [i.op for i in fused.instrs]
    assert ops.count("cast") == 1 and ops.count("gemm") == 1
    (gemm,) = [i for i in fused.instrs if i.op == "gemm"]
    assert gemm.inputs == (a, w)
    rng = np.random.default_rng(0)
    feeds = [_random(rng, (6, 8), "bf16"), _random(rng, (8, 20), "bf16")]
    got = CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds])
    want = p.interpret([f.copy() for f in feeds])
    np.testing.assert_allclose(widen_half(got[0]), widen_half(want[0]), rtol=2**-6, atol=2**-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_a_product_read_before_its_rounding_keeps_its_cast():
    p = Program()
    a, w = p.feed((6, 8), "f16"), p.feed((8, 20), "f16")
    y = p.op("matmul", p.op("cast", a, dtype="f32"), p.op("cast", w, dtype="f32"))
    p.result(p.op("cast", y, dtype="f16"), y)  # the float32 product is a result too
    fused = fuse_kernels(p)
    (gemm,) = [i for i in fused.instrs if i.op == "gemm"]
    assert "dtype" not in gemm.attrs and [i.op for i in fused.instrs] == ["gemm", "cast"]


def _half_gemm_program(**attrs) -> Program:
    p = Program()
    a, b = p.feed((4, 3), "f16"), p.feed((3, 5), "f16")
    out = p.new_slot((4, 5), attrs.pop("out", "f16"))
    full = {"transpose_a": False, "transpose_b": False, "alpha": 1.0, **attrs}
    p.instrs.append(Instr("gemm", (a, b), (out,), full))
    p.result(out)
    return p


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"dtype": "f64", "out": "f64"}, "f32, f16 or bf16 outputs"),
        ({"dtype": "f32", "round_product": "f16", "out": "f32"}, "round_product needs"),
        ({"dtype": "f16"}, None),
    ],
)
def test_the_validator_names_half_gemm_types_it_does_not_take(attrs, message):
    p = _half_gemm_program(**attrs)
    if message is None:
        (got,) = (
            CPUBackend(fuse=False, cache=False)
            .compile(p)
            .run([np.ones((4, 3), np.float16), np.ones((3, 5), np.float16)])
        )
        np.testing.assert_array_equal(got, np.full((4, 5), 3.0, np.float16))
        return
    with pytest.raises(ValueError, match=message):
        CPUBackend(fuse=False, cache=False).compile(p)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_a_compiled_half_mlp_is_gemms_only_and_equals_eager(dtype_name):
    lucid.manual_seed(0)
    dtype = getattr(lucid, dtype_name)
    model = nn.Sequential(
        nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 40), nn.GELU(), nn.Linear(40, 8)
    )
    model = model.to(dtype).eval()
    x = lucid.randn(10, 24).to(dtype)
    compiled = lucid.compile(model)
    with lucid.no_grad():
        got, want = compiled(x).numpy(), model(x).numpy()
        instrs = [row["instr"] for row in compiled.profile(x, repeats=1)]
    assert compiled.cache_info()["reasons"] == {}
    assert len(instrs) == 3 and all("= gemm{" in i for i in instrs), instrs
    assert sum("activation=s'relu'" in i for i in instrs) == 1
    assert sum("activation=s'gelu'" in i for i in instrs) == 1
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=2**-6, atol=2**-6
    )
