"""A ``lucid.amp.GradScaler`` bound to a compiled step (``fused_step``/``compile_optimizer``
with ``scaler=``): the step feeds and updates the scaler's scale tensor in place and keeps the
growth tracker as float32 state, copied from the scaler before each step and back after it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import lucid
from lucid._tensor import Tensor
from lucid.compile.training.update_terms import LossScaling

__all__ = ["BoundScaler"]


class BoundScaler:
    """The scaler of a compiled step; ``BoundScaler.of(None or a disabled scaler)`` is None (a
    disabled scaler changes nothing, as in PyTorch)."""

    def __init__(self, scaler: Any):
        self.scaler = scaler
        self.growth_tracker = Tensor._wrap(np.zeros((), dtype=np.float32))

    @staticmethod
    def of(scaler: Any, what: str, params: Iterable[Tensor]) -> BoundScaler | None:
        """The bound ``scaler`` of a step training ``params``; refuses float16 parameters as
        ``GradScaler.unscale_`` refuses their gradients."""
        if scaler is None:
            return None
        from lucid.amp import GradScaler

        if not isinstance(scaler, GradScaler):
            raise TypeError(
                f"{what}: scaler must be a lucid.amp.GradScaler, got {type(scaler).__name__}"
            )
        if not scaler.is_enabled():
            return None
        if any(p.dtype is lucid.float16 and p.requires_grad for p in params):
            raise ValueError(
                f"{what}: Attempting to unscale FP16 gradients: keep the parameters in float32 "
                "(autocast casts them per op) when using a GradScaler"
            )
        return BoundScaler(scaler)

    def key(self) -> tuple:
        """What a compiled step bakes in: the scale tensor it binds and the growth options."""
        sc = self.scaler
        if sc._scale is None:  # the tensor the step binds exists from the first key on
            sc._lazy_init()
        return (
            id(sc._scale),
            sc.get_growth_factor(),
            sc.get_backoff_factor(),
            sc.get_growth_interval(),
        )

    def loss_scaling(self) -> LossScaling:
        sc = self.scaler
        return LossScaling(
            sc._scale,
            self.growth_tracker,
            sc.get_growth_factor(),
            sc.get_backoff_factor(),
            sc.get_growth_interval(),
        )

    def load(self) -> None:
        """The scaler's state into the step's (the user may have loaded or set it)."""
        sc = self.scaler
        if sc._scale is None:
            sc._lazy_init()
        self.growth_tracker._data[...] = np.float32(sc._get_growth_tracker())

    def store(self) -> None:
        """The step's scaler state back into the scaler (``get_scale``, ``state_dict``)."""
        sc = self.scaler
        sc._growth_tracker._data[...] = np.int32(self.growth_tracker._data)
        sc._growth_tracker._version[0] += 1
        sc._scale._version[0] += 1

    def scale_value(self) -> float:
        return float(self.scaler._scale._data)

    def skipped(self, scale_before: float) -> bool:
        """Whether the step just run skipped its update (it backed the scale off)."""
        return self.scale_value() < scale_before

    def tensors(self) -> list[Tensor]:
        """Every tensor a step writes: saved and restored around a parity check."""
        return [self.scaler._scale, self.scaler._growth_tracker, self.growth_tracker]
