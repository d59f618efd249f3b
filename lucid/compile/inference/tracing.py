"""Tracing one call of a compiled model: tensor arguments become fed trace inputs, the model
runs under the tracer, and its return value is flattened (shared by the no-grad and the
grad-mode path of ``CompiledModule``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucid._tensor import Tensor
from lucid.compile import _pytree
from lucid.compile._pytree import _at, _replace_tensors, _tensor_paths
from lucid.compile.errors import Unsupported
from lucid.compile.signature import _has_tensor, _NotSymbolic
from lucid.trace._tracing import GraphBreak

__all__ = ["TracedCall", "trace_call"]


@dataclass
class TracedCall:
    """What ``trace_call`` recorded of one call."""

    # The access path of each tensor argument (``(i,)`` for ``args[i]``, ``(i, k)`` for
    # ``args[i][k]``: an LSTM's ``(h, c)``), in feed order ``input:0``, ``input:1``, ...
    tensor_pos: list[tuple]
    targs: list  # the arguments as the model saw them (trace tensors in place of tensors)
    tkwargs: dict
    out: Any  # the model's return value
    leaves: list[Tensor]  # its tensors, depth first
    rebuild: _pytree.Rebuild  # leaves -> the return structure
    # Leaves that are inputs returned unchanged (handed back as the very objects passed in):
    # leaf index -> ("input", k) for the tensor at ``tensor_pos[k]`` or ("kw", name).
    passthrough: dict[int, tuple[str, Any]]

    @property
    def computed(self) -> list[Tensor]:
        """The leaves the graph computes (every one but the inputs returned unchanged)."""
        return [t for j, t in enumerate(self.leaves) if j not in self.passthrough]


def trace_call(tracer: Any, model: Any, args: tuple, kwargs: dict, symbolic: bool) -> TracedCall:
    """Run ``model(*args, **kwargs)`` under ``tracer`` with every tensor argument (inside
    tuples, lists and dicts too) fed as a trace input. With ``symbolic`` the positional
    tensors' leading dim is a symbolic batch; a failure to trace then is ``_NotSymbolic``.
    Tensors inside a container keyword argument are ``Unsupported``."""
    if any(_has_tensor(v) and not isinstance(v, Tensor) for v in kwargs.values()):
        raise Unsupported("tensors inside a container keyword argument")
    tensor_pos: list[tuple] = []
    targs = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            tensor_pos.append((i,))
            shape = (None, *a.shape[1:]) if symbolic else tuple(a.shape)
            t = tracer.input(shape, a.dtype)
            t._requires_grad = a._requires_grad
            targs.append(t)
        elif _has_tensor(a):
            _tensor_paths(a, (i,), tensor_pos)
            targs.append(_replace_tensors(a, tracer.input_like))
        else:
            targs.append(a)
    tkwargs = {
        k: tracer.input_like(v, role=f"input:{k}") if isinstance(v, Tensor) else v
        for k, v in kwargs.items()
    }
    try:
        out = model(*targs, **tkwargs)
    except (TypeError, ValueError, IndexError, GraphBreak) as e:
        if symbolic:
            raise _NotSymbolic(f"tracing with a symbolic batch failed: {e}") from e
        raise
    leaves: list[Tensor] = []
    rebuild = _pytree.flatten(out, leaves)
    passthrough: dict[int, tuple[str, Any]] = {}
    for j, t in enumerate(leaves):
        k = next((k for k, p in enumerate(tensor_pos) if _at(targs, p) is t), None)
        if k is not None:
            passthrough[j] = ("input", k)
            continue
        name = next((n for n, v in tkwargs.items() if v is t), None)
        if name is not None:
            passthrough[j] = ("kw", name)
    return TracedCall(tensor_pos, targs, tkwargs, out, leaves, rebuild, passthrough)
