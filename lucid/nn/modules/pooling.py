"""Pooling modules: ``MaxPool1d/2d``, ``AvgPool1d/2d``, ``AdaptiveAvgPool1d/2d``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn.modules.module import Module

__all__ = [
    "FractionalMaxPool2d",
    "FractionalMaxPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool3d",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "AvgPool3d",
    "MaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
]


class _WindowPoolNd(Module):
    """Pooling over ``kernel_size`` windows; ``stride`` defaults to ``kernel_size``."""

    def __init__(self, kernel_size: Any, stride: Any, padding: Any) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding


class _MaxPoolNd(_WindowPoolNd):
    _pool: Callable[..., Any]  # F.max_pool1d or F.max_pool2d

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__(kernel_size, stride, padding)
        self.dilation = dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return self._pool(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
            self.return_indices,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    """Max over windows of ``kernel_size`` along the last dim of (N, C, L) inputs."""

    _pool = staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over ``kernel_size`` windows of (N, C, H, W) inputs; ``stride`` defaults to
    ``kernel_size``. With ``return_indices`` it returns ``(values, flat indices)`` as torch."""

    _pool = staticmethod(F.max_pool2d)


class _AvgPoolNd(_WindowPoolNd):
    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> None:
        super().__init__(kernel_size, stride, padding)
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    """Mean over windows of ``kernel_size`` along the last dim of (N, C, L) inputs."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool1d(
            input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
            self.count_include_pad,
        )  # fmt: skip


class AvgPool2d(_AvgPoolNd):
    """Mean over ``kernel_size`` windows; ``count_include_pad`` counts padding in the divisor."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool2d(
            input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
            self.count_include_pad, self.divisor_override,
        )  # fmt: skip


class _AdaptiveAvgPoolNd(Module):
    _pool: Callable[..., Tensor]  # F.adaptive_avg_pool1d or F.adaptive_avg_pool2d

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return self._pool(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """Average pooling of (N, C, L) inputs to a fixed length ``output_size`` (an int)."""

    _pool = staticmethod(F.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Average pooling to a fixed ``output_size`` (an int, a pair, or None to keep a dim)."""

    _pool = staticmethod(F.adaptive_avg_pool2d)


class _AdaptiveMaxPoolNd(_AdaptiveAvgPoolNd):
    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = return_indices

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return self._pool(input, self.output_size, self.return_indices)


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling of (N, C, L) inputs over torch's adaptive windows to ``output_size``."""

    _pool = staticmethod(F.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling over torch's adaptive windows to a fixed ``output_size``."""

    _pool = staticmethod(F.adaptive_max_pool2d)


class _LPPoolNd(Module):
    _pool: Callable[..., Tensor]

    def __init__(
        self, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False
    ) -> None:
        super().__init__()
        self.norm_type, self.kernel_size = norm_type, kernel_size
        self.stride, self.ceil_mode = stride, ceil_mode

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return self._pool(input, self.norm_type, self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self) -> str:
        return (
            f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"ceil_mode={self.ceil_mode}"
        )


class LPPool1d(_LPPoolNd):
    """Power-average pooling: the ``norm_type``-norm of each window of (N, C, L) inputs."""

    _pool = staticmethod(F.lp_pool1d)


class LPPool2d(_LPPoolNd):
    """Power-average pooling over 2-d windows."""

    _pool = staticmethod(F.lp_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Average pooling of (N, C, D, H, W) inputs over torch's adaptive windows."""

    _pool = staticmethod(F.adaptive_avg_pool3d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max pooling of (N, C, D, H, W) inputs over torch's adaptive windows."""

    _pool = staticmethod(F.adaptive_max_pool3d)


class LPPool3d(_LPPoolNd):
    """Power-average pooling over 3-d windows."""

    _pool = staticmethod(F.lp_pool3d)


class AvgPool3d(Module):
    """3-d average pooling (``ceil_mode=False``)."""

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
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool3d(
            input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
            self.count_include_pad, self.divisor_override,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool3d(Module):
    """3-d max pooling (no dilation or ``ceil_mode``; ``return_indices`` as torch)."""

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
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.max_pool3d(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
            self.return_indices,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _MaxUnpoolNd(Module):
    _unpool: Callable[..., Tensor]

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, input: Tensor, indices: Tensor, output_size: Any = None) -> Tensor:  # noqa: A002
        return self._unpool(
            input, indices, self.kernel_size, self.stride, self.padding, output_size
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """The partial inverse of ``MaxPool1d``: maxima back at their indices, zeros elsewhere."""

    _unpool = staticmethod(F.max_unpool1d)


class MaxUnpool2d(_MaxUnpoolNd):
    """The partial inverse of ``MaxPool2d``: maxima back at their indices, zeros elsewhere."""

    _unpool = staticmethod(F.max_unpool2d)


class MaxUnpool3d(_MaxUnpoolNd):
    """The partial inverse of ``MaxPool3d``: maxima back at their indices, zeros elsewhere."""

    _unpool = staticmethod(F.max_unpool3d)


class _FractionalMaxPoolNd(Module):
    _pool: Callable[..., Any]
    _dims: int

    def __init__(
        self,
        kernel_size: Any,
        output_size: Any = None,
        output_ratio: Any = None,
        return_indices: bool = False,
        _random_samples: Tensor | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if (output_size is None) == (output_ratio is None):
            raise ValueError(
                f"{name} requires specifying either an output size or a pooling ratio (not both)"
            )
        if output_ratio is not None:
            ratios = output_ratio if isinstance(output_ratio, (tuple, list)) else [output_ratio]
            if not all(0 < r < 1 for r in ratios):
                raise ValueError(
                    f"{name}: output_ratio must be between 0 and 1, got {output_ratio}"
                )
        self.kernel_size, self.output_size = kernel_size, output_size
        self.output_ratio, self.return_indices = output_ratio, return_indices
        self._random_samples = _random_samples

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return self._pool(
            input,
            self.kernel_size,
            self.output_size,
            self.output_ratio,
            self.return_indices,
            _random_samples=self._random_samples,
        )

    def extra_repr(self) -> str:
        size = f"output_size={self.output_size}" if self.output_size is not None else (
            f"output_ratio={self.output_ratio}")  # fmt: skip
        return f"kernel_size={self.kernel_size}, {size}"


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """2-d fractional max pooling over (N, C, H, W) or (C, H, W): windows of ``kernel_size``
    at pseudo-random positions, a fresh draw per call unless ``_random_samples`` fixes them."""

    _pool = staticmethod(F.fractional_max_pool2d)


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """3-d fractional max pooling over (N, C, T, H, W) or (C, T, H, W)."""

    _pool = staticmethod(F.fractional_max_pool3d)
