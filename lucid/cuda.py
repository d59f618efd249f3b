"""``lucid.cuda``: what a PyTorch script asks of ``torch.cuda`` on a machine without CUDA.

Lucid has no CUDA device, so scripts that pick their device with
``"cuda" if torch.cuda.is_available() else "cpu"`` run unchanged on the CPU. The seeding calls
are ignored, as torch ignores them where CUDA is unavailable.
"""

from __future__ import annotations

__all__ = ["device_count", "is_available", "manual_seed", "manual_seed_all"]


def is_available() -> bool:
    """False: Lucid has no CUDA device."""
    return False


def device_count() -> int:
    """0: Lucid has no CUDA device."""
    return 0


def manual_seed(seed: int) -> None:
    """Ignored (no CUDA generator), as in torch without CUDA; seed with ``lucid.manual_seed``."""
    int(seed)


def manual_seed_all(seed: int) -> None:
    """Ignored (no CUDA generator), as in torch without CUDA; seed with ``lucid.manual_seed``."""
    int(seed)
