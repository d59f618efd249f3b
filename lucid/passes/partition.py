"""``partition``: split a differentiated function into a forward and a backward function.

The input is what ``lucid.compile`` makes of a model call in grad mode: ``@forward`` with one
cotangent feed ``cot:<j>`` per floating output and, after ``vjp``, results ``output:*`` (the
seeded ``output:0`` first), ``update:*`` and ``grad:*``. The pass leaves two functions in the
module:

- ``@forward``: every op that does not depend on a cotangent. Feeds: the original ones it
  reads (no ``cot:``). Results: the model's outputs (without the seeded ``output:0``), the
  ``update:*`` results, then ``residual:<i>``: the intermediate values the backward reads.
- ``@backward``: the ops that do. Feeds: the original feeds it reads (parameters, inputs, the
  RNG state, the cotangents), then ``residual:<i>``. Results: the ``grad:*`` results.

Running ``@forward`` and feeding its residuals to ``@backward`` computes exactly what the
original function computed (``tests/compile/test_partition.py`` checks it with the IR
interpreter). ``split_module`` then gives each half its own module (named ``@forward``, as a
backend expects), to be lowered and compiled separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.passes._blocks import erase_dead
from lucid.passes._graph import append_results, block_of, erase_args, keep_results, set_arg_roles

__all__ = ["BACKWARD", "Partition", "PartitionError", "partition", "split_module"]

STAGE = "partition"  # the visit counters' name for this pass
BACKWARD = "backward"  # the name of the backward function the pass adds


class PartitionError(ValueError):
    """The function cannot be partitioned (nothing to split, or already split)."""


def partition(module: x.ModuleOp) -> int:
    """Split ``@forward`` of ``module`` into ``@forward`` and ``@backward`` in place (see the
    module docstring); returns the number of residuals passed between them."""
    if any(isinstance(op, x.func.FuncOp) and op.sym_name.data == BACKWARD for op in module.ops):
        raise PartitionError(f"the module already has a @{BACKWARD} function")
    fn = forward_func(module)
    block = block_of(fn)
    roles = feed_roles(fn)
    if not any(r.startswith("cot:") for r in roles):
        raise PartitionError("@forward has no cotangent feed (cot:<j>): nothing to split")
    backward: set[x.SSAValue] = {
        a for a, r in zip(block.args, roles, strict=True) if r.startswith("cot:")
    }
    ops = list(block.ops)
    ret, body = ops[-1], ops[:-1]
    for op in body:
        visits.count(STAGE)
        if any(o in backward for o in op.operands):
            backward.update(op.results)
    args = set(block.args)
    position = {op: i for i, op in enumerate(body)}  # body.index per residual was quadratic
    residual_pos: list[tuple[int, int]] = []  # (op index, result index) of each residual
    seen: set[x.SSAValue] = set()

    def need(v: x.SSAValue) -> None:
        if v in backward or v in args or v in seen:
            return
        seen.add(v)
        residual_pos.append((position[v.owner], v.index))

    for op in body:
        if any(o in backward for o in op.operands):
            for o in op.operands:
                need(o)
    r_roles = result_roles(fn)
    for v, role in zip(ret.operands, r_roles, strict=True):
        if role.startswith("grad:"):
            need(v)

    def residuals_of(f: x.func.FuncOp) -> list[x.SSAValue]:
        f_ops = list(block_of(f).ops)
        return [f_ops[i].results[j] for i, j in residual_pos]

    bwd = fn.clone()
    bwd.sym_name = x.StringAttr(BACKWARD)
    # Forward: outputs (but the seeded sum), updates, residuals; the backward ops die.
    residuals = residuals_of(fn)
    keep_results(
        fn,
        [
            i
            for i, r in enumerate(r_roles)
            if r.startswith("update:") or (r.startswith("output:") and r != "output:0")
        ],
    )
    append_results(fn, residuals, [f"residual:{i}" for i in range(len(residuals))])
    _prune(fn)
    # Backward: the residuals become feeds; only the gradients are returned.
    b_block = block_of(bwd)
    b_roles = feed_roles(bwd)
    for i, v in enumerate(residuals_of(bwd)):
        arg = b_block.insert_arg(v.type, len(b_block.args))
        v.replace_all_uses_with(arg)
        b_roles.append(f"residual:{i}")
    set_arg_roles(bwd, b_roles)
    bwd.update_function_type()
    keep_results(bwd, [i for i, r in enumerate(r_roles) if r.startswith("grad:")])
    _prune(bwd)
    module.body.block.insert_op_after(bwd, fn)
    return len(residual_pos)


def _prune(fn: x.func.FuncOp) -> None:
    """Erase the ops nothing reads any more, then the feeds nothing reads."""
    block = block_of(fn)
    erase_dead(block, STAGE)
    erase_args(fn, [i for i, a in enumerate(block.args) if not a.uses])


def split_module(module: x.ModuleOp) -> tuple[x.ModuleOp, x.ModuleOp]:
    """The two halves of a partitioned module, each in a module of its own as ``@forward``."""
    halves = []
    for keep in ("forward", BACKWARD):
        half = module.clone()
        for op in list(half.ops):
            if isinstance(op, x.func.FuncOp) and op.sym_name.data != keep:
                half.body.block.erase_op(op)
        forward_func(half, keep).sym_name = x.StringAttr("forward")
        halves.append(half)
    return halves[0], halves[1]


@dataclass(frozen=True)
class Partition(x.ModulePass):
    """Split the differentiated ``@forward`` into ``@forward`` and ``@backward``."""

    name = "partition"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        partition(op)
