"""The reference interpreter of the ``prim`` dialect: runs a prim module on numpy inputs with the
prim table's numpy semantics (``lucid.ir.prim.evaluate``).

It is the oracle of the ``lower-to-prim`` tests (lucid interpreter vs prim interpreter) and of the
backends (prim interpreter vs native executable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.importer import feed_roles, forward_func
from lucid.ir.prim.dialect import PrimIROp, aval_of_type

__all__ = ["interpret_prim"]


def interpret_prim(
    module: x.ModuleOp,
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    func_name: str = "forward",
) -> list[np.ndarray]:
    """Run ``@func_name`` of a prim module and return its results as numpy arrays.

    ``inputs``: one array per argument in order, or a mapping from feed role to array. Each input
    must have its argument's shape; it is converted to the argument's dtype only when the
    conversion is exact (e.g. a Python list of floats for an f32 argument).
    """
    fn = forward_func(module, func_name)
    args = fn.body.blocks.first.args
    if isinstance(inputs, Mapping):
        roles = feed_roles(fn)
        missing = [r for r in roles if r not in inputs]
        if missing:
            raise ValueError(f"interpret_prim: no value given for the feeds {missing}")
        inputs = [inputs[r] for r in roles]
    if len(inputs) != len(args):
        raise ValueError(
            f"interpret_prim: @{func_name} takes {len(args)} inputs, got {len(inputs)}"
        )
    env: dict[x.SSAValue, np.ndarray] = {}
    for i, (a, v) in enumerate(zip(args, inputs, strict=True)):
        aval = aval_of_type(a.type)
        arr = np.asarray(getattr(v, "_data", v))
        if arr.shape != aval.shape:
            raise ValueError(
                f"interpret_prim: input {i} has shape {arr.shape}, expected {aval.shape}"
            )
        env[a] = arr.astype(P.NUMPY_DTYPES[aval.dtype], copy=False)
    for op in fn.body.blocks.first.ops:
        if isinstance(op, PrimIROp):
            outs = P.evaluate(op.PRIM.name, [env[v] for v in op.operands], op.given_attrs())
            for r, o in zip(op.results, outs, strict=True):
                env[r] = o
        elif isinstance(op, x.func.ReturnOp):
            return [env[v] for v in op.operands]
        else:
            raise ValueError(
                f"interpret_prim: op {op.name} is not in the prim dialect; run lower-to-prim first"
            )
    raise ValueError(f"interpret_prim: @{func_name} has no func.return")
