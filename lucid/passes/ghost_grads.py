"""``ghost-grads``: bind an optimizer update traced against placeholder gradients to the real ones.

A fused training step is traced as forward + loss + the optimizer's update, where the update reads
a placeholder ("ghost") feed per parameter (role ``ghost:<param role>``, e.g.
``ghost:param:fc1.weight``) instead of a gradient. After ``vjp`` has appended the gradients
(results ``grad:<param role>``), this pass replaces every use of each ghost feed with the matching
gradient, moves the ops that read it (and everything computed from them) after the backward
graph, and removes the ghost feeds. The ``grad:`` results it bound are dropped unless
``keep-grads=true``. Forward, loss, backward and update are then one graph.

A ghost feed without a matching ``grad:`` result is an error naming it (run ``vjp`` first, with
``wrt`` covering that parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.passes._graph import block_of, erase_args, keep_results, return_op

STAGE = "ghost-grads"  # the visit counters' name for this pass

__all__ = ["GhostGrads", "GhostGradError", "bind_ghost_grads"]

GHOST = "ghost:"
GRAD = "grad:"


class GhostGradError(ValueError):
    """A ghost feed has no gradient to bind to."""


def bind_ghost_grads(fn: x.func.FuncOp, keep_grads: bool = False) -> list[str]:
    """Bind every ``ghost:<role>`` feed of ``fn`` to its ``grad:<role>`` result; returns the
    roles bound."""
    block = block_of(fn)
    roles = feed_roles(fn)
    res_roles = result_roles(fn)
    ret = return_op(fn)
    grads = {
        r[len(GRAD) :]: v
        for r, v in zip(res_roles, ret.operands, strict=True)
        if r.startswith(GRAD)
    }
    ghosts = [(i, r[len(GHOST) :]) for i, r in enumerate(roles) if r.startswith(GHOST)]
    unbound = [GHOST + target for _, target in ghosts if target not in grads]
    if unbound:
        raise GhostGradError(
            f"ghost-grads: no grad:<role> result for the ghost feeds {unbound}; run vjp first "
            "with wrt covering those feeds"
        )
    readers: set[x.Operation] = set()
    for i, target in ghosts:
        arg = block.args[i]
        readers.update(use.operation for use in arg.uses)
        arg.replace_all_uses_with(grads[target])
    _move_after_backward(block, readers, ret)
    erase_args(fn, [i for i, _ in ghosts])
    bound = {target for _, target in ghosts}
    if not keep_grads:
        keep_results(
            fn,
            [
                k
                for k, r in enumerate(res_roles)
                if not (r.startswith(GRAD) and r[len(GRAD) :] in bound)
            ],
        )
    return sorted(bound)


def _move_after_backward(block: x.Block, readers: set[x.Operation], ret: x.Operation) -> None:
    """Move ``readers`` and every op computed from them to just before ``ret``, in order: they
    read gradients, which the backward graph defines after them."""
    moved: set[x.Operation] = set()
    order: list[x.Operation] = []
    for op in block.ops:
        visits.count(STAGE)
        if op is ret:
            break
        if op in readers or any(
            v.owner in moved for v in op.operands if isinstance(v.owner, x.Operation)
        ):
            moved.add(op)
            order.append(op)
    for op in order:
        op.detach()
        block.insert_op_before(op, ret)


@dataclass(frozen=True)
class GhostGrads(x.ModulePass):
    """Replace ``ghost:<role>`` feeds by the ``grad:<role>`` results and drop them."""

    name = "ghost-grads"

    keep_grads: bool = False
    func: str = "forward"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        bind_ghost_grads(forward_func(op, self.func), self.keep_grads)
