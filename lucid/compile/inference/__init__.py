"""Compiled inference and grad-mode calls: ``CompiledModule`` (what ``lucid.compile(model)``
returns) and ``compile``.

``module`` holds the wrapper's call loop and introspection, ``facade`` its ``nn.Module`` side,
``tracing`` tracing one call, ``forward`` compiling a signature without gradients (with its
binder and finisher),
``grad`` the grad-mode signature (compiled forward and backward halves), ``checked`` the
``check=`` and ``mode="auto"`` entry wrappers.
"""

from lucid.compile.inference.module import CompiledModule, compile

__all__ = ["CompiledModule", "compile"]
