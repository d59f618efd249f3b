"""lucid.compile: trace, import, optimize and run compiled graphs.

``lucid.compile`` is both this namespace and a callable: ``lucid.compile(model)`` (or
``@lucid.compile``) wraps a model in a ``CompiledModule``. The tracing entry points
(``_tracing``, ``trace``) are the unstable low-level surface the rest is built on.
"""

import sys
import types

from lucid._lazy import lazy_attributes
from lucid.compile.diagnose import DiagnosisReport, OpInfo, diagnose
from lucid.compile.errors import CompileError
from lucid.compile.inference import CompiledModule, compile
from lucid.compile.signature import CacheKey
from lucid.trace import GraphBreak, Trace, Tracer, _tracing, trace

# Imported on first use: ``lucid.compile(model)``'s first call imports this package, so what it
# does not need (saving and loading, the training entry points) stays out of it.
_LAZY = {
    "LoadedModule": "lucid.compile.aot",
    "load_compiled": "lucid.compile.aot",
    "save_compiled": "lucid.compile.aot",
    "compile_optimizer": "lucid.compile.training",
    "compiled_step": "lucid.compile.training",
    "fused_step": "lucid.compile.training",
    "make_step": "lucid.compile.training",
}
_lazy_attribute = lazy_attributes(__name__, _LAZY)

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

    def __getattr__(self, name: str):
        return _lazy_attribute(name)

    def __dir__(self):
        return sorted({*super().__dir__(), *_LAZY})


sys.modules[__name__].__class__ = _CallableModule
