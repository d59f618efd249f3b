"""Stages 2–6 for one traced signature, and the only place they are replayed.

The backend is reached only by name, through ``lucid.backends``' registry: its ``pipeline`` runs
after ``lower-to-prim`` and its ``compile`` makes the executable (see ``lucid/backends/base.py``).

``CompileSession`` carries one compile's debugging switches and stage timings; ``compile_trace``
runs import, graph passes, lowering and the backend compile in order and returns a
``CompiledGraph`` (the executable plus what the caller needs to bind it). ``ir_at`` and
``trace_ir`` replay the same stages to show the IR at any of them (``ir(stage=...)`` of every
wrapper), so the compile path itself never prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# lucid.ir and lucid.passes load their contents on first use: a disk-cache hit compiles nothing
# and loads no xDSL.
from lucid import ir
from lucid import passes as _passes
from lucid.backends import Unsupported as BackendUnsupported
from lucid.compile import _disk_cache
from lucid.compile.errors import FeedMismatch, Unsupported, check_value_sizes
from lucid.compile.options import GRAPH_PIPELINE, backend_of, env_flag
from lucid.ir._gc import paused_gc, promote_young, release_ir
from lucid.passes.instrumentation import Instrumentation

__all__ = [
    "STAGES",
    "CompileSession",
    "CompiledGraph",
    "compile_module",
    "compile_symbolic_trace",
    "compile_trace",
    "discard_from_disk",
    "dump_trace",
    "ir_at",
    "lower",
    "specialize_batch",
    "trace_ir",
]

STAGES = ("imported", "optimized", "prim", "final")

logger = logging.getLogger("lucid.compile")


_TREE_ENTRY = re.compile(r"^(\d+)_")


def _tree_subfolder(tree: str, pipeline: str) -> str:
    """A new folder ``<tree>/<NN>_<pipeline>`` numbered after every entry already there, so
    that no two pipelines (of one compile, of several, of earlier processes) share one."""
    os.makedirs(tree, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", pipeline)
    while True:
        taken = [int(m.group(1)) for e in os.listdir(tree) if (m := _TREE_ENTRY.match(e))]
        path = os.path.join(tree, f"{max(taken, default=-1) + 1:02d}_{name}")
        try:
            os.makedirs(path)
            return path
        except FileExistsError:  # another thread or process took the number: try the next
            continue


class CompileSession:
    """The debugging switches and the timings of one compile, whatever the entry point
    (``lucid.compile`` calls with or without grad mode, training steps).

    Every pass pipeline of the compile runs through ``run_passes`` (or ``lower`` /
    ``compile_module``) with the switches of ``LUCID_COMPILE_PRINT_IR_*`` and friends plus the
    ``options=`` ones; ``LUCID_COMPILE_PRINT_IR_TREE_DIR`` gives each pipeline its own
    numbered subfolder (``03_forward-lowering/00_input.mlir``). ``passes_ms`` collects the time
    of each stage (``prefix:`` tells pipelines apart, e.g. ``backward:lower-to-prim``), and
    ``finish`` applies ``LUCID_COMPILE_VERBOSE`` (one log line) and ``LUCID_COMPILE_DEBUG``
    (the trace JSON written out).

    >>> session = CompileSession(switches)
    >>> session.run_passes("canonicalize,cse,dce", module, pipeline="graph")
    >>> exe = session.compile_module(module, backend, pipeline="lowering")
    >>> session.finish("fused_step (x: 32x784)", trace=trace, backend=name)
    """

    def __init__(self, switches: dict[str, Any] | None = None, *, env: bool = True):
        self.switches = dict(switches or {})
        self.env = env  # False: the LUCID_COMPILE_* variables do not apply (internal compiles)
        self.passes_ms: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def instrumentation(self, pipeline: str) -> Instrumentation:
        """The pass manager's switches for one pipeline of this compile."""
        inst = Instrumentation.from_env() if self.env else Instrumentation()
        for name, value in self.switches.items():
            setattr(inst, name, value)
        if inst.print_ir_tree_dir:
            inst.print_ir_tree_dir = _tree_subfolder(inst.print_ir_tree_dir, pipeline)
        return inst

    @property
    def quiet(self) -> bool:
        """No pass-manager switch is on (the disk cache may then skip the passes)."""
        return not self.switches and (
            not self.env or Instrumentation.from_env() == Instrumentation()
        )

    def record(self, name: str, ms: float) -> None:
        self.passes_ms[name] = self.passes_ms.get(name, 0.0) + ms

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block as the stage ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, (time.perf_counter() - t0) * 1e3)

    def run_passes(
        self,
        passes: str | Sequence[Any],
        module: Any,
        *,
        pipeline: str,
        prefix: str = "",
        instrumented: bool = True,
    ) -> None:
        """Run ``passes`` (a spec or pass instances) on ``module`` in place with the switches
        (``pipeline`` names the run in the IR tree); a ``PassFailure`` propagates."""
        inst = self.instrumentation(pipeline) if instrumented else Instrumentation()
        report = _passes.PassManager(passes, inst).run(module)
        for name, ms in report.passes_ms().items():
            self.record(prefix + name, ms)

    def lower(
        self, module: Any, backend: Any, *, pipeline: str = "lowering", prefix: str = ""
    ) -> None:
        """Stages 4-5: ``lower-to-prim`` and the backend's own passes, in place; a pass that
        refuses the graph raises ``Unsupported`` with its reason."""
        passes = "lower-to-prim" + ("," + backend.pipeline if backend.pipeline else "")
        try:
            self.run_passes(passes, module, pipeline=pipeline, prefix=prefix)
        except _passes.PassFailure as e:
            raise Unsupported(str(e.cause)) from e

    def compile_module(
        self,
        module: Any,
        backend: Any,
        *,
        inplace: bool = True,
        pipeline: str = "lowering",
        prefix: str = "",
    ) -> Any:
        """Lower a ``lucid``-dialect module and compile it on ``backend``; the executable. With
        ``inplace`` the ``update:`` results are written into their feeds by the run."""
        self.lower(module, backend, pipeline=pipeline, prefix=prefix)
        with self.timed(prefix + "backend-compile"):
            try:
                return backend.compile(module, inplace_updates=inplace)
            except (BackendUnsupported, *backend.refusals) as e:
                raise Unsupported(str(e)) from e

    def finish(self, what: str, *, trace: Any = None, backend: str = "", n_ops: int | None = None):
        """End of the compile: the milliseconds since the session began. With
        ``LUCID_COMPILE_VERBOSE`` one line on the ``lucid.compile`` logger (what, ops, time per
        stage, backend); with ``LUCID_COMPILE_DEBUG`` the trace JSON is written
        (``LUCID_COMPILE_DEBUG_DIR``). A compile run under ``paused_gc`` (the whole of it,
        tracing included) moves what it allocated and keeps to the oldest generation here,
        without scanning it (``promote_young``, see ``lucid.ir._gc``), timed as the stage
        ``gc``."""
        t0 = time.perf_counter()
        if promote_young():
            self.record("gc", (time.perf_counter() - t0) * 1e3)
        compile_ms = (time.perf_counter() - self.t0) * 1e3
        if env_flag("LUCID_COMPILE_VERBOSE"):
            if n_ops is None:
                n_ops = len(trace.ops) if trace is not None else 0
            split = ", ".join(f"{k} {v:.1f}" for k, v in self.passes_ms.items())
            logger.warning(
                "lucid.compile: compiled %s: %d ops, %.1f ms (%s), backend %s",
                what,
                n_ops,
                compile_ms,
                split,
                backend,
            )
        if trace is not None and env_flag("LUCID_COMPILE_DEBUG"):
            dump_trace(trace)
        return compile_ms


def lower(module: Any, backend: Any, inst: Instrumentation | None = None) -> dict[str, float]:
    """Stage 4-5 without debugging switches (``inst``: the pass manager's, if any): the time of
    each pass. A pass that refuses the graph raises ``Unsupported`` with its reason."""
    pipeline = "lower-to-prim" + ("," + backend.pipeline if backend.pipeline else "")
    try:
        return _passes.PassManager(pipeline, inst or Instrumentation()).run(module).passes_ms()
    except _passes.PassFailure as e:
        raise Unsupported(str(e.cause)) from e


def compile_module(
    module: Any, backend: Any, *, inplace: bool = True, session: CompileSession | None = None
) -> tuple[Any, dict[str, float]]:
    """Lower a ``lucid``-dialect module and compile it on ``backend``: (executable, ms per
    stage). With ``inplace`` the ``update:`` results are written into their feeds by the run.
    Without ``session`` no debugging switch applies (a session: see ``CompileSession``)."""
    session = session or CompileSession(env=False)
    with paused_gc():  # the whole compile: see lucid.ir._gc
        executable = session.compile_module(module, backend, inplace=inplace)
    return executable, dict(session.passes_ms)


@dataclass
class CompiledGraph:
    executable: Any
    feed_roles: list[str]
    result_roles: list[str]
    passes_ms: dict[str, float]
    #: True when the executable came from the disk cache (``LUCID_COMPILE_DISK_CACHE``).
    from_disk: bool = False
    #: The disk-cache entry it came from (see ``discard_from_disk``).
    disk_key: str | None = None

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
    trace: Any,
    pipeline: str | None,
    switches: dict[str, Any] | None,
    batch: int | None = None,
    *,
    session: CompileSession | None = None,
    label: str = "graph",
    prefix: str = "",
) -> tuple[Any, CompileSession, dict[str, float]]:
    """Stages 2-3: the imported module after the graph passes, the session and the time of
    each stage so far. With ``batch``, a symbolic-batch trace is specialised to that size by the
    ``shape-specialize`` pass, first in the pipeline (so ``--print-ir-after-all`` shows it)."""
    session = session or CompileSession(switches)
    with session.timed(prefix + "import"):
        module = ir.import_trace(trace)
    passes = _graph_passes(pipeline) if batch is None else _specialized_passes(pipeline, batch)
    session.run_passes(passes, module, pipeline=label, prefix=prefix)
    return module, session, dict(session.passes_ms)


@paused_gc()  # the whole compile (see lucid.ir._gc)
def compile_trace(
    trace: Any,
    *,
    backend: str,
    pipeline: str | None = None,
    switches: dict[str, Any] | None = None,
    batch: int | None = None,
    session: CompileSession | None = None,
) -> CompiledGraph:
    """Stages 2-6 for ``trace`` on ``backend`` (a registry name); a symbolic-batch ``trace``
    is specialised to ``batch`` by ``shape-specialize``. With the disk cache on
    (``LUCID_COMPILE_DISK_CACHE=1``, see ``_disk_cache``) a graph compiled before, by any
    process, skips the passes, the lowering and the backend's program building."""
    check_value_sizes(trace, batch)
    session = session or CompileSession(switches)
    target = backend_of(backend)
    # The batch is part of what the disk cache keys on (the symbolic trace is the same).
    disk_pipeline = pipeline if batch is None else _specialized_passes(pipeline, batch)
    cached = _from_disk(trace, target, disk_pipeline, session)
    if isinstance(cached, CompiledGraph):
        return cached
    module, _, _ = _graph_module(trace, pipeline, None, batch, session=session)
    fn = ir.forward_func(module)
    roles = (ir.feed_roles(fn), ir.result_roles(fn))
    executable = session.compile_module(module, target)
    # Only graphs whose roles are the trace's are stored: that is what a hit is checked against.
    if cached is not None and roles == _trace_roles(trace):
        with session.timed("disk-cache-store"):
            _disk_cache.store(cached, roles[0], roles[1], target.export_program(module))
    # Nothing reads the module any more (the executable is the backend's own program): freed
    # now by reference counting, not by the collection that ends the compile (see release_ir).
    release_ir(module)
    return CompiledGraph(executable, roles[0], roles[1], dict(session.passes_ms))


def _trace_roles(trace: Any) -> tuple[list[str], list[str]]:
    return [f.role for f in trace.feeds], [role for role, _ in trace.outputs]


def discard_from_disk(graph: CompiledGraph, problem: str) -> None:
    """Remove the disk-cache entry ``graph`` came from (it did not fit the graph at run time),
    so the next compile of that graph compiles it afresh."""
    if graph.disk_key is not None:
        _disk_cache.discard(graph.disk_key, problem)


def _from_disk(
    trace: Any, target: Any, pipeline: str | None, session: CompileSession
) -> CompiledGraph | str | None:
    """The disk cache's graph for ``trace`` (a hit), its entry name (a miss: the caller stores
    what it compiles), or None (the cache is off, the backend exports no program, or the pass
    manager is asked to print or verify, which a hit would skip)."""
    if not _disk_cache.enabled() or getattr(target, "program_format", None) is None:
        return None
    if not session.quiet:
        return None
    t0 = time.perf_counter()
    text = _disk_cache.trace_text(trace)
    if text is None:
        return None
    name = _disk_cache.key(text, backend=target, graph_pipeline=_graph_passes(pipeline))
    hit = _disk_cache.load(name)
    if hit is None:
        return name
    # The checksum says the entry is whole; whether it fits this graph is checked here, and
    # one that does not is removed (the caller compiles and stores the graph afresh).
    feeds, results, program = hit
    if (feeds, results) != _trace_roles(trace):
        _disk_cache.discard(name, "its feed or result roles are not the graph's")
        return name
    try:
        executable = target.import_program(program)
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        _disk_cache.discard(name, f"the backend refused its program ({type(e).__name__}: {e})")
        return name
    counts = (getattr(executable, "num_feeds", None), getattr(executable, "num_results", None))
    if counts[0] is not None and counts != (len(feeds), len(results)):
        _disk_cache.discard(name, "its program's feeds or results are not the graph's")
        return name
    graph = CompiledGraph(executable, feeds, results, {}, disk_key=name)
    graph.passes_ms["disk-cache-load"] = (time.perf_counter() - t0) * 1e3
    graph.from_disk = True
    return graph


@paused_gc()  # the whole compile (see lucid.ir._gc)
def compile_symbolic_trace(
    trace: Any,
    batch: int,
    *,
    backend: str,
    pipeline: str | None = None,
    switches: dict[str, Any] | None = None,
    session: CompileSession | None = None,
) -> CompiledGraph:
    """One executable for every batch size of a symbolic-batch ``trace``, on a backend that
    ``supports_symbolic_batch``: the trace is lowered at ``batch`` and at ``batch + 1`` (the
    probe that tells the backend which dimensions are the batch). A backend refusal is
    ``Unsupported`` with its reason."""
    check_value_sizes(trace, batch + 1)
    session = session or CompileSession(switches)
    target = backend_of(backend)
    module, _, _ = _graph_module(trace, pipeline, None, batch, session=session)
    probe, _, _ = _graph_module(
        trace, pipeline, None, batch + 1, session=session, label="probe-graph", prefix="probe:"
    )
    fn = ir.forward_func(module)
    roles = (ir.feed_roles(fn), ir.result_roles(fn))
    session.lower(module, target)
    session.lower(probe, target, pipeline="probe-lowering", prefix="probe:")
    with session.timed("backend-compile"):
        try:
            executable = target.compile_symbolic(module, probe, inplace_updates=True)
        except (BackendUnsupported, *target.refusals) as e:
            raise Unsupported(str(e)) from e
    return CompiledGraph(executable, roles[0], roles[1], dict(session.passes_ms))


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


def ir_at(module: Any, start: str, stage: str, *, backend: str, pipeline: str | None = None) -> str:
    """The MLIR text of ``module`` (at stage ``start``: ``imported``, ``optimized``,
    ``lowered`` or ``prim``) brought to ``stage``: ``imported``, ``optimized`` (after the graph
    ``pipeline``), ``prim`` (lowered and the backend's passes) or ``final`` (the backend's
    program). ``module`` is changed in place."""
    order = ("imported", "optimized", "lowered", "prim", "final")
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    if order.index(stage) < order.index(start):
        raise ValueError(f"stage {stage!r} comes before what is kept ({start!r})")
    if start == "imported" and stage != "imported":
        _passes.PassManager(_graph_passes(pipeline)).run(module)
    if stage in ("imported", "optimized"):
        return ir.print_ir(module)
    target = backend_of(backend)
    if start in ("imported", "optimized"):
        lower(module, target)
    elif start == "lowered" and target.pipeline:
        _passes.PassManager(target.pipeline).run(module)
    return ir.print_ir(module) if stage == "prim" else target.stage_ir(module)


def trace_ir(trace: Any, stage: str, *, backend: str, pipeline: str | None = None) -> str:
    """The module of ``trace`` at ``stage``, replayed from the trace (``pipeline``: the graph
    passes it was compiled with; None for the default)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    return ir_at(ir.import_trace(trace), "imported", stage, backend=backend, pipeline=pipeline)
