"""fuse-elementwise: merge chains of elementwise instructions into one `fused` instruction.

The native runtime evaluates a fused instruction in one pass over blocks of output elements, so the
intermediates of a chain never travel through memory. A producer joins its consumer's group when
it is elementwise, its value has exactly one use (inside the group) and is not a program result,
and it has the group's output shape (so every node is computed at one shape; operands from
outside the group may still broadcast).
"""

from __future__ import annotations

from collections import Counter

from lucid.backends.cpu.program import FUSED, FusedNode, Instr, Program
from lucid.backends.prim_ops import ELEMENTWISE_OPS


def fuse_elementwise(program: Program, max_nodes: int = 64) -> Program:
    """A new program with elementwise chains fused; the input program is left unchanged."""
    instrs = program.instrs
    uses = Counter(s for ins in instrs for s in ins.inputs)
    uses.update(program.results)
    producer = {ins.outputs[0]: k for k, ins in enumerate(instrs)}
    absorbed: set[int] = set()
    groups: dict[int, list[int]] = {}
    for k in reversed(range(len(instrs))):
        root = instrs[k]
        if k in absorbed or root.op not in ELEMENTWISE_OPS:
            continue
        shape = program.slots[root.outputs[0]].shape
        members, pending = [k], list(root.inputs)
        while pending:
            s = pending.pop()
            j = producer.get(s)
            if j is None or j in absorbed or instrs[j].op not in ELEMENTWISE_OPS:
                continue
            if uses[s] != 1 or program.slots[s].shape != shape or len(members) >= max_nodes:
                continue
            members.append(j)
            absorbed.add(j)
            pending.extend(instrs[j].inputs)
        if len(members) > 1:
            groups[k] = sorted(members)

    fused = Program()
    fused.slots = list(program.slots)
    fused.feeds = list(program.feeds)
    fused.results = list(program.results)
    fused.inplace = dict(program.inplace)
    for k, ins in enumerate(instrs):
        if k in absorbed:
            continue
        fused.instrs.append(_fuse_group(program, groups[k]) if k in groups else ins)
    return fused


def _fuse_group(program: Program, members: list[int]) -> Instr:
    inner = {program.instrs[j].outputs[0]: n for n, j in enumerate(members)}
    inputs: list[int] = []
    for j in members:
        for s in program.instrs[j].inputs:
            if s not in inner and s not in inputs:
                inputs.append(s)
    nodes = []
    for j in members:
        ins = program.instrs[j]
        args = tuple(len(inputs) + inner[s] if s in inner else inputs.index(s) for s in ins.inputs)
        out = ins.outputs[0]
        nodes.append(FusedNode(ins.op, args, program.slots[out].dtype, dict(ins.attrs)))
    root = program.instrs[members[-1]]
    return Instr(FUSED, tuple(inputs), root.outputs, {}, tuple(nodes))


__all__ = ["fuse_elementwise"]
