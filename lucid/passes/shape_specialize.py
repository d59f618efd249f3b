"""``shape-specialize``: give the symbolic (``?``) dimensions of a ``lucid``-dialect module a size.

A symbolic-batch trace imports as types such as ``tensor<?x8xf32>``: ``?`` is the batch, the one
symbolic dimension the tracer makes (the IR carries no dimension names, so every ``?`` is that
symbol). ``shape-specialize{batch=8}`` rewrites each function of the module:

- every ``?`` in an argument type becomes 8;
- in every shape-like attribute (a flat tuple of ints in which a None stands for the symbolic
  dim, printed ``[unit, 16]``) each None becomes 8, as ``specialize_batch`` does in Python;
  nested tuples (``lucid.index`` specs, where None is an open slice end) are left alone;
- each op's result types are inferred again by the registry's shape rule from the specialised
  operands, so an op whose output dim is not the batch itself (``reshape`` to ``[-1, 4]``,
  a ``cat`` along the batch) gets its true size, not a blind substitution;
- the function type follows, and the module is verified.

It is the dynamic path's specialisation as a pass: ``import_trace(symbolic_trace)`` then
``shape-specialize{batch=B}`` gives the module that importing ``specialize_batch(trace, B)``
gives, visible to ``--print-ir-after-all`` and to the passes after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import ConstantOp, LucidOp, operand_aval
from lucid.ir.types import aval_of_type, ints_attr, tensor_type

STAGE = "shape-specialize"  # the visit counters' name for this pass

__all__ = ["ShapeSpecializeError", "ShapeSpecialize", "specialize_module"]


class ShapeSpecializeError(ValueError):
    """The module cannot be specialised to the given size (the message names the op)."""


def _has_symbolic(t: x.Attribute) -> bool:
    return isinstance(t, x.TensorType) and x.DYNAMIC_INDEX in t.get_shape()


def _specialized_type(t: x.Attribute, size: int) -> x.Attribute:
    if not _has_symbolic(t):
        return t
    av = aval_of_type(t)
    return tensor_type(tuple(size if d is None else d for d in av.shape), av.dtype)


def _specialized_attr(a: x.Attribute, size: int) -> x.Attribute:
    """A flat tuple of ints and Nones (``[unit, 16]``) with each None set to ``size``."""
    if not isinstance(a, x.ArrayAttr) or not a.data:
        return a
    elems = a.data
    if not any(isinstance(e, x.UnitAttr) for e in elems):
        return a
    if not all(
        isinstance(e, x.UnitAttr) or (isinstance(e, x.IntegerAttr) and e.type == x.i64)
        for e in elems
    ):
        return a
    dims = tuple(size if isinstance(e, x.UnitAttr) else int(e.value.data) for e in elems)
    return ints_attr(dims)  # as attr_to_ir writes a tuple of ints


def _matches(declared: x.Attribute, inferred: x.Attribute) -> bool:
    """``inferred`` is ``declared`` with its ``?`` dims filled in."""
    d, i = aval_of_type(declared), aval_of_type(inferred)
    if d.dtype is not i.dtype or len(d.shape) != len(i.shape):
        return False
    return all(a is None or a == b for a, b in zip(d.shape, i.shape, strict=True))


def _specialize_op(op: LucidOp, index: int, size: int) -> None:
    props = op.properties
    for k, a in list(props.items()):
        new = _specialized_attr(a, size)
        if new is not a:
            props[k] = new
    opdef = op.OPDEF
    try:
        args = op.operand_groups([operand_aval(v) for v in op.operands])
        avals = opdef.infer(*args, **op.lucid_attrs())
    except Exception as e:  # the registry's shape rule refuses the specialised operands
        raise ShapeSpecializeError(f"op #{index} {op.name}: {e}") from e
    if opdef.n_outputs == 1:
        avals = (avals,)
    if len(avals) != len(op.results):
        raise ShapeSpecializeError(
            f"op #{index} {op.name} has {len(op.results)} results; the op gives {len(avals)}"
        )
    for r, av in zip(list(op.results), avals, strict=True):
        if any(d is None for d in av.shape):
            raise ShapeSpecializeError(
                f"op #{index} {op.name}: a result dim stays symbolic ({av.shape}) after "
                f"specialising to {size}"
            )
        new_type = tensor_type(tuple(av.shape), av.dtype)
        if new_type == r.type:
            continue
        if not _matches(r.type, new_type):
            raise ShapeSpecializeError(
                f"op #{index} {op.name}: a result is declared {r.type} but the op gives "
                f"{new_type} once specialised to {size}"
            )
        x.Rewriter.replace_value_with_new_type(r, new_type)


def _specialize_func(fn: x.func.FuncOp, size: int) -> None:
    for block in fn.body.blocks:
        for arg in list(block.args):
            new_type = _specialized_type(arg.type, size)
            if new_type is not arg.type:
                x.Rewriter.replace_value_with_new_type(arg, new_type)
        for index, op in enumerate(block.ops):
            visits.count(STAGE)
            if isinstance(op, LucidOp):
                _specialize_op(op, index, size)
            elif isinstance(op, (ConstantOp, x.func.ReturnOp)):
                continue
            elif any(_has_symbolic(v.type) for v in (*op.operands, *op.results)):
                raise ShapeSpecializeError(
                    f"op #{index} {op.name}: shape-specialize rewrites lucid-dialect ops only "
                    "(run it before lower-to-prim)"
                )
    fn.update_function_type()


def specialize_module(module: x.ModuleOp, batch: int) -> x.ModuleOp:
    """Give every symbolic dim of ``module`` the size ``batch``, in place, and verify it
    (``ShapeSpecializeError`` names the op that cannot take that size)."""
    if type(batch) is not int or batch < 0:
        raise ShapeSpecializeError(f"batch must be an integer >= 0, got {batch!r}")
    for op in module.ops:
        if isinstance(op, x.func.FuncOp):
            _specialize_func(op, batch)
    module.verify()
    return module


@dataclass(frozen=True)
class ShapeSpecialize(x.ModulePass):
    """Give the symbolic (?) dims a size: shape-specialize{batch=8}.

    Options: ``batch`` (required), the size of every ``?`` dim (the symbolic batch). Argument
    types, shape-like attributes and, through the registry's shape rules, every result type are
    specialised; the module is verified afterwards.
    """

    name = "shape-specialize"

    batch: int

    def __post_init__(self) -> None:
        if type(self.batch) is not int or self.batch < 0:
            raise ValueError(f"batch must be an integer >= 0, got {self.batch!r}")

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        specialize_module(op, self.batch)
