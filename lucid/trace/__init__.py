"""Stage 1 of the compiler: record a Python call as a ``Trace`` (shape-only, nothing computed).

The tracer sits just above the eager core and below everything else: ``lucid/ir`` imports a
Trace, ``lucid/passes`` re-trace rules through it, ``lucid/compile`` drives it. It imports nothing
of ``lucid.ir``, ``lucid.passes``, ``lucid.backends`` or ``lucid.compile``.

>>> from lucid.trace import trace
>>> t = trace(lambda x: (x * 2).relu(), lucid.randn(3))
>>> print(t.to_json())
"""

from lucid.trace._trace import FORMAT, Const, Feed, Trace, TraceOp, Value
from lucid.trace._tracing import GraphBreak, Tracer, _tracing, trace, user_location

__all__ = [
    "FORMAT",
    "Const",
    "Feed",
    "GraphBreak",
    "Trace",
    "TraceOp",
    "Tracer",
    "Value",
    "_tracing",
    "trace",
    "user_location",
]
