"""Lucid's sgemm split across threads by rows (M >= N, more chunks than threads) packs op(B)
once for all chunks: results equal a float64 numpy reference and the single-thread bits, on both
register tiles (the AVX2 one forced with ``set_sgemm_isa("avx2")``); and the worker pool hands
back-to-back runs to a worker still watching for them as to one that went to sleep."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import set_num_threads

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _product(m, n, k, tb, isa, threads, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    c = np.empty((m, n), np.float32)
    set_num_threads(threads)
    _native.set_sgemm_isa(isa)
    _native.sgemm(a, b, c, transpose_b=tb, bias=bias, activation="relu")
    want = np.maximum(a.astype(np.float64) @ (b.T if tb else b).astype(np.float64) + bias, 0)
    return c, want


@settings(max_examples=8, deadline=None)
@given(
    m=st.integers(200, 700),
    n=st.integers(16, 200),
    k=st.sampled_from([64, 300, 513]),
    tb=st.booleans(),
    isa=st.sampled_from(["auto", "avx2"]),
    seed=st.integers(0, 2**16),
)
def test_row_split_products_match_reference_and_one_thread(m, n, k, tb, isa, seed):
    two, want = _product(m, n, k, tb, isa, 2, seed)
    one, _ = _product(m, n, k, tb, isa, 1, seed)
    np.testing.assert_array_equal(two, one)
    np.testing.assert_allclose(two, want, rtol=1e-4, atol=1e-3 * np.sqrt(k))


def test_back_to_back_runs_reach_a_watching_and_a_sleeping_worker():
    """Runs handed to the worker while it still watches for the next one (straight after a run)
    and after it went to sleep (a pause of milliseconds) give the single-thread bits."""
    one, _ = _product(300, 120, 257, True, "auto", 1, 5)
    set_num_threads(2)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((300, 257), dtype=np.float32)
    b = rng.standard_normal((120, 257), dtype=np.float32)
    bias = rng.standard_normal(120, dtype=np.float32)
    for pause in [0.0] * 20 + [0.002] * 5:
        c = np.empty((300, 120), np.float32)
        _native.sgemm(a, b, c, transpose_b=True, bias=bias, activation="relu")
        np.testing.assert_array_equal(c, one)
        time.sleep(pause)
