"""Old path of ``lucid.compile.inference``, kept for the code and tests that import from here."""

from lucid.compile.errors import CompileError
from lucid.compile.inference.module import CompiledModule, compile
from lucid.compile.signature import _SYMBOLIC_SAFE_OPS, CacheKey

__all__ = ["_SYMBOLIC_SAFE_OPS", "CacheKey", "CompileError", "CompiledModule", "compile"]
