"""``grad-allreduce``: average the gradients over the data-parallel ranks inside the step.

Run after ``vjp`` and before ``ghost-grads``: the gradients are then the ``grad:<role>``
results. The pass groups them into buckets (in the order backward defines them, one dtype per
bucket, at most ``bucket-cap-mb`` each), and for each bucket emits

    flat = cat(reshape(g, [-1]) for g in bucket)      # one contiguous buffer
    avg  = lucid.all_reduce(flat) {reduce_op = "avg"}  # one collective per bucket
    g'   = reshape(avg[start:end], shape(g))           # per gradient

right after the last gradient of the bucket is defined, so a backend can start each bucket's
collective while the rest of the backward graph runs. The ``grad:`` results become the averaged
values: ``ghost-grads`` then binds the optimizer update (with its gradient clipping and loss
scaling) to the averages, as PyTorch's DDP does.

Options: ``bucket-cap-mb`` (default 25, PyTorch's), ``reduce-op`` (``avg`` or ``sum``),
``func`` (default ``forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid._dispatch import apply
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.importer import forward_func, result_roles
from lucid.ir.types import dtype_of_type, shape_of_type
from lucid.passes._blocks import erase_dead
from lucid.passes._graph import Emitter, _set_results, block_of, erase_args, return_op

STAGE = "grad-allreduce"

__all__ = [
    "BUCKET",
    "GradAllReduce",
    "GradAllReduceError",
    "cut_at_allreduce",
    "insert_grad_allreduce",
]

GRAD = "grad:"
BUCKET = "bucket:"  # the results cut_at_allreduce leaves: one flat buffer per bucket


class GradAllReduceError(ValueError):
    """The function has no gradients to reduce, or an option is invalid."""


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        if d is None:
            raise GradAllReduceError(
                "grad-allreduce: a gradient has a symbolic dimension; specialize shapes first"
            )
        n *= d
    return n


def _buckets(values: list[tuple[int, x.SSAValue]], cap_bytes: float) -> list[list[int]]:
    """Result indices grouped into buckets: in order, one dtype each, at most ``cap_bytes``
    (a gradient larger than the cap gets a bucket of its own)."""
    buckets: list[list[int]] = []
    open_bucket: dict[object, tuple[list[int], int]] = {}
    for k, v in values:
        dt = dtype_of_type(v.type)
        nbytes = _numel(shape_of_type(v.type)) * dt.itemsize
        members, size = open_bucket.get(dt, ([], 0))
        if members and size + nbytes > cap_bytes:
            buckets.append(members)
            members, size = [], 0
        members.append(k)
        open_bucket[dt] = (members, size + nbytes)
    buckets.extend(members for members, _ in open_bucket.values())
    return buckets


def _definition_order(block: x.Block) -> dict[x.Operation, int]:
    order = {}
    for i, op in enumerate(block.ops):
        visits.count(STAGE)
        order[op] = i
    return order


def insert_grad_allreduce(
    fn: x.func.FuncOp, bucket_cap_mb: float = 25.0, reduce_op: str = "avg"
) -> list[list[str]]:
    """Reduce every ``grad:`` result of ``fn`` over the ranks; returns the buckets' roles, in
    the order their collectives run."""
    if not bucket_cap_mb > 0:
        raise GradAllReduceError(f"grad-allreduce: bucket-cap-mb must be > 0, got {bucket_cap_mb}")
    if reduce_op not in ("avg", "sum"):
        raise GradAllReduceError(f"grad-allreduce: reduce-op must be avg or sum, got {reduce_op!r}")
    block = block_of(fn)
    roles = result_roles(fn)
    ret = return_op(fn)
    operands = list(ret.operands)
    grads = [
        (k, v) for k, (r, v) in enumerate(zip(roles, operands, strict=True)) if r.startswith(GRAD)
    ]
    if not grads:
        raise GradAllReduceError(
            "grad-allreduce: the function has no grad:<role> results; run vjp first"
        )
    order = _definition_order(block)

    def defined_at(v: x.SSAValue) -> int:
        return order[v.owner] if isinstance(v.owner, x.Operation) else -1

    grads.sort(key=lambda kv: defined_at(kv[1]))  # backward order: the first ready goes first
    buckets = _buckets(grads, bucket_cap_mb * 1024 * 1024)
    emitter = Emitter(fn)
    for bucket in buckets:
        values = [operands[k] for k in bucket]
        before = set(block.ops)
        with emitter.recording():
            tensors = [emitter.tensor(v) for v in values]
            flat = [t.reshape(-1) for t in tensors]
            reduced = apply(
                "all_reduce", flat[0] if len(flat) == 1 else apply("cat", flat), reduce_op=reduce_op
            )
            outs, start = [], 0
            for t in tensors:
                n = t.numel()
                part = reduced if len(tensors) == 1 else reduced[start : start + n]
                outs.append(part.reshape(tuple(t.shape)))
                start += n
        new_values = emitter.flush(outs)
        for k, v in zip(bucket, new_values, strict=True):
            operands[k] = v
        _move_after(block, [op for op in block.ops if op not in before and op is not ret], values)
    _set_results(fn, operands, roles)
    return [[roles[k] for k in bucket] for bucket in buckets]


def _move_after(block: x.Block, new_ops: list[x.Operation], inputs: list[x.SSAValue]) -> None:
    """Move ``new_ops`` (just emitted before the return) up to just after the last op defining
    one of ``inputs``: the bucket's collective is ready to start there."""
    owners = {v.owner for v in inputs if isinstance(v.owner, x.Operation)}
    anchor = None
    for op in block.ops:
        visits.count(STAGE)
        if op in owners:
            anchor = op
    if anchor is None or anchor.next_op is (new_ops[0] if new_ops else None):
        return
    for op in new_ops:
        op.detach()
    block.insert_ops_after(new_ops, anchor)


@dataclass(frozen=True)
class GradAllReduce(x.ModulePass):
    """Average the ``grad:`` results over the ranks, one ``lucid.all_reduce`` per bucket."""

    name = "grad-allreduce"

    bucket_cap_mb: float = 25.0
    reduce_op: str = "avg"
    func: str = "forward"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        buckets = insert_grad_allreduce(
            forward_func(op, self.func), self.bucket_cap_mb, self.reduce_op
        )
        # Kept for the caller that cuts the function at the collectives (not an option).
        object.__setattr__(self, "buckets", buckets)


def cut_at_allreduce(fn: x.func.FuncOp, buckets: list[list[str]]) -> None:
    """Cut ``fn`` (after ``grad-allreduce``, whose ``buckets`` these are) just before its
    collectives, for a backend that cannot run them: the ``grad:`` results are replaced by
    ``bucket:<i>``, the flat buffer bucket ``i`` would reduce (its gradients flattened and
    concatenated in the order of ``buckets[i]``); what reads the reduced values dies. The host
    reduces each buffer and slices the gradients back out."""
    block = block_of(fn)
    collectives = []
    for op in block.ops:
        visits.count(STAGE)
        if op.name == "lucid.all_reduce":
            collectives.append(op)
    if len(collectives) != len(buckets):
        raise GradAllReduceError(
            f"grad-allreduce: {len(buckets)} buckets but {len(collectives)} all_reduce ops left "
            "to cut at"
        )
    roles = result_roles(fn)
    operands = list(return_op(fn).operands)
    kept = [(v, r) for v, r in zip(operands, roles, strict=True) if not r.startswith(GRAD)]
    kept += [(op.operands[0], f"{BUCKET}{i}") for i, op in enumerate(collectives)]
    _set_results(fn, [v for v, _ in kept], [r for _, r in kept])
    erase_dead(block, STAGE)
    for op in collectives:  # a collective is not pure: dead-code elimination keeps it
        if op.parent is not None and not any(r.uses for r in op.results):
            block.erase_op(op)
    erase_args(fn, [i for i, a in enumerate(block.args) if not a.uses])
