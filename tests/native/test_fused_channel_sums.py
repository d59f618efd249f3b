"""An elementwise output read only by the next instruction, a per-channel sum or mean over
(N, H, W) (BatchNorm's variance of (x - mean)^2, its backward's sums), is summed as it is computed
and never written (native/src/runtime.cpp pairs them, elementwise.cpp runs the pair): the same
bits as the two steps apart, at one and two threads, close to float64 numpy; pairs that do not
qualify run as before."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _variance_program(shape: tuple[int, ...], op: str, keep_centered: bool) -> Program:
    """(x - m)^2 summed (or averaged) per channel; with ``keep_centered`` x - m is a second
    result scaled by the sum (BatchNorm's backward keeps it)."""
    p = Program()
    x = p.feed(shape, "f32")
    m = p.feed((1, shape[1], 1, 1), "f32")
    centered = p.op("sub", x, m)
    stat = p.op(op, p.op("mul", centered, centered), axes=(0, 2, 3), keepdims=True)
    p.result(stat)
    if keep_centered:
        p.result(p.op("mul", centered, stat))
    return p


def _compile_and_run(p: Program, feeds: list[np.ndarray], fused: bool, threads: int):
    _native.set_fused_reductions(fused)
    set_num_threads(threads)
    ex = CPUBackend(cache=False).compile(p)
    return ex.run(feeds), list(ex.fused_reductions)


def _feeds(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    m = rng.standard_normal((1, shape[1], 1, 1)).astype(np.float32)
    return [x, m]


def _check(shape, op, keep_centered, seed, expect_fused):
    p = _variance_program(shape, op, keep_centered)
    feeds = _feeds(shape, seed)
    apart, none = _compile_and_run(p, feeds, False, 1)
    assert none == []
    for threads in (1, 2):
        together, pairs = _compile_and_run(p, feeds, True, threads)
        assert bool(pairs) == expect_fused
        for a, b in zip(together, apart, strict=True):
            np.testing.assert_array_equal(a, b)
    x, m = (f.astype(np.float64) for f in feeds)
    sq = ((x - m) ** 2).sum(axis=(0, 2, 3), keepdims=True)
    if op == "reduce_mean":
        sq /= shape[0] * shape[2] * shape[3]
    np.testing.assert_allclose(apart[0], sq, rtol=1e-5)
    if keep_centered:
        np.testing.assert_allclose(apart[1], (x - m) * sq, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
@pytest.mark.parametrize("keep_centered", [False, True])
@pytest.mark.parametrize(
    ("shape", "expect_fused"),
    [
        ((16, 64, 32, 32), True),  # workload G's stem: runs of one block
        ((16, 64, 16, 16), True),
        ((16, 128, 8, 8), True),  # runs of 64: sixteen per block
        ((3, 5, 30, 50), True),  # runs of 1500: two blocks each, the second partial
        ((4, 7, 9, 11), True),  # runs of 99: blocks of ten runs, the last short
        ((16, 256, 4, 4), False),  # short runs: the channel sums walk them alone
    ],
)
def test_fused_channel_sums_give_the_separate_steps_bits(op, keep_centered, shape, expect_fused):
    _check(shape, op, keep_centered, 5, expect_fused)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 9), st.integers(8, 40), st.integers(8, 40)),
    op=st.sampled_from(["reduce_sum", "reduce_mean"]),
    keep_centered=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_fused_channel_sums_over_hypothesis_shapes(shape, op, keep_centered, seed):
    # One channel leaves nothing kept between the reduced dims: a plain sum, not paired.
    _check(shape, op, keep_centered, seed, expect_fused=shape[1] > 1)


def test_an_output_read_again_is_written_and_not_fused():
    """The squared deviations are a result too: they must be written, so no pairing."""
    shape = (4, 6, 10, 10)
    p = Program()
    x = p.feed(shape, "f32")
    m = p.feed((1, 6, 1, 1), "f32")
    centered = p.op("sub", x, m)
    sq = p.op("mul", centered, centered)
    p.result(p.op("reduce_sum", sq, axes=(0, 2, 3), keepdims=False))
    p.result(sq)
    feeds = _feeds(shape, 1)
    (total, squares), pairs = _compile_and_run(p, feeds, True, 2)
    assert pairs == []
    want = (feeds[0] - feeds[1]) * (feeds[0] - feeds[1])
    np.testing.assert_array_equal(squares, want)
    np.testing.assert_allclose(total, want.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)


def test_a_reduction_that_is_not_per_channel_is_not_fused():
    shape = (4, 6, 10, 10)
    p = Program()
    x = p.feed(shape, "f32")
    m = p.feed((1, 6, 1, 1), "f32")
    centered = p.op("sub", x, m)
    p.result(p.op("reduce_sum", p.op("mul", centered, centered), axes=(1,), keepdims=False))
    feeds = _feeds(shape, 2)
    (got,), pairs = _compile_and_run(p, feeds, True, 2)
    assert pairs == []
    want = ((feeds[0] - feeds[1]).astype(np.float64) ** 2).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
