"""Normalization layers: ``BatchNorm1d/2d``, ``InstanceNorm1d/2d/3d``, ``LayerNorm``, ``RMSNorm``,
``GroupNorm``."""

from __future__ import annotations

import numbers
from typing import Any

from lucid import _dtype
from lucid._tensor import Tensor
from lucid.nn import functional as F
from lucid.nn import init
from lucid.nn.modules._utils import (
    buffer,
    check_positive_int,
    factory_dtype,
    optional_parameter,
)
from lucid.nn.modules.module import Module

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "RMSNorm",
    "GroupNorm",
    "LocalResponseNorm",
    "CrossMapLRN2d",
]


def _register_affine(
    module: Module, shape: tuple[int, ...], dt: Any, weight: bool, bias: bool
) -> None:
    """Register ``weight`` and ``bias`` parameters of ``shape`` (each None when switched off)."""
    module.register_parameter("weight", optional_parameter(shape, dt, weight))
    module.register_parameter("bias", optional_parameter(shape, dt, bias))


class _BatchNorm(Module):
    """Shared BatchNorm: ``running_mean``/``running_var``/``num_batches_tracked`` buffers, updated
    in training mode only; ``momentum=None`` gives a cumulative moving average."""

    _expected_ndims: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        check_positive_int(num_features, "num_features", type(self).__name__)
        dt = factory_dtype(device, dtype)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _register_affine(self, (num_features,), dt, affine, affine)
        if track_running_stats:
            self.register_buffer("running_mean", buffer([0.0] * num_features, dt))
            self.register_buffer("running_var", buffer([1.0] * num_features, dt))
            self.register_buffer("num_batches_tracked", buffer(0, _dtype.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.ndim not in self._expected_ndims:
            dims = " or ".join(f"{d}D" for d in self._expected_ndims)
            raise ValueError(
                f"{type(self).__name__}: expected {dims} input (got {input.ndim}D input)"
            )
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        # Eval mode uses the running statistics, unless there are none to use.
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            input,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            use_batch_stats,
            factor,
            self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """BatchNorm over (N, C) or (N, C, L) inputs, per channel C."""

    _expected_ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """BatchNorm over (N, C, H, W) inputs, per channel C."""

    _expected_ndims = (4,)


class BatchNorm3d(_BatchNorm):
    """BatchNorm over (N, C, D, H, W) inputs, per channel C."""

    _expected_ndims = (5,)


class _InstanceNorm(_BatchNorm):
    """Shared InstanceNorm: each (sample, channel) is normalised over its spatial dims. Same
    parameters and buffers as BatchNorm, but no affine parameters and no running statistics by
    default (as torch); with ``track_running_stats`` the eval mode uses the running ones."""

    _spatial_dims = 1

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        batched_ndim = self._spatial_dims + 2
        if input.ndim not in (batched_ndim - 1, batched_ndim):
            raise ValueError(
                f"{type(self).__name__}: expected {batched_ndim - 1}D (unbatched) or "
                f"{batched_ndim}D (batched) input, got {input.ndim}D input"
            )
        unbatched = input.ndim == batched_ndim - 1
        x = input.unsqueeze(0) if unbatched else input
        if x.shape[1] != self.num_features and self.affine:
            raise ValueError(
                f"{type(self).__name__}: expected input with {self.num_features} channels, got "
                f"{x.shape[1]} (shape {tuple(input.shape)})"
            )
        out = F.instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            use_input_stats=self.training or not self.track_running_stats,
            momentum=0.1 if self.momentum is None else self.momentum,
            eps=self.eps,
        )
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """InstanceNorm over (N, C, L) or unbatched (C, L) inputs."""

    _spatial_dims = 1


class InstanceNorm2d(_InstanceNorm):
    """InstanceNorm over (N, C, H, W) or unbatched (C, H, W) inputs."""

    _spatial_dims = 2


class InstanceNorm3d(_InstanceNorm):
    """InstanceNorm over (N, C, D, H, W) or unbatched (C, D, H, W) inputs."""

    _spatial_dims = 3


def _shape_tuple(normalized_shape: Any) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(d) for d in normalized_shape)


class _LastDimsNorm(Module):
    """What LayerNorm and RMSNorm share: normalization over the trailing ``normalized_shape``
    dims with an optional elementwise ``weight`` (initialized to 1) and ``bias`` (to 0)."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float | None,
        elementwise_affine: bool,
        bias: bool | None,
        device: Any,
        dtype: Any,
    ) -> None:
        """``bias=None``: the module has no ``bias`` at all (RMSNorm)."""
        super().__init__()
        dt = factory_dtype(device, dtype)
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if bias is None:
            weight = optional_parameter(self.normalized_shape, dt, elementwise_affine)
            self.register_parameter("weight", weight)
        else:
            _register_affine(
                self, self.normalized_shape, dt, elementwise_affine, elementwise_affine and bias
            )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self._parameters.get("bias") is not None:
            init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class LayerNorm(_LastDimsNorm):
    """Normalizes over the last ``len(normalized_shape)`` dims, then ``* weight + bias``."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bool(bias), device, dtype)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(_LastDimsNorm):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dims; ``eps=None`` uses the dtype's
    machine epsilon, as torch."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, None, device, dtype)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class GroupNorm(Module):
    """Normalizes (N, C, *) inputs over groups of ``C / num_groups`` channels."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        check_positive_int(num_groups, "num_groups", "GroupNorm")
        check_positive_int(num_channels, "num_channels", "GroupNorm")
        if num_channels % num_groups:
            raise ValueError(
                f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                f"num_groups ({num_groups})"
            )
        dt = factory_dtype(device, dtype)
        self.num_groups, self.num_channels, self.eps, self.affine = (
            num_groups,
            num_channels,
            eps,
            affine,
        )
        _register_affine(self, (num_channels,), dt, affine, affine)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class LocalResponseNorm(Module):
    """Normalises each channel by the squares of its ``size`` neighbouring channels:
    ``x / (k + alpha / size * sum x^2)^beta``."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        check_positive_int(size, "size", "LocalResponseNorm")
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class CrossMapLRN2d(LocalResponseNorm):
    """torch's legacy cross-channel LRN of 4-D inputs, ``x / (k + alpha / size * s)^beta``: for
    channel ``c`` the sum ``s`` of squares runs over channels ``c - p + 1 .. c + p - 1`` with
    ``p = (size - 1) // 2 + 1`` (clipped), plus channel 0 always, as torch's running-sum loop
    leaves it (``LocalResponseNorm`` uses a centred window)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        import numpy as np

        import lucid

        if input.ndim != 4:
            raise ValueError(f"CrossMapLRN2d: expected a 4D input, got {input.ndim}D")
        channels = input.shape[1]
        ahead = (self.size - 1) // 2 + 1
        window = np.zeros((channels, channels))
        for c in range(channels):
            low = 0 if c <= ahead else c - ahead + 1
            window[c, low : min(c + ahead, channels)] = 1
            window[c, 0] = 1
        squares = lucid.einsum(
            "nchw,dc->ndhw", input * input, lucid.tensor(window, dtype=input.dtype)
        )
        return input * (self.k + self.alpha / self.size * squares) ** -self.beta
