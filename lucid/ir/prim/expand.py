"""The one expansion step of composite prim ops (``composite.py``): every composite a backend
has no kernel for becomes its decomposition, in place, before the backend emits the module.
Backends call it with the ops they run (``Backend.supported_ops``); the MPSGraph backend, which
runs none, expands them all."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.prim.dialect import PrimIROp, aval_of_type, create_prim, made_prim_classes


def expand_composites(module: x.ModuleOp, keep: Iterable[str] = ()) -> int:
    """Replace each composite op of ``module`` not named in ``keep`` by its decomposition
    (composites inside a decomposition are expanded too); returns how many were expanded."""
    kept = frozenset(keep)
    expanded = made_prim_classes(name for name in P.COMPOSITE_OPS if name not in kept)
    if not expanded:  # the backend runs every composite op the program can hold
        return 0
    pending = [op for op in module.walk() if type(op) in expanded]
    count = 0
    while pending:
        op = pending.pop()
        block = op.parent_block()
        assert block is not None
        made: list[PrimIROp] = []

        def emit(name: str, *operands: x.SSAValue, **attrs: Any) -> x.SSAValue:
            new = create_prim(name, list(operands), attrs)
            block.insert_op_before(new, op)  # noqa: B023  (called before the loop moves on)
            made.append(new)  # noqa: B023
            return new.results[0]

        def const(value: float, like: x.SSAValue) -> x.SSAValue:
            dtype = aval_of_type(like.type).dtype
            return emit("constant", shape=(), dtype=dtype, value=(float(value),))

        outs = P.COMPOSITE_OPS[op.PRIM.name].decompose(
            emit, const, list(op.operands), op.prim_attrs()
        )
        for result, value in zip(op.results, outs, strict=True):
            result.replace_all_uses_with(value)
        block.erase_op(op)
        count += 1
        # A result nothing read (a layer norm's dgamma without a weight) leaves its ops unread.
        live: list[PrimIROp] = []
        for m in reversed(made):
            if any(r.uses for r in m.results):
                live.append(m)
            else:
                block.erase_op(m)
        pending.extend(
            m for m in live if m.PRIM.name in P.COMPOSITE_OPS and m.PRIM.name not in kept
        )
    return count


__all__ = ["expand_composites"]
