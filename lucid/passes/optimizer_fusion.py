"""``optimizer-fusion``: all parameters' optimizer updates as one flat elementwise chain.

An optimizer step traced per parameter (``update:param:<name>`` and
``update:state:<name>.<key>`` results) repeats the same elementwise chain once per parameter,
differing only in shapes. This pass finds each parameter's chain: the elementwise ops whose
results flow only into that parameter's update results. Chains that are identical up to shape
(same ops, attributes, dtypes and wiring) are fused horizontally by flattening into one buffer:

- a per-parameter tensor operand (parameter, gradient, state) is flattened and concatenated;
- a per-parameter 0-d operand (a step scalar such as ``scalar:3:step_size``) is expanded to that
  parameter's size (and cast to the chain's dtype) and concatenated; an operand shared by every
  chain (the same value, e.g. a constant) is used as it is;
- the chain runs once on the flat buffers, and its results are sliced and reshaped back into
  each parameter's (and state's) update result.

The function's signature and result roles do not change: the in-place outputs stay
``update:param:*``/``update:state:*`` results, so a backend writes them back in place. 0-d
bookkeeping (``step += 1``) stays per parameter. The replaced per-parameter ops are erased.

Option ``min-group`` (default 2): the fewest chains worth fusing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucid._dispatch import apply
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import ConstantOp, LucidOp
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.ir.types import dtype_of_type, shape_of_type
from lucid.ops._registry import ELEMENTWISE, RANDOM
from lucid.passes._graph import Emitter, block_of, return_op

STAGE = "optimizer-fusion"  # the visit counters' name for this pass

__all__ = ["OptimizerFusion", "fuse_optimizer_updates"]


def _owner_of_role(role: str) -> str | None:
    if role.startswith("update:param:"):
        return role[len("update:param:") :]
    if role.startswith("update:state:"):
        return role[len("update:state:") :].rsplit(".", 1)[0]
    return None


def _eligible(op: x.Operation) -> bool:
    if not isinstance(op, LucidOp):
        return False
    opdef = op.OPDEF
    return (
        ELEMENTWISE in opdef.props
        and RANDOM not in opdef.props
        and opdef.n_outputs == 1
        and not opdef.variadic
    )


@dataclass
class _Chain:
    owner: str
    shape: tuple
    full_ops: list  # the chain's ops with the parameter's shape, in block order
    outputs: list  # (position in the return, index in full_ops)
    signature: tuple = ()
    leaves: list = None  # per full op, per operand: ("op", j) | ("const", v) | SSA value


def _scalar_const(v: x.SSAValue) -> Any:
    owner = v.owner
    if isinstance(owner, ConstantOp):
        return owner.scalar()
    return None


def _chains(fn: x.func.FuncOp) -> list[_Chain]:
    block = block_of(fn)
    ret = return_op(fn)
    roles = result_roles(fn)
    pos_owner = {k: _owner_of_role(r) for k, r in enumerate(roles)}
    owner: dict[x.Operation, str] = {}
    ops = list(block.ops)
    visits.count(STAGE, 2 * len(ops))  # the two sweeps below
    for op in reversed(ops):
        if op is ret or not _eligible(op):
            continue
        labels = set()
        for r in op.results:
            for use in r.uses:
                if use.operation is ret:
                    labels.add(pos_owner.get(use.index))
                else:
                    labels.add(owner.get(use.operation))
        if len(labels) == 1 and None not in labels:
            owner[op] = labels.pop()
    params = dict(zip(feed_roles(fn), block.args, strict=True))
    chains: dict[str, _Chain] = {}
    for k in range(len(ret.operands)):
        name = pos_owner.get(k)
        if name is None or name in chains:
            continue
        p = params.get(f"param:{name}")
        shape = shape_of_type(p.type) if p is not None else None
        chains[name] = _Chain(name, shape, [], [])
    for op in ops:
        name = owner.get(op)
        chain = chains.get(name) if name is not None else None
        if chain is None or chain.shape is None:
            continue
        rshape = shape_of_type(op.results[0].type)
        if rshape == chain.shape and len(rshape) > 0:
            chain.full_ops.append(op)
    out = []
    for chain in chains.values():
        if chain.full_ops and _describe(chain, ret, pos_owner):
            out.append(chain)
    return out


def _describe(chain: _Chain, ret: x.Operation, pos_owner: dict) -> bool:
    """Fill in the chain's signature (structure up to shape) and leaves; False if it cannot be
    fused (mixed dtypes, a per-parameter operand of another shape or a non-float 0-d one)."""
    index = {op: j for j, op in enumerate(chain.full_ops)}
    dts = {dtype_of_type(op.results[0].type) for op in chain.full_ops}
    if len(dts) != 1:
        return False
    (dt,) = dts
    sig: list = [dt.name]
    leaves: list = []
    for op in chain.full_ops:
        op_sig: list = [op.OPDEF.name, tuple(sorted(op.lucid_attrs().items(), key=str))]
        op_leaves: list = []
        for v in op.operands:
            j = index.get(v.owner)
            if j is not None:
                op_sig.append(("op", j))
                op_leaves.append(("op", j))
                continue
            c = _scalar_const(v)
            if c is not None:
                op_sig.append(("const", type(c).__name__, c))
                op_leaves.append(("const", c))
                continue
            vshape = shape_of_type(v.type)
            vdt = dtype_of_type(v.type)
            if vshape == chain.shape and vdt is dt:
                op_sig.append(("full",))
            elif vshape == () and vdt.is_floating_point:
                op_sig.append(("scalar", vdt.name))
            else:
                return False
            op_leaves.append(v)
        sig.append(tuple(op_sig))
        leaves.append(op_leaves)
    for k, v in enumerate(ret.operands):
        if pos_owner.get(k) == chain.owner and v.owner in index:
            chain.outputs.append((k, index[v.owner]))
    roles_sig = tuple(j for _, j in chain.outputs)
    chain.signature = (tuple(sig), roles_sig)
    chain.leaves = leaves
    return bool(chain.outputs)


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fuse_group(fn: x.func.FuncOp, group: list[_Chain], new_results: dict) -> None:
    emitter = Emitter(fn)
    sizes = [_numel(c.shape) for c in group]
    dt = dtype_of_type(group[0].full_ops[0].results[0].type)
    n_ops = len(group[0].full_ops)
    with emitter.recording():
        env: list = []
        for j in range(n_ops):
            first = group[0].full_ops[j]
            operands = []
            for slot, leaf in enumerate(group[0].leaves[j]):
                if isinstance(leaf, tuple):
                    operands.append(env[leaf[1]] if leaf[0] == "op" else leaf[1])
                    continue
                values = [c.leaves[j][slot] for c in group]
                operands.append(_flat_operand(emitter, values, sizes, dt))
            env.append(apply(first.OPDEF, *operands, **first.lucid_attrs()))
        pieces = []
        offsets = [sum(sizes[:i]) for i in range(len(group))]
        for chain, off, n in zip(group, offsets, sizes, strict=True):
            for pos, j in chain.outputs:
                pieces.append((pos, env[j][off : off + n].reshape(chain.shape)))
    values = emitter.flush([t for _, t in pieces])
    for (pos, _), v in zip(pieces, values, strict=True):
        new_results[pos] = v


def _flat_operand(emitter: Emitter, values: list, sizes: list, dt) -> Any:
    if all(v is values[0] for v in values) and shape_of_type(values[0].type) == ():
        return emitter.tensor(values[0])  # shared by every chain: stays 0-d
    parts = []
    for v, n in zip(values, sizes, strict=True):
        t = emitter.tensor(v)
        if tuple(t.shape) == ():
            if t.dtype is not dt:
                t = t.type(dt)
            parts.append(t.expand(n))
        else:
            parts.append(t.reshape(n))
    return apply("cat", parts, dim=0)


def fuse_optimizer_updates(fn: x.func.FuncOp, min_group: int = 2) -> int:
    """Fuse the identical per-parameter update chains of ``fn``; returns how many chains were
    fused."""
    groups: dict[tuple, list[_Chain]] = {}
    for chain in _chains(fn):
        groups.setdefault(chain.signature, []).append(chain)
    new_results: dict[int, x.SSAValue] = {}
    fused = 0
    for group in groups.values():
        if len(group) >= max(min_group, 2):
            _fuse_group(fn, group, new_results)
            fused += len(group)
    if not new_results:
        return 0
    ret = return_op(fn)
    operands = [new_results.get(k, v) for k, v in enumerate(ret.operands)]
    new_ret = x.func.ReturnOp(*operands)
    block_of(fn).insert_op_before(new_ret, ret)
    block_of(fn).erase_op(ret)
    x.region_dce(fn.body)
    return fused


@dataclass(frozen=True)
class OptimizerFusion(x.ModulePass):
    """Fuse identical per-parameter optimizer update chains into one flat chain."""

    name = "optimizer-fusion"

    min_group: int = 2
    func: str = "forward"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        fuse_optimizer_updates(forward_func(op, self.func), self.min_group)
