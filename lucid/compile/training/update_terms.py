"""What a traced training step does between the backward and the update: gradient clipping
(``GradClip``, as ``lucid.nn.utils.clip_grad``) and loss scaling (``LossScaling``, as
``lucid.amp.GradScaler``'s unscale, finite check and scale update), written in Lucid ops so the
trace records them inside the step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.nn.utils.clip_grad import clip_coefficient, parse_norm_type, total_norm_of

__all__ = ["GradClip", "LossScaling"]


@dataclass(frozen=True)
class GradClip:
    """Gradient clipping traced into a training step between the backward and the optimizer's
    update, as eager ``clip_grad_value_(params, clip_value)`` followed by
    ``clip_grad_norm_(params, max_norm, norm_type)`` would do it (the same formulas, from
    ``lucid.nn.utils.clip_grad``). ``None`` skips that kind of clipping."""

    max_norm: float | None = None
    norm_type: float = 2.0
    clip_value: float | None = None

    @staticmethod
    def of(
        max_norm: Any = None, norm_type: Any = 2.0, clip_value: Any = None, *, what: str
    ) -> GradClip | None:
        """A checked ``GradClip``, or None when nothing is to be clipped; ``what`` names the
        caller in error messages."""
        norm_type = parse_norm_type(norm_type)
        if max_norm is not None:
            max_norm = _nonnegative(max_norm, "max_grad_norm", what)
        if clip_value is not None:
            clip_value = _nonnegative(clip_value, "clip_grad_value", what)
        if max_norm is None and clip_value is None:
            return None
        return GradClip(max_norm, norm_type, clip_value)

    def apply(self, grads: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        """The clipped gradients and, with ``max_norm``, the total norm before norm clipping
        (what ``clip_grad_norm_`` returns); Lucid ops only, so it traces."""
        if self.clip_value is not None:
            grads = [lucid.clamp(g, -self.clip_value, self.clip_value) for g in grads]
        if self.max_norm is None or not grads:
            return grads, None
        total = total_norm_of(grads, self.norm_type)
        coef = clip_coefficient(self.max_norm, total)
        by_dtype: dict[Any, Tensor] = {}  # one cast per dtype: one shared 0-d operand for fusion
        clipped = []
        for g in grads:
            c = by_dtype.get(g.dtype)
            if c is None:
                c = by_dtype[g.dtype] = coef.to(g.dtype)
            clipped.append(g * c)
        return clipped, total


@dataclass(frozen=True)
class LossScaling:
    """``GradScaler``'s work traced into a training step, as ``torch.amp.GradScaler`` does it
    eagerly: the loss times ``scale`` is differentiated; the gradients are divided by it
    (``unscale_``) before clipping; the optimizer's update of parameters and state is kept only
    when every gradient is finite; then ``scale`` and ``growth_tracker`` (0-d float32 tensors,
    updated in place) back off after an overflow or grow after ``growth_interval`` clean steps."""

    scale: Tensor
    growth_tracker: Tensor
    growth_factor: float
    backoff_factor: float
    growth_interval: int

    def name_feeds(self, tracer: Any) -> None:
        """The roles of the scaler's tensors in the trace (updated in place, written back)."""
        tracer._names[id(self.scale)] = "scaler:scale"
        tracer._names[id(self.growth_tracker)] = "scaler:growth_tracker"

    def unscale(self, grads: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The gradients divided by the scale (in float32, rounded once to their dtype) and
        whether all of them are finite (a 0-d bool tensor)."""
        inv_scale = lucid.reciprocal(self.scale)
        # g * 0 is NaN exactly where g is inf or NaN: one sum tells whether any gradient was.
        overflow = None
        unscaled = []
        for g in grads:
            wide = g if g.dtype in (lucid.float32, lucid.float64) else g.to(lucid.float32)
            probe = (wide * 0.0).sum().to(lucid.float32)
            overflow = probe if overflow is None else overflow + probe
            unscaled.append((wide * inv_scale).to(g.dtype))
        finite = lucid.isfinite(overflow if overflow is not None else self.scale * 0.0)
        return unscaled, finite

    def update_scale(self, finite: Tensor) -> None:
        """``GradScaler.update``: back off after an overflow; after ``growth_interval`` clean
        steps in a row grow the scale (unless that overflows float32) and restart the count."""
        scale, tracker = self.scale, self.growth_tracker
        counted = tracker + 1.0
        due = lucid.ge(counted, float(self.growth_interval))
        grown = scale * self.growth_factor
        grown = lucid.where(lucid.logical_and(due, lucid.isfinite(grown)), grown, scale)
        new_scale = lucid.where(finite, grown, scale * self.backoff_factor)
        new_tracker = lucid.where(
            lucid.logical_and(finite, lucid.logical_not(due)), counted, counted * 0.0
        )
        scale.copy_(new_scale)
        tracker.copy_(new_tracker)


def _nonnegative(value: Any, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what}: {name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not value >= 0.0:  # NaN too
        raise ValueError(f"{what}: {name} must be >= 0, got {value}")
    return value
