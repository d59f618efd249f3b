"""Public autograd API: ``grad``, ``backward``, ``Function`` and the grad-mode switches."""

from lucid._autograd import (  # noqa: F401
    Function,
    FunctionCtx,
    backward,
    enable_grad,
    grad,
    inference_mode,
    no_grad,
    set_grad_enabled,
)

__all__ = [
    "Function",
    "FunctionCtx",
    "backward",
    "enable_grad",
    "grad",
    "inference_mode",
    "no_grad",
    "set_grad_enabled",
]
