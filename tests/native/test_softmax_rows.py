"""The native float32 softmax and log_softmax over rows (native/src/reduce.cpp): the AVX-512 copy
and the AVX2 one (forced with ``set_sgemm_isa("avx2")``) compile the same source, so they give
the same bits; both agree with a float64 numpy reference, NaN and infinite rows included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu.program import Program


def _run(x: np.ndarray, op: str, isa: str) -> np.ndarray:
    p = Program()
    p.result(p.op(op, p.feed(x.shape), axis=-1))
    _native.set_sgemm_isa(isa)
    try:
        return _native.compile(p.describe(), cache=False).run([x])[0]
    finally:
        _native.set_sgemm_isa("auto")


def _reference(x: np.ndarray, op: str) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        z = x - x.max(axis=-1, keepdims=True)
        total = np.exp(z).sum(axis=-1, keepdims=True)
        return z - np.log(total) if op == "log_softmax" else np.exp(z) / total


def _check(x: np.ndarray, op: str) -> None:
    best, avx2 = _run(x, op, "auto"), _run(x, op, "avx2")
    np.testing.assert_array_equal(best.view(np.int32), avx2.view(np.int32))
    # log_softmax subtracts a float32 shift of the inputs' size: its error scales with them.
    atol = 2e-7 if op == "softmax" else 2e-7 * (1 + float(np.abs(x[np.isfinite(x)]).max()))
    np.testing.assert_allclose(best, _reference(x, op), rtol=2e-6, atol=atol)


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 300),
    op=st.sampled_from(["softmax", "log_softmax"]),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_rows_match_reference_and_both_isas(rows, cols, op, scale, seed):
    rng = np.random.default_rng(seed)
    _check((rng.standard_normal((rows, cols)) * scale).astype(np.float32), op)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_causal_masked_scores_and_non_finite_rows(op):
    rng = np.random.default_rng(0)
    # Attention's causal scores: -inf above the diagonal, over 4 x 8 heads of 128 x 128.
    x = rng.standard_normal((4, 8, 128, 128)).astype(np.float32)
    x[..., np.triu_indices(128, 1)[0], np.triu_indices(128, 1)[1]] = -np.inf
    _check(x, op)
    y = rng.standard_normal((4, 37)).astype(np.float32)
    y[0, 5] = np.nan  # the whole row NaN
    y[1, :] = -np.inf  # exp(-inf - -inf): NaN, as the reference
    y[2, 7] = np.inf
    best, avx2 = _run(y, op, "auto"), _run(y, op, "avx2")
    np.testing.assert_array_equal(best.view(np.int32), avx2.view(np.int32))
    want = _reference(y, op)
    np.testing.assert_array_equal(np.isnan(best), np.isnan(want))
    assert np.isnan(best[0]).all() and np.isnan(best[1]).all()
    finite = ~np.isnan(want)
    np.testing.assert_allclose(best[finite], want[finite], rtol=2e-6, atol=2e-6)
