"""Lucid's sgemm with a transposed B (weights stored [N, K], read one 8-row group at a time while
packed, with the next group's or sliver's lines asked for ahead): results equal a float64 numpy
reference and the single-thread bits on both register tiles, for workload F's shapes and odd
ones (row counts not a multiple of 8 or of the 64-column sliver, contraction lengths off the
8-step transposes, B rows farther apart than K), with bias, addend and GELU epilogues, and for
float16 / bfloat16 weights through gemm_mixed."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import set_num_threads

pytestmark = [
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 and FMA"),
    pytest.mark.usefixtures("fixed_threads"),
]


def _gelu64(x):
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def _operands(m, n, k, ld_extra, epilogue, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    # B rows ld_extra floats farther apart than K: a view into a wider array.
    b = rng.standard_normal((n, k + ld_extra), dtype=np.float32)[:, :k]
    bias = rng.standard_normal(n, dtype=np.float32) if epilogue == "bias" else None
    addend = rng.standard_normal((m, n), dtype=np.float32) if epilogue == "addend" else None
    return a, b, bias, addend


def _reference(a, b, bias, addend, activation):
    want = a.astype(np.float64) @ b.T.astype(np.float64)
    if bias is not None:
        want += bias
    if addend is not None:
        want += addend
    return _gelu64(want) if activation == "gelu" else want


def _run(a, b, bias, addend, activation, isa, threads):
    c = np.empty((a.shape[0], b.shape[0]), np.float32)
    set_num_threads(threads)
    _native.set_sgemm_isa(isa)
    _native.sgemm(a, b, c, transpose_b=True, bias=bias, addend=addend, activation=activation)
    return c


def _check(m, n, k, ld_extra, epilogue, activation, isa, seed):
    a, b, bias, addend = _operands(m, n, k, ld_extra, epilogue, seed)
    two = _run(a, b, bias, addend, activation, isa, 2)
    one = _run(a, b, bias, addend, activation, isa, 1)
    np.testing.assert_array_equal(two, one)
    want = _reference(a, b, bias, addend, activation)
    np.testing.assert_allclose(two, want, rtol=1e-4, atol=1e-3 * np.sqrt(k))
    return two


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(6, 300),
    n=st.integers(16, 300),
    k=st.integers(1, 600),
    ld_extra=st.sampled_from([0, 3, 512]),
    epilogue=st.sampled_from(["none", "bias", "addend"]),
    activation=st.sampled_from(["none", "gelu"]),
    isa=st.sampled_from(["auto", "avx2"]),
    seed=st.integers(0, 2**16),
)
def test_transposed_b_products_match_reference_and_one_thread(
    m, n, k, ld_extra, epilogue, activation, isa, seed
):
    _check(m, n, k, ld_extra, epilogue, activation, isa, seed)


@pytest.mark.parametrize(
    "m,k,n,epilogue,activation",
    [
        (512, 2048, 512, "addend", "none"),  # F's feed-forward down projection + residual
        (512, 512, 2048, "bias", "gelu"),  # F's feed-forward up projection
        (512, 512, 1536, "none", "none"),  # F's QKV projection
        (512, 512, 512, "addend", "none"),  # F's output projection + residual
    ],
)
def test_workload_f_shapes(m, k, n, epilogue, activation):
    got = _check(m, n, k, 0, epilogue, activation, "auto", 7)
    avx2 = _check(m, n, k, 0, epilogue, activation, "avx2", 7)
    np.testing.assert_array_equal(got, avx2)  # both tiles give the same bits


@pytest.mark.slow
def test_workload_f_vocabulary_projection():
    _check(512, 8192, 512, 0, "none", "none", "auto", 3)


@settings(max_examples=10, deadline=None)
@given(
    m=st.integers(6, 200),
    n=st.integers(16, 200),
    k=st.integers(1, 400),
    b_type=st.sampled_from(["float16", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_half_transposed_b_matches_reference(m, n, k, b_type, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    dtype = np.float16 if b_type == "float16" else ml_dtypes.bfloat16
    b = rng.standard_normal((n, k)).astype(dtype)
    results = []
    for threads in (1, 2):
        set_num_threads(threads)
        c = np.empty((m, n), np.float32)
        _native.gemm_mixed(a, b, c, transpose_b=True)
        results.append(c)
    np.testing.assert_array_equal(results[0], results[1])
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(results[1], want, rtol=1e-4, atol=1e-3 * np.sqrt(k))
