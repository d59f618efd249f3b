"""The CPU backend: program model, fuse-kernels (``rewrites``), fuse-elementwise, and the native
runtime behind it."""

from typing import Any

from lucid.backends.cpu.backend import (
    CPUBackend,
    cache_clear,
    cache_info,
    get_num_threads,
    last_compile_split,
    set_adaptive_threads,
    set_cache_capacity,
    set_num_threads,
    thread_stats,
)

# The program model and the fusion pass load on first use: serving a saved program needs neither.
_LAZY = {
    "FusedNode": "lucid.backends.cpu.program",
    "Program": "lucid.backends.cpu.program",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CPUBackend",
    "FusedNode",
    "Program",
    "cache_clear",
    "cache_info",
    "get_num_threads",
    "last_compile_split",
    "set_adaptive_threads",
    "set_cache_capacity",
    "set_num_threads",
    "thread_stats",
]
