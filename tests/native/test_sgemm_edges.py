"""Lucid's sgemm on edge shapes (M, N, K off the tile sizes, K = 1, tiny products) and on wide
products split in 256-column chunks (N >= 1536): results match a float64 numpy reference, and
give the same bits at one and two threads and on the AVX2 and AVX-512 tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import set_num_threads

pytestmark = [
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
    pytest.mark.usefixtures("fixed_threads"),
]


def _operands(m, n, k, tb, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    addend = rng.standard_normal((m, n), dtype=np.float32)
    want = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64) + bias + addend
    return a, b, bias, addend, want


def _run(a, b, bias, addend, tb, isa, threads):
    set_num_threads(threads)
    _native.set_sgemm_isa(isa)
    c = np.full((a.shape[0], b.shape[0] if tb else b.shape[1]), np.nan, np.float32)
    _native.sgemm(a, b, c, transpose_b=tb, bias=bias, addend=addend)
    return c


def _check(m, n, k, tb, seed):
    a, b, bias, addend, want = _operands(m, n, k, tb, seed)
    base = _run(a, b, bias, addend, tb, "avx2", 1)
    np.testing.assert_allclose(base, want, rtol=1e-4, atol=1e-4 * np.sqrt(k) + 1e-5)
    for isa, threads in [("avx2", 2), ("auto", 1), ("auto", 2), ("avx512", 2)]:
        np.testing.assert_array_equal(_run(a, b, bias, addend, tb, isa, threads), base)


@settings(max_examples=25, deadline=None)
@given(
    m=st.sampled_from([1, 5, 6, 7, 13, 14, 15, 97]),
    n=st.sampled_from([1, 15, 16, 17, 33, 63, 64, 65, 129]),
    k=st.sampled_from([1, 2, 7, 255, 256, 257, 513]),
    tb=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_edge_shapes_match_reference_and_agree_across_tiles_and_threads(m, n, k, tb, seed):
    _check(m, n, k, tb, seed)


@settings(max_examples=6, deadline=None)
@given(
    m=st.integers(30, 140),
    n=st.integers(1536, 2200),
    k=st.sampled_from([1, 64, 300]),
    tb=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_wide_products_in_wide_column_chunks_match_reference_and_bits(m, n, k, tb, seed):
    _check(m, n, k, tb, seed)
