"""The CPU backend: fuse-elementwise on the program, then the native runtime compiles and caches it.

Threading policy: the native runtime is single-threaded except for GEMM (matmul and convolution),
which uses the OpenBLAS (or Accelerate) thread pool of the native module. Its size is
``LUCID_NUM_THREADS`` when set, else the BLAS default (one per core); change it with
:func:`set_num_threads`. numpy carries its own OpenBLAS: when both pools spin on the same cores
they slow each other down, so set ``OPENBLAS_THREAD_TIMEOUT=1`` (or fewer threads on one side)
before starting a process that interleaves numpy BLAS and compiled calls. See docs/backend-cpu.md.
"""

from __future__ import annotations

import os
from typing import Any

from lucid._native_loader import _native
from lucid.backends.base import Backend
from lucid.backends.cpu.fuse import fuse_elementwise
from lucid.backends.cpu.program import Program
from lucid.backends.prim_ops import PRIM_OPS


class CPUBackend(Backend):
    """Compiles :class:`Program` objects to native executables (cached process-wide)."""

    name = "cpu"

    def __init__(self, fuse: bool = True, cache: bool = True) -> None:
        self.fuse = fuse
        self.cache = cache

    def supported_ops(self) -> frozenset[str]:
        return frozenset(PRIM_OPS) & frozenset(_native.op_names())

    def compile(self, program: Program) -> Any:
        """A native executable: ``run(feeds) -> list[np.ndarray]``; ValueError if malformed."""
        if self.fuse:
            program = fuse_elementwise(program)
        return _native.compile(program.describe(), self.cache)


def cache_info() -> dict[str, int]:
    """The process-wide executable cache: size, capacity, hits, misses, evictions."""
    return dict(_native.cache_stats())


def cache_clear() -> None:
    """Drop every cached executable and reset the counters."""
    _native.cache_clear()


def set_cache_capacity(capacity: int) -> None:
    """Change the LRU cap (``LUCID_COMPILE_MAX_CACHE`` sets it at start-up, default 32)."""
    _native.cache_set_capacity(capacity)


def set_num_threads(n: int) -> None:
    """Threads the native GEMM may use."""
    _native.set_num_threads(n)


def get_num_threads() -> int:
    return int(_native.get_num_threads())


def thread_setting_error() -> str | None:
    """Why ``LUCID_NUM_THREADS`` is not a usable setting (None when it is unset or valid)."""
    value = os.environ.get("LUCID_NUM_THREADS", "")
    if not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        return f"LUCID_NUM_THREADS must be a positive integer, got {value!r}"
    return None


def _apply_thread_env() -> None:
    # A bad value is not applied here (an import error would hide it); the compiler refuses it
    # once, at the first compile, through thread_setting_error().
    if thread_setting_error() is None and os.environ.get("LUCID_NUM_THREADS", "").strip():
        set_num_threads(int(os.environ["LUCID_NUM_THREADS"]))


_apply_thread_env()

__all__ = [
    "CPUBackend",
    "cache_clear",
    "cache_info",
    "get_num_threads",
    "set_cache_capacity",
    "set_num_threads",
    "thread_setting_error",
]
