"""``ConvTranspose1d/2d/3d`` (weight layout (in_channels, out_channels / groups, *kernel))."""

from __future__ import annotations

import math
from typing import Any

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

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


class ConvTranspose2d(Module):
    """2-D transposed convolution over (N, C_in, H, W) inputs; the output is
    ``(H - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1`` high
    (and as wide), or ``output_size`` when ``forward`` is given one."""

    _dims = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        for name, v in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("groups", groups),
        ):
            check_positive_int(v, name, cls)
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels)):
            if v % groups:
                raise ValueError(f"{cls}: {name} ({v}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f"{cls}: only padding_mode='zeros' is supported, got {padding_mode!r}")
        self.kernel_size = ntuple(kernel_size, self._dims, "kernel_size")
        self.stride = ntuple(stride, self._dims, "stride")
        self.padding = ntuple(padding, self._dims, "padding")
        self.output_padding = ntuple(output_padding, self._dims, "output_padding")
        self.dilation = ntuple(dilation, self._dims, "dilation")
        for name, vals in (("kernel_size", self.kernel_size), ("stride", self.stride),
                           ("dilation", self.dilation)):  # fmt: skip
            for v in vals:
                check_positive_int(v, name, cls)
        for name, vals in (("padding", self.padding), ("output_padding", self.output_padding)):
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in vals):
                raise ValueError(f"{cls}: {name} must be non-negative ints, got {vals!r}")
        for o, s, d in zip(self.output_padding, self.stride, self.dilation, strict=True):
            if o >= s and o >= d:
                raise ValueError(
                    f"{cls}: output_padding {self.output_padding} must be smaller than either "
                    f"stride {self.stride} or dilation {self.dilation}"
                )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.padding_mode = padding_mode
        dt = factory_dtype(device, dtype)
        self.weight = empty_parameter((in_channels, out_channels // groups, *self.kernel_size), dt)
        self.register_parameter("bias", optional_parameter((out_channels,), dt, bias))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's: fan_in read from the (in, out/groups, kh, kw) weight as if it were a conv's.
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:  # noqa: A002
        """PyTorch's rule: the output_padding that gives ``output_size`` (its last entries)."""
        if output_size is None:
            return self.output_padding
        n, cls = self._dims, type(self).__name__
        size = [int(v) for v in output_size][-n:]
        if len(size) != n:
            raise ValueError(
                f"{cls}: output_size must have {n} or more entries, got {output_size!r}"
            )
        out = []
        for i in range(n):
            smallest = (
                (input.shape[-n + i] - 1) * self.stride[i]
                - 2 * self.padding[i]
                + self.dilation[i] * (self.kernel_size[i] - 1)
                + 1
            )
            largest = smallest + max(self.stride[i], self.dilation[i]) - 1
            if not smallest <= size[i] <= largest:
                raise ValueError(
                    f"{cls}: requested an output size of {size}, but valid sizes range "
                    f"from {smallest} to {largest} for dim {i} (for an input of "
                    f"{tuple(input.shape[-n:])})"
                )
            out.append(size[i] - smallest)
        return tuple(out)

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:  # noqa: A002
        n = self._dims
        if input.ndim not in (n + 1, n + 2):
            raise ValueError(
                f"{type(self).__name__}: expected a {n + 1}D (unbatched) or {n + 2}D (batched) "
                f"input, got {input.ndim}D with shape {tuple(input.shape)}"
            )
        function = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
        return function(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self._output_padding(input, output_size),
            self.groups,
            self.dilation,
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if any(self.padding):
            s += f", padding={self.padding}"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class ConvTranspose1d(ConvTranspose2d):
    """1-D transposed convolution over (N, C_in, L) inputs, weight (C_in, C_out/groups, k); the
    output is ``(L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1`` long."""

    _dims = 1


class ConvTranspose3d(ConvTranspose2d):
    """3-D transposed convolution over (N, C_in, D, H, W) inputs, weight (C_in, C_out/groups,
    kd, kh, kw); each output dim is ``(n - 1) * stride - 2 * padding + dilation * (k - 1) +
    output_padding + 1``."""

    _dims = 3
