"""``lucid.accelerator``: torch.accelerator's device queries, for scripts that choose their device
with ``torch.accelerator.is_available()`` (the current pytorch/examples do).

Eager Lucid tensors live on the CPU, which is not an accelerator; the MPSGraph backend is a
compilation target (``lucid.compile(..., backend="mpsgraph")``), not an eager device.
"""

from __future__ import annotations

__all__ = ["current_accelerator", "device_count", "is_available"]


def is_available() -> bool:
    """False: eager Lucid runs on the CPU only."""
    return False


def device_count() -> int:
    """0: no accelerator device."""
    return 0


def current_accelerator(check_available: bool = False) -> None:
    """None: no accelerator (torch returns None too when there is none)."""
    return None
