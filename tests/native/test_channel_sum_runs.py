"""Per-channel sums over (N, H, W) on the run lengths native/src/reduce.cpp specializes (1, 2, 4
and 16 elements: a ResNet's 1 x 1, 2 x 2 and 4 x 4 planes) and the general ones: the chunk is
walked in memory order, and each channel still adds its runs in image order, each run summed in
double by eight partial sums then its tail (row_sums.h's sum_run). Bit for bit against that
model at one and two threads, close to float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _sum_run(run: np.ndarray, mean: float | None = None) -> float:
    vals = [float(v) - mean for v in run] if mean is not None else [float(v) for v in run]
    if mean is not None:
        vals = [v * v for v in vals]
    acc = [0.0] * 8
    whole = len(vals) // 8 * 8
    for k in range(0, whole, 8):
        for lane in range(8):
            acc[lane] += vals[k + lane]
    tail = 0.0
    for v in vals[whole:]:
        tail += v
    return tail + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


def _model(op: str, x: np.ndarray) -> np.ndarray:
    n, c = x.shape[:2]
    v = x.reshape(n, c, -1)
    count = n * v.shape[2]
    sums = np.array([sum_runs(v[:, k], None) for k in range(c)])
    if op == "reduce_sum":
        return sums.astype(x.dtype)
    means = sums / count
    if op == "reduce_mean":
        return means.astype(x.dtype)
    sq = np.array([sum_runs(v[:, k], means[k]) for k in range(c)])
    return (sq / count).astype(x.dtype)


def sum_runs(runs: np.ndarray, mean: float | None) -> float:
    a = 0.0
    for run in runs:
        a += _sum_run(run, mean)
    return a


def _run(op: str, x: np.ndarray) -> np.ndarray:
    p = Program()
    s = p.feed(x.shape, "f32")
    p.result(p.op(op, s, axes=(0, 2, 3), keepdims=False))
    return CPUBackend(cache=False).compile(p).run([x])[0]


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "variance"])
@pytest.mark.parametrize(
    "shape",
    [
        (16, 300, 1, 1),
        (16, 200, 1, 2),
        (16, 512, 2, 2),
        (16, 256, 4, 4),
        (16, 128, 8, 8),
        (5, 33, 3, 7),
        (3, 2, 40, 41),
    ],
)
def test_channel_sums_match_the_run_model_at_one_and_two_threads(op, shape):
    x = (np.random.default_rng(11).standard_normal(shape) * 3 + 1).astype(np.float32)
    outs = []
    for threads in (1, 2):
        set_num_threads(threads)
        outs.append(_run(op, x))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], _model(op, x))
    wide = x.astype(np.float64)
    want = {"reduce_sum": wide.sum, "reduce_mean": wide.mean, "variance": wide.var}[op](
        axis=(0, 2, 3)
    )
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
