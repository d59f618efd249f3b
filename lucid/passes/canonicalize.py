"""``canonicalize``: algebraic identities and constant folding on the ``lucid`` dialect.

Rules (each applies only when the replacement has exactly the op's result type, so no rule ever
changes a shape or a dtype):

- ``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x``, ``x / 1``, ``x ** 1`` -> ``x``
  (as MLIR's fast-math folds, ``x + 0`` does not keep the sign of a ``-0.0``);
- ``neg(neg(x))`` -> ``x``;
- ``reshape(reshape(x))`` -> one reshape; a reshape, expand or cast to the operand's own type
  -> ``x``; ``cast(cast(x))`` back to ``x``'s dtype through a type that holds it exactly -> ``x``;
- ``permute(permute(x))`` -> one permute (transpose-of-transpose), an identity permute -> ``x``;
- an op whose operands are all constants is folded by running the registry's eager kernel, when
  its results have at most ``fold-limit`` elements (random ops are never folded).

Unused pure ops are erased at the end (the dead ops the rewrites leave, and any others).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import _run_eager
from lucid._tensor import Tensor
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import ConstantOp, LucidOp, constant_value, make_constant
from lucid.ir.types import dtype_of_type, ints_attr, shape_of_type
from lucid.ops._registry import RANDOM
from lucid.passes._blocks import blocks_of, erase_dead


class _Rewriter:
    """The slice of xDSL's PatternRewriter the rules use, over the core IR API: the pass walks
    the straight-line body once itself, which is several times cheaper than the greedy driver."""

    __slots__ = ("created",)

    def __init__(self) -> None:
        self.created: x.Operation | None = None

    def replace(
        self,
        op: x.Operation,
        new_ops: list[x.Operation],
        new_results: list[x.SSAValue] | None = None,
    ) -> None:
        block = op.parent
        if new_ops:
            block.insert_ops_before(new_ops, op)
            self.created = new_ops[-1]
        values = new_results if new_results is not None else new_ops[-1].results
        for old, new in zip(op.results, values, strict=True):
            old.replace_all_uses_with(new)
        block.erase_op(op)


Rule = Callable[[LucidOp, _Rewriter], bool]


def _const(v: x.SSAValue) -> Any:
    """The Python scalar or array of a value defined by ``lucid.constant``, else None."""
    owner = v.owner
    return constant_value(owner) if isinstance(owner, ConstantOp) else None


def _is_splat(v: x.SSAValue, scalar: float) -> bool:
    c = _const(v)
    if c is None or isinstance(c, bool):
        return False
    if isinstance(c, np.ndarray):
        return c.size > 0 and bool(np.all(c == scalar))
    return c == scalar


def _forward(op: LucidOp, rewriter: _Rewriter, value: x.SSAValue) -> bool:
    """Replace ``op`` by ``value`` when it has exactly the op's result type."""
    if value.type != op.results[0].type:
        return False
    rewriter.replace(op, [], [value])
    return True


def _right_identity(scalar: float) -> Rule:
    def rule(op: LucidOp, rewriter: _Rewriter) -> bool:
        lhs, rhs = op.operands
        return _is_splat(rhs, scalar) and _forward(op, rewriter, lhs)

    return rule


def _both_identity(scalar: float) -> Rule:
    def rule(op: LucidOp, rewriter: _Rewriter) -> bool:
        lhs, rhs = op.operands
        if _is_splat(rhs, scalar) and _forward(op, rewriter, lhs):
            return True
        return _is_splat(lhs, scalar) and _forward(op, rewriter, rhs)

    return rule


def _producer(v: x.SSAValue, name: str) -> LucidOp | None:
    owner = v.owner
    return owner if isinstance(owner, LucidOp) and owner.name == name else None


def _involution(op: LucidOp, rewriter: _Rewriter) -> bool:
    inner = _producer(op.operands[0], op.name)
    return inner is not None and _forward(op, rewriter, inner.operands[0])


def _noop_same_type(op: LucidOp, rewriter: _Rewriter) -> bool:
    t = op.operands[0].type
    return None not in shape_of_type(t) and _forward(op, rewriter, op.operands[0])


def _reshape(op: LucidOp, rewriter: _Rewriter) -> bool:
    if _noop_same_type(op, rewriter):
        return True
    inner = _producer(op.operands[0], "lucid.reshape")
    if inner is None:
        return False
    # A reshape depends only on the element count, so the inner one can be skipped.
    new = type(op).create(
        operands=[inner.operands[0]],
        result_types=[op.results[0].type],
        properties=dict(op.properties),
    )
    rewriter.replace(op, [new])
    return True


def _holds_exactly(wide: _dtype.dtype, narrow: _dtype.dtype) -> bool:
    if narrow is _dtype.bool_:
        return True
    if wide.category != narrow.category or wide.itemsize < narrow.itemsize:
        return False
    # uint8 fits a wider signed int; a signed type never fits an unsigned one.
    return not (wide is _dtype.uint8 and narrow is not _dtype.uint8)


def _cast(op: LucidOp, rewriter: _Rewriter) -> bool:
    if _forward(op, rewriter, op.operands[0]):
        return True
    inner = _producer(op.operands[0], "lucid.cast")
    if inner is None:
        return False
    src = inner.operands[0]
    mid = dtype_of_type(op.operands[0].type)
    return _holds_exactly(mid, dtype_of_type(src.type)) and _forward(op, rewriter, src)


def _perm_of(op: LucidOp) -> tuple[int, ...]:
    dims = op.lucid_attrs()["dims"]
    n = len(dims)
    return tuple(d % n for d in dims)


def _permute(op: LucidOp, rewriter: _Rewriter) -> bool:
    perm = _perm_of(op)
    if perm == tuple(range(len(perm))):
        return _forward(op, rewriter, op.operands[0])
    inner = _producer(op.operands[0], "lucid.permute")
    if inner is None:
        return False
    first = _perm_of(inner)
    composed = tuple(first[p] for p in perm)
    if composed == tuple(range(len(composed))):
        return _forward(op, rewriter, inner.operands[0])
    props = dict(op.properties)
    props["dims"] = ints_attr(composed)
    new = type(op).create(
        operands=[inner.operands[0]], result_types=[op.results[0].type], properties=props
    )
    rewriter.replace(op, [new])
    return True


RULES: dict[str, list[Rule]] = {
    "lucid.add": [_both_identity(0)],
    "lucid.sub": [_right_identity(0)],
    "lucid.mul": [_both_identity(1)],
    "lucid.div": [_right_identity(1)],
    "lucid.pow": [_right_identity(1)],
    "lucid.neg": [_involution],
    "lucid.reshape": [_reshape],
    "lucid.expand": [_noop_same_type],
    "lucid.cast": [_cast],
    "lucid.permute": [_permute],
}


def _fold(op: LucidOp, rewriter: _Rewriter, limit: int) -> bool:
    opdef = op.OPDEF
    if RANDOM in opdef.props or not op.operands:
        return False
    if not all(isinstance(v.owner, ConstantOp) for v in op.operands):
        return False
    values = []
    for v in op.operands:
        c = _const(v)
        if c is None:
            return False
        values.append(Tensor._wrap(c) if isinstance(c, np.ndarray) else c)
    for r in op.results:
        shape = shape_of_type(r.type)
        if None in shape or int(np.prod(shape, dtype=np.int64)) > limit:
            return False
    try:
        out = _run_eager(opdef, tuple(op.operand_groups(values)), op.lucid_attrs())
    except Exception:  # leave an op that fails at run time to fail at run time, as eager would
        return False
    outs = (out,) if opdef.n_outputs == 1 else out
    consts = [make_constant(np.asarray(t._data)) for t in outs]
    rewriter.replace(op, consts, [c.results[0] for c in consts])
    return True


def _simplify(op: LucidOp, fold_limit: int) -> None:
    """Apply rules to ``op`` until none applies; an op a rule creates gets the same treatment.

    Rules only look at an op's producers, which come earlier in the block and were simplified
    already, so one forward sweep reaches the fixpoint a greedy driver would.
    """
    rewriter = _Rewriter()
    while op is not None:
        visits.count(Canonicalize.name)
        rewriter.created = None
        changed = any(rule(op, rewriter) for rule in RULES.get(op.name, ()))
        if not changed:
            changed = _fold(op, rewriter, fold_limit)
        if not changed:
            return
        new = rewriter.created
        op = new if isinstance(new, LucidOp) else None


@dataclass(frozen=True)
class Canonicalize(x.ModulePass):
    """Simplify ``lucid`` ops by algebraic identities and fold constant subgraphs.

    Options: ``fold-limit`` (default 4096) is the largest number of elements a folded constant
    may have; larger results stay computed at run time so the IR does not carry big tensors.
    """

    name = "canonicalize"

    fold_limit: int = 4096

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            current = block.first_op
            while current is not None:
                nxt = current.next_op
                if isinstance(current, LucidOp):
                    _simplify(current, self.fold_limit)
                current = nxt
            erase_dead(block, self.name)
