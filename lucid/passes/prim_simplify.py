"""``prim-simplify``: clean up what lowering leaves in the ``prim`` dialect.

Lowering rules work one ``lucid`` op at a time, so the same primitive is often emitted twice (the
``log_softmax`` of a cross-entropy and the one its gradient recomputes) and a transpose that
only feeds a matmul is materialised. This pass, run after ``lower-to-prim``:

- folds ``prim.transpose`` that swaps the last two dimensions of a ``prim.matmul`` operand into
  the matmul's ``transpose_a``/``transpose_b`` flag (BLAS reads the operand transposed for free);
- turns ``c - s * matmul(a, b)`` and ``c + s * matmul(a, b)`` (``s`` 0-d, the product used
  nowhere else, rank 2, float) into ``prim.matmul_accumulate(a, b, c, -s or s)``: a plain SGD
  update of a weight from its gradient GEMM becomes one GEMM with BLAS's ``beta = 1``, which the
  CPU runtime runs straight in the weight's buffer;
- merges identical pure ops (as ``cse``);
- erases unused pure ops (as ``dce``).

Every rewrite keeps each value's type, so the function computes exactly what it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.prim.dialect import PrimIROp, create_prim, prim_attrs
from lucid.passes._blocks import blocks_of, erase_dead, merge_common

STAGE = "prim-simplify"  # the visit counters' name for this pass

_FLAG = ("transpose_a", "transpose_b")


def _swapped_last_two(op: x.Operation) -> bool:
    if not isinstance(op, PrimIROp) or op.name != "prim.transpose":
        return False
    perm = tuple(prim_attrs(op)["perm"])
    r = len(perm)
    return r >= 2 and perm == (*range(r - 2), r - 1, r - 2)


def fold_transposes_into_matmul(block: x.Block) -> None:
    """Rewrite ``matmul(transpose(a), b)`` to ``matmul{transpose_a = !flag}(a, b)`` (and for b)."""
    ops = list(block.ops)
    visits.count(STAGE, len(ops))
    for op in ops:
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


def _only_use(value: x.SSAValue) -> x.Operation | None:
    uses = list(value.uses)
    return uses[0].operation if len(uses) == 1 else None


def _scaled_product(value: x.SSAValue) -> tuple[x.Operation, x.SSAValue] | None:
    """``(matmul, s)`` when ``value`` is ``s * matmul(a, b)`` with 0-d ``s``, both used once."""
    mul = value.owner
    if not isinstance(mul, PrimIROp) or mul.name != "prim.mul" or _only_use(value) is None:
        return None
    for i in (0, 1):
        product, scale = mul.operands[i], mul.operands[1 - i]
        mm = product.owner
        if (
            isinstance(mm, PrimIROp)
            and mm.name == "prim.matmul"
            and _only_use(product) is mul
            and scale.type.get_shape() == ()
            and product.type == mul.results[0].type
            and len(product.type.get_shape()) == 2
            and isinstance(product.type.element_type, x.Float32Type | x.Float64Type)
        ):
            return mm, scale
    return None


def fold_scaled_products_into_accumulate(block: x.Block) -> None:
    """Rewrite ``c -/+ s * matmul(a, b)`` to ``matmul_accumulate(a, b, c, -s/s)``."""
    ops = list(block.ops)
    visits.count(STAGE, len(ops))
    for op in ops:
        if not isinstance(op, PrimIROp) or op.name not in ("prim.add", "prim.sub"):
            continue
        out_type = op.results[0].type
        for ci in (0, 1) if op.name == "prim.add" else (0,):
            c, term = op.operands[ci], op.operands[1 - ci]
            found = _scaled_product(term) if c.type == out_type else None
            if found is None:
                continue
            mm, scale = found
            new_ops = []
            if op.name == "prim.sub":
                new_ops.append(create_prim("neg", [scale], {}))
                scale = new_ops[-1].results[0]
            new_ops.append(
                create_prim("matmul_accumulate", [*mm.operands, c, scale], prim_attrs(mm))
            )
            block.insert_ops_before(new_ops, op)
            op.results[0].replace_all_uses_with(new_ops[-1].results[0])
            block.erase_op(op)
            break


@dataclass(frozen=True)
class PrimSimplify(x.ModulePass):
    """Fold transposes and scaled accumulations into matmuls, merge identical ops, erase dead
    ones (prim dialect)."""

    name = "prim-simplify"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            fold_transposes_into_matmul(block)
            fold_scaled_products_into_accumulate(block)
            merge_common(block, self.name)
            erase_dead(block, self.name)
