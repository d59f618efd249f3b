"""Reductions whose innermost dims are reduced (BatchNorm's statistics over N, H, W): the
split, ISA-dispatched channel path gives the serial walk's bits (each output adds its runs in
memory order, each run summed in double by eight partial sums), at one and two threads, and agrees
with float64 numpy."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import CPUBackend, Program, set_num_threads

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _sum_run(run: np.ndarray) -> float:
    """row_sums.h's sum_run: eight partial sums over whole chunks, then the tail."""
    acc = [0.0] * 8
    whole = len(run) // 8 * 8
    for k in range(0, whole, 8):
        for lane in range(8):
            acc[lane] += float(run[k + lane])
    tail = 0.0
    for k in range(whole, len(run)):
        tail += float(run[k])
    return tail + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


def _sq_dev_run(run: np.ndarray, mean: float) -> float:
    acc = [0.0] * 8
    whole = len(run) // 8 * 8
    for k in range(0, whole, 8):
        for lane in range(8):
            d = float(run[k + lane]) - mean
            acc[lane] += d * d
    tail = 0.0
    for k in range(whole, len(run)):
        d = float(run[k]) - mean
        tail += d * d
    return tail + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


def _model(op: str, x: np.ndarray, lead: int) -> np.ndarray:
    """The kernel's order for x viewed as [R0, K, R1] with R0 = prod(shape[:lead])."""
    r0 = int(np.prod(x.shape[:lead]))
    k = x.shape[lead]
    if k == 1:  # the kernel merges the reduced groups around a kept dim of 1: one run
        r0 = 1
    v = x.reshape(r0, k, -1)
    count = r0 * v.shape[2]
    sums = np.zeros(k)
    for c in range(k):
        a = 0.0
        for i in range(r0):
            a += _sum_run(v[i, c])
        sums[c] = a
    if op == "reduce_sum":
        return sums.astype(x.dtype)
    means = sums / count
    if op == "reduce_mean":
        return means.astype(x.dtype)
    sq = np.zeros(k)
    for c in range(k):
        a = 0.0
        for i in range(r0):
            a += _sq_dev_run(v[i, c], means[c])
        sq[c] = a
    return (sq / count).astype(x.dtype)


def _run(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    p = Program()
    s = p.feed(x.shape, "f32" if x.dtype == np.float32 else "f64")
    p.result(p.op(op, s, axes=axes, keepdims=False))
    return CPUBackend(cache=False).compile(p).run([x])[0]


def _numpy(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    w = x.astype(np.float64)
    if op == "reduce_sum":
        return w.sum(axis=axes)
    if op == "reduce_mean":
        return w.mean(axis=axes)
    return w.var(axis=axes)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "variance"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.lists(st.integers(1, 7), min_size=2, max_size=4),
    lead=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
)
def test_channel_reductions_match_the_walk_bit_for_bit(op, dtype, shape, lead, seed):
    lead = min(lead, len(shape) - 2)
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype) * 3 + 1
    axes = tuple(d for d in range(len(shape)) if d != lead)
    got = _run(op, x, axes)
    np.testing.assert_array_equal(got, _model(op, x, lead))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, _numpy(op, x, axes), rtol=rtol)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "variance"])
def test_split_channel_reductions_give_the_same_bits_at_one_and_two_threads(op):
    x = np.random.default_rng(3).standard_normal((4, 9, 64, 65)).astype(np.float32)
    outs = []
    for n in (1, 2):
        set_num_threads(n)
        outs.append(_run(op, x, (0, 2, 3)))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], _numpy(op, x, (0, 2, 3)), rtol=1e-5)
    np.testing.assert_array_equal(outs[0][:2], _model(op, x[:, :2], 1))
