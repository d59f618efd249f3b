"""The CPU backend: fuse-elementwise on the program, then the native runtime compiles and caches it.

Threading policy: the native runtime is single-threaded except for GEMM (matmul and convolution),
which uses the OpenBLAS (or Accelerate) thread pool of the native module. Its size is
``LUCID_NUM_THREADS`` when set, else the BLAS default (one per core); change it with
:func:`set_num_threads`. numpy carries its own OpenBLAS: when both pools spin on the same cores
they slow each other down, so set ``OPENBLAS_THREAD_TIMEOUT=1`` (or fewer threads on one side)
before starting a process that interleaves numpy BLAS and compiled calls. See docs/backend-cpu.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lucid._native_loader import _native
from lucid.backends.base import Backend, Unsupported
from lucid.backends.cpu.fuse import fuse_elementwise
from lucid.backends.cpu.kernel_fusion import fuse_kernels
from lucid.backends.cpu.program import Program
from lucid.backends.prim_ops import PRIM_OPS


class CPUBackend(Backend):
    """The native CPU runtime: ``prim-simplify`` after ``lower-to-prim``, then the prim module is
    emitted as a native :class:`Program`, GEMM epilogues and layer norms become single kernels
    (``fuse-kernels``), elementwise chains are fused and ``lucid._native``
    compiles it (buffer planning; executables cached process-wide, ``LUCID_COMPILE_MAX_CACHE``).
    """

    name = "cpu"
    pipeline = "prim-simplify"

    def __init__(self, fuse: bool = True, cache: bool = True) -> None:
        self.fuse = fuse
        self.cache = cache

    def available(self) -> tuple[bool, str]:
        return True, ""  # the native module is part of every install

    def check_settings(self) -> None:
        error = thread_setting_error()
        if error is not None:
            raise ValueError(error)

    def supported_ops(self) -> frozenset[str]:
        return frozenset(PRIM_OPS) & frozenset(_native.op_names())

    def program(self, module: Any, *, inplace_updates: bool = True) -> Program:
        """The (fused, unless ``fuse=False``) native program of a prim module; with
        ``inplace_updates``, ``update:<role>`` results are written into their feeds by the
        runtime."""
        from lucid.backends.cpu.emit import EmitError, emit_program
        from lucid.backends.cpu.program import Instr
        from lucid.backends.prim_ops import Aval

        try:
            desc = emit_program(module, inplace_updates=inplace_updates).desc
        except EmitError as e:
            raise Unsupported(str(e)) from e
        program = Program()
        program.slots = [Aval(tuple(shape), dt) for shape, dt in desc["slots"]]
        program.instrs = [Instr(op, tuple(i), tuple(o), dict(a)) for op, i, o, a in desc["instrs"]]
        program.feeds = list(desc["feeds"])
        program.results = list(desc["results"])
        program.inplace = dict(desc.get("inplace", {}))
        return fuse_elementwise(fuse_kernels(program)) if self.fuse else program

    def compile(self, module: Any, *, inplace_updates: bool = True) -> Any:
        """A native executable (``run(feeds) -> list[np.ndarray]``) of a prim module, or of an
        already emitted :class:`Program` (tests and tools); ValueError if malformed."""
        if isinstance(module, Program):
            program = fuse_elementwise(fuse_kernels(module)) if self.fuse else module
        else:
            program = self.program(module, inplace_updates=inplace_updates)
        return _native.compile(program.describe(), self.cache)

    program_format = "lucid-cpu-program/1"

    def export_program(self, module: Any, *, inplace_updates: bool = True) -> str:
        """The program description ``lucid._native.compile`` takes, as JSON (``inplace_updates``
        as for ``compile``)."""
        # allow_nan: attributes hold infinities (reduction identities, clamps); Python reads them.
        return json.dumps(self.program(module, inplace_updates=inplace_updates).describe())

    def import_program(self, text: str, *, inplace_updates: bool = True) -> Any:
        """A native executable of ``export_program``'s JSON; the native validator checks every
        slot, instruction and attribute, so a malformed description is a ValueError."""
        try:
            desc = json.loads(text)
            desc["slots"] = [(tuple(shape), dtype) for shape, dtype in desc["slots"]]
            desc["instrs"] = [
                (op, list(i), list(o), {k: _attr(v) for k, v in a.items()})
                for op, i, o, a in desc["instrs"]
            ]
            desc["inplace"] = {int(r): int(f) for r, f in desc.get("inplace", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"not a CPU program description: {e}") from None
        return _native.compile(desc, self.cache)

    def stage_ir(self, module: Any) -> str:
        from lucid.ir import print_ir

        return print_ir(module) + "\n// native program\n" + self.program(module).dump()


def _attr(value: Any) -> Any:
    # JSON has no tuples: shape-like attributes come back as lists.
    return tuple(_attr(v) for v in value) if isinstance(value, list) else value


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
