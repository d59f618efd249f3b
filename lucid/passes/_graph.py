"""Helpers the training passes share: editing a ``func.func``'s signature with its roles, and
``Emitter``, which runs Python code written with Lucid ops and appends the ops it records to a
function (before its ``func.return``).

``Emitter`` is how the ``vjp`` pass turns the registry's VJP rules into IR: the rule runs under a
``Tracer`` whose feeds are bound to SSA values of the function, exactly as eager autograd runs it
on concrete tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lucid._state import state
from lucid._tensor import Tensor
from lucid.ir import _xdsl as x
from lucid.ir.dialect import ConstantOp, get_op_class, make_constant
from lucid.ir.importer import ROLE, feed_roles, result_roles
from lucid.ir.types import attr_to_ir, dtype_of_type, shape_of_type, tensor_type
from lucid.trace import Const, Tracer

__all__ = [
    "Emitter",
    "append_results",
    "block_of",
    "erase_args",
    "keep_results",
    "return_op",
    "set_arg_roles",
]


def block_of(fn: x.func.FuncOp) -> x.Block:
    return fn.body.blocks.first


def return_op(fn: x.func.FuncOp) -> x.func.ReturnOp:
    last = block_of(fn).last_op
    if not isinstance(last, x.func.ReturnOp):
        raise ValueError(f"@{fn.sym_name.data} does not end with func.return")
    return last


def _roles_attr(roles: Sequence[str]) -> x.ArrayAttr:
    return x.ArrayAttr([x.DictionaryAttr({ROLE: x.StringAttr(r)}) for r in roles])


def _set_results(fn: x.func.FuncOp, values: Sequence[x.SSAValue], roles: Sequence[str]) -> None:
    ret = return_op(fn)
    new_ret = x.func.ReturnOp(*values)
    block_of(fn).insert_op_before(new_ret, ret)
    block_of(fn).erase_op(ret)
    fn.res_attrs = _roles_attr(roles)
    fn.update_function_type()


def append_results(fn: x.func.FuncOp, values: Sequence[x.SSAValue], roles: Sequence[str]) -> None:
    """Add results (with their roles) after ``fn``'s existing ones."""
    ret = return_op(fn)
    _set_results(fn, [*ret.operands, *values], [*result_roles(fn), *roles])


def keep_results(fn: x.func.FuncOp, keep: Iterable[int]) -> None:
    """Keep only the results at the indices ``keep`` (in their order)."""
    keep = list(keep)
    ret = return_op(fn)
    roles = result_roles(fn)
    _set_results(fn, [ret.operands[i] for i in keep], [roles[i] for i in keep])


def set_arg_roles(fn: x.func.FuncOp, roles: Sequence[str]) -> None:
    fn.arg_attrs = _roles_attr(roles)


def erase_args(fn: x.func.FuncOp, indices: Iterable[int]) -> None:
    """Remove the (unused) arguments at ``indices``, with their roles."""
    drop = set(indices)
    roles = feed_roles(fn)
    block = block_of(fn)
    for i in sorted(drop):
        if block.args[i].uses:
            raise ValueError(f"argument {i} ({roles[i]}) is still used and cannot be removed")
    x.erase_block_args(block, [block.args[i] for i in drop])
    set_arg_roles(fn, [r for i, r in enumerate(roles) if i not in drop])
    fn.update_function_type()


class EmitError(RuntimeError):
    """Code run by an ``Emitter`` did something that cannot become IR (read a value, drew random
    numbers)."""


class _EmitTracer(Tracer):
    def graph_break(self, what: str, tensor: Tensor | None = None) -> Any:
        raise EmitError(f"{what} cannot be emitted as IR: the code read a tensor's value")

    def next_rng(self) -> Tensor:
        raise EmitError("random numbers cannot be drawn while emitting IR into a function")


class Emitter:
    """Appends the ops that Lucid code records to ``fn``, before its ``func.return``.

    ``tensor(v)`` gives the trace tensor (or Python scalar, for a scalar ``lucid.constant``) that
    stands for SSA value ``v``; run Lucid code on those inside ``with emitter.recording():``;
    ``flush(tensors)`` appends what was recorded and returns the SSA values of ``tensors``.
    A concrete tensor the code creates (``lucid.tensor(...)``) becomes a ``lucid.constant``.
    """

    def __init__(self, fn: x.func.FuncOp):
        self.fn = fn
        self.tracer = _EmitTracer()
        self._env: dict[int, x.SSAValue] = {}  # trace value id -> SSA value
        self._tensors: dict[x.SSAValue, Tensor] = {}
        self._n_flushed = 0

    def tensor(self, v: x.SSAValue) -> Tensor | bool | int | float:
        owner = v.owner
        if isinstance(owner, ConstantOp):
            scalar = owner.scalar()
            if scalar is not None:
                return scalar
        t = self._tensors.get(v)
        if t is None:
            t = self.tracer.input(
                shape_of_type(v.type), dtype_of_type(v.type), role=f"bound:{len(self._tensors)}"
            )
            self._env[t._trace.id] = v
            self._tensors[v] = t
        return t

    @contextmanager
    def recording(self) -> Iterator[Emitter]:
        prev = state.tracer
        state.tracer = self.tracer
        try:
            yield self
        finally:
            state.tracer = prev

    def _feed_value(self, value: Any, new_ops: list) -> x.SSAValue:
        """The SSA value of a trace feed the code captured (a concrete tensor: a constant)."""
        role = next(f.role for f in self.tracer.trace.feeds if f.value.id == value.id)
        t = self.tracer.feed_tensors().get(role)
        if t is None or t._data is None:
            raise EmitError(f"emitted code used feed {role!r}, which has no value")
        op = make_constant(t._data)
        new_ops.append(op)
        self._env[value.id] = op.results[0]
        return op.results[0]

    def flush(self, tensors: Sequence[Any]) -> list[x.SSAValue]:
        """Append the ops recorded since the last flush and return the SSA values of ``tensors``
        (Tensors of this emitter, concrete tensors, or Python scalars)."""
        new_ops: list[x.Operation] = []
        consts: dict[tuple, x.SSAValue] = {}

        def operand(c: Any) -> x.SSAValue:
            if isinstance(c, Const):
                key = (type(c.value), c.value)
                v = consts.get(key)
                if v is None:
                    op = make_constant(c.value)
                    new_ops.append(op)
                    v = consts[key] = op.results[0]
                return v
            v = self._env.get(c.id)
            return v if v is not None else self._feed_value(c, new_ops)

        ops = self.tracer.trace.ops
        for top in ops[self._n_flushed :]:
            operands = []
            for inp in top.inputs:
                if isinstance(inp, list):
                    operands.extend(operand(e) for e in inp)
                else:
                    operands.append(operand(inp))
            props = {k: a for k, v in top.attrs.items() if (a := attr_to_ir(v)) is not None}
            op = get_op_class(top.name).create(
                operands=operands,
                result_types=[tensor_type(v.shape, v.dtype) for v in top.outputs],
                properties=props,
            )
            new_ops.append(op)
            for v, r in zip(top.outputs, op.results, strict=True):
                self._env[v.id] = r
        self._n_flushed = len(ops)
        results = []
        for t in tensors:
            if isinstance(t, Tensor):
                results.append(operand(self.tracer._operand(t)))
            else:
                results.append(operand(Const(t)))
        if new_ops:
            block_of(self.fn).insert_ops_before(new_ops, return_op(self.fn))
        return results
