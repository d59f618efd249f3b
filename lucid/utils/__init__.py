"""``lucid.utils``: data loading (``lucid.utils.data``), as ``torch.utils``."""

from lucid.utils import data

__all__ = ["data"]
