"""The CPU backend: program model, fuse-elementwise, and the native runtime behind it."""

from lucid.backends.cpu.backend import (
    CPUBackend,
    cache_clear,
    cache_info,
    get_num_threads,
    set_adaptive_threads,
    set_cache_capacity,
    set_num_threads,
    thread_stats,
)
from lucid.backends.cpu.fuse import fuse_elementwise
from lucid.backends.cpu.program import FusedNode, Program

__all__ = [
    "CPUBackend",
    "FusedNode",
    "Program",
    "cache_clear",
    "cache_info",
    "fuse_elementwise",
    "get_num_threads",
    "set_adaptive_threads",
    "set_cache_capacity",
    "set_num_threads",
    "thread_stats",
]
