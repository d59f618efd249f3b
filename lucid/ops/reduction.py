"""Reductions."""

from __future__ import annotations

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import tensor_method
from lucid.ops._registry import AVal, OpDef, normalize_dims, register

__all__ = ["sum"]


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def _sum_infer(x, dim, keepdim, dtype):
    dims = normalize_dims(dim, x.ndim, "sum")
    from lucid import _dtype

    dt = dtype or (x.dtype if x.dtype.is_floating_point else _dtype.int64)
    return AVal(_reduced_shape(x.shape, dims, keepdim), dt)


def _expand_back(g, x, dim, keepdim):
    """Broadcast a reduced gradient back to ``x``'s shape."""
    if not keepdim and x.ndim:
        dims = normalize_dims(dim, x.ndim)
        shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        g = g.reshape(shape)
    return g.expand(*x.shape)


register(
    OpDef(
        "sum",
        ("x",),
        _sum_infer,
        lambda x, dim, keepdim, dtype: np.sum(
            x, axis=None if dim is None else dim, keepdims=keepdim
        ),
        lambda c, g: (_expand_back(g, c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]),),
        attrs={"dim": None, "keepdim": False, "dtype": None},
        saves_outputs=False,
    )
)


def _sum_to_size_infer(x, shape):
    return AVal(tuple(shape), x.dtype)


def _sum_to_size_kernel(x, shape):
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and x.shape[i + lead] != 1
    )
    out = np.sum(x, axis=axes, keepdims=True) if axes else x
    return out.reshape(shape)


register(
    OpDef(
        "sum_to_size",
        ("x",),
        _sum_to_size_infer,
        _sum_to_size_kernel,
        lambda c, g: (g.expand(*c.inputs[0].shape),),
        attrs={"shape": None},
        saves_outputs=False,
        doc="Sum a broadcast gradient back to ``shape`` (the inverse of broadcasting).",
    )
)


@tensor_method()
def sum(x, dim=None, keepdim=False, *, dtype=None) -> Tensor:  # noqa: A001
    if isinstance(dim, list):
        dim = tuple(dim)
    return apply("sum", x, dim=dim, keepdim=keepdim, dtype=dtype)
