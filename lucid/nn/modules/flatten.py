"""``Flatten`` and ``Unflatten``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.module import Module
from lucid.ops._registry import normalize_dim

__all__ = ["Flatten", "Unflatten", "Unfold", "Fold"]


class Flatten(Module):
    """Flattens dims ``start_dim..end_dim`` into one (by default all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        shape = tuple(input.shape)
        if not shape:
            return input.reshape(1)
        start = normalize_dim(self.start_dim, len(shape), "Flatten")
        end = normalize_dim(self.end_dim, len(shape), "Flatten")
        if start > end:
            raise ValueError(
                f"Flatten: start_dim ({self.start_dim}) comes after end_dim ({self.end_dim}) "
                f"for an input of {len(shape)} dims"
            )
        merged = 1
        for d in shape[start : end + 1]:
            merged = None if d is None or merged is None else merged * d
        return input.reshape(*_with_wildcard((*shape[:start], merged, *shape[end + 1 :])))

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


def _with_wildcard(shape: tuple) -> tuple:
    # A symbolic (None) dim under a tracer becomes reshape's -1; only one can be inferred.
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) > 1:
        raise ValueError(f"cannot reshape to {shape}: more than one dimension is symbolic")
    return tuple(-1 if d is None else d for d in shape)


class Unflatten(Module):
    """Splits dim ``dim`` into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size: Sequence[int]) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        shape = tuple(input.shape)
        d = normalize_dim(self.dim, len(shape), "Unflatten")
        return input.reshape(*_with_wildcard((*shape[:d], *self.unflattened_size, *shape[d + 1 :])))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class Unfold(Module):
    """im2col: the (C, kh, kw) sliding blocks of (N, C, H, W) inputs as columns,
    (N, C * kh * kw, L)."""

    def __init__(self, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1):
        super().__init__()
        self.kernel_size, self.dilation = kernel_size, dilation
        self.padding, self.stride = padding, stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
            f"stride={self.stride}"
        )


class Fold(Module):
    """col2im: sums the columns (N, C * kh * kw, L) of sliding blocks back into
    (N, C, *output_size), the adjoint of ``Unfold``."""

    def __init__(
        self,
        output_size: Any,
        kernel_size: Any,
        dilation: Any = 1,
        padding: Any = 0,
        stride: Any = 1,
    ):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.fold(
            input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
            f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}"
        )
