"""Lowering rules of random ops onto prim's counter-based draws (Philox-4x32-10), fed by the
graph's RNG-state operand.

Eager kernels draw from the same Philox stream with the same formulas, so ``uniform``, ``normal``,
``randint`` (ranges up to 2**53) and ``bernoulli_mask`` give the same numbers compiled as eager for
a (key, counter) state. ``randperm`` follows the same law but not eager's numbers: eager argsorts
raw 32-bit words, which prim does not expose.
"""

from __future__ import annotations

import numpy as np

from lucid import _dtype
from lucid.passes.lowering._core import Builder, LoweringUnsupported, lower_dtype, rule


def _float_dtype(dt: _dtype.dtype) -> _dtype.dtype:
    return _dtype.float64 if dt is _dtype.float64 else _dtype.float32


@rule("uniform")
def _uniform(b: Builder, rng, shape, dtype, low, high):
    dt = b.outs[0].dtype
    u = b.op("random_uniform", rng, shape=tuple(shape), dtype=lower_dtype(dt), low=low, high=high)
    if high > low:  # rounding must not reach the open upper bound (as eager)
        top = float(np.nextafter(dt.numpy.type(high), dt.numpy.type(low)))
        u = b.binary("minimum", u, top, dt)
    return u


@rule("normal")
def _normal(b: Builder, rng, shape, dtype, mean, std):
    dt = b.outs[0].dtype
    return b.op("random_normal", rng, shape=tuple(shape), dtype=lower_dtype(dt), mean=mean, std=std)


@rule("randint")
def _randint(b: Builder, rng, shape, dtype, low, high):
    if high - low > 2**53:
        raise LoweringUnsupported("randint over a range wider than 2**53 (drawn through float64)")
    u = b.op(
        "random_uniform", rng, shape=tuple(shape), dtype="f64", low=float(low), high=float(high)
    )
    drawn = b.binary("minimum", b.op("floor", u), float(high - 1), _dtype.float64)
    return b.cast(drawn, b.outs[0].dtype)


@rule("bernoulli_mask")
def _bernoulli_mask(b: Builder, rng, v, p):
    out = b.outs[0]
    if p >= 1:
        return b.full(0, out.shape, out.dtype)
    draw_dt = _float_dtype(out.dtype)
    u = b.op("random_uniform", rng, shape=out.shape, dtype=lower_dtype(draw_dt))
    keep = b.cast(b.binary("ge", u, p, draw_dt), out.dtype)
    return b.binary("mul", keep, float(out.dtype.numpy.type(1 / (1 - p))), out.dtype)


MAX_RANDPERM = 2048


@rule("randperm")
def _randperm(b: Builder, rng, n, dtype):
    """Random keys ranked by an n x n comparison (ties broken by position), each position sent
    to its rank: a uniform permutation without a sort op."""
    out = b.outs[0].dtype
    if n > MAX_RANDPERM:
        raise LoweringUnsupported(
            f"randperm of {n} > {MAX_RANDPERM} elements (prim has no sort; ranking compares "
            "every pair)"
        )
    if n <= 1:
        return b.full(0, (n,), out)
    f64 = _dtype.float64
    keys = b.op("random_uniform", rng, shape=(n,), dtype="f64")
    k_i, k_j = b.reshape(keys, (n, 1)), b.reshape(keys, (1, n))
    earlier = b.const(np.tril(np.ones((n, n), dtype=bool), -1), _dtype.bool_, (n, n))
    before = b.op(
        "logical_or",
        b.binary("lt", k_j, k_i, f64),
        b.op("logical_and", b.binary("eq", k_j, k_i, f64), earlier),
    )
    rank = b.reduce("reduce_sum", b.cast(before, _dtype.int64), (1,))
    positions = b.const(np.arange(n), _dtype.int64, (n,))
    perm = b.op("scatter_add", b.full(0, (n,), _dtype.int64), rank, positions, axis=0)
    return b.cast(perm, out)
