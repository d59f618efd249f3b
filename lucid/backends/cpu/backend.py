"""The CPU backend: fuse-elementwise on the program, then the native runtime compiles and caches it.

Threading policy: the native runtime is single-threaded except for GEMM (matmul and convolution),
which uses the OpenBLAS (or Accelerate) thread pool of the native module, and large compute-bound
elementwise chains, split across the module's worker pool. Both use ``LUCID_NUM_THREADS`` threads
when set, else the BLAS default (one per core); change it with :func:`set_num_threads`. While
other processes keep the cores busy, runs use only the cores left free (at least one) and get the
configured count back when the load goes away (:func:`set_adaptive_threads`,
``LUCID_ADAPTIVE_THREADS=0`` to turn it off; Linux). numpy carries its own OpenBLAS, whose idle
workers ``import lucid`` puts to sleep at once, whatever the import order (``lucid/_threads.py``).
See docs/backend-cpu.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lucid._native_loader import _native
from lucid._threads import thread_env_error
from lucid.backends.base import Backend, Unsupported
from lucid.ir._gc import paused_gc

if TYPE_CHECKING:
    from lucid.backends.cpu.program import Program

_split = threading.local()


def last_compile_split() -> dict[str, float]:
    """Milliseconds of each step of this thread's last ``CPUBackend.compile``: ``emit`` (prim
    module to program), ``fuse-kernels``, ``fuse-elementwise`` and ``native-compile`` (buffer
    planning and the executable); empty before the first. ``timing()["passes_ms"]`` has their
    sum as ``backend-compile``; the benchmarks read the split from here."""
    return dict(getattr(_split, "ms", {}))


@contextmanager
def _step(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _split.ms[name] = _split.ms.get(name, 0.0) + (time.perf_counter() - t0) * 1e3


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
        # The composite ops with a native kernel (gelu, gelu_grad) run it; others are expanded.
        # (Imported here: a disk-cache hit loads a stored program without the prim dialect.)
        from lucid.ir.prim import COMPOSITE_OPS, PRIM_OPS

        return (frozenset(PRIM_OPS) | frozenset(COMPOSITE_OPS)) & frozenset(_native.op_names())

    def program(self, module: Any, *, inplace_updates: bool = True) -> Program:
        """The (fused, unless ``fuse=False``) native program of a prim module; with
        ``inplace_updates``, ``update:<role>`` results are written into their feeds by the
        runtime."""
        from lucid.backends.cpu.emit import EmitError, emit_program
        from lucid.ir.prim.expand import expand_composites

        _split.ms = {}
        with _step("emit"):
            expand_composites(module, keep=self.supported_ops())
            try:
                program = emit_program(module, inplace_updates=inplace_updates).program
            except EmitError as e:
                raise Unsupported(str(e)) from e
        return self._fused(program)

    def _fused(self, program: Program) -> Program:
        from lucid.backends.cpu.fuse_elementwise import fuse_elementwise
        from lucid.backends.cpu.rewrites import fuse_kernels

        if not self.fuse:
            return program
        with _step("fuse-kernels"):
            program = fuse_kernels(program)
        with _step("fuse-elementwise"):
            return fuse_elementwise(program)

    def compile(self, module: Any, *, inplace_updates: bool = True) -> Any:
        """A native executable (``run(feeds) -> list[np.ndarray]``) of a prim module, or of an
        already emitted :class:`Program` (tests and tools); ValueError if malformed."""
        # Imported here, not at the top: a program loaded from a file (load_compiled, the disk
        # cache) is compiled through import_program and never needs the program model.
        from lucid.backends.cpu.program import Program

        with paused_gc():  # see lucid.ir._gc: collections cost more than they free here
            return self._compile_paused(module, inplace_updates, Program)

    def _compile_paused(self, module: Any, inplace_updates: bool, program_type: type) -> Any:
        # A helper, so the emitted program (every instruction, attribute dict and slot) is freed
        # by reference counting when it returns: the collection that follows the pause then
        # walks only what outlives the compile, not a program about to die (a whole-program walk
        # per compile, growing faster than the program on large steps).
        if isinstance(module, program_type):
            _split.ms = {}
            program = self._fused(module)
        else:
            program = self.program(module, inplace_updates=inplace_updates)
        with _step("native-compile"):
            return _native.compile(program.describe(copy=False), self.cache)

    def bound_call(
        self, executable: Any, positions: Sequence[int], tensors: Sequence[Any], *, single: bool
    ) -> Any:
        """A native ``call(args, kwargs=None)`` doing a whole cache hit of ``lucid.compile``
        in one C++ call: feeds ``args[p]._data`` for each of ``positions`` then ``t._data`` for
        each of ``tensors`` (checked as ``run`` checks them: TypeError/ValueError on a mismatch),
        runs ``executable`` and returns its results as new Tensors (the Tensor itself with
        ``single``, else a list). None when ``executable`` is not this backend's or writes a feed
        in place (its caller then binds and wraps in Python)."""
        from lucid._tensor import Tensor

        if not isinstance(executable, _native.Executable):
            return None
        try:
            return _native.BoundCall(
                executable, list(positions), list(tensors), Tensor._wrap(None), single
            )
        except ValueError:  # a program with in-place results, a Tensor it cannot build
            return None

    # /2: attention and attention_grad carry ``causal``, which a /1 reader would ignore.
    # /3: conv2d_bias takes an optional scale and residual (x, w, bias[, scale[, residual]]).
    program_format = "lucid-cpu-program/3"

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
    """Threads the native GEMM and the worker pool may use (at most: see
    :func:`set_adaptive_threads`)."""
    _native.set_num_threads(n)


def get_num_threads() -> int:
    """The configured thread count (:func:`set_num_threads`, ``LUCID_NUM_THREADS``)."""
    return int(_native.get_num_threads())


def set_adaptive_threads(enabled: bool) -> None:
    """With ``enabled`` (the default unless ``LUCID_ADAPTIVE_THREADS=0``), runs use fewer threads
    than configured while other processes keep the cores busy; off, always the configured count."""
    _native.set_adaptive_threads(bool(enabled))


def thread_stats() -> dict[str, Any]:
    """The thread policy's state: ``configured`` and ``effective`` thread counts, ``blas_threads``
    (the native BLAS's own count), ``adaptive``, ``contended``, ``other_cores`` (the last estimate
    of other processes' load on the allowed cores, -1 before the first), ``allowed_cpus``, and
    counters (``samples``, ``changes``, ``parts_run_by_caller``, ``sample_seconds``)."""
    return dict(_native.thread_stats())


def thread_setting_error() -> str | None:
    """Why ``LUCID_NUM_THREADS`` or ``LUCID_ADAPTIVE_THREADS`` is not a usable setting (None when
    unset or valid)."""
    return thread_env_error()


__all__ = [
    "CPUBackend",
    "cache_clear",
    "cache_info",
    "get_num_threads",
    "set_cache_capacity",
    "set_adaptive_threads",
    "set_num_threads",
    "thread_setting_error",
    "thread_stats",
]
