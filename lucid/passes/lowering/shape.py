"""Lowering rules of shape ops: reshape, expand, permute, cat, pad, flip, roll, tril/triu."""

from __future__ import annotations

import numpy as np

from lucid import _dtype
from lucid.ops._registry import normalize_dim, normalize_dims
from lucid.ops.shape import _pad_pairs
from lucid.passes.lowering._core import PV, Builder, rule


@rule("reshape")
def _reshape(b: Builder, v, shape):
    return b.reshape(v, b.outs[0].shape)


@rule("expand")
def _expand(b: Builder, v, shape):
    return b.broadcast_to(v, b.outs[0].shape)


@rule("permute")
def _permute(b: Builder, v, dims):
    return b.transpose(v, normalize_dims(tuple(dims), v.ndim) if v.ndim else ())


@rule("cat")
def _cat(b: Builder, tensors, dim):
    out = b.outs[0]
    parts = [b.cast(t, out.dtype) for t in tensors if t.size or t.shape == out.shape]
    if not parts:
        return b.full(0, out.shape, out.dtype)
    axis = normalize_dim(dim, out.ndim)
    parts = [p for p in parts if p.ndim == out.ndim]  # torch skips 1-D empty tensors in cat
    return b.concat(parts, axis)


@rule("pad")
def _pad(b: Builder, v, pad, value):
    pairs = _pad_pairs(pad, v.ndim)
    starts = [max(-lo, 0) for lo, _ in pairs]
    ends = [n - max(-hi, 0) for n, (_, hi) in zip(v.shape, pairs, strict=True)]
    if any(s != 0 for s in starts) or tuple(ends) != v.shape:
        v = b.op("slice", v, starts=starts, ends=ends, strides=[1] * v.ndim)
    low = [max(lo, 0) for lo, _ in pairs]
    high = [max(hi, 0) for _, hi in pairs]
    if any(low) or any(high):
        v = b.op("pad", v, low=low, high=high, value=float(value))
    return v


def _reverse(b: Builder, v: PV, axis: int) -> PV:
    n = v.shape[axis]
    if n <= 1:
        return v
    idx = b.const(np.arange(n - 1, -1, -1), _dtype.int64, (n,))
    return b.op("gather", v, idx, axis=axis)


@rule("flip")
def _flip(b: Builder, v, dims):
    for axis in normalize_dims(tuple(dims), v.ndim) if v.ndim else ():
        v = _reverse(b, v, axis)
    return v


def _roll_axis(b: Builder, v: PV, shift: int, axis: int) -> PV:
    n = v.shape[axis]
    if n == 0 or shift % n == 0:
        return v
    s = shift % n
    return b.concat([b.slice_axis(v, axis, n - s, n), b.slice_axis(v, axis, 0, n - s)], axis)


@rule("roll")
def _roll(b: Builder, v, shifts, dims):
    if dims is None:
        flat = _roll_axis(b, b.reshape(v, (v.size,)), shifts[0], 0)
        return b.reshape(flat, v.shape)
    for shift, d in zip(shifts, dims, strict=True):
        v = _roll_axis(b, v, shift, normalize_dim(d, v.ndim))
    return v


def tri_mask(b: Builder, rows: int, cols: int, diagonal: int, lower: bool) -> PV:
    """(rows, cols) bool: col - row <= diagonal (lower) or >= diagonal (upper), from two ranges."""
    i64 = _dtype.int64
    offset = b.op("sub", b.arange_along(cols, 1, 2), b.arange_along(rows, 0, 2))
    return b.binary("le" if lower else "ge", offset, diagonal, i64)


def _tri(keep_lower: bool):
    def lower(b: Builder, v, diagonal):
        rows, cols = v.shape[-2:]
        mask = tri_mask(b, rows, cols, diagonal, keep_lower)
        return b.select(mask, v, 0, v.dtype)

    return lower


rule("tril")(_tri(True))
rule("triu")(_tri(False))
