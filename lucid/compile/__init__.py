"""lucid.compile: trace, import, optimize and run compiled graphs.

``lucid.compile`` is both this namespace and a callable: ``lucid.compile(model)`` (or
``@lucid.compile``) wraps a model in a ``CompiledModule``. The tracing entry points
(``_tracing``, ``trace``) are the unstable low-level surface the rest is built on.
"""

import sys
import types

from lucid.compile.aot import LoadedModule, load_compiled, save_compiled
from lucid.compile.diagnose import DiagnosisReport, OpInfo, diagnose
from lucid.compile.errors import CompileError
from lucid.compile.inference import CompiledModule, compile
from lucid.compile.signature import CacheKey
from lucid.compile.training import (
    compile_optimizer,
    compiled_step,
    fused_step,
    make_step,
)
from lucid.trace import GraphBreak, Trace, Tracer, _tracing, trace

__all__ = [
    "CacheKey",
    "CompileError",
    "CompiledModule",
    "DiagnosisReport",
    "GraphBreak",
    "LoadedModule",
    "OpInfo",
    "Trace",
    "Tracer",
    "_tracing",
    "compile",
    "compile_optimizer",
    "compiled_step",
    "diagnose",
    "fused_step",
    "load_compiled",
    "make_step",
    "save_compiled",
    "trace",
]


class _CallableModule(types.ModuleType):
    """Lets ``lucid.compile(model)`` call ``lucid.compile.compile``."""

    def __call__(self, target=None, **kwargs):
        return compile(target, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
