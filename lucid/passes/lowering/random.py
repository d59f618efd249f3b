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
from lucid.passes.lowering._core import (
    Builder,
    LoweringUnsupported,
    lower_dtype,
    numpy_dtype,
    rule,
)


def _float_dtype(dt: _dtype.dtype) -> _dtype.dtype:
    return _dtype.float64 if dt is _dtype.float64 else _dtype.float32


# Half draws are float32 draws rounded once (as eager's kernels): backends compute in float32.
@rule("uniform")
def _uniform(b: Builder, rng, shape, dtype, low, high):
    dt = b.outs[0].dtype
    drawn = _float_dtype(dt)
    u = b.op(
        "random_uniform", rng, shape=tuple(shape), dtype=lower_dtype(drawn), low=low, high=high
    )
    if high > low:  # rounding must not reach the open upper bound (as eager)
        # Clamping to a value of ``dt`` before the rounding equals eager's clamp after it.
        typed = numpy_dtype(dt).type
        top = float(np.nextafter(typed(high), typed(low)))
        u = b.binary("minimum", u, top, drawn)
    return b.cast(u, dt)


@rule("normal")
def _normal(b: Builder, rng, shape, dtype, mean, std):
    dt = b.outs[0].dtype
    drawn = lower_dtype(_float_dtype(dt))
    return b.cast(
        b.op("random_normal", rng, shape=tuple(shape), dtype=drawn, mean=mean, std=std), dt
    )


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
    return b.binary("mul", keep, float(numpy_dtype(out.dtype).type(1 / (1 - p))), out.dtype)


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


@rule("multinomial")
def _multinomial(b: Builder, rng, probs, num_samples, replacement):
    """Eager's formulas on the same draws: the inverse CDF with replacement, the top
    ``num_samples`` of p / Exp(1) without (sorted as ``topk``). The probabilities' checks (finite,
    non-negative, enough non-zero entries) read values and stay eager's."""
    from lucid.passes.lowering.sorting import sorted_positions

    f64 = _dtype.float64
    n = probs.shape[-1]
    m = probs.size // n
    s = num_samples
    rows = b.reshape(b.cast(probs, f64), (m, n))
    positive = b.binary("gt", rows, 0.0, f64)
    if replacement:
        cdf = b.op("cumsum", rows, axis=1)
        total = b.slice_axis(cdf, 1, n - 1, n)
        u = b.op("random_uniform", rng, shape=(m, s), dtype="f64")
        target = b.op("mul", u, total)
        at_or_below = b.op("le", b.reshape(cdf, (m, 1, n)), b.reshape(target, (m, s, 1)))
        drawn = b.reduce("reduce_sum", b.cast(at_or_below, _dtype.int64), (2,))
        # Rounding can put u * total at the last sum: clamp to the last drawable category.
        where_positive = b.select(positive, b.arange_along(n, 1, 2), 0, _dtype.int64)
        last = b.reduce("reduce_max", where_positive, (1,), keepdims=True)
        out = b.op("minimum", drawn, last)
    else:
        u = b.op("random_uniform", rng, shape=(m, n), dtype="f64")
        race = b.op("neg", b.op("log1p", b.op("neg", u)))
        keys = b.select(positive, b.op("div", rows, race), -1.0, f64)
        if s == 1:  # the first largest key, as eager
            out = b.op("argmax", keys, axis=1, keepdims=True)
        else:
            out = b.slice_axis(sorted_positions(b, keys, True), 1, 0, s)
    return b.reshape(out, b.outs[0].shape)
