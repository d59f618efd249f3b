"""Sorting ops: ``sort`` and ``topk`` (values and int64 indices); ``argsort`` is sort's indices.

Both are stable: equal elements keep their order of position, ascending or descending, so the
eager kernel and the compiled (ranking) lowering give the same indices. NaN sorts as the largest
value, as in PyTorch (last ascending, first descending, picked first by ``topk(largest=True)``).
The gradient of the values goes back to the positions the indices name (a scatter-add into
zeros); the indices are not differentiable.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor, _tensor_from
from lucid.ops._front import tensor_method
from lucid.ops._registry import (
    DATA_DEPENDENT,
    GRAD_SINK,
    AVal,
    OpDef,
    normalize_dim,
    register,
)

__all__ = ["argsort", "msort", "sort", "topk", "searchsorted", "bucketize", "bincount", "unique"]

sort_result = namedtuple("sort", ["values", "indices"])
topk_result = namedtuple("topk", ["values", "indices"])


def _check_sortable(op: str, x) -> None:
    if x.dtype not in (
        _dtype.float32,
        _dtype.float64,
        _dtype.float16,
        _dtype.bfloat16,
        _dtype.int8,
        _dtype.int16,
        _dtype.int32,
        _dtype.int64,
        _dtype.uint8,
        _dtype.bool_,
    ):
        raise TypeError(f"{op}: cannot sort a tensor of dtype {x.dtype}")


def stable_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Positions that sort ``x`` along ``axis``, stably (ties keep their order), NaN largest."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    # Sorting the reversed array ascending and reading the result backwards is descending with
    # ties in their original order (numpy puts NaN last ascending, so it comes first here).
    rev = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(rev, axis)


def _sort_infer(x, dim, descending):
    _check_sortable("sort", x)
    normalize_dim(dim, x.ndim, "sort")
    return AVal(tuple(x.shape), x.dtype), AVal(tuple(x.shape), _dtype.int64)


def _sort_kernel(x, dim, descending):
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    d = normalize_dim(dim, x.ndim, "sort")
    idx = stable_order(x, d, descending).astype(np.int64)
    return np.take_along_axis(x, idx, d), idx


def _scatter_back_vjp(c, g, _g_indices=None):
    x, indices = c.inputs[0], c.outputs[1]
    if g is None:
        return (None,)
    if x.ndim == 0:
        return (g,)
    dim = normalize_dim(c.attrs["dim"], x.ndim)
    return (apply("scatter_add", apply("zeros_like", x), indices, g, dim=dim),)


register(
    OpDef(
        "sort",
        ("x",),
        _sort_infer,
        _sort_kernel,
        _scatter_back_vjp,
        attrs={"dim": -1, "descending": False},
        n_outputs=2,
        saves_inputs=False,
        doc="Stable sort along dim: (values, int64 indices); NaN sorts as the largest value.",
    )
)


def _topk_infer(x, k, dim, largest):
    _check_sortable("topk", x)
    d = normalize_dim(dim, x.ndim, "topk")
    n = x.shape[d] if x.ndim else 1
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (n is not None and k > n):
        raise ValueError(f"topk: k={k!r} is out of range for a dimension of size {n}")
    shape = list(x.shape)
    if x.ndim:
        shape[d] = k
    return AVal(tuple(shape), x.dtype), AVal(tuple(shape), _dtype.int64)


def _topk_kernel(x, k, dim, largest):
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    d = normalize_dim(dim, x.ndim, "topk")
    idx = np.take(stable_order(x, d, largest), np.arange(k), axis=d).astype(np.int64)
    return np.take_along_axis(x, idx, d), idx


register(
    OpDef(
        "topk",
        ("x",),
        _topk_infer,
        _topk_kernel,
        _scatter_back_vjp,
        attrs={"k": 1, "dim": -1, "largest": True},
        n_outputs=2,
        saves_inputs=False,
        doc="The k largest (or smallest) entries along dim, sorted, ties by position; NaN largest.",
    )
)


# --- fronts


def _int(v: Any, what: str, op: str) -> int:
    if isinstance(v, Tensor) and v.ndim == 0 and v.dtype.category == 1:
        v = int(v.item())
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{op}(): {what} must be an int, got {type(v).__name__}")
    return int(v)


def _tensor(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): expected a Tensor, got {type(x).__name__}")
    return x


@tensor_method()
def sort(
    x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False
) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of ``x`` sorted along ``dim``. Always stable (``stable`` is accepted
    for PyTorch's signature); NaN sorts as the largest value."""
    x = _tensor(x, "sort")
    values, indices = apply("sort", x, dim=_int(dim, "dim", "sort"), descending=bool(descending))
    return sort_result(values, indices)


@tensor_method()
def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 positions that sort ``x`` along ``dim`` (stable; NaN largest)."""
    return sort(x, dim, descending).indices


@tensor_method()
def msort(x: Tensor) -> Tensor:
    """``x`` sorted along its first dim."""
    return sort(x, 0).values


@tensor_method()
def topk(
    x: Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,  # noqa: A002
) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) entries along
    ``dim``, in sorted order (also when ``sorted=False``); ties go to the lower position."""
    x = _tensor(x, "topk")
    values, indices = apply(
        "topk",
        x,
        k=_int(k, "k", "topk"),
        dim=_int(dim, "dim", "topk"),
        largest=bool(largest),
    )
    return topk_result(values, indices)


# --- searchsorted / bucketize / bincount / unique: index-valued, so no gradient ----------------


def _searchsorted_infer(sorted_sequence, values, right):
    seq, vals = tuple(sorted_sequence.shape), tuple(values.shape)
    if len(seq) > 1 and seq[:-1] != vals[:-1]:
        raise ValueError(
            f"searchsorted: a {len(seq)}-d sorted_sequence {seq} needs values with the same "
            f"leading dims, got {vals}"
        )
    return AVal(vals, _dtype.int64)


def _searchsorted_kernel(sorted_sequence, values, right):
    side = "right" if right else "left"
    if sorted_sequence.ndim <= 1:
        return np.searchsorted(sorted_sequence, values, side=side).astype(np.int64)
    rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    queries = values.reshape(rows.shape[0], -1)
    out = [np.searchsorted(r, q, side=side) for r, q in zip(rows, queries, strict=True)]
    return np.stack(out).reshape(values.shape).astype(np.int64)


register(
    OpDef(
        "searchsorted",
        ("sorted_sequence", "values"),
        _searchsorted_infer,
        _searchsorted_kernel,
        attrs={"right": False},
        props=frozenset({GRAD_SINK}),
        doc="Insertion positions of values in the last dim of a sorted sequence (int64).",
    )
)


def searchsorted(
    sorted_sequence: Tensor,
    values: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Tensor | None = None,
) -> Tensor:
    """Where each value would be inserted in ``sorted_sequence`` (its last dim) to keep it
    sorted: the first such position, or the last with ``right=True`` / ``side="right"``."""
    if side is not None:
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        right = side == "right"
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    scalar = not isinstance(values, Tensor)
    if scalar:
        values = _tensor_from(values, sorted_sequence.dtype)
    out = apply("searchsorted", sorted_sequence, values, right=bool(right))
    out = out.reshape(()) if scalar and values.ndim == 0 else out
    return out.type(_dtype.int32) if out_int32 else out


def bucketize(
    input: Any,  # noqa: A002
    boundaries: Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
) -> Tensor:
    """The bucket of each input among 1-d sorted ``boundaries`` (torch's convention: ``right``
    False gives ``boundaries[i-1] < x <= boundaries[i]``)."""
    if boundaries.ndim != 1:
        raise ValueError(f"bucketize: boundaries must be 1-d, got shape {tuple(boundaries.shape)}")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def _bincount_infer(x, weights, minlength, weighted):
    if x.ndim != 1 or x.dtype.is_floating_point:
        raise ValueError(f"bincount: expected a 1-d integer tensor, got {x.dtype} {tuple(x.shape)}")
    # The length is known from values only: eager inference reads them, a tracer sees None.
    data = getattr(x, "_data", None)
    n = None
    if isinstance(data, np.ndarray):
        n = max(int(minlength), int(data.max()) + 1 if data.size else 0)
    if not weighted:
        return AVal((n,), _dtype.int64)
    # As torch: float weights keep their dtype, others sum as float64.
    return AVal((n,), weights.dtype if weights.dtype.is_floating_point else _dtype.float64)


def _bincount_kernel(x, weights, minlength, weighted):
    if x.size and x.min() < 0:
        raise ValueError("bincount: the input must hold non-negative integers")
    if not weighted:
        return np.bincount(x, minlength=minlength).astype(np.int64)
    out = np.bincount(x, weights=weights, minlength=minlength)
    return out.astype(weights.dtype if weights.dtype.kind == "f" else np.float64)


register(
    OpDef(
        "bincount",
        ("x", "weights"),
        _bincount_infer,
        _bincount_kernel,
        attrs={"minlength": 0, "weighted": False},
        props=frozenset({GRAD_SINK, DATA_DEPENDENT}),
        # Without weights the input stands in for them (operands are tensors): "weighted" says.
        doc="Counts (or summed weights) of each non-negative integer; length from the values.",
    )
)


@tensor_method()
def bincount(x: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each value 0..max(x) occurs in the 1-d non-negative integer ``x`` (at least
    ``minlength`` bins), or the sum of ``weights`` per value."""
    if weights is not None and tuple(weights.shape) != tuple(x.shape):
        raise ValueError(
            f"bincount: weights {tuple(weights.shape)} must have the input's shape {tuple(x.shape)}"
        )
    weighted = weights is not None
    return apply(
        "bincount", x, weights if weighted else x, minlength=int(minlength), weighted=weighted
    )


def _unique_infer(x, sorted, return_inverse, return_counts, dim):  # noqa: A002
    # The number of distinct values is known from values only (as nonzero's count).
    data = getattr(x, "_data", None)
    k = np.unique(data, axis=dim).shape[dim or 0] if isinstance(data, np.ndarray) else None
    inverse_shape = tuple(x.shape) if dim is None else (x.shape[dim],)
    values = (k,) if dim is None else tuple(k if i == dim else n for i, n in enumerate(x.shape))
    return (AVal(values, x.dtype), AVal(inverse_shape, _dtype.int64), AVal((k,), _dtype.int64))


def _unique_kernel(x, sorted, return_inverse, return_counts, dim):  # noqa: A002
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True, axis=dim)
    inverse = inverse.reshape(x.shape if dim is None else (x.shape[dim],))
    return values, inverse.astype(np.int64), counts.astype(np.int64)


register(
    OpDef(
        "unique",
        ("x",),
        _unique_infer,
        _unique_kernel,
        attrs={"sorted": True, "return_inverse": False, "return_counts": False, "dim": None},
        n_outputs=3,
        props=frozenset({GRAD_SINK, DATA_DEPENDENT}),
        doc="Sorted distinct values (or slices along dim), the inverse indices and the counts.",
    )
)


@tensor_method()
def unique(
    x: Tensor,
    sorted: bool = True,  # noqa: A002
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> Any:
    """The distinct values of ``x`` (sorted; slices along ``dim`` when given), with the index of
    each input element's value (``return_inverse``) and each value's count (``return_counts``)."""
    d = None if dim is None else normalize_dim(dim, x.ndim, "unique")
    values, inverse, counts = apply(
        "unique", x, sorted=True, return_inverse=False, return_counts=False, dim=d
    )
    out = (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())
    return out[0] if len(out) == 1 else out
