"""The one dispatch point every op goes through.

``apply(name, *operands, **attrs)`` either records the op (a tracer is active on this thread) or
runs it eagerly: shape/dtype inference, the numpy kernel, and an autograd node when a gradient is
needed. Operands are Tensors or Python scalars; a variadic operand is a list of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid import _dtype
from lucid._autograd import Node
from lucid._state import state
from lucid._tensor import Tensor
from lucid.ops._registry import PROMOTE, REGISTRY, OpDef

# Tests switch this on to check every kernel's result against the op's shape/dtype inference.
CHECK_INFERENCE = False


def apply(op: str | OpDef, *operands: Any, **attrs: Any) -> Any:
    opdef = op if isinstance(op, OpDef) else REGISTRY[op]
    attrs = opdef.bind_attrs(attrs)
    autocast = state.autocast
    if autocast is not None:
        # lucid.autocast: the op's row of the policy table may cast floating operands first;
        # the casts are ordinary ``cast`` ops, so a tracer records them like any other op.
        operands = autocast.cast_operands(opdef, operands, attrs)
    if opdef.resolve_attrs is not None:  # from the dtypes the op runs in (after autocast's casts)
        attrs = opdef.resolve_attrs(operands, attrs)
    tracer = state.tracer
    if tracer is not None:
        return tracer.record(opdef, operands, attrs)
    return _run_eager(opdef, operands, attrs)


def _flat_operands(opdef: OpDef, operands: tuple) -> list:
    if opdef.variadic:
        return [*operands[:-1], *operands[-1]]
    return list(operands)


_FLOAT32 = np.dtype(np.float32)


def _to_array(x: Any, compute: np.dtype | None) -> np.ndarray:
    """The kernel's view of an operand. float16/bfloat16 storage is widened to float32 (exactly):
    kernels compute in float32 and the result is rounded once to the half format, which is what
    PyTorch's CPU kernels do (float32 accumulation in sums, softmax, norms and matmul)."""
    if isinstance(x, Tensor):
        a = x._data
        if compute is not None:
            if a.dtype != compute:
                a = a.astype(compute)
        elif a.itemsize == 2 and a.dtype in _dtype.HALF_NUMPY:  # itemsize first: cheap
            a = a.astype(_FLOAT32)
        return a
    np_dt = compute if compute is not None else _dtype.result_type(x).numpy
    return np.asarray(x, dtype=np_dt)


def _run_eager(opdef: OpDef, operands: tuple, attrs: dict) -> Any:
    n_fixed = len(opdef.operands) - (1 if opdef.variadic else 0)
    if len(operands) != len(opdef.operands):
        raise TypeError(
            f"{opdef.name}() takes {len(opdef.operands)} operands ({', '.join(opdef.operands)}), "
            f"got {len(operands)}"
        )
    if opdef.variadic and not isinstance(operands[-1], (list, tuple)):
        raise TypeError(f"{opdef.name}(): operand {opdef.operands[-1][:-1]!r} must be a sequence")
    for x in _flat_operands(opdef, operands):
        if isinstance(x, Tensor):
            if x._data is None:
                raise RuntimeError(
                    f"{opdef.name}(): a trace tensor reached eager code outside its trace"
                )
        elif not isinstance(x, (bool, int, float, np.number, np.bool_)):
            raise TypeError(
                f"{opdef.name}(): expected a Tensor or a number as operand, got {type(x).__name__}"
            )
    avals = opdef.infer(*operands, **attrs)
    compute = None
    if PROMOTE in opdef.props:
        promoted = _dtype.result_type(*_flat_operands(opdef, operands))
        compute = _FLOAT32 if promoted in _dtype.HALF_DTYPES else promoted.numpy
    if opdef.variadic:
        arrays = [_to_array(x, compute) for x in operands[:n_fixed]]
        arrays.append([_to_array(x, compute) for x in operands[-1]])
    else:
        arrays = [_to_array(x, compute) for x in operands]
    result = opdef.kernel(*arrays, **attrs)
    single = opdef.n_outputs == 1
    if single:
        result, avals = (result,), (avals,)
    outs = []
    for r, av in zip(result, avals, strict=True):
        np_dt = av.dtype.numpy
        if type(r) is not np.ndarray or r.dtype != np_dt:
            if np_dt in _dtype.HALF_NUMPY:
                with np.errstate(over="ignore"):  # float32 beyond the half range rounds to inf
                    r = np.asarray(r, dtype=np_dt)
            else:
                r = np.asarray(r, dtype=np_dt)
        if CHECK_INFERENCE and r.shape != tuple(av.shape):
            raise AssertionError(f"{opdef.name}: kernel gave {r.shape}, inference {av.shape}")
        outs.append(Tensor._wrap(r))
    if state.grad_enabled:
        flat = _flat_operands(opdef, operands)
        if any(isinstance(x, Tensor) and x.requires_grad for x in flat):
            Node.attach(opdef, operands, attrs, outs)
    return outs[0] if single else tuple(outs)
