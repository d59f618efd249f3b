"""``lower-to-prim``: rewrite every ``lucid`` op into ``prim`` ops.

Each lucid op is lowered by the one rule registered for its name in ``lucid.passes.lowering``
(a table per op family). Promotion becomes explicit ``prim.cast``; Python scalar constants become
``prim.constant`` of the dtype they are used in; composite lucid ops (linear, cross_entropy,
...) decompose into primitives, while gelu, layer norm, attention and their gradients become
composite prim ops (``lucid.ir.prim.composite``) that backends run or expand. After the pass the
function holds only ``prim`` ops and ``func.return``; its signature is unchanged.

An op that cannot lower makes the pass raise ``LoweringError`` naming the op and the reason
(``lucid.compile`` turns it into an eager fallback carrying that reason). ``lowering_status(name)``
says, per registry op, ``"yes"`` or ``"no: <reason>"`` (for the coverage table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucid import _dtype
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import ConstantOp, LucidOp, constant_value
from lucid.ir.types import aval_of_type
from lucid.ops._registry import AVal
from lucid.passes.lowering import RULES, UNSUPPORTED
from lucid.passes.lowering._core import (
    HALF_DTYPES,
    PV,
    Builder,
    LoweringUnsupported,
    P,
    lower_dtype,
)

STAGE = "lower-to-prim"  # the visit counters' name for this pass

__all__ = ["LowerToPrim", "LoweringError", "lower_module", "lowering_status"]


class LoweringError(ValueError):
    """A ``lucid`` op could not be lowered to ``prim``; ``op`` names it, ``reason`` says why."""

    def __init__(self, op: str, reason: str):
        self.op = op
        self.reason = reason
        super().__init__(f"cannot lower lucid.{op} to prim: {reason}")


def lowering_status(op_name: str) -> str:
    """``"yes"`` when registry op ``op_name`` has a lowering rule, else ``"no: <reason>"``."""
    if op_name in RULES:
        return "yes"
    reason = UNSUPPORTED.get(op_name)
    return f"no: {reason}" if reason else "no: no lowering rule"


def _static_aval(t: x.Attribute, what: str) -> AVal:
    aval = aval_of_type(t)  # memoized per type object: most values share a few types
    if None in aval.shape:
        raise LoweringUnsupported(
            f"{what} has a symbolic dimension ({t}); specialize shapes before lowering"
        )
    lower_dtype(aval.dtype)
    return aval


def _lower_func(fn: x.func.FuncOp) -> None:
    block = fn.body.blocks.first
    env: dict[x.SSAValue, Any] = {}
    for i, a in enumerate(block.args):
        try:
            av = _static_aval(a.type, f"argument {i}")
        except LoweringUnsupported as e:
            raise LoweringError("func", e.reason) from None
        env[a] = PV(a, av.shape, av.dtype)
    old_ops = list(block.ops)
    current: list[x.Operation] = []
    inserted: list[x.Operation] = []

    def insert(new: x.Operation) -> None:
        block.insert_op_before(new, current[0])
        inserted.append(new)

    b = Builder(insert)
    visits.count(STAGE, 2 * len(old_ops))  # lowered, then erased
    try:
        for op in old_ops:
            current[:] = [op]
            _lower_one(b, fn, op, env, insert)
    except BaseException:
        # Leave the function as it was: the new ops only read arguments and each other.
        for new in reversed(inserted):
            block.erase_op(new)
        raise
    for op in reversed(old_ops):
        for r in op.results:
            if r.uses:
                raise AssertionError(f"{op.name} still used after lowering")
        block.erase_op(op)


def _lower_one(b: Builder, fn: x.func.FuncOp, op: x.Operation, env: dict, insert) -> None:
    if isinstance(op, ConstantOp):
        value = constant_value(op)
        if op.scalar() is not None:
            env[op.results[0]] = value
            return
        try:
            av = _static_aval(op.results[0].type, "a constant")
        except LoweringUnsupported as e:
            raise LoweringError("constant", e.reason) from None
        env[op.results[0]] = b.const(value, av.dtype, av.shape)
    elif isinstance(op, LucidOp):
        _lower_op(b, op, env)
    elif isinstance(op, x.func.ReturnOp):
        values = []
        for v, t in zip(op.operands, fn.function_type.outputs.data, strict=True):
            pv = env[v]
            if not isinstance(pv, PV):
                try:
                    av = _static_aval(t, "a result")
                except LoweringUnsupported as e:
                    raise LoweringError("func", e.reason) from None
                pv = b.const(pv, av.dtype, av.shape)
            values.append(pv.ssa)
        insert(x.func.ReturnOp(*values))
    else:
        raise LoweringError(op.name, "only lucid ops and func.return can be lowered")


def _lower_op(b: Builder, op: LucidOp, env: dict) -> None:
    opdef = op.OPDEF
    name = opdef.name
    fn = RULES.get(name)
    if fn is None:
        raise LoweringError(name, UNSUPPORTED.get(name, "no lowering rule"))
    try:
        outs = tuple(_static_aval(r.type, "a result") for r in op.results)
        values = [env[v] for v in op.operands]
        for v in values:
            if isinstance(v, PV):
                lower_dtype(v.dtype)
        seen = outs
        if any(isinstance(v, PV) and v.dtype in HALF_DTYPES for v in values):
            # As eager runs a kernel on half tensors: the rule sees the operands widened to
            # float32 (exact) and computes float32 results, each rounded once to its half dtype
            # below. So composites (norms, attention, losses) accumulate in float32.
            values = [b.widen(v) if isinstance(v, PV) else v for v in values]
            seen = tuple(
                AVal(a.shape, _dtype.float32) if a.dtype in HALF_DTYPES else a for a in outs
            )
        operands = op.operand_groups(values)
        b.outs, b.stored_outs, b.op_name = seen, outs, name
        b.used = tuple(bool(r.uses) for r in op.results)
        result = fn(b, *operands, **op.lucid_attrs())
    except LoweringUnsupported as e:
        raise LoweringError(name, e.reason) from None
    except P.PrimError as e:  # the rule built prim ops their table rejects: no silent fallback
        raise LoweringError(name, f"prim rejected the lowering ({e})") from e
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(op.results):
        raise AssertionError(
            f"lowering of {name} gave {len(results)} results, not {len(op.results)}"
        )
    for r, pv, av in zip(op.results, results, outs, strict=True):
        if pv is None:  # an output the rule leaves out because nothing reads it
            if r.uses:
                raise LoweringError(name, "the rule cannot produce a result that is used")
            continue
        if not isinstance(pv, PV):
            pv = b.const(pv, av.dtype, av.shape)
        if pv.shape != av.shape:
            raise AssertionError(f"lowering of {name} gave shape {pv.shape}, expected {av.shape}")
        env[r] = b.cast(pv, av.dtype)


def lower_module(module: x.ModuleOp) -> x.ModuleOp:
    """Lower every function of ``module`` in place; returns it."""
    for fn in module.ops:
        if isinstance(fn, x.func.FuncOp):
            _lower_func(fn)
    return module


@dataclass(frozen=True)
class LowerToPrim(x.ModulePass):
    """Lower every ``lucid`` op to ``prim`` ops (promotion made explicit, composites decomposed).
    Fails with a ``LoweringError`` naming the first op that cannot lower."""

    name = "lower-to-prim"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        from lucid.ir.prim.dialect import prim_dialect

        # Registered lazily: generating all prim op classes costs ~0.5 s, and lowering itself
        # creates only the classes it uses.
        if "prim" not in ctx.registered_dialect_names and ctx.get_optional_dialect("prim") is None:
            ctx.register_dialect("prim", prim_dialect)
        lower_module(op)
