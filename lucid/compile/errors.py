"""The exceptions of the compile layer, and the errors it raises for values too large to run.

``CompileError``: compiling failed where no fallback is allowed; ``Unsupported``: the compiler
cannot handle a graph (the caller falls back to eager with the reason); ``FeedMismatch``: a bound
feed no longer fits its executable (the caller re-lays out or rebuilds once).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "MAX_VALUE_ELEMENTS",
    "CompileError",
    "FeedMismatch",
    "Unsupported",
    "check_value_sizes",
    "out_of_memory",
]


class CompileError(RuntimeError):
    """Compilation of a signature failed (raised instead of falling back when ``strict``, by
    the training entry points, and for ``LUCID_MANUAL_VJP_REQUIRE=1`` coverage gaps)."""


class Unsupported(Exception):
    """The compiler cannot handle this graph; the caller falls back to eager with this reason."""


class AliasedInputs(Exception):
    """A call whose compiled entry writes an input in place got that input sharing memory with
    another argument or a bound tensor (``cf(x, x)``): the trace took them as independent
    values, eager sees the write through both. The call runs eagerly."""


class FeedMismatch(ValueError):
    """A bound feed no longer has the shape/dtype the executable was compiled for."""


# The runtime refuses a value of more elements (docs/architecture.md, "Failure policy"); so
# would eager numpy in practice: 2^40 float32 elements are 4 TiB.
MAX_VALUE_ELEMENTS = 2**40


def _value_size(v: Any, batch: int | None = None) -> tuple[int, int]:
    """(elements, bytes) of a trace value, a symbolic dim counted as ``batch`` (or 1)."""
    n = math.prod((batch or 1) if d is None else d for d in v.shape)
    return n, n * np.dtype(v.dtype.numpy).itemsize


def _describe_value(op: Any, v: Any, batch: int | None = None) -> str:
    n, nbytes = _value_size(v, batch)
    where = f" at {op.loc[0]}:{op.loc[1]}" if getattr(op, "loc", None) else ""
    shape = "x".join(str(batch or "?") if d is None else str(d) for d in v.shape) or "scalar"
    return f"{op.name}{where} makes a {shape} {v.dtype.name} value ({n} elements, {_bytes(nbytes)})"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} TiB"


def check_value_sizes(trace: Any, batch: int | None = None) -> None:
    """Raise ``MemoryError`` naming the op and the size when ``trace`` makes a value too large
    for any machine (over ``MAX_VALUE_ELEMENTS``): the same class eager numpy raises, in strict
    and non-strict mode alike, instead of the backend's refusal or a fallback that fails anyway."""
    for op in trace.ops:
        for v in op.outputs:
            if _value_size(v, batch)[0] > MAX_VALUE_ELEMENTS:
                raise MemoryError(
                    f"lucid.compile: {_describe_value(op, v, batch)}, over the {MAX_VALUE_ELEMENTS}"
                    "-element limit of a value"
                )


def out_of_memory(trace: Any, error: MemoryError) -> MemoryError:
    """The ``MemoryError`` of a run that could not allocate, naming the largest value of its
    graph (the runtime's own message, ``std::bad_alloc``, names neither op nor size)."""
    if trace is None:
        return error
    sized = [(_value_size(v)[1], i, op, v) for i, op in enumerate(trace.ops) for v in op.outputs]
    if not sized:
        return error
    _, _, op, v = max(sized, key=lambda t: (t[0], -t[1]))
    return MemoryError(f"lucid.compile: out of memory running the compiled graph ({error}); "
                       f"its largest value: {_describe_value(op, v)}")  # fmt: skip
