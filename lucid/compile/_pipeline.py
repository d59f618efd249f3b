"""Stages 2–6 for one traced signature: import, graph passes, lowering, backend compile.

``compile_trace`` runs them in order and returns a ``CompiledGraph`` (the executable plus what
the caller needs to bind it). ``stage_ir`` replays the same stages to show the IR at any of them,
so the compile path itself never prints.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from lucid.ir import feed_roles as _feed_roles
from lucid.ir import forward_func, import_trace, print_ir, result_roles
from lucid.passes import Instrumentation, PassManager

GRAPH_PIPELINE = "canonicalize,cse,dce"
STAGES = ("imported", "optimized", "prim", "final")


class Unsupported(Exception):
    """The compiler cannot handle this graph; the caller falls back to eager with this reason."""


class FeedMismatch(ValueError):
    """A bound feed no longer has the shape/dtype the executable was compiled for."""


class _CPUTarget:
    """Stages 4–6 on the CPU: lower-to-prim, emit the native program, fuse-elementwise, compile
    (the native module plans buffers and caches the executable process-wide)."""

    name = "cpu"

    def lower(self, module: Any, inst: Instrumentation | None = None) -> dict[str, float]:
        pipeline = PassManager("lower-to-prim,prim-simplify", inst or Instrumentation())
        return pipeline.run(module).passes_ms()

    def program(self, module: Any, inplace: bool = True) -> Any:
        """The fused native program of a prim module; with ``inplace``, ``update:<role>`` results
        are written into their feeds by the runtime."""
        from lucid.backends.cpu import Program, fuse_elementwise
        from lucid.backends.cpu.emit import emit_program
        from lucid.backends.cpu.program import Instr
        from lucid.backends.prim_ops import Aval

        desc = emit_program(module, inplace_updates=inplace).desc
        program = Program()
        program.slots = [Aval(tuple(shape), dt) for shape, dt in desc["slots"]]
        program.instrs = [Instr(op, tuple(i), tuple(o), dict(a)) for op, i, o, a in desc["instrs"]]
        program.feeds = list(desc["feeds"])
        program.results = list(desc["results"])
        program.inplace = dict(desc.get("inplace", {}))
        return fuse_elementwise(program)

    def compile_module(self, module: Any, inst: Instrumentation | None = None):
        from lucid import _native
        from lucid.passes import PassFailure

        timings: dict[str, float] = {}
        try:
            timings.update(self.lower(module, inst))
        except PassFailure as e:
            raise Unsupported(str(e.cause)) from e
        t0 = time.perf_counter()
        program = self.program(module)
        timings["emit"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        executable = _native.compile(program.describe(), True)
        timings["native-compile"] = (time.perf_counter() - t0) * 1e3
        return executable, timings

    def stage_ir(self, module: Any, stage: str) -> str:
        self.lower(module)
        if stage == "prim":
            return print_ir(module)
        return print_ir(module) + "\n// native program\n" + self.program(module).dump()


_TARGETS = {"cpu": _CPUTarget()}


def available_backends() -> tuple[str, ...]:
    return tuple(_TARGETS)


def resolve_backend(name: str) -> str:
    """``auto`` is MPSGraph on Apple Silicon with Metal, the CPU everywhere else."""
    if name == "auto":
        return "cpu"
    if name == "mpsgraph":
        raise ValueError(
            "backend 'mpsgraph' needs Apple Silicon with macOS 14+; it is not "
            "available on this machine (use backend='cpu' or 'auto')"
        )
    if name not in _TARGETS:
        raise ValueError(f"unknown backend {name!r}; expected 'auto', 'cpu' or 'mpsgraph'")
    return name


@dataclass
class CompiledGraph:
    executable: Any
    feed_roles: list[str]
    result_roles: list[str]
    passes_ms: dict[str, float]

    def run(self, feeds: list) -> list:
        try:
            return self.executable.run(feeds)
        except (TypeError, ValueError) as e:
            raise FeedMismatch(str(e)) from e


def _graph_passes(pipeline: str | None) -> str:
    return pipeline if pipeline is not None else GRAPH_PIPELINE


def compile_trace(
    trace: Any,
    *,
    backend: str,
    pipeline: str | None = None,
    switches: dict[str, Any] | None = None,
) -> CompiledGraph:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    module = import_trace(trace)
    timings["import"] = (time.perf_counter() - t0) * 1e3
    inst = Instrumentation.from_env()
    for name, value in (switches or {}).items():
        setattr(inst, name, value)
    graph = PassManager(_graph_passes(pipeline), inst).run(module)
    for name, ms in graph.passes_ms().items():
        timings[name] = timings.get(name, 0.0) + ms
    fn = forward_func(module)
    roles = (_feed_roles(fn), result_roles(fn))
    executable, backend_ms = _TARGETS[backend].compile_module(module, inst)
    timings.update(backend_ms)
    return CompiledGraph(executable, roles[0], roles[1], timings)


def stage_ir(trace: Any, stage: str, *, backend: str, pipeline: str | None = None) -> str:
    """The module of ``trace`` at ``stage`` (see ``STAGES``), as MLIR text."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    module = import_trace(trace)
    if stage == "imported":
        return print_ir(module)
    PassManager(_graph_passes(pipeline)).run(module)
    if stage == "optimized":
        return print_ir(module)
    return _TARGETS[backend].stage_ir(module, stage)


def dump_trace(trace: Any) -> str:
    """Write the trace JSON to ``LUCID_COMPILE_DEBUG_DIR`` (default: the temp dir)."""
    folder = os.environ.get("LUCID_COMPILE_DEBUG_DIR") or tempfile.gettempdir()
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="lucid-trace-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(trace.to_dict(), f, indent=1)
    sys.stderr.write(f"lucid.compile: trace written to {path}\n")
    return path


def specialize_batch(trace: Any, batch: int) -> Any:
    """A copy of a symbolic-batch trace with the batch dim (None) set to ``batch``, in value
    shapes and in shape-like attributes (tuples of dims)."""
    from lucid.trace._trace import Feed, Trace, TraceOp, Value

    values: dict[int, Value] = {}

    def value(v: Any) -> Any:
        if isinstance(v, Value):
            new = values.get(v.id)
            if new is None:
                shape = tuple(batch if d is None else d for d in v.shape)
                new = values[v.id] = Value(v.id, shape, v.dtype, v.device)
            return new
        if isinstance(v, list):
            return [value(e) for e in v]
        return v

    def attr(a: Any) -> Any:
        if isinstance(a, (tuple, list)):
            return type(a)(batch if e is None else attr(e) for e in a)
        return a

    return Trace(
        feeds=[Feed(value(f.value), f.role) for f in trace.feeds],
        ops=[
            TraceOp(
                op.name,
                [value(i) for i in op.inputs],
                [value(o) for o in op.outputs],
                {k: attr(v) for k, v in op.attrs.items()},
            )
            for op in trace.ops
        ],
        outputs=[(role, value(v)) for role, v in trace.outputs],
    )
