"""Pooling modules: ``MaxPool1d/2d``, ``AvgPool1d/2d``, ``AdaptiveAvgPool2d``."""

from __future__ import annotations

from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool2d"]


class _MaxPoolNd(Module):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def _kwargs(self) -> dict:
        kw: dict = {"stride": self.stride, "padding": self.padding, "dilation": self.dilation}
        # Only non-default flags are passed, so the functional form needs only what is used.
        if self.ceil_mode:
            kw["ceil_mode"] = True
        if self.return_indices:
            kw["return_indices"] = True
        return kw

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return F.max_pool1d(input, self.kernel_size, **self._kwargs())


class MaxPool2d(_MaxPoolNd):
    """Max over ``kernel_size`` windows; ``stride`` defaults to ``kernel_size``."""

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return F.max_pool2d(input, self.kernel_size, **self._kwargs())


class _AvgPoolNd(Module):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def _kwargs(self) -> dict:
        kw: dict = {
            "stride": self.stride,
            "padding": self.padding,
            "count_include_pad": self.count_include_pad,
        }
        if self.ceil_mode:
            kw["ceil_mode"] = True
        if self.divisor_override is not None:
            kw["divisor_override"] = self.divisor_override
        return kw

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool1d(input, self.kernel_size, **self._kwargs())


class AvgPool2d(_AvgPoolNd):
    """Mean over ``kernel_size`` windows; ``count_include_pad`` counts padding in the divisor."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool2d(input, self.kernel_size, **self._kwargs())


class AdaptiveAvgPool2d(Module):
    """Average pooling to a fixed ``output_size`` (an int, a pair, or None to keep a dim)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
