"""``Conv1d``, ``Conv2d`` and ``Conv3d`` (weight layout (out_channels, in_channels / groups,
*kernel))."""

from __future__ import annotations

import math
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import (
    check_positive_int,
    empty_parameter,
    factory_dtype,
    ntuple,
    optional_parameter,
)
from lucid.nn.modules.module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    _n: int = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        n = self._n
        for name, v in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("groups", groups),
        ):
            check_positive_int(v, name, cls)
        if in_channels % groups:
            raise ValueError(
                f"{cls}: in_channels ({in_channels}) must be divisible by groups ({groups})"
            )
        if out_channels % groups:
            raise ValueError(
                f"{cls}: out_channels ({out_channels}) must be divisible by groups ({groups})"
            )
        if padding_mode not in _PADDING_MODES:
            raise ValueError(
                f"{cls}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}"
            )
        self.kernel_size = ntuple(kernel_size, n, "kernel_size")
        self.stride = ntuple(stride, n, "stride")
        self.dilation = ntuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(
                    f"{cls}: padding string must be 'same' or 'valid', got {padding!r}"
                )
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{cls}: padding='same' is not supported for strided convolutions")
            self.padding: Any = padding
        else:
            self.padding = ntuple(padding, n, "padding")
        for name, vals in (("kernel_size", self.kernel_size), ("stride", self.stride),
                           ("dilation", self.dilation)):  # fmt: skip
            for v in vals:
                check_positive_int(v, name, cls)
        if not isinstance(self.padding, str) and any(p < 0 for p in self.padding):
            raise ValueError(f"{cls}: padding must be non-negative, got {padding!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.padding_mode = padding_mode
        dt = factory_dtype(device, dtype)
        self.weight = empty_parameter((out_channels, in_channels // groups, *self.kernel_size), dt)
        self.register_parameter("bias", optional_parameter((out_channels,), dt, bias))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _explicit_padding(self) -> list[int]:
        """``pad`` amounts (last dim first) amounts for a non-zeros padding_mode."""
        if self.padding == "valid":
            return [0] * (2 * self._n)
        if self.padding == "same":
            pads = []
            for d, k in zip(reversed(self.dilation), reversed(self.kernel_size), strict=True):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]
            return pads
        return [p for p in reversed(self.padding) for _ in (0, 1)]

    def _conv(self, x: Tensor, padding: Any) -> Tensor:
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[self._n]
        return conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.ndim not in (self._n + 1, self._n + 2):
            raise ValueError(
                f"{type(self).__name__}: expected a {self._n + 1}D (unbatched) or "
                f"{self._n + 2}D (batched) input, got {input.ndim}D with shape {tuple(input.shape)}"
            )
        if self.padding_mode != "zeros":
            x = lucid.pad(input, self._explicit_padding(), mode=self.padding_mode)
            return self._conv(x, 0)
        return self._conv(input, self.padding)

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0,) * self._n:
            s += (
                f", padding={self.padding!r}"
                if isinstance(self.padding, str)
                else (f", padding={self.padding}")
            )
        if self.dilation != (1,) * self._n:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    """1-D convolution over (N, C_in, L) inputs."""

    _n = 1


class Conv2d(_ConvNd):
    """2-D convolution over (N, C_in, H, W) inputs."""

    _n = 2


class Conv3d(_ConvNd):
    """3-D convolution over (N, C_in, D, H, W) inputs."""

    _n = 3
