"""``symbolic-safety``: prove that a symbolic-batch prim module never makes MPSGraph abort.

MPSGraph aborts the process (uncatchably, inside its MLIR passes) when a graph compiled with a
``-1`` batch dimension materializes a constant that carries that axis: a batch-shaped constant or
fill, an explicit broadcast to a batch shape, a concatenation or padding along the batch axis, a
static reshape or output shape that bakes the trace-time batch in, random numbers of a batch
shape. So the decision is made here, in Python, before any native call.

Prim shapes are static, so the symbolic axis is found by comparison: the same trace is lowered at
two batch sizes, and the dims that differ between the two modules are the ones that carry the
batch. The pass then walks the ops and accepts each one only by a rule that shows it safe:

- elementwise ops, casts, normalization, matmul, reductions (keeping or dropping any axis),
  softmax, cumsum, transpose, one_hot, conv2d, max/avg pooling and the max-pool and weight
  gradients read the batch from their operands (shape inference at run time);
- a reshape is safe when its target has at most one symbolic dim (written ``-1``);
- a slice, concat or pad is safe when it leaves the symbolic axis whole;
- a gather/scatter is safe when it does not index along the symbolic axis (the range check's bound
  would bake the trace batch in) and, for ``scatter_add``, its indices do not carry it;
- anything else whose operands or results carry the symbolic axis is unsafe, and so is any op
  whose attributes differ between the two lowerings (it bakes the batch into an attribute) unless
  a rule above covers that attribute.

If the proof fails, :class:`SymbolicUnsafe` carries the reason; the caller compiles per shape
instead and shows the reason in ``cache_info()``. On success, :func:`symbolic_dims` gives, for
each SSA value of the first module, its symbolic dims (what the emitter writes as ``-1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.importer import feed_roles, forward_func
from lucid.ir.prim.dialect import PrimIROp, aval_of_type
from lucid.passes.registry import register_pass

__all__ = ["SymbolicSafety", "SymbolicUnsafe", "symbolic_dims"]


class SymbolicUnsafe(ValueError):
    """The module cannot be proven safe under a symbolic batch; ``reason`` says which op."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"not safe under a symbolic batch: {reason}")


_READS_BATCH = (
    set(P.ELEMENTWISE_OPS)
    | {"select", "cast", "normalize", "matmul", "matmul_accumulate", "softmax", "log_softmax"}
    | {"cumsum", "transpose", "one_hot", "conv2d", "max_pool2d", "avg_pool2d", "max_pool2d_grad"}
    | {"conv2d_weights_grad", "argmax", "argmin", "check_index"}
    | set(P.REDUCTIONS)
)
_GATHERS = ("gather", "gather_along_axis", "scatter_add", "scatter_add_along_axis")


def _differing_dims(ta: x.Attribute, tb: x.Attribute, where: str) -> frozenset[int]:
    a, b = aval_of_type(ta), aval_of_type(tb)
    if a.dtype != b.dtype or len(a.shape) != len(b.shape):
        raise SymbolicUnsafe(f"{where} changes rank or dtype with the batch size")
    return frozenset(i for i, (da, db) in enumerate(zip(a.shape, b.shape, strict=True)) if da != db)


def _check_op(op: PrimIROp, other: PrimIROp, ins: list[frozenset[int]], outs) -> None:
    name = op.PRIM.name
    attrs, attrs_b = op.prim_attrs(), other.prim_attrs()
    changed = {k for k in attrs if attrs[k] != attrs_b[k]}
    carries = any(ins) or any(outs)
    where = f"prim.{name}"
    if not carries:
        if changed:
            raise SymbolicUnsafe(f"{where} has attributes {sorted(changed)} that follow the batch")
        return
    if any(len(s) > 1 for s in outs):
        raise SymbolicUnsafe(f"{where} has a result with more than one batch-sized dim")
    if name in _READS_BATCH:
        if changed:
            raise SymbolicUnsafe(f"{where} bakes the batch into {sorted(changed)}")
        return
    if name == "reshape":
        return  # one symbolic dim at most (checked above): written as -1
    if name in ("slice", "pad", "concat"):
        (x_sym,) = ins[:1]
        shape = aval_of_type(op.operands[0].type).shape
        for axis in x_sym | outs[0]:
            if name == "slice":
                s, e, st = attrs["starts"][axis], attrs["ends"][axis], attrs["strides"][axis]
                whole = s == 0 and e == shape[axis] and st == 1
            elif name == "pad":
                whole = attrs["low"][axis] == 0 and attrs["high"][axis] == 0
            else:
                whole = P.normalize_axis("concat", attrs["axis"], len(shape)) != axis
            if not whole:
                raise SymbolicUnsafe(f"{where} cuts, pads or joins along the batch axis {axis}")
        if changed - {"ends"} or (changed and name != "slice"):
            raise SymbolicUnsafe(f"{where} bakes the batch into {sorted(changed)}")
        return
    if name in _GATHERS:
        rank = len(aval_of_type(op.operands[0].type).shape)
        axis = P.normalize_axis(name, attrs["axis"], rank)
        if axis in ins[0]:
            raise SymbolicUnsafe(f"{where} indexes along the batch axis")
        if name == "scatter_add" and ins[1]:
            raise SymbolicUnsafe(f"{where} has batch-sized indices (flattened to a static size)")
        if changed:
            raise SymbolicUnsafe(f"{where} bakes the batch into {sorted(changed)}")
        return
    if name in ("constant", "fill", "broadcast_to", "random_uniform", "random_normal"):
        raise SymbolicUnsafe(f"{where} materializes a batch-shaped value")
    raise SymbolicUnsafe(f"{where} is not proven safe with a batch-sized operand or result")


def symbolic_dims(
    module: x.ModuleOp, probe: x.ModuleOp, *, func_name: str = "forward", prove: bool = True
) -> dict[Any, frozenset[int]]:
    """The symbolic dims of every value of ``module``, given ``probe``: the same trace lowered at
    another batch size. Raises SymbolicUnsafe when an op is not proven safe (``prove=False``
    skips the per-op proof: only for tests that show what MPSGraph would do without it)."""
    fa, fb = forward_func(module, func_name), forward_func(probe, func_name)
    ba, bb = fa.body.blocks.first, fb.body.blocks.first
    if len(ba.args) != len(bb.args):
        raise SymbolicUnsafe("the two lowerings take different inputs")
    dims: dict[Any, frozenset[int]] = {}
    partner: dict[Any, Any] = {}
    roles = feed_roles(fa)
    for i, (a, b) in enumerate(zip(ba.args, bb.args, strict=True)):
        dims[a] = _differing_dims(a.type, b.type, f"argument {i}")
        if dims[a] - {0}:
            raise SymbolicUnsafe(f"argument {i}: only the leading dim may be the batch")
        if dims[a] and not roles[i].startswith("input:"):
            raise SymbolicUnsafe(f"the feed {roles[i]} (not an input) has a batch-sized shape")
        partner[a] = b
    ops_a, ops_b = list(ba.ops), list(bb.ops)
    if len(ops_a) != len(ops_b):
        raise SymbolicUnsafe("the graph's structure depends on the batch size")
    for oa, ob in zip(ops_a, ops_b, strict=True):
        if oa.name != ob.name or len(oa.operands) != len(ob.operands):
            raise SymbolicUnsafe(f"the graph's structure depends on the batch size ({oa.name})")
        for va, vb in zip(oa.operands, ob.operands, strict=True):
            if partner.get(va) is not vb:
                raise SymbolicUnsafe(f"{oa.name}: operands differ between the two lowerings")
        outs = []
        for ra, rb in zip(oa.results, ob.results, strict=True):
            dims[ra] = _differing_dims(ra.type, rb.type, oa.name)
            partner[ra] = rb
            outs.append(dims[ra])
        if isinstance(oa, PrimIROp):
            if prove:
                _check_op(oa, ob, [dims[v] for v in oa.operands], outs)
        elif not isinstance(oa, x.func.ReturnOp):
            raise SymbolicUnsafe(f"{oa.name} is not a prim op")
    return dims


@register_pass
@dataclass(frozen=True, eq=False)
class SymbolicSafety(x.ModulePass):
    """Prove a symbolic-batch prim module safe for MPSGraph (``probe``: the same trace lowered
    at another batch size); ``dims`` then holds each value's symbolic dims."""

    name = "symbolic-safety"
    probe: x.ModuleOp | None = None
    dims: dict = field(default_factory=dict)

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        if self.probe is None:
            raise SymbolicUnsafe(
                "symbolic-safety needs the module lowered at a second batch size (probe)"
            )
        self.dims.clear()
        self.dims.update(symbolic_dims(op, self.probe))
