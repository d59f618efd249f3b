"""The native builder: the recording builder + ``lucid._native.mpsgraph_compile`` of its program.

The Objective-C++ part (``native/mpsgraph``) replays a recorded ``lucid.mpsgraph/v1`` program into
a real ``MPSGraph``, compiles it into an ``MPSGraphExecutable`` (kept in the native LRU keyed by the
program's structural hash) and runs it with the GIL released. It is built only on macOS; elsewhere
the entry points are absent and :func:`native_status` says why.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid.backends.base import BackendUnavailable
from lucid.backends.mpsgraph.program import RecordingBuilder

__all__ = ["MPSGraphUnavailable", "NativeBuilder", "macos_version", "native_status"]


class MPSGraphUnavailable(BackendUnavailable):
    """The native MPSGraph part cannot run here; the message says why."""


def _native_module() -> Any:
    from lucid._native_loader import _native

    return _native


def _on_macos() -> bool:
    return sys.platform == "darwin"


def macos_version() -> tuple[int, ...] | None:
    """The running macOS version as a tuple (None elsewhere, or when it cannot be read)."""
    if not _on_macos():
        return None
    text = platform.mac_ver()[0]
    try:
        return tuple(int(p) for p in text.split(".")) if text else None
    except ValueError:
        return None


def native_status() -> tuple[bool, str]:
    """(available, reason): the native MPSGraph part is built and a Metal device on macOS >= 14
    is present."""
    if not _on_macos():
        return False, "MPSGraph native part not built: not macOS"
    native = _native_module()
    if not hasattr(native, "mpsgraph_available"):
        return False, (
            "MPSGraph native part not built: lucid._native has no mpsgraph_available "
            f"(rebuild on macOS 14+; this is macOS {platform.mac_ver()[0] or '?'})"
        )
    ok, reason = native.mpsgraph_available()
    return bool(ok), str(reason)


class NativeBuilder(RecordingBuilder):
    """Records the program, then compiles it natively (:meth:`compile`)."""

    def compile(self, program: dict, cache: bool = True) -> Any:
        """The native ``MPSGraphExecutable`` of ``program``; MPSGraphUnavailable off macOS."""
        ok, reason = native_status()
        if not ok:
            raise MPSGraphUnavailable(reason)
        return _native_module().mpsgraph_compile(program, cache)

    @staticmethod
    def run(executable: Any, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(executable.run(list(feeds)))
