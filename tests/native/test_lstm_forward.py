"""The native LSTM forward (native/src/lstm.cpp) against a float64 numpy reference: the fused
AVX-512 step (weights packed in blocks of 16 hidden units, the cell finished in registers) and,
forced with ``set_sgemm_isa("avx2")``, the AVX2 path (the transposed GEMM and the row pass), over
shapes that leave partial unit blocks and row tiles, with and without bias, reversed, and with
the saved cells and gates of training."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu.program import Program


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def reference_lstm(x, h0, c0, w_hh, b_hh, reverse):
    """y, h_n, c_n, cells, activated gates ([i, f, g, o] along the last axis) in float64."""
    x, h, c, w = (np.asarray(a, np.float64) for a in (x, h0, c0, w_hh))
    b = np.asarray(b_hh, np.float64)
    length, hidden = x.shape[0], w.shape[1]
    y = np.zeros(x.shape[:2] + (hidden,))
    cells, gates = np.zeros_like(y), np.zeros_like(x)
    for t in range(length - 1, -1, -1) if reverse else range(length):
        pre = x[t] + (h @ w.T + b)
        i, f = _sigmoid(pre[:, :hidden]), _sigmoid(pre[:, hidden : 2 * hidden])
        g, o = np.tanh(pre[:, 2 * hidden : 3 * hidden]), _sigmoid(pre[:, 3 * hidden :])
        c = i * g + f * c
        h = o * np.tanh(c)
        y[t], cells[t], gates[t] = h, c, np.concatenate([i, f, g, o], axis=1)
    return [y, h, c, cells, gates]


def run_native(length, batch, hidden, bias, reverse, save, seed, scale=0.6):
    rng = np.random.default_rng(seed)
    shapes = [(length, batch, 4 * hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden)]
    feeds = [(rng.standard_normal(s) * scale).astype(np.float32) for s in shapes]
    # Without a bias the operand is a 0-d placeholder the kernel does not read.
    b_hh = rng.standard_normal(4 * hidden) * scale if bias else np.zeros(())
    feeds.append(np.asarray(b_hh, np.float32))
    p = Program()
    slots = [p.feed(f.shape) for f in feeds]
    p.result(*p.op_results("lstm", *slots, reverse=reverse, save=save))
    got = _native.compile(p.describe(), cache=False).run(feeds)
    want = reference_lstm(*feeds, reverse)
    return got, want if save else want[:3]


@pytest.fixture(params=["auto", "avx2"])
def isa(request):
    """Each test on the CPU's best path and on the AVX2 one (the fused step needs AVX-512)."""
    _native.set_sgemm_isa(request.param)
    yield request.param
    _native.set_sgemm_isa("auto")


def _check(length, batch, hidden, bias, reverse, save, seed, scale=0.6):
    got, want = run_native(length, batch, hidden, bias, reverse, save, seed, scale)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "length, batch, hidden, bias, reverse, save",
    [
        (3, 16, 40, True, False, False),  # three row tiles (6, 6, 4), a partial unit block
        (2, 7, 32, False, True, True),  # two full unit blocks, a one-row tile, saved state
        (4, 1, 5, True, True, True),  # one row, one partial block
    ],
)
def test_lstm_forward_matches_the_float64_reference(
    isa, length, batch, hidden, bias, reverse, save
):
    _check(length, batch, hidden, bias, reverse, save, seed=0)


def test_saturated_gates_and_non_finite_inputs(isa):
    # Pre-activations far past the nonlinearities' knees: sigmoid at 0 and 1, tanh at -1 and 1.
    _check(2, 5, 20, True, False, True, seed=1, scale=40.0)
    rng = np.random.default_rng(3)
    feeds = [(rng.standard_normal(s) * 0.5).astype(np.float32)
             for s in [(2, 3, 68), (3, 17), (3, 17), (68, 17), (68,)]]  # fmt: skip
    feeds[0][0, 1, 5] = np.nan  # row 1's input gate of unit 5
    feeds[0][1, 2, 40] = np.inf  # row 2's tanh gate of unit 6: g = 1
    p = Program()
    p.result(*p.op_results("lstm", *(p.feed(f.shape) for f in feeds)))
    y, _, _ = _native.compile(p.describe(), cache=False).run(feeds)
    with np.errstate(invalid="ignore"):
        want = reference_lstm(*feeds, False)[0]
    assert np.isnan(y[0, 1, 5]) and np.isnan(y[1, 1, 5])  # carried through the cell state
    finite = ~np.isnan(want)
    np.testing.assert_allclose(y[finite], want[finite], rtol=2e-5, atol=2e-5)


@settings(max_examples=12, deadline=None)
@given(
    length=st.integers(1, 3),
    batch=st.integers(1, 14),
    hidden=st.integers(1, 36),
    bias=st.booleans(),
    reverse=st.booleans(),
    save=st.booleans(),
    seed=st.integers(0, 2**16),
    forced_avx2=st.booleans(),
)
def test_lstm_forward_over_shapes(length, batch, hidden, bias, reverse, save, seed, forced_avx2):
    _native.set_sgemm_isa("avx2" if forced_avx2 else "auto")
    try:
        _check(length, batch, hidden, bias, reverse, save, seed)
    finally:
        _native.set_sgemm_isa("auto")
