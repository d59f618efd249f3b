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

Unused pure ops are erased as the walk goes (the greedy driver's dead-code elimination).
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
from lucid.ir.dialect import ConstantOp, LucidOp, constant_value, make_constant
from lucid.ir.types import dtype_of_type, shape_of_type
from lucid.ops._registry import RANDOM

Rule = Callable[[LucidOp, x.PatternRewriter], bool]


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


def _forward(op: LucidOp, rewriter: x.PatternRewriter, value: x.SSAValue) -> bool:
    """Replace ``op`` by ``value`` when it has exactly the op's result type."""
    if value.type != op.results[0].type:
        return False
    rewriter.replace(op, [], [value])
    return True


def _right_identity(scalar: float) -> Rule:
    def rule(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
        lhs, rhs = op.operands
        return _is_splat(rhs, scalar) and _forward(op, rewriter, lhs)

    return rule


def _both_identity(scalar: float) -> Rule:
    def rule(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
        lhs, rhs = op.operands
        if _is_splat(rhs, scalar) and _forward(op, rewriter, lhs):
            return True
        return _is_splat(lhs, scalar) and _forward(op, rewriter, rhs)

    return rule


def _producer(v: x.SSAValue, name: str) -> LucidOp | None:
    owner = v.owner
    return owner if isinstance(owner, LucidOp) and owner.name == name else None


def _involution(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
    inner = _producer(op.operands[0], op.name)
    return inner is not None and _forward(op, rewriter, inner.operands[0])


def _noop_same_type(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
    t = op.operands[0].type
    return None not in shape_of_type(t) and _forward(op, rewriter, op.operands[0])


def _reshape(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
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


def _cast(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
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


def _permute(op: LucidOp, rewriter: x.PatternRewriter) -> bool:
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
    props["dims"] = x.DenseArrayBase.from_list(x.i64, list(composed))
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


def _fold(op: LucidOp, rewriter: x.PatternRewriter, limit: int) -> bool:
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


@dataclass(eq=False)
class _CanonicalizePattern(x.RewritePattern):
    fold_limit: int

    def match_and_rewrite(self, op: x.Operation, rewriter: x.PatternRewriter) -> None:
        if not isinstance(op, LucidOp):
            return
        for rule in RULES.get(op.name, ()):
            if rule(op, rewriter):
                return
        _fold(op, rewriter, self.fold_limit)


@dataclass(frozen=True)
class Canonicalize(x.ModulePass):
    """Simplify ``lucid`` ops by algebraic identities and fold constant subgraphs.

    Options: ``fold-limit`` (default 4096) is the largest number of elements a folded constant
    may have; larger results stay computed at run time so the IR does not carry big tensors.
    """

    name = "canonicalize"

    fold_limit: int = 4096

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        x.PatternRewriteWalker(
            x.GreedyRewritePatternApplier([_CanonicalizePattern(self.fold_limit)]),
        ).rewrite_module(op)
