"""The MPSGraph backend: all decisions in Python, a mechanical native replay on Apple.

- ``selectors``: the selector/descriptor table shared with ``native/mpsgraph`` and the emission
  table (prim op -> MPSGraph methods);
- ``program``: the recorded-program format ``lucid.mpsgraph/v1`` and the recording builder;
- ``legalize`` (``mpsgraph-legalize``) and ``symbolic`` (``symbolic-safety``): the passes
  (importing this package registers both by name);
- ``emit``: the emitter; ``reference``: the numpy builder with MPSGraph's semantics; ``native``:
  the native builder;
- ``backend``: the ``mpsgraph`` and ``mpsgraph-reference`` backends.

See docs/backend-mpsgraph.md.
"""

from lucid.backends.mpsgraph.backend import (
    MPSGraphBackend,
    MPSGraphExecutable,
    MPSGraphReferenceBackend,
    dump_program,
)
from lucid.backends.mpsgraph.emit import EmitError
from lucid.backends.mpsgraph.legalize import MPSGraphLegalize, MPSGraphUnsupported
from lucid.backends.mpsgraph.native import MPSGraphUnavailable, native_status
from lucid.backends.mpsgraph.reference import MPSGraphAbort, UndefinedBehavior
from lucid.backends.mpsgraph.symbolic import SymbolicSafety, SymbolicUnsafe, symbolic_dims

__all__ = [
    "EmitError",
    "MPSGraphAbort",
    "MPSGraphBackend",
    "MPSGraphExecutable",
    "MPSGraphLegalize",
    "MPSGraphReferenceBackend",
    "MPSGraphUnavailable",
    "MPSGraphUnsupported",
    "SymbolicSafety",
    "SymbolicUnsafe",
    "UndefinedBehavior",
    "dump_program",
    "native_status",
    "symbolic_dims",
]
