"""Lowering rules of ``sort`` and ``topk`` onto ``prim.argsort``: a stable sort of every row
(ties keep their positions, NaN is the largest value), so the indices are exactly eager's.

The sorted axis is moved last; ``prim.argsort`` gives the permutation (its first k columns for
``topk``) and ``prim.gather_along_axis`` the values.
"""

from __future__ import annotations

import math

import numpy as np

from lucid import _dtype
from lucid.ops._registry import normalize_dim
from lucid.passes.lowering._core import PV, Builder, rule

_I64 = _dtype.int64


def sorted_positions(b: Builder, v: PV, descending: bool) -> PV:
    """The permutation that sorts ``v`` along its last axis (int64, ``v``'s shape)."""
    return b.op("argsort", v, axis=v.ndim - 1, descending=descending)


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
    order = sorted_positions(b, work, descending)
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
