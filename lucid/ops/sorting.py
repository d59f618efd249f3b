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
from lucid._tensor import Tensor
from lucid.ops._front import tensor_method
from lucid.ops._registry import AVal, OpDef, normalize_dim, register

__all__ = ["argsort", "msort", "sort", "topk"]

sort_result = namedtuple("sort", ["values", "indices"])
topk_result = namedtuple("topk", ["values", "indices"])


def _check_sortable(op: str, x) -> None:
    if x.dtype not in (
        _dtype.float32,
        _dtype.float64,
        _dtype.float16,
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
