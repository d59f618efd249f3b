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

from lucid.backends.cpu.program import FUSED, FusedNode, Instr, Program
from lucid.ir import visits
from lucid.ir.prim import ELEMENTWISE_OPS

STAGE = "fuse-elementwise"  # the visit counters' name for this step


def fuse_elementwise(program: Program, max_nodes: int = 64) -> Program:
    """A new program with elementwise chains fused; the input program is left unchanged."""
    instrs, slots = program.instrs, program.slots
    visits.count(STAGE, 2 * len(instrs))  # the grouping and rebuilding sweeps
    uses = Counter(s for ins in instrs for s in ins.inputs)
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
    position: dict[int, int] = {}  # the inputs without repeats
    for s in ins.inputs:
        position.setdefault(s, len(position))
    node = FusedNode(
        ins.op,
        tuple([position[s] for s in ins.inputs]),
        program.slots[ins.outputs[0]].dtype,
        ins.attrs,
    )
    return Instr(FUSED, tuple(position), ins.outputs, {}, (node,))


def _first_positions(slots: tuple[int, ...] | list[int]) -> dict[int, int]:
    """Each slot's first position in ``slots`` (in order of first appearance): what
    ``list.index`` answers, in O(1) per lookup (a merged instruction has dozens of inputs)."""
    position: dict[int, int] = {}
    for i, s in enumerate(slots):
        position.setdefault(s, i)
    return position


def _merge(program: Program, producer: Instr, consumer: Instr, keep: set[int]) -> Instr:
    """``consumer`` with ``producer``'s nodes first; producer outputs in ``keep`` stay outputs."""
    p, c = _as_fused(program, producer), _as_fused(program, consumer)
    p_value = dict(zip(p.outputs, p.output_nodes(), strict=True))
    inputs = list(p.inputs)
    position = _first_positions(inputs)
    for s in c.inputs:
        if s not in p_value and s not in position:
            position[s] = len(inputs)
            inputs.append(s)
    n_in, n_p = len(inputs), len(p.nodes)
    # Node arguments index the inputs, then the nodes: what each argument of the producer's
    # and the consumer's nodes becomes in the merged instruction, by old index.
    p_arg = [position[s] for s in p.inputs] + list(range(n_in, n_in + n_p))
    c_arg = [n_in + p_value[s] if s in p_value else position[s] for s in c.inputs]
    c_arg += range(n_in + n_p, n_in + n_p + len(c.nodes))
    nodes = [FusedNode(n.op, tuple([p_arg[a] for a in n.args]), n.dtype, n.attrs) for n in p.nodes]
    nodes += [FusedNode(n.op, tuple([c_arg[a] for a in n.args]), n.dtype, n.attrs) for n in c.nodes]
    kept = [(s, k) for s, k in p_value.items() if s in keep]
    outputs = tuple(s for s, _ in kept) + c.outputs
    out_nodes = tuple(k for _, k in kept) + tuple(n_p + k for k in c.output_nodes())
    default = len(outputs) == 1 and out_nodes == (len(nodes) - 1,)
    return Instr(FUSED, tuple(inputs), outputs, {}, tuple(nodes), None if default else out_nodes)


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
        merged = True
        while merged:
            merged = False
            for s in dict.fromkeys(consumer.inputs):
                j = producer_of.get(s)
                if j is None:
                    continue
                producer = instrs[j]
                if slots[s].shape != shape or size(producer) + size(consumer) > max_nodes:
                    continue
                outs = producer.outputs
                if any(j < i < k for t in outs for i in readers[t]):
                    continue  # read in between: it must be computed where it is
                keep = {t for t in outs if t in results or any(i > k for i in readers[t])}
                # A merge copies both node lists: at most max_nodes each.
                visits.count(STAGE, size(producer) + size(consumer))
                consumer = _merge(program, producer, consumer, keep)
                instrs[j], instrs[k] = None, consumer
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
