"""Elementwise chains whose operands broadcast over the leading dims (BatchNorm's [1, C, 1, 1]
scale and shift over [N, C, H, W], a [C, H, W] bias over a batch): the evaluator expands one
period of such an operand per run and reads it in place per block, copying the pieces of a block
that wraps around the period (native/src/elementwise.cpp). Same bits as numpy's float32 ops in
the chain's order, at one and two threads, and close to a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)

pytestmark = pytest.mark.usefixtures("fixed_threads")


def _operand_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    n, c, h, w = shape
    return {
        "channel": (1, c, 1, 1),  # BatchNorm's statistics: periodic over N
        "channel_3d": (c, 1, 1),  # right-aligned, the same view
        "image": (1, c, h, w),  # one image's worth: periodic over N
        "plane": (h, w),  # periodic over N and C
        "row": (w,),  # periodic over N, C and H
        "batch": (n, 1, 1, 1),  # broadcast inside: not periodic (load_block)
        "full": (n, c, h, w),
    }[kind]


def _bn_backward_chain(shape, kinds, seed, threads):
    """(g - (x - m) * k) * s, the shape of BatchNorm's input gradient, with operand shapes
    ``kinds`` for (x, m, g, k, s)."""
    set_num_threads(threads)
    rng = np.random.default_rng(seed)
    vals = [
        (rng.standard_normal(_operand_shape(shape, kind)) * 2 + 0.5).astype(np.float32)
        for kind in kinds
    ]
    p = Program()
    x, m, g, k, s = (p.feed(v.shape, "f32") for v in vals)
    centered = p.op("sub", x, m)
    scaled = p.op("mul", centered, k)
    p.result(p.op("mul", p.op("sub", g, scaled), s))
    got = CPUBackend(cache=False).compile(p).run(vals)[0]
    vx, vm, vg, vk, vs = vals
    same_order = (vg - (vx - vm) * vk) * vs
    wide = [v.astype(np.float64) for v in vals]
    reference = (wide[2] - (wide[0] - wide[1]) * wide[3]) * wide[4]
    return got, same_order, reference


KINDS = st.sampled_from(["channel", "channel_3d", "image", "plane", "row", "batch", "full"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.tuples(st.integers(1, 40), st.integers(1, 70), st.integers(1, 9), st.integers(1, 9)),
    kinds=st.tuples(st.just("full"), KINDS, KINDS, KINDS, KINDS),
    seed=st.integers(0, 2**31 - 1),
    threads=st.sampled_from([1, 2]),
)
def test_periodic_operands_give_numpy_float32_bits(shape, kinds, seed, threads):
    got, same_order, reference = _bn_backward_chain(shape, kinds, seed, threads)
    assert got.shape == reference.shape
    np.testing.assert_array_equal(got, same_order)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "shape",
    [
        (16, 512, 2, 2),  # workload G's stages: periods of 2048, 4096, 8192 and 16384 elements
        (16, 256, 4, 4),
        (16, 128, 8, 8),
        (16, 64, 16, 16),
        (16, 64, 32, 32),  # a period beyond the expansion's limit: load_block
        (64, 3, 7, 11),  # a period of 231: most blocks wrap around it
        (300, 37, 1, 1),  # runs of one element, blocks wrapping, split across threads
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_batch_norm_shaped_chains_match_at_any_thread_count(shape, threads):
    kinds = ("full", "channel", "full", "channel", "channel")
    got, same_order, reference = _bn_backward_chain(shape, kinds, 7, threads)
    np.testing.assert_array_equal(got, same_order)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-4)


def test_normalize_with_channel_operands_matches_its_formula():
    """normalize's four [1, C, 1, 1] operands take the expansion: (x - m) / sqrt(v + eps) * g
    + b in float32, element by element."""
    rng = np.random.default_rng(3)
    shape = (8, 96, 3, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    m, g, b = (rng.standard_normal((1, 96, 1, 1)).astype(np.float32) for _ in range(3))
    v = rng.random((1, 96, 1, 1)).astype(np.float32) + 0.1
    p = Program()
    feeds = [p.feed(a.shape, "f32") for a in (x, m, v, g, b)]
    p.result(p.op("relu", p.op("normalize", *feeds, epsilon=1e-5)))
    got = CPUBackend(cache=False).compile(p).run([x, m, v, g, b])[0]
    want = np.maximum((x - m) / np.sqrt(v + np.float32(1e-5)) * g + b, 0)
    np.testing.assert_array_equal(got, want)
