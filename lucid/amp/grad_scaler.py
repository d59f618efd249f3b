"""``lucid.amp.GradScaler``: dynamic loss scaling with ``torch.amp.GradScaler``'s API.

Small float16 gradients underflow to zero; scaling the loss by ``S`` scales every gradient by
``S``. ``step`` divides the gradients by ``S`` again (``unscale_``) and skips the optimizer step
when any of them is inf or NaN; ``update`` then multiplies ``S`` by ``backoff_factor`` after an
overflow, or by ``growth_factor`` after ``growth_interval`` clean steps in a row.

The scale (float32) and the growth tracker (int32) are 0-d tensors, as in PyTorch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._autograd import no_grad
from lucid._tensor import Tensor

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_FIX = (
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the "
    "iteration."
)


def _fresh_state() -> dict[str, Any]:
    return {"stage": _READY, "found_inf": None}


class GradScaler:
    """Scale the loss, unscale gradients, skip steps whose gradients overflowed.

    >>> scaler = lucid.amp.GradScaler()
    >>> scaler.scale(loss).backward()
    >>> scaler.step(optimizer)   # unscales first; skipped if a gradient is inf/NaN
    >>> scaler.update()
    """

    def __init__(
        self,
        device: str = "cpu",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        if device == "metal":
            device = "mps"
        if device not in ("cpu", "mps"):
            if enabled:
                warnings.warn(
                    f"GradScaler: Lucid has no {device!r} device; the scaler is disabled "
                    "(use device 'cpu' or 'mps')",
                    stacklevel=2,
                )
            enabled = False
        self._device = device
        self._enabled = bool(enabled)
        if self._enabled:
            if not growth_factor > 1.0:
                raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
            if not 0.0 < backoff_factor < 1.0:
                raise ValueError(
                    f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}"
                )
            if not isinstance(growth_interval, int) or growth_interval <= 0:
                raise ValueError(
                    f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}"
                )
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._scale: Tensor | None = None
        self._growth_tracker: Tensor | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # --- scaling ------------------------------------------------------------------------------
    def _lazy_init(self) -> None:
        self._scale = Tensor._wrap(np.array(self._init_scale, dtype=np.float32))
        self._growth_tracker = Tensor._wrap(np.array(self._init_growth_tracker, dtype=np.int32))

    def _check_initialised(self, funcname: str) -> Tensor:
        if self._scale is None:
            raise RuntimeError(f"GradScaler.{funcname}() was called before scale(). " + _FIX)
        return self._scale

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor or nested lists/tuples of tensors) times the current scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._lazy_init()
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError("GradScaler.scale: outputs must be a Tensor or an iterable of Tensors")

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is
        inf/NaN. At most once per optimizer between ``update`` calls (clip gradients after it)."""
        if not self._enabled:
            return
        scale = self._check_initialised("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # The reciprocal in float64, rounded once to float32, as PyTorch.
        inv_scale = np.float32(1.0 / np.float64(scale._data))
        found_inf = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None or g._data is None:
                        continue
                    if g.dtype is _dtype.float16:
                        raise ValueError(
                            "Attempting to unscale FP16 gradients: keep the parameters in "
                            "float32 (autocast casts them per op) when using GradScaler."
                        )
                    found_inf |= _unscale_in_place(g, inv_scale)
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless ``unscale_`` already did) and run ``optimizer.step`` unless a
        gradient was inf/NaN; returns what ``optimizer.step`` returned, or None if skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_initialised("step")
        state = self._state(optimizer)
        if state["stage"] is _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _READY:
            self.unscale_(optimizer)
        retval = None
        if not state["found_inf"]:
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return retval

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Back off after an overflow, grow after ``growth_interval`` clean steps; or set
        ``new_scale``. Call once per iteration, after every ``step``."""
        if not self._enabled:
            return
        scale = self._check_initialised("update")
        tracker = self._growth_tracker
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or not new_scale.dtype.is_floating_point:
                    raise ValueError(
                        "GradScaler.update: new_scale must be a 1-element float tensor"
                    )
                value = float(new_scale.item())
            else:
                value = float(new_scale)
            scale._data[...] = np.float32(value)
        else:
            infs = [s["found_inf"] for s in self._per_optimizer_states.values()]
            infs = [f for f in infs if f is not None]
            if not infs:
                raise RuntimeError("No inf checks were recorded prior to update(). " + _FIX)
            if any(infs):
                scale._data[...] = scale._data * np.float32(self._backoff_factor)
                tracker._data[...] = 0
            else:
                successful = int(tracker._data) + 1
                if successful == self._growth_interval:
                    grown = scale._data * np.float32(self._growth_factor)
                    if np.isfinite(grown):
                        scale._data[...] = grown
                    tracker._data[...] = 0
                else:
                    tracker._data[...] = successful
        scale._version[0] += 1
        tracker._version[0] += 1
        self._per_optimizer_states = {}

    # --- accessors ----------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (``init_scale`` before the first ``scale``; 1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale._data)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        if self._growth_tracker is None:
            return self._init_growth_tracker
        return int(self._growth_tracker._data)

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """``scale``, the growth options and ``_growth_tracker`` (empty when disabled)."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled "
                "instance of GradScaler."
            )
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale._data[...] = np.float32(self._init_scale)
            self._growth_tracker._data[...] = self._init_growth_tracker


def _unscale_in_place(grad: Tensor, inv_scale: np.float32) -> bool:
    """``grad *= inv_scale`` computed in float32 (float64 for float64), rounded once to the
    gradient's dtype; whether any element was inf or NaN. The gradient tensor gets a new array:
    its old one may be a read-only broadcast view shared with other tensors."""
    data = grad._data
    wide = data.astype(np.float64 if data.dtype == np.float64 else np.float32)
    found = not bool(np.isfinite(wide).all())
    grad._data = (wide * inv_scale).astype(data.dtype)
    grad._version[0] += 1
    return found
