"""The CPU backend: program model, fuse-kernels (``rewrites``), fuse-elementwise, and the native
runtime behind it."""

from lucid._lazy import lazy_attributes
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
__getattr__ = lazy_attributes(__name__, _LAZY)


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
