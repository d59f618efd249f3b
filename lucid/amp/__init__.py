"""Automatic mixed precision: ``autocast`` (per-op casting) and ``GradScaler`` (loss scaling)."""

from lucid.amp.autocast_mode import (
    autocast,
    autocast_key,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_available,
    is_autocast_cache_enabled,
    is_autocast_enabled,
)
from lucid.amp.grad_scaler import GradScaler

__all__ = [
    "GradScaler",
    "autocast",
    "autocast_key",
    "clear_autocast_cache",
    "get_autocast_dtype",
    "is_autocast_available",
    "is_autocast_cache_enabled",
    "is_autocast_enabled",
]
