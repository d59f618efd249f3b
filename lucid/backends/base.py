"""The Backend interface: compile a final program into an Executable, run feeds to outputs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Executable(Protocol):
    """A compiled program. ``run`` takes the feeds in order and returns the results in order."""

    def run(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]: ...


class Backend(ABC):
    """One way to execute final programs (CPU runtime, MPSGraph)."""

    name: str = "abstract"

    @abstractmethod
    def supported_ops(self) -> frozenset[str]:
        """The prim op names this backend can compile."""

    @abstractmethod
    def compile(self, program: Any) -> Executable:
        """Compile a final program; raises ValueError if it is malformed or unsupported."""

    def run(self, executable: Executable, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run ``executable`` on ``feeds`` (numpy arrays, exact dtypes and shapes)."""
        return executable.run(feeds)


__all__ = ["Backend", "Executable"]
