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

from lucid.ir import forward_func, import_trace, print_ir, result_roles
from lucid.ir import feed_roles as _feed_roles
from lucid.passes import Instrumentation, PassManager

GRAPH_PIPELINE = "canonicalize,cse,dce"
STAGES = ("imported", "optimized", "prim", "final")


class Unsupported(Exception):
    """The compiler cannot handle this graph; the caller falls back to eager with this reason."""


class FeedMismatch(Exception):
    """A bound feed no longer has the shape/dtype the executable was compiled for."""


def resolve_backend(name: str) -> str:
    from lucid.backends import available_backends, default_backend

    if name == "auto":
        return default_backend()
    if name not in available_backends():
        raise ValueError(f"unknown or unavailable backend {name!r}; available: "
                         f"{sorted(available_backends())}")
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


def compile_trace(trace: Any, *, backend: str, pipeline: str | None = None,
                  print_ir_after_all: bool = False, dynamic: bool = False) -> CompiledGraph:
    from lucid.backends import get_backend

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    module = import_trace(trace)
    timings["import"] = (time.perf_counter() - t0) * 1e3
    inst = Instrumentation.from_env()
    if print_ir_after_all:
        inst.print_ir_after_all = True
    graph = PassManager(_graph_passes(pipeline), inst).run(module)
    for name, ms in graph.passes_ms.items():
        timings[name] = timings.get(name, 0.0) + ms
    impl = get_backend(backend)
    try:
        executable, backend_ms = impl.compile_module(module, instrumentation=inst)
    except impl.Unsupported as e:  # the backend says why it cannot take this graph
        raise Unsupported(str(e)) from e
    timings.update(backend_ms)
    fn = forward_func(module)
    return CompiledGraph(executable, _feed_roles(fn), result_roles(fn), timings)


def stage_ir(trace: Any, stage: str, *, backend: str, pipeline: str | None = None) -> str:
    """The module of ``trace`` at ``stage`` (see ``STAGES``), as MLIR text."""
    from lucid.backends import get_backend

    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    module = import_trace(trace)
    if stage == "imported":
        return print_ir(module)
    PassManager(_graph_passes(pipeline)).run(module)
    if stage == "optimized":
        return print_ir(module)
    return get_backend(backend).stage_ir(module, stage)


def dump_trace(trace: Any) -> str:
    """Write the trace JSON to ``LUCID_COMPILE_DEBUG_DIR`` (default: the temp dir)."""
    folder = os.environ.get("LUCID_COMPILE_DEBUG_DIR") or tempfile.gettempdir()
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="lucid-trace-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(trace.to_dict(), f, indent=1)
    sys.stderr.write(f"lucid.compile: trace written to {path}\n")
    return path
