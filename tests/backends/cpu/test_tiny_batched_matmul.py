"""Batches of matrices with a few multiply-adds each (an adaptive average pool over 2x2 planes):
the loop path against float64 numpy, transposes, broadcast batch dims and gemm's alpha, bias and
addend included, and the same bits at one and two threads."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import CPUBackend, Program, set_num_threads

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _matmul(a, b, ta, tb):
    a = np.swapaxes(a, -1, -2) if ta else a
    b = np.swapaxes(b, -1, -2) if tb else b
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 4),
    n=st.integers(1, 4),
    k=st.integers(1, 4),
    batch=st.lists(st.integers(1, 5), min_size=1, max_size=2),
    a_batched=st.booleans(),
    ta=st.booleans(),
    tb=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_tiny_batched_matmul_matches_numpy(dtype, m, n, k, batch, a_batched, ta, tb, seed):
    rng = np.random.default_rng(seed)
    npd = np.float32 if dtype == "f32" else np.float64
    a_shape = (*batch, *((k, m) if ta else (m, k))) if a_batched else ((k, m) if ta else (m, k))
    b_shape = (*batch, *((n, k) if tb else (k, n)))
    a = rng.standard_normal(a_shape).astype(npd)
    b = rng.standard_normal(b_shape).astype(npd)
    p = Program()
    sa, sb = p.feed(a.shape, dtype), p.feed(b.shape, dtype)
    p.result(p.op("matmul", sa, sb, transpose_a=ta, transpose_b=tb))
    got = CPUBackend(cache=False).compile(p).run([a, b])[0]
    tol = 1e-5 if dtype == "f32" else 1e-12
    np.testing.assert_allclose(got, _matmul(a, b, ta, tb), rtol=tol, atol=tol)


def test_tiny_batched_matmul_over_many_planes_is_split_with_the_same_bits():
    # workload G's head: a [1, 2] pooling row times each 2x2 plane of f32[16, 512, 2, 2].
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 512, 2, 2)).astype(np.float32)
    row = np.full((1, 2), 0.5, np.float32)
    p = Program()
    sr, sx = p.feed(row.shape, "f32"), p.feed(x.shape, "f32")
    p.result(p.op("matmul", sr, sx))
    p.result(p.op("matmul", sx, sr, transpose_a=True, transpose_b=True))
    ex = CPUBackend(cache=False).compile(p)
    outs = []
    for threads in (1, 2):
        set_num_threads(threads)
        outs.append(ex.run([row, x]))
    for one, two in zip(*outs, strict=True):
        np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(outs[0][0], _matmul(row, x, False, False), rtol=1e-6)
    np.testing.assert_allclose(outs[0][1], _matmul(x, row, True, True), rtol=1e-6)


@pytest.mark.parametrize("m, n, k", [(2, 3, 0), (0, 3, 2), (2, 0, 2)])
def test_tiny_batched_matmul_with_an_empty_dimension(m, n, k):
    a = np.ones((4, m, k), np.float32)
    b = np.ones((4, k, n), np.float32)
    p = Program()
    sa, sb = p.feed(a.shape, "f32"), p.feed(b.shape, "f32")
    p.result(p.op("matmul", sa, sb))
    got = CPUBackend(cache=False).compile(p).run([a, b])[0]
    np.testing.assert_array_equal(got, np.zeros((4, m, n), np.float32))


def test_tiny_batched_matmul_overflowing_products_keep_the_sign():
    # Each product overflows float32 when rounded alone (about 1e60); a fused multiply-add keeps
    # the first infinity, as BLAS does, where separate rounding meets -inf + inf = NaN. The
    # float64 sum is -1e60: float32's -inf.
    a = np.array([[[-2e30, 1e30]], [[-2e30, 1e30]]], np.float32)  # [2, 1, 2]
    b = np.full((2, 2, 1), 1e30, np.float32)
    p = Program()
    slots = [p.feed(a.shape, "f32"), p.feed(b.shape, "f32")]
    p.result(p.op("matmul", *slots, transpose_a=False, transpose_b=False))
    got = CPUBackend(cache=False).compile(p).run([a, b])[0]
    with np.errstate(over="ignore"):
        want = _matmul(a, b, False, False).astype(np.float32)
    assert np.isneginf(want).all()
    np.testing.assert_array_equal(got, want)
