"""Kernels compiled per ISA (the AVX-512 and AVX2 copies of the max pools, BatchNorm's
normalize, the channel reductions) give the same bits whichever copy runs, and normalize's bits
are float32 numpy's step-by-step formula."""

import numpy as np
import pytest

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program


@pytest.fixture
def run_at_isas():
    def run(program: Program, feeds: list[np.ndarray]) -> list[list[np.ndarray]]:
        ex = CPUBackend(cache=False).compile(program)
        outs = []
        try:
            for isa in ("auto", "avx2"):
                _native.set_sgemm_isa(isa)
                outs.append(ex.run([f.copy() for f in feeds]))
        finally:
            _native.set_sgemm_isa("auto")
        return outs

    return run


@pytest.mark.parametrize("shape", [(2, 3, 5, 37), (16, 8, 4, 4), (1, 1, 1, 1)])
def test_normalize_bits_equal_float32_numpy_at_every_isa(run_at_isas, shape):
    rng = np.random.default_rng(0)
    stat = (1, shape[1], 1, 1)
    x = rng.standard_normal(shape).astype(np.float32)
    m, g, b = (rng.standard_normal(stat).astype(np.float32) for _ in range(3))
    v = rng.random(stat).astype(np.float32) + np.float32(0.5)
    p = Program()
    slots = [p.feed(a.shape, "f32") for a in (x, m, v, g, b)]
    p.result(p.op("normalize", *slots, epsilon=1e-5))
    want = (x - m) / np.sqrt(v + np.float32(1e-5)) * g + b
    for (got,) in run_at_isas(p, [x, m, v, g, b]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "op, kernel, strides, padding",
    [
        ("max_pool2d", (3, 3), (2, 2), (1, 1, 1, 1)),
        ("max_pool2d_grad", (3, 3), (2, 2), (1, 1, 1, 1)),
        ("max_pool2d", (3, 2), (1, 3), (1, 0, 1, 0)),
        ("max_pool2d_grad", (2, 3), (3, 1), (0, 1, 1, 1)),
    ],
)
def test_max_pool_bits_are_the_same_at_every_isa(run_at_isas, op, kernel, strides, padding):
    rng = np.random.default_rng(1)
    x = rng.integers(-2, 3, size=(2, 3, 19, 41)).astype(np.float32)  # ties
    x[rng.random(x.shape) < 0.05] = np.nan
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "dilation": (1, 1)}
    p = Program()
    xs = p.feed(x.shape, "f32")
    pooled = p.op("max_pool2d", xs, **attrs)
    if op == "max_pool2d":
        p.result(pooled)
        feeds = [x]
    else:
        dy = p.feed(p.slots[pooled].shape, "f32")
        p.result(p.op("max_pool2d_grad", dy, xs, **attrs))
        feeds = [x, rng.standard_normal(p.slots[pooled].shape).astype(np.float32)]
    first, second = run_at_isas(p, feeds)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(np.signbit(first[0]), np.signbit(second[0]))
