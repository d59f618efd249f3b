"""Lucid's sgemm on workload F's inference products (native/src/sgemm.cpp): the QKV, feed-forward
and output projections with their epilogues (bias, GELU, residual addend) and the 512 x 8192
head, against float64 numpy references; the same bits at one and two threads and on both
register tiles (the AVX-512 tile finishes its tiles on 16 lanes, GELU included, the AVX2 one on
8); the head's large output stored non-temporally gives the bits of an ordinary store; and the
uneven row chunks of a two-thread split give the single-thread bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import set_num_threads
from lucid.backends.cpu.testing import sgemm_isa as _isa

pytestmark = [
    pytest.mark.usefixtures("fixed_threads"),
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
]

# name: (M, N, K, bias, addend, activation); weights stored [N, K] (transpose_b), as F's are.
F_PRODUCTS = {
    "qkv": (512, 1536, 512, True, False, "none"),
    "ffn_up_gelu": (512, 2048, 512, True, False, "gelu"),
    "ffn_down_residual": (512, 512, 2048, True, True, "none"),
    "out_proj_residual": (512, 512, 512, True, True, "none"),
}


def _operands(m, n, k, bias, addend, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n, dtype=np.float32) if bias else None
    r = rng.standard_normal((m, n), dtype=np.float32) if addend else None
    return a, w, b, r


def _gelu64(x):
    from math import erf

    return x * 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def _reference(a, w, b, r, act):
    out = a.astype(np.float64) @ w.astype(np.float64).T
    if b is not None:
        out = out + b
    if r is not None:
        out = out + r
    return _gelu64(out) if act == "gelu" else out


def _lucid(a, w, b, r, act, threads, c=None):
    set_num_threads(threads)
    if c is None:
        c = np.empty((a.shape[0], w.shape[0]), np.float32)
    _native.sgemm(a, w, c, transpose_b=True, bias=b, addend=r, activation=act, kernel="lucid")
    return c


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(F_PRODUCTS))
def test_f_products_match_float64_and_give_one_set_of_bits(name):
    m, n, k, bias, addend, act = F_PRODUCTS[name]
    a, w, b, r = _operands(m, n, k, bias, addend)
    runs = []
    for isa in ("auto", "avx2"):
        with _isa(isa):
            for threads in (1, 2):
                runs.append(_lucid(a, w, b, r, act, threads))
    want = _reference(a, w, b, r, act)
    np.testing.assert_allclose(runs[0], want, rtol=1e-4, atol=2e-5 * np.sqrt(k))
    for other in runs[1:]:
        np.testing.assert_array_equal(other.view(np.uint32), runs[0].view(np.uint32))


def test_gelu_epilogue_on_special_values_is_the_same_on_both_tiles():
    """NaN, infinities, signed zeros and the erf clamp's edges through the fused GELU: the
    16-lane finisher of the AVX-512 tile against the 8-lane one of the AVX2 tile."""
    rng = np.random.default_rng(3)
    m, n, k = 13, 200, 40
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 5.7, -5.7, 3e38, -3e38, 1e-30, -1e-30]
    bias = rng.standard_normal(n, dtype=np.float32) * 4
    bias[: len(specials)] = specials
    # Columns whose products are exactly zero: the bias alone is GELU's argument there.
    w[: len(specials)] = 0.0
    outs = []
    for isa in ("avx512", "avx2"):
        for act in ("gelu", "relu"):
            with _isa(isa):
                outs.append(_lucid(a, w, bias, None, act, 1))
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[2].view(np.uint32))
    np.testing.assert_array_equal(outs[1].view(np.uint32), outs[3].view(np.uint32))
    gelu, relu = outs[0][0, : len(specials)], outs[1][0, : len(specials)]
    assert np.isnan(gelu[0]) and gelu[1] == np.inf
    assert np.isnan(relu[0]) and relu[1] == np.inf and relu[2] == 0.0


@pytest.mark.slow
def test_head_streamed_output_equals_an_ordinary_store():
    """F's 512 x 8192 head writes a 16 MB output past the caches when its rows are 64-byte
    aligned; a C whose rows start 4 bytes off takes ordinary stores: the same bits, which also
    match float64 at one and two threads."""
    m, n, k = 512, 8192, 512
    a, w, _, _ = _operands(m, n, k, False, False, seed=7)
    buf = np.empty(m * n + 32, np.float32)
    start = (-buf.ctypes.data // 4) % 16  # first 64-byte boundary
    aligned = buf[start : start + m * n].reshape(m, n)
    assert aligned.ctypes.data % 64 == 0
    off = np.empty(m * n + 1, np.float32)[1:].reshape(m, n)
    if off.ctypes.data % 64 == 0:
        off = np.empty(m * n + 2, np.float32)[2:].reshape(m, n)
    outs = []
    for threads in (1, 2):
        aligned[:] = np.nan
        outs.append(_lucid(a, w, None, None, "none", threads, c=aligned).copy())
    outs.append(_lucid(a, w, None, None, "none", 2, c=off).copy())
    want = a.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=2e-5 * np.sqrt(k))
    for other in outs[1:]:
        np.testing.assert_array_equal(other.view(np.uint32), outs[0].view(np.uint32))


@settings(max_examples=10, deadline=None)
@given(
    m=st.integers(100, 800),
    n=st.sampled_from([64, 130, 512]),
    k=st.sampled_from([33, 512, 700]),
    isa=st.sampled_from(["auto", "avx2"]),
    seed=st.integers(0, 2**16),
)
def test_uneven_row_chunks_give_the_single_thread_bits(m, n, k, isa, seed):
    """Two-thread splits whose chunks differ by a sliver (by rows when M > N, by columns when
    M == N): the same bits as one thread, within float32 rounding of float64, with a residual
    addend and bias."""
    m = max(m, n)
    a, w, b, r = _operands(m, n, k, True, True, seed)
    with _isa(isa):
        two = _lucid(a, w, b, r, "none", 2)
        one = _lucid(a, w, b, r, "none", 1)
    np.testing.assert_array_equal(two.view(np.uint32), one.view(np.uint32))
    np.testing.assert_allclose(
        two, _reference(a, w, b, r, "none"), rtol=1e-4, atol=2e-5 * np.sqrt(k)
    )


@settings(max_examples=10, deadline=None)
@given(
    m=st.integers(290, 700),
    n=st.sampled_from([16, 70, 200]),
    k=st.sampled_from([600, 1100, 1537]),
    alpha=st.sampled_from([1.0, 0.5]),
    beta=st.sampled_from([0.0, 1.0, -0.5]),
    act=st.sampled_from(["none", "relu", "gelu"]),
    isa=st.sampled_from(["auto", "avx2"]),
    seed=st.integers(0, 2**16),
)
def test_row_splits_over_several_contraction_blocks_give_the_single_thread_bits(
    m, n, k, alpha, beta, act, isa, seed
):
    """Two threads split these by rows into more chunks than threads over a B packed whole, K
    over several contraction blocks; one thread runs the whole output. Same bits, with every
    epilogue term (beta included), a bottom sliver of fewer than 6 rows and a right edge
    narrower than the tile."""
    a, w, b, r = _operands(m, n, k, True, True, seed)
    c0 = np.random.default_rng(seed + 1).standard_normal((m, n), dtype=np.float32)
    outs = []
    with _isa(isa):
        for threads in (2, 1):
            set_num_threads(threads)
            c = c0.copy()
            _native.sgemm(
                a,
                w,
                c,
                transpose_b=True,
                alpha=alpha,
                beta=beta,
                bias=b,
                addend=r,
                activation=act,
                kernel="lucid",
            )
            outs.append(c)
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    want = alpha * (a.astype(np.float64) @ w.astype(np.float64).T) + beta * c0 + b + r
    if act == "relu":
        want = np.maximum(want, 0)
    elif act == "gelu":
        want = _gelu64(want)
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=2e-5 * np.sqrt(k))
