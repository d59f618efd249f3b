"""fuse-elementwise: merge chains of elementwise instructions into one `fused` instruction.

The native runtime evaluates a fused instruction in one pass over blocks of output elements, so the
intermediates of a chain never travel through memory. A producer joins its consumer's group when
it is elementwise, its value has exactly one use (inside the group) and is not a program result,
and it has the group's output shape (so every node is computed at one shape; operands from
outside the group may still broadcast).

A second sweep merges an elementwise producer whose value is needed elsewhere too (a program
result, or read again later) into the elementwise consumer that reads it, when both have one
output shape and nothing in between reads the value: the merged instruction has several outputs.
An Adam step is the case in point: the new first and second moments are results (written back
into the optimizer state) and the parameter update reads both; merged, one pass reads the
gradient, the moments and the parameter once and writes all three (7 array passes instead of 10).
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

from lucid.backends.cpu.program import FUSED, FusedNode, Instr, Program
from lucid.ir import visits
from lucid.ir.prim import ELEMENTWISE_OPS

STAGE = "fuse-elementwise"  # the visit counters' name for this step


def fuse_elementwise(program: Program, max_nodes: int = 64) -> Program:
    """A new program with elementwise chains fused; the input program is left unchanged."""
    instrs, slots = program.instrs, program.slots
    visits.count(STAGE, 2 * len(instrs))  # the grouping and rebuilding sweeps
    uses = Counter(chain.from_iterable([ins.inputs for ins in instrs]))  # counted in C
    uses.update(program.results)
    # Only elementwise producers can join a group.
    producer = {ins.outputs[0]: k for k, ins in enumerate(instrs) if ins.op in ELEMENTWISE_OPS}
    absorbed: set[int] = set()
    groups: dict[int, list[int]] = {}
    for k in reversed(range(len(instrs))):
        root = instrs[k]
        if root.op not in ELEMENTWISE_OPS or k in absorbed:
            continue
        shape = slots[root.outputs[0]].shape
        members, pending = [k], list(root.inputs)
        visited = 0
        while pending:
            s = pending.pop()
            visited += 1
            j = producer.get(s)
            if j is None or j in absorbed:
                continue
            if uses[s] != 1 or slots[s].shape != shape or len(members) >= max_nodes:
                continue
            members.append(j)
            absorbed.add(j)
            pending.extend(instrs[j].inputs)
        visits.count(STAGE, visited)
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
    fused.instrs = _merge_shared_producers(fused, max_nodes)
    return fused


def _as_fused(program: Program, ins: Instr) -> Instr:
    """An elementwise instruction in `fused` form (inputs without repeats)."""
    if ins.op == FUSED:
        return ins
    position = _first_positions(ins.inputs)  # the inputs without repeats
    node = FusedNode(
        ins.op,
        tuple([position[s] for s in ins.inputs]),
        program.slots[ins.outputs[0]].dtype,
        ins.attrs,
    )
    return Instr(FUSED, tuple(position), ins.outputs, {}, (node,))


def _first_positions(slots: tuple[int, ...] | list[int]) -> dict[int, int]:
    """Each distinct slot of ``slots`` and its position among them, in order of first
    appearance: for a list without repeats what ``list.index`` answers, in O(1) per lookup (a
    merged instruction has dozens of inputs)."""
    position: dict[int, int] = {}
    for s in slots:
        position.setdefault(s, len(position))
    return position


class _Merged:
    """A consumer with producers merged into it, built into one instruction once its last
    producer is in (rebuilding every node at each merge made a consumer that takes in ``m``
    producers cost ``m`` times its size). Merging ``p`` puts its nodes first and its inputs
    first; a node's operand that a merged producer computes becomes that producer's node, and
    the producer outputs in ``keep`` stay outputs (before the consumer's)."""

    __slots__ = ("blocks", "inputs", "outputs", "produced", "size")

    def __init__(self, consumer: Instr) -> None:
        self.blocks = [consumer]  # in reverse order of their nodes in the built instruction
        self.inputs = list(consumer.inputs)
        # (slot, block index, node index in that block) of each output, in order.
        outs = zip(consumer.outputs, consumer.output_nodes(), strict=True)
        self.outputs = [(s, 0, n) for s, n in outs]
        self.produced: dict[int, tuple[int, int]] = {}  # slot -> (block index, node index)
        self.size = len(consumer.nodes)

    def merge(self, producer: Instr, keep: set[int]) -> None:
        """Merge ``producer`` (in fused form) in."""
        b = len(self.blocks)
        values = list(zip(producer.outputs, producer.output_nodes(), strict=True))
        for s, n in values:
            self.produced[s] = (b, n)
        inputs = list(producer.inputs)
        seen = set(inputs)
        for s in self.inputs:
            if s not in seen and s not in self.produced:
                seen.add(s)
                inputs.append(s)
        self.inputs = inputs
        self.outputs[:0] = [(s, b, n) for s, n in values if s in keep]
        self.blocks.append(producer)
        self.size += len(producer.nodes)

    def build(self) -> Instr:
        inputs = self.inputs
        position = _first_positions(inputs)
        n_in, blocks, produced = len(inputs), self.blocks, self.produced
        first = [0] * len(blocks)  # each block's first node in the built instruction
        at = 0
        for b in reversed(range(len(blocks))):
            first[b] = at
            at += len(blocks[b].nodes)
        nodes: list[FusedNode] = []
        for b in reversed(range(len(blocks))):
            block = blocks[b]
            # What each argument index of the block's nodes becomes: inputs, then nodes.
            arg = []
            for s in block.inputs:
                found = produced.get(s)
                arg.append(position[s] if found is None else n_in + first[found[0]] + found[1])
            arg += range(n_in + first[b], n_in + first[b] + len(block.nodes))
            nodes += [
                FusedNode(n.op, tuple([arg[a] for a in n.args]), n.dtype, n.attrs)
                for n in block.nodes
            ]
        outputs = tuple(s for s, _, _ in self.outputs)
        out_nodes = tuple(first[b] + n for _, b, n in self.outputs)
        default = len(outputs) == 1 and out_nodes == (len(nodes) - 1,)
        return Instr(
            FUSED, tuple(inputs), outputs, {}, tuple(nodes), None if default else out_nodes
        )


def _merge_shared_producers(program: Program, max_nodes: int) -> list[Instr]:
    instrs: list[Instr | None] = list(program.instrs)
    slots, results = program.slots, set(program.results)
    elementwise = [ins.op == FUSED or ins.op in ELEMENTWISE_OPS for ins in instrs]
    # Kept up to date as instructions merge, so each lookup is O(1) (a big graph has thousands
    # of instructions; rescanning them per candidate made this sweep quadratic). Only the values
    # of elementwise instructions can merge, so only theirs are tracked: fewer tables to build
    # and hold (a set of readers per value).
    producer_of = {s: j for j, ins in enumerate(instrs) if elementwise[j] for s in ins.outputs}
    readers: dict[int, set[int]] = {s: set() for s in producer_of}
    for i, ins in enumerate(instrs):
        for s in ins.inputs:
            if s in readers:
                readers[s].add(i)

    def size(ins: Instr) -> int:
        return len(ins.nodes) if ins.op == FUSED else 1

    visits.count(STAGE, len(instrs))
    for k in range(len(instrs)):
        if not elementwise[k]:
            continue
        consumer = instrs[k]
        shape = slots[consumer.outputs[0]].shape
        merging: _Merged | None = None
        merged = True
        while merged:
            merged = False
            inputs = consumer.inputs if merging is None else merging.inputs
            consumer_size = size(consumer) if merging is None else merging.size
            for s in dict.fromkeys(inputs):
                j = producer_of.get(s)
                if j is None:
                    continue
                producer = instrs[j]
                if slots[s].shape != shape or size(producer) + consumer_size > max_nodes:
                    continue
                outs = producer.outputs
                if any(j < i < k for t in outs for i in readers[t]):
                    continue  # read in between: it must be computed where it is
                keep = {t for t in outs if t in results or any(i > k for i in readers[t])}
                visits.count(STAGE, size(producer))
                if merging is None:
                    merging = _Merged(_as_fused(program, consumer))
                merging.merge(_as_fused(program, producer), keep)
                instrs[j] = None
                for t in outs:
                    readers[t].discard(k)
                    if t in keep:
                        producer_of[t] = k
                    else:
                        del producer_of[t]
                for t in producer.inputs:
                    if t in readers:
                        readers[t].discard(j)
                        readers[t].add(k)
                merged = True
                break
        if merging is not None:
            visits.count(STAGE, merging.size)  # the build: each node once
            instrs[k] = merging.build()
    return [ins for ins in instrs if ins is not None]


def _fuse_group(program: Program, members: list[int]) -> Instr:
    instrs, slots = program.instrs, program.slots
    inner = {instrs[j].outputs[0]: n for n, j in enumerate(members)}
    position: dict[int, int] = {}  # the group's inputs, in order of first use
    for j in members:
        for s in instrs[j].inputs:
            if s not in inner and s not in position:
                position[s] = len(position)
    # A node argument indexes the inputs, then the nodes.
    arg = {s: len(position) + n for s, n in inner.items()}
    arg.update(position)
    nodes = []
    for j in members:
        ins = instrs[j]
        # The instruction's attribute dict itself: nothing edits a node's attributes.
        node = FusedNode(
            ins.op, tuple([arg[s] for s in ins.inputs]), slots[ins.outputs[0]].dtype, ins.attrs
        )
        nodes.append(node)
    return Instr(FUSED, tuple(position), instrs[members[-1]].outputs, {}, tuple(nodes))


__all__ = ["fuse_elementwise"]
