"""Stages 2–6 for one traced signature: import, graph passes, lowering, backend compile.

The backend is reached only by name, through ``lucid.backends``' registry: its ``pipeline`` runs
after ``lower-to-prim`` and its ``compile`` makes the executable (see ``lucid/backends/base.py``).

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

from lucid.backends import Unsupported as BackendUnsupported
from lucid.backends import get_backend
from lucid.backends import resolve_backend as _resolve
from lucid.compile import _disk_cache
from lucid.ir import feed_roles as _feed_roles
from lucid.ir import forward_func, import_trace, print_ir, result_roles
from lucid.passes import Instrumentation, PassFailure, PassManager

GRAPH_PIPELINE = "canonicalize,cse,dce"
STAGES = ("imported", "optimized", "prim", "final")


class Unsupported(Exception):
    """The compiler cannot handle this graph; the caller falls back to eager with this reason."""


class FeedMismatch(ValueError):
    """A bound feed no longer has the shape/dtype the executable was compiled for."""


def backend_of(name: str) -> Any:
    """The backend called ``name`` (resolved, available), from the registry."""
    return get_backend(name)


def resolve_backend(name: str) -> str:
    """The backend a ``backend=`` argument selects: ``LUCID_COMPILE_BACKEND`` when it is
    ``"auto"`` and the variable is set, resolved through the registry (``auto``: the best
    backend available here). Unknown: ValueError; unavailable: ``BackendUnavailable`` (why)."""
    if name == "auto":
        name = os.environ.get("LUCID_COMPILE_BACKEND", "").strip() or "auto"
    return _resolve(name)


def lower(module: Any, backend: Any, inst: Instrumentation | None = None) -> dict[str, float]:
    """Stage 4-5: ``lower-to-prim`` and the backend's own passes, in place; a pass that refuses
    the graph raises ``Unsupported`` with its reason."""
    pipeline = "lower-to-prim" + ("," + backend.pipeline if backend.pipeline else "")
    try:
        return PassManager(pipeline, inst or Instrumentation()).run(module).passes_ms()
    except PassFailure as e:
        raise Unsupported(str(e.cause)) from e


def compile_module(
    module: Any, backend: Any, *, inplace: bool = True, inst: Instrumentation | None = None
) -> tuple[Any, dict[str, float]]:
    """Lower a ``lucid``-dialect module and compile it on ``backend``: (executable, ms per
    stage). With ``inplace`` the ``update:`` results are written into their feeds by the run."""
    timings = lower(module, backend, inst)
    t0 = time.perf_counter()
    try:
        executable = backend.compile(module, inplace_updates=inplace)
    except (BackendUnsupported, *backend.refusals) as e:
        raise Unsupported(str(e)) from e
    timings["backend-compile"] = (time.perf_counter() - t0) * 1e3
    return executable, timings


@dataclass
class CompiledGraph:
    executable: Any
    feed_roles: list[str]
    result_roles: list[str]
    passes_ms: dict[str, float]
    #: True when the executable came from the disk cache (``LUCID_COMPILE_DISK_CACHE``).
    from_disk: bool = False

    def run(self, feeds: list) -> list:
        try:
            return self.executable.run(feeds)
        except (TypeError, ValueError) as e:
            raise FeedMismatch(str(e)) from e


def _graph_passes(pipeline: str | None) -> str:
    return pipeline if pipeline is not None else GRAPH_PIPELINE


def _specialized_passes(pipeline: str | None, batch: int) -> str:
    """The graph pipeline with ``shape-specialize{batch=B}`` in front (the dynamic path)."""
    return f"shape-specialize{{batch={batch}}}," + _graph_passes(pipeline)


def _graph_module(
    trace: Any, pipeline: str | None, switches: dict[str, Any] | None, batch: int | None = None
) -> tuple[Any, Instrumentation, dict[str, float]]:
    """Stages 2-3: the imported module after the graph passes, the instrumentation used and the
    time of each stage. With ``batch``, a symbolic-batch trace is specialised to that size by
    the ``shape-specialize`` pass, first in the pipeline (so ``--print-ir-after-all`` shows it)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    module = import_trace(trace)
    timings["import"] = (time.perf_counter() - t0) * 1e3
    inst = Instrumentation.from_env()
    for name, value in (switches or {}).items():
        setattr(inst, name, value)
    passes = _graph_passes(pipeline) if batch is None else _specialized_passes(pipeline, batch)
    graph = PassManager(passes, inst).run(module)
    for name, ms in graph.passes_ms().items():
        timings[name] = timings.get(name, 0.0) + ms
    return module, inst, timings


def compile_trace(
    trace: Any,
    *,
    backend: str,
    pipeline: str | None = None,
    switches: dict[str, Any] | None = None,
    batch: int | None = None,
) -> CompiledGraph:
    """Stages 2-6 for ``trace`` on ``backend`` (a registry name); a symbolic-batch ``trace``
    is specialised to ``batch`` by ``shape-specialize``. With the disk cache on
    (``LUCID_COMPILE_DISK_CACHE=1``, see ``_disk_cache``) a graph compiled before, by any
    process, skips the passes, the lowering and the backend's program building."""
    target = backend_of(backend)
    # The batch is part of what the disk cache keys on (the symbolic trace is the same).
    disk_pipeline = pipeline if batch is None else _specialized_passes(pipeline, batch)
    cached = _from_disk(trace, target, disk_pipeline, switches)
    if isinstance(cached, CompiledGraph):
        return cached
    module, inst, timings = _graph_module(trace, pipeline, switches, batch)
    fn = forward_func(module)
    roles = (_feed_roles(fn), result_roles(fn))
    executable, backend_ms = compile_module(module, target, inst=inst)
    timings.update(backend_ms)
    if cached is not None:
        t0 = time.perf_counter()
        _disk_cache.store(cached, roles[0], roles[1], target.export_program(module))
        timings["disk-cache-store"] = (time.perf_counter() - t0) * 1e3
    return CompiledGraph(executable, roles[0], roles[1], timings)


def _from_disk(
    trace: Any, target: Any, pipeline: str | None, switches: dict[str, Any] | None
) -> CompiledGraph | str | None:
    """The disk cache's graph for ``trace`` (a hit), its entry name (a miss: the caller stores
    what it compiles), or None (the cache is off, the backend exports no program, or the pass
    manager is asked to print or verify, which a hit would skip)."""
    if not _disk_cache.enabled() or getattr(target, "program_format", None) is None:
        return None
    if switches or Instrumentation.from_env() != Instrumentation():
        return None
    t0 = time.perf_counter()
    text = _disk_cache.trace_text(trace)
    if text is None:
        return None
    name = _disk_cache.key(text, backend=target, graph_pipeline=_graph_passes(pipeline))
    hit = _disk_cache.load(name)
    if hit is None:
        return name
    # The roles were checked (checksum) when read; the key covers the graph that made them.
    feeds, results, program = hit
    try:
        executable = target.import_program(program)
    except ValueError as e:
        _disk_cache.discard(name, f"the backend refused its program ({e})")
        return name
    graph = CompiledGraph(executable, feeds, results, {})
    graph.passes_ms["disk-cache-load"] = (time.perf_counter() - t0) * 1e3
    graph.from_disk = True
    return graph


def compile_symbolic_trace(
    trace: Any,
    batch: int,
    *,
    backend: str,
    pipeline: str | None = None,
    switches: dict[str, Any] | None = None,
) -> CompiledGraph:
    """One executable for every batch size of a symbolic-batch ``trace``, on a backend that
    ``supports_symbolic_batch``: the trace is lowered at ``batch`` and at ``batch + 1`` (the
    probe that tells the backend which dimensions are the batch). A backend refusal is
    ``Unsupported`` with its reason."""
    target = backend_of(backend)
    module, inst, timings = _graph_module(trace, pipeline, switches, batch)
    probe, _, _ = _graph_module(trace, pipeline, switches, batch + 1)
    fn = forward_func(module)
    roles = (_feed_roles(fn), result_roles(fn))
    timings.update(lower(module, target, inst))
    lower(probe, target)
    t0 = time.perf_counter()
    try:
        executable = target.compile_symbolic(module, probe, inplace_updates=True)
    except (BackendUnsupported, *target.refusals) as e:
        raise Unsupported(str(e)) from e
    timings["backend-compile"] = (time.perf_counter() - t0) * 1e3
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
    target = backend_of(backend)
    lower(module, target)
    if stage == "prim":
        return print_ir(module)
    return target.stage_ir(module)


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
