"""Lowering rules of ``sort`` and ``topk`` by ranking: prim has no sort op, so each element's
place in the sorted order is counted from a pairwise comparison along the sorted axis.

An element's rank is the number of elements that come before it: smaller ones (larger when
descending), NaN counting as the largest value, and equal ones at an earlier position (a stable
order, as eager's kernel). Sending every position to its rank (``scatter_add_along_axis``) gives
the sorting permutation, and a gather the values. The comparison holds rows x n x n entries, so
long rows are refused (``MAX_RANK_ELEMENTS``) and run eagerly after a graph break.
"""

from __future__ import annotations

import math

import numpy as np

from lucid import _dtype
from lucid.ops._registry import normalize_dim
from lucid.passes.lowering._core import PV, Builder, LoweringUnsupported, rule

MAX_RANK_ELEMENTS = 1 << 24  # entries of the pairwise comparison (rows * n * n)

_I32, _I64, _BOOL = _dtype.int32, _dtype.int64, _dtype.bool_


def stable_ranks(b: Builder, v: PV, descending: bool, op: str) -> PV:
    """The rank (int64) of every element of ``v`` within its last axis, in the stable order
    eager's sort uses (NaN largest)."""
    n = v.shape[-1]
    rows = v.size // n if n else 0
    if rows * n * n > MAX_RANK_ELEMENTS:
        raise LoweringUnsupported(
            f"{op} along a dim of {n} over {rows} rows: ranking compares {rows * n * n} pairs "
            f"(> {MAX_RANK_ELEMENTS}; prim has no sort op)"
        )
    if v.dtype is _BOOL:
        v = b.cast(v, _I32)
    lead = v.shape[:-1]
    mine = b.reshape(v, (*lead, n, 1))  # element i (axis -2)
    other = b.reshape(v, (*lead, 1, n))  # element j (axis -1)
    before = b.op("gt" if descending else "lt", other, mine)
    same = b.op("eq", other, mine)
    if v.dtype.is_floating_point:
        nan_mine, nan_other = b.op("isnan", mine), b.op("isnan", other)
        # NaN is the largest value and NaNs are equal to each other.
        if descending:
            nan_first = b.op("logical_and", nan_other, b.op("logical_not", nan_mine))
        else:
            nan_first = b.op("logical_and", nan_mine, b.op("logical_not", nan_other))
        before = b.op("logical_or", before, nan_first)
        same = b.op("logical_or", same, b.op("logical_and", nan_mine, nan_other))
    earlier = b.const(np.tril(np.ones((n, n), dtype=bool), -1), _BOOL, (n, n))  # [i, j]: j < i
    before = b.op("logical_or", before, b.op("logical_and", same, earlier))
    return b.cast(b.reduce("reduce_sum", b.cast(before, _I32), (v.ndim,)), _I64)


def sorted_positions(b: Builder, v: PV, descending: bool, op: str) -> PV:
    """The permutation that sorts ``v`` along its last axis (int64, ``v``'s shape)."""
    rank = stable_ranks(b, v, descending, op)
    n = v.shape[-1]
    positions = b.broadcast_to(b.arange_along(n, v.ndim - 1, v.ndim), v.shape)
    return b.op(
        "scatter_add_along_axis", b.full(0, v.shape, _I64), rank, positions, axis=v.ndim - 1
    )


def _to_last(b: Builder, v: PV, axis: int) -> tuple[PV, tuple[int, ...]]:
    perm = tuple(i for i in range(v.ndim) if i != axis) + (axis,)
    return b.transpose(v, perm), tuple(int(i) for i in np.argsort(perm))


def _sort_top(b: Builder, v: PV, dim: int, descending: bool, k: int | None, op: str):
    if v.ndim == 0:
        return v, b.full(0, (), _I64)
    axis = normalize_dim(dim, v.ndim, op)
    out_shape = b.outs[0].shape
    if math.prod(out_shape) == 0:
        return b.full(0, out_shape, v.dtype), b.full(0, out_shape, _I64)
    work, back = _to_last(b, v, axis)
    order = sorted_positions(b, work, descending, op)
    if k is not None:
        order = b.slice_axis(order, work.ndim - 1, 0, k)
    values = b.op("gather_along_axis", work, order, axis=work.ndim - 1)
    return b.transpose(values, back), b.transpose(order, back)


@rule("sort")
def _sort(b: Builder, v, dim, descending):
    return _sort_top(b, v, dim, descending, None, "sort")


@rule("topk")
def _topk(b: Builder, v, k, dim, largest):
    return _sort_top(b, v, dim, largest, k, "topk")
