"""The reference interpreter: runs a ``lucid`` module on numpy inputs with the registry's eager
kernels (through the eager dispatch path, so promotion and result casts match eager Lucid exactly).

Every pass and backend is tested against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lucid._dispatch import _run_eager
from lucid._tensor import Tensor
from lucid.ir import _xdsl as x
from lucid.ir.dialect import ConstantOp, LucidOp, constant_value
from lucid.ir.importer import feed_roles, forward_func

__all__ = ["interpret"]


def interpret(
    module: x.ModuleOp,
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    func_name: str = "forward",
) -> list[np.ndarray]:
    """Run ``@func_name`` and return its results as numpy arrays.

    ``inputs``: one array (or Tensor) per argument in order, or a mapping from role
    (``input:0``, ``param:fc.weight``) to array.
    """
    fn = forward_func(module, func_name)
    args = fn.body.blocks.first.args
    if isinstance(inputs, Mapping):
        roles = feed_roles(fn)
        missing = [r for r in roles if r not in inputs]
        if missing:
            raise ValueError(f"interpret: no value given for the feeds {missing}")
        inputs = [inputs[r] for r in roles]
    if len(inputs) != len(args):
        raise ValueError(f"interpret: @{func_name} takes {len(args)} inputs, got {len(inputs)}")
    env: dict[x.SSAValue, Any] = {}
    for a, v in zip(args, inputs, strict=True):
        env[a] = v if isinstance(v, Tensor) else Tensor._wrap(np.asarray(v))
    for op in fn.body.blocks.first.ops:
        if isinstance(op, LucidOp):
            operands = op.operand_groups([env[v] for v in op.operands])
            out = _run_eager(op.OPDEF, tuple(operands), op.lucid_attrs())
            outs = (out,) if op.OPDEF.n_outputs == 1 else out
            for r, o in zip(op.results, outs, strict=True):
                env[r] = o
        elif isinstance(op, ConstantOp):
            v = constant_value(op)
            env[op.results[0]] = v if not isinstance(v, np.ndarray) else Tensor._wrap(v)
        elif isinstance(op, x.func.ReturnOp):
            return [_array(env[v]) for v in op.operands]
        else:
            raise ValueError(
                f"interpret: op {op.name} is not in the lucid dialect; lower or remove it first"
            )
    raise ValueError(f"interpret: @{func_name} has no func.return")


def _array(v: Any) -> np.ndarray:
    return v._data if isinstance(v, Tensor) else np.asarray(v)
