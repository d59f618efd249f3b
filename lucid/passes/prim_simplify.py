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

``narrow-half`` (a separate pass, for backends whose kernels take half operands) runs an op on
half values directly instead of on their float32 casts, bit for bit the same (see
``narrow_half_ops``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucid.ir import _xdsl as x
from lucid.ir import prim as P
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


def fold_transposes_into_matmul(block: x.Block) -> int:
    """Rewrite ``matmul(transpose(a), b)`` to ``matmul{transpose_a = !flag}(a, b)`` (and for b);
    returns how many matmuls the block has."""
    ops = list(block.ops)
    visits.count(STAGE, len(ops))
    matmuls = 0
    for op in ops:
        if op.name != "prim.matmul" or not isinstance(op, PrimIROp):
            continue
        matmuls += 1
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
    return matmuls


def _only_use(value: x.SSAValue) -> x.Operation | None:
    uses = list(value.uses)
    return uses[0].operation if len(uses) == 1 else None


def _scaled_product(value: x.SSAValue) -> tuple[x.Operation, x.SSAValue] | None:
    """``(matmul, s)`` when ``value`` is ``s * matmul(a, b)`` with 0-d ``s``, both used once."""
    mul = value.owner
    if getattr(mul, "name", None) != "prim.mul" or not isinstance(mul, PrimIROp):
        return None
    for i in (0, 1):
        product, scale = mul.operands[i], mul.operands[1 - i]
        mm = product.owner
        # The opcodes before the uses: an optimizer's update adds many products of a scalar
        # and a tensor, few of them a matmul's.
        if (
            getattr(mm, "name", None) == "prim.matmul"
            and isinstance(mm, PrimIROp)
            and _only_use(value) is not None
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
        # The opcode first: comparing tensor types (or an ABC isinstance) per op costs more,
        # and an optimizer's update is mostly adds and subs of other things than products
        # (which ``_scaled_product`` turns down by their opcodes, before the type test here).
        name = op.name
        if name != "prim.add" and name != "prim.sub" or not isinstance(op, PrimIROp):
            continue
        operands = tuple(op.operands)
        for ci in (0, 1) if name == "prim.add" else (0,):
            c, term = operands[ci], operands[1 - ci]
            found = _scaled_product(term)
            if found is None or c.type != op.results[0].type:
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


def _half_source(value: x.SSAValue, half: x.Attribute) -> x.SSAValue | None:
    """The ``half`` value that ``value`` widens (``prim.cast`` to f32 of it), else None."""
    cast = value.owner
    if isinstance(cast, PrimIROp) and cast.name == "prim.cast":
        source = cast.operands[0]
        if isinstance(source.type, x.TensorType) and source.type.element_type == half:
            return source
    return None


def _half_constant(value: x.SSAValue, dtype: str) -> x.Operation | None:
    """A ``dtype`` copy of the f32 ``prim.constant`` behind ``value`` when every entry is exact
    in ``dtype``, else None."""
    const = value.owner
    if not isinstance(const, PrimIROp) or const.name != "prim.constant":
        return None
    attrs = prim_attrs(const)
    values = np.array(attrs["value"], np.float64)
    if not np.array_equal(P.to_half(values, dtype).astype(np.float64), values, equal_nan=True):
        return None
    return create_prim("constant", [], {**attrs, "dtype": dtype})


def narrow_half_ops(block: x.Block) -> None:
    """Rewrite ``cast<half>(op(cast<f32>(a), ...))`` to ``op(a, ...)`` on the half values.

    Lowering computes an op on half values in float32 between casts (as eager's kernels); a prim
    op on half operands is defined as exactly that (its float32 op, then one rounding), so the
    rewrite keeps every bit. A backend whose kernels take half operands (converting while they
    load, as a GEMM packs) runs this after ``prim-simplify`` to drop the conversion passes."""
    ops = list(block.ops)
    visits.count(STAGE, len(ops))
    for cast in ops:
        if not isinstance(cast, PrimIROp) or cast.name != "prim.cast":
            continue
        dtype = prim_attrs(cast)["dtype"]
        op = cast.operands[0].owner
        if (
            dtype not in P.HALF
            or not isinstance(op, PrimIROp)
            or "HALF_AWARE" in op.PRIM.props
            or len(op.results) != 1
            or _only_use(op.results[0]) is not cast
        ):
            continue
        half = cast.results[0].type.element_type
        operands, constants = [], []
        for v in op.operands:
            element = v.type.element_type if isinstance(v.type, x.TensorType) else None
            if element != x.f32:
                operands.append(v)  # indices, conditions: unchanged
                continue
            narrow = _half_source(v, half)
            if narrow is None:
                const = _half_constant(v, dtype)
                if const is None:
                    break
                constants.append(const)
                narrow = const.results[0]
            operands.append(narrow)
        else:
            try:
                new = create_prim(op.PRIM.name, operands, prim_attrs(op))
            except P.PrimError:
                continue
            if new.results[0].type != cast.results[0].type:
                continue
            block.insert_ops_before([*constants, new], cast)
            cast.results[0].replace_all_uses_with(new.results[0])
            block.erase_op(cast)
            block.erase_op(op)


@dataclass(frozen=True)
class NarrowHalf(x.ModulePass):
    """Run ops on half values directly instead of on their float32 casts (prim dialect); for
    backends whose kernels take half operands."""

    name = "narrow-half"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            narrow_half_ops(block)
            erase_dead(block, self.name)


@dataclass(frozen=True)
class PrimSimplify(x.ModulePass):
    """Fold transposes and scaled accumulations into matmuls, merge identical ops, erase dead
    ones (prim dialect)."""

    name = "prim-simplify"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            if fold_transposes_into_matmul(block):  # no matmul, no scaled product of one
                fold_scaled_products_into_accumulate(block)
            merge_common(block, self.name)
            erase_dead(block, self.name)
