"""Creation ops (factories).

Factories without a tensor operand (``zeros``, ``arange``, ``eye``, ...) build Tensors directly.
The ``*_like`` factories take a tensor operand, so they are registry ops (``zeros_like`` and
``ones_like`` are registered next to the elementwise ops, because autograd uses them), which
keeps them symbolic under a tracer.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor, device
from lucid.ops._registry import GRAD_SINK, SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

__all__ = [
    "arange",
    "empty",
    "empty_like",
    "eye",
    "full",
    "full_like",
    "linspace",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]


def _size(size: tuple, op: str, size_kw: Any = None) -> tuple[int, ...]:
    """A shape given as varargs (``zeros(2, 3)``), one sequence (``zeros((2, 3))``) or ``size=``."""
    if size_kw is not None:
        if size:
            raise TypeError(f"{op}(): pass the shape either positionally or as size=, not both")
        size = (size_kw,)
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    shape = []
    for d in size:
        try:
            d = operator.index(d)
        except TypeError:
            raise TypeError(
                f"{op}(): the shape must be integers, got {type(d).__name__} in {size!r}"
            ) from None
        if d < 0:
            raise ValueError(f"{op}(): negative dimension {d} in shape {tuple(size)}")
        shape.append(d)
    return tuple(shape)


def _check_device(dev: Any) -> None:
    if dev is not None:
        device(dev)  # raises for an unknown or unavailable device


def _dtype_or(dtype: Any, default: _dtype.dtype) -> _dtype.dtype:
    return default if dtype is None else _dtype.canonical(dtype)


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad_(True)
    return t


def _filled(size, fill, dtype, device_, requires_grad, op, size_kw=None):
    shape = _size(size, op, size_kw)
    _check_device(device_)
    dt = _dtype_or(dtype, _dtype.default_float)
    return _finish(Tensor._wrap(np.full(shape, fill, dtype=dt.numpy)), requires_grad)


def zeros(*shape, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros; float32 unless ``dtype`` says otherwise."""
    return _filled(shape, 0, dtype, device, requires_grad, "zeros", size)


def ones(*shape, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones; float32 unless ``dtype`` says otherwise."""
    return _filled(shape, 1, dtype, device, requires_grad, "ones", size)


def empty(*shape, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor (zero-filled here, which is one valid content)."""
    return _filled(shape, 0, dtype, device, requires_grad, "empty", size)


def _scalar_dtype(value: Any) -> _dtype.dtype:
    cat = _dtype.scalar_category(value)
    return (_dtype.bool_, _dtype.default_int, _dtype.default_float)[cat]


def _scalar(value: Any, op: str) -> Any:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{op}(): expected a number, got a tensor of shape {value.shape}")
        return value.item()
    if not isinstance(value, (bool, int, float, np.number, np.bool_)):
        raise TypeError(f"{op}(): expected a number, got {type(value).__name__}")
    return value


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``fill_value``; the dtype follows the value (bool, int64, float32)."""
    fill_value = _scalar(fill_value, "full")
    shape = _size((size,) if isinstance(size, (tuple, list)) else (size,), "full")
    _check_device(device)
    dt = _dtype_or(dtype, _scalar_dtype(fill_value))
    return _finish(Tensor._wrap(np.full(shape, fill_value, dtype=dt.numpy)), requires_grad)


def arange(
    start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """``[start, end)`` in steps of ``step``; int64 when every bound is an int, else float32."""
    if end is None:
        start, end = 0, start
    start, end, step = (_scalar(v, "arange") for v in (start, end, step))
    _check_device(device)
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    if (end - start) * step < 0:
        raise ValueError(
            f"arange(): upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})"
        )
    all_int = all(_dtype.scalar_category(v) <= 1 for v in (start, end, step))
    dt = _dtype_or(dtype, _dtype.default_int if all_int else _dtype.default_float)
    n = max(math.ceil((end - start) / step), 0)
    if all_int and dt.category == 1:
        values = start + step * np.arange(n, dtype=np.int64)
    else:
        values = start + step * np.arange(n, dtype=np.float64)
    return _finish(Tensor._wrap(values.astype(dt.numpy)), requires_grad)


def linspace(
    start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive; float32 by default."""
    start, end = _scalar(start, "linspace"), _scalar(end, "linspace")
    steps = operator.index(steps)
    if steps < 0:
        raise ValueError(f"linspace(): number of steps must be non-negative, got {steps}")
    _check_device(device)
    dt = _dtype_or(dtype, _dtype.default_float)
    values = np.linspace(start, end, steps, dtype=np.float64)
    if dt.category < 2:
        values = np.trunc(values)  # PyTorch truncates for integer dtypes
    return _finish(Tensor._wrap(values.astype(dt.numpy)), requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """An ``n x m`` matrix (``m`` defaults to ``n``) with ones on the diagonal."""
    n = operator.index(n)
    m = n if m is None else operator.index(m)
    if n < 0 or m < 0:
        raise ValueError(f"eye(): n and m must be non-negative, got n={n}, m={m}")
    _check_device(device)
    dt = _dtype_or(dtype, _dtype.default_float)
    return _finish(Tensor._wrap(np.eye(n, m, dtype=dt.numpy)), requires_grad)


# --- *_like: registry ops, so a traced graph keeps them symbolic


def _full_like_infer(x, fill_value, dtype):
    return AVal(tuple(x.shape), dtype if dtype is not None else x.dtype)


register(
    OpDef(
        "full_like",
        ("x",),
        _full_like_infer,
        lambda x, fill_value, dtype: np.full(
            x.shape, fill_value, dtype=x.dtype if dtype is None else dtype.numpy
        ),
        None,
        attrs={"fill_value": 0, "dtype": None},
        props=frozenset({GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _like(op: str, x: Tensor, dtype, device_, requires_grad, **attrs) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): expected a Tensor, got {type(x).__name__}")
    _check_device(device_)
    dt = None if dtype is None else _dtype.canonical(dtype)
    return _finish(apply(op, x, dtype=dt, **attrs), requires_grad)


def zeros_like(x, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros with ``x``'s shape (and dtype unless given)."""
    return _like("zeros_like", x, dtype, device, requires_grad)


def ones_like(x, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Ones with ``x``'s shape (and dtype unless given)."""
    return _like("ones_like", x, dtype, device, requires_grad)


def empty_like(x, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor like ``x`` (zero-filled here)."""
    return _like("zeros_like", x, dtype, device, requires_grad)


def full_like(x, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` with ``x``'s shape (and dtype unless given)."""
    fill_value = _scalar(fill_value, "full_like")
    return _like("full_like", x, dtype, device, requires_grad, fill_value=fill_value)


Tensor.new_zeros = lambda self, *size, dtype=None, device=None, requires_grad=False: zeros(
    *size, dtype=dtype or self.dtype, device=device, requires_grad=requires_grad
)
Tensor.new_ones = lambda self, *size, dtype=None, device=None, requires_grad=False: ones(
    *size, dtype=dtype or self.dtype, device=device, requires_grad=requires_grad
)
Tensor.new_full = lambda self, size, fill_value, *, dtype=None, device=None, requires_grad=False: (
    full(size, fill_value, dtype=dtype or self.dtype, device=device, requires_grad=requires_grad)
)
