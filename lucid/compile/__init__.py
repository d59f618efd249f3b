"""lucid.compile: trace, import, optimize and run compiled graphs.

Only the tracing entry points live here for now; the user-facing ``lucid.compile(...)`` API is
built on top of them in its own module.
"""

from lucid.compile._trace import Trace
from lucid.compile._tracing import GraphBreak, Tracer, _tracing, trace

__all__ = ["GraphBreak", "Trace", "Tracer", "_tracing", "trace"]
