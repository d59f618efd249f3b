"""What every compiled wrapper shows of itself, written once: ``cache_info``, ``timing``, ``ir``
and ``profile``.

``CompiledModule``, the training steps and the callables ``load_compiled`` returns each answer
these four with the same keys and the same rules; what differs (a loaded file has no trace, a
training step counts runs rather than hits) is passed in, not rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from lucid.compile import _pipeline
from lucid.compile.cache import SignatureCache
from lucid.ir import import_trace, print_ir
from lucid.passes import PassManager

__all__ = [
    "cache_info",
    "check_repeats",
    "ir_at",
    "profile_rows",
    "timing_row",
    "trace_ir",
]

# The stages ``ir(stage=...)`` shows, in pipeline order; "lowered" (after ``lower-to-prim``,
# before the backend's own passes) is where a saved training step's module starts.
STAGES = _pipeline.STAGES


def cache_info(cache: SignatureCache, **extra: Any) -> dict[str, Any]:
    """``cache.info()`` (entries, max_entries, evictions, keys, eager_only, reasons,
    recompiles) with the wrapper's own fields ``extra`` on top."""
    info = cache.info()
    info.update(extra)
    return info


def timing_row(key: Any, entry: Any, **extra: Any) -> dict[str, Any]:
    """One row of ``timing()``: ``key``, ``compile_ms``, ``last_run_ms`` and ``passes_ms`` of
    ``entry``, with the wrapper's own fields ``extra``."""
    return {
        "key": key,
        "compile_ms": entry.compile_ms,
        "last_run_ms": entry.last_run_ms,
        "passes_ms": dict(getattr(entry, "passes_ms", None) or {}),
        **extra,
    }


def check_repeats(repeats: Any) -> None:
    """``profile(repeats=...)`` takes a positive int."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"profile: repeats must be a positive int, got {repeats!r}")


def profile_rows(
    executable: Any, feeds: Iterable[np.ndarray], repeats: int, backend: str
) -> list[dict[str, Any]]:
    """Run ``executable`` ``repeats`` times on copies of ``feeds`` (in-place results go to the
    copies, never to the model): one row per instruction, slowest first: ``index``, ``op``,
    ``ms`` (mean wall time) and ``instr`` (the instruction as the native program prints it)."""
    if not (hasattr(executable, "profile") and hasattr(executable, "dump")):
        raise RuntimeError(
            f"profile: the {backend!r} backend's executables do not report per-instruction times"
        )
    copies = [np.array(f, order="C", copy=True) for f in feeds]
    lines = executable.dump().splitlines()[1:]
    rows = [
        {"index": i, "op": op, "ms": seconds * 1e3, "instr": lines[i].strip()}
        for i, op, seconds in executable.profile(copies, repeats)
    ]
    return sorted(rows, key=lambda r: -r["ms"])


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
        PassManager(_pipeline._graph_passes(pipeline)).run(module)
    if stage in ("imported", "optimized"):
        return print_ir(module)
    target = _pipeline.backend_of(backend)
    if start in ("imported", "optimized"):
        _pipeline.lower(module, target)
    elif start == "lowered" and target.pipeline:
        PassManager(target.pipeline).run(module)
    return print_ir(module) if stage == "prim" else target.stage_ir(module)


def trace_ir(trace: Any, stage: str, *, backend: str, pipeline: str | None = None) -> str:
    """The module of ``trace`` at ``stage``, replayed from the trace (``pipeline``: the graph
    passes it was compiled with; None for the default)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    return ir_at(import_trace(trace), "imported", stage, backend=backend, pipeline=pipeline)
