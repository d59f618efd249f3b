"""``prim-simplify``: clean up what lowering leaves in the ``prim`` dialect.

Lowering rules work one ``lucid`` op at a time, so the same primitive is often emitted twice (the
``log_softmax`` of a cross-entropy and the one its gradient recomputes) and a transpose that
only feeds a matmul is materialised. This pass, run after ``lower-to-prim``:

- folds ``prim.transpose`` that swaps the last two dimensions of a ``prim.matmul`` operand into
  the matmul's ``transpose_a``/``transpose_b`` flag (BLAS reads the operand transposed for free);
- merges identical pure ops (as ``cse``);
- erases unused pure ops (as ``dce``).

Every rewrite keeps each value's type, so the function computes exactly what it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir.prim import PrimIROp, create_prim, prim_attrs
from lucid.passes._blocks import blocks_of, erase_dead, merge_common

_FLAG = ("transpose_a", "transpose_b")


def _swapped_last_two(op: x.Operation) -> bool:
    if not isinstance(op, PrimIROp) or op.name != "prim.transpose":
        return False
    perm = tuple(prim_attrs(op)["perm"])
    r = len(perm)
    return r >= 2 and perm == (*range(r - 2), r - 1, r - 2)


def fold_transposes_into_matmul(block: x.Block) -> None:
    """Rewrite ``matmul(transpose(a), b)`` to ``matmul{transpose_a = !flag}(a, b)`` (and for b)."""
    for op in list(block.ops):
        if not isinstance(op, PrimIROp) or op.name != "prim.matmul":
            continue
        operands = list(op.operands)
        attrs = prim_attrs(op)
        changed = False
        for i, v in enumerate(operands):
            producer = v.owner
            if isinstance(producer, x.Operation) and _swapped_last_two(producer):
                operands[i] = producer.operands[0]
                attrs[_FLAG[i]] = not attrs[_FLAG[i]]
                changed = True
        if not changed:
            continue
        new = create_prim("matmul", operands, attrs)
        block.insert_op_before(new, op)
        op.results[0].replace_all_uses_with(new.results[0])
        block.erase_op(op)


@dataclass(frozen=True)
class PrimSimplify(x.ModulePass):
    """Fold transposes into matmuls, merge identical ops, erase dead ones (prim dialect)."""

    name = "prim-simplify"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            fold_transposes_into_matmul(block)
            merge_common(block)
            erase_dead(block)
