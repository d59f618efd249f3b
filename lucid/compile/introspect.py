"""What every compiled wrapper shows of itself, written once: ``cache_info``, ``timing``, ``ir``
and ``profile``.

``CompiledModule``, the training steps and the callables ``load_compiled`` returns each answer
these four with the same keys and the same rules; what differs (a loaded file has no trace, a
training step counts runs rather than hits) is passed in, not rewritten. ``ir`` replays the
compile's stages, which ``session`` does (``ir_at``, ``trace_ir``, re-exported here).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from lucid.compile.cache import SignatureCache
from lucid.compile.session import STAGES, ir_at, trace_ir

__all__ = [
    "STAGES",
    "cache_info",
    "check_repeats",
    "ir_at",
    "profile_rows",
    "timing_row",
    "trace_ir",
]


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
