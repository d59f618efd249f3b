"""What every ``fuse-kernels`` rewrite is written with: :class:`Graph` (producers, uses and
readers of the instruction list, kept current through ``Graph.set``) and the small queries the
rewrite families share."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import chain
from math import prod

import numpy as np

from lucid.backends.cpu.program import Instr, Program
from lucid.ir import visits

FLOAT_DTYPES = ("f32", "f64")
STAGE = "fuse-kernels"  # the visit counters' name for this step
PRODUCTS = ("matmul", "gemm")  # the opcodes a gemm fold starts from


class Graph:
    """Producers, use counts, readers and positions by opcode of the instruction list, built
    once and kept current by ``set``, through which every rewrite edits the list: a fold costs
    the instructions it looks at, not a rebuild of the whole program per rewrite (which made
    fusion quadratic), and a rewrite walks only the instructions of its opcodes (``each``), not
    the whole program."""

    def __init__(self, program: Program, instrs: list[Instr | None]) -> None:
        self.program = program
        self.instrs = instrs
        # A set: ``used_only_by`` asks once per candidate, and a step's results (every updated
        # parameter and optimizer state) are thousands.
        self.results = frozenset(program.results)
        self.uses: Counter[int] = Counter(program.results)
        self.uses.update(chain.from_iterable([ins.inputs for ins in instrs if ins is not None]))
        self.producer: dict[int, int] = {}
        self._by_op: dict[str, dict[int, None]] = {}
        for k, ins in enumerate(instrs):
            if ins is not None:
                for s in ins.outputs:
                    self.producer[s] = k
                self._by_op.setdefault(ins.op, {})[k] = None
        # Built when first asked (``readers``), then kept current: most programs have no
        # instruction whose rewrite asks, and it was the largest table.
        self._readers: _Readers | None = None
        self._walks: list[_Walk] = []
        # Slots whose last reader went away since the last ``erase_unread``.
        self.unread: set[int] = set()
        visits.count(STAGE, len(instrs))

    def _link(self, k: int, ins: Instr) -> None:
        for s in ins.outputs:
            self.producer[s] = k
        uses = self.uses
        for s in ins.inputs:
            uses[s] = uses.get(s, 0) + 1
        if self._readers is not None:
            self._readers.add(k, ins)
        self._by_op.setdefault(ins.op, {})[k] = None
        for walk in self._walks:
            walk.placed(k, ins.op)

    def _unlink(self, k: int, ins: Instr) -> None:
        for s in ins.outputs:
            if self.producer.get(s) == k:
                del self.producer[s]
        for s in ins.inputs:
            self.uses[s] -= 1
            if not self.uses[s]:
                self.unread.add(s)
        if self._readers is not None:
            self._readers.remove(k, ins)
        del self._by_op[ins.op][k]

    def set(self, k: int, ins: Instr | None) -> None:
        """Put ``ins`` (None: nothing) at position ``k``, updating producers, uses, readers."""
        visits.count(STAGE)
        old = self.instrs[k]
        if old is not None:
            self._unlink(k, old)
        self.instrs[k] = ins
        if ins is not None:
            self._link(k, ins)

    def each(self, *ops: str, reverse: bool = False) -> Iterator[tuple[int, Instr]]:
        """(position, instruction) of every instruction whose opcode is one of ``ops``, in
        program order (``reverse``: backwards), met as a walk over the whole list would meet
        them while the caller edits it: an instruction ``set`` ahead of the walk is met, one
        removed or replaced before the walk gets there is not. Costs the instructions of those
        opcodes, not the program's."""
        positions = sorted((k for op in ops for k in self._by_op.get(op, ())), reverse=reverse)
        visits.count(STAGE, len(positions))
        walk = _Walk(frozenset(ops), reverse)
        self._walks.append(walk)
        try:
            for k in walk.merged(positions):
                ins = self.instrs[k]
                if ins is not None and ins.op in walk.ops:
                    yield k, ins
        finally:
            self._walks.remove(walk)

    def count(self, *ops: str) -> int:
        """How many instructions have one of ``ops`` as their opcode (no walk)."""
        return sum(len(self._by_op.get(op, ())) for op in ops)

    def outputs_of(self, *ops: str) -> set[int]:
        """The first output slot of every instruction whose opcode is one of ``ops``: a cheap
        first test (``slot in products``) that visits those instructions, not each candidate's
        producer. A snapshot: a rewrite that makes such instructions adds their slots."""
        return {ins.outputs[0] for _, ins in self.each(*ops)}

    def readers(self, slot: int) -> list[int]:
        """Positions of the instructions reading ``slot``, in program order."""
        if self._readers is None:
            self._readers = _Readers()
            visits.count(STAGE, len(self.instrs))
            for k, ins in enumerate(self.instrs):
                if ins is not None:
                    self._readers.add(k, ins)
        return self._readers.of(slot)

    def erase_unread(self, erasable: Callable[[int, Instr], bool]) -> None:
        """Drop the instructions ``erasable`` accepts whose values nothing reads any more, among
        the producers of values left unread by the edits so far, and so on up their operands."""
        pending: list[int] = []
        while True:
            pending.extend(self.producer[s] for s in self.unread if s in self.producer)
            self.unread.clear()
            if not pending:
                return
            k = pending.pop()
            ins = self.instrs[k]
            if ins is None or not erasable(k, ins) or any(self.uses[s] for s in ins.outputs):
                continue
            self.set(k, None)

    def only_reader(self, slot: int, op: str) -> tuple[int, Instr] | None:
        """(index, instruction) of the one ``op`` instruction reading ``slot``, when nothing else
        reads it (and it is not a result)."""
        # One use (and not a result) is one reader: the use count answers first, without the
        # readers table (built on a first ask) or the sorted list of a value read many times.
        if not self.used_only_by(slot, 1):
            return None
        readers = self.readers(slot)
        ins = self.instrs[readers[0]]
        return (readers[0], ins) if ins is not None and ins.op == op else None

    def op_of(self, slot: int) -> str | None:
        """The opcode of the instruction computing ``slot`` (None for a feed): a cheap first
        test before a rewrite's full match."""
        k = self.producer.get(slot)
        ins = self.instrs[k] if k is not None else None
        return ins.op if ins is not None else None

    def made_by(self, slot: int, op: str) -> tuple[int, Instr] | None:
        """(index, instruction) when ``slot`` is the output of an ``op`` instruction."""
        k = self.producer.get(slot)
        ins = self.instrs[k] if k is not None else None
        return (k, ins) if ins is not None and ins.op == op else None

    def used_only_by(self, slot: int, count: int) -> bool:
        return self.uses[slot] == count and slot not in self.results

    def aval(self, slot: int):
        return self.program.slots[slot]


class _Readers:
    """The positions reading each slot: its one reader, or a dict of its readers when several
    (most values are read once, and a dict per value was most of this table's memory)."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[int, int | dict[int, None]] = {}

    def add(self, k: int, ins: Instr) -> None:
        table = self.table
        for s in ins.inputs:
            r = table.get(s)
            if r is None:
                table[s] = k
            elif type(r) is int:
                if r != k:
                    table[s] = {r: None, k: None}
            else:
                r[k] = None

    def remove(self, k: int, ins: Instr) -> None:
        table = self.table
        for s in ins.inputs:
            r = table.get(s)
            if type(r) is int:
                if r == k:
                    del table[s]
            elif r is not None:
                r.pop(k, None)

    def of(self, slot: int) -> list[int]:
        r = self.table.get(slot)
        return [] if r is None else [r] if type(r) is int else sorted(r)


class _Walk:
    """One ``Graph.each`` in progress: where it is, and the positions of its opcodes that edits
    placed ahead of it since it began (a heap; keys negated when walking backwards)."""

    def __init__(self, ops: frozenset[str], reverse: bool) -> None:
        self.ops = ops
        self.sign = -1 if reverse else 1
        self.at: int | None = None
        self.ahead: list[int] = []

    def placed(self, k: int, op: str) -> None:
        if op in self.ops and (self.at is None or self.sign * k > self.sign * self.at):
            visits.count(STAGE)
            heapq.heappush(self.ahead, self.sign * k)

    def merged(self, positions: list[int]) -> Iterator[int]:
        """``positions`` (in walk order) merged with those placed ahead meanwhile, each once."""
        sign, ahead = self.sign, self.ahead
        i, n = 0, len(positions)
        while True:
            if ahead and (i == n or ahead[0] <= sign * positions[i]):
                k = sign * heapq.heappop(ahead)
            elif i < n:
                k = positions[i]
                i += 1
            else:
                return
            if k != self.at:
                self.at = k
                yield k


def float_matmul(g: Graph, slot: int) -> tuple[int, Instr] | None:
    found = g.made_by(slot, "matmul")
    if found is None or g.aval(slot).dtype not in FLOAT_DTYPES or not g.used_only_by(slot, 1):
        return None
    return found


def gemm_of(ins: Instr) -> Instr:
    """``ins`` (a matmul or gemm) as a gemm."""
    if ins.op == "gemm":
        return ins
    attrs = {"transpose_a": ins.attrs["transpose_a"], "transpose_b": ins.attrs["transpose_b"]}
    return Instr("gemm", ins.inputs, ins.outputs, {**attrs, "alpha": 1.0})


def constant_scalar(g: Graph, slot: int) -> float | None:
    found = g.made_by(slot, "constant")
    if found is None or g.aval(slot).shape != () or g.aval(slot).dtype not in FLOAT_DTYPES:
        return None
    value = np.asarray(found[1].attrs["value"], dtype=np.float64).reshape(-1)
    return float(value[0]) if value.size == 1 else None


def single_use(g: Graph, slot: int, op: str) -> tuple[int, Instr] | None:
    found = g.made_by(slot, op)
    return found if found is not None and g.used_only_by(slot, 1) else None


def zero_constant(g: Graph, slot: int) -> bool:
    found = g.made_by(slot, "constant")
    return found is not None and not any(found[1].attrs["value"])


def is_close(value: float, want: float) -> bool:
    return abs(value - want) <= 1e-6 * max(1.0, abs(want))


def column_sum(g: Graph, slot: int, after: int) -> tuple[int, Instr] | None:
    """A ``reduce_sum`` after instruction ``after`` of ``slot`` (or of its reshape to
    ``[rows, n]``) over every axis but the last: the gradient of a bias added to ``slot``'s
    rows."""
    shape = g.aval(slot).shape
    sources = [slot]
    for j in g.readers(slot):
        r = g.instrs[j]
        if r is not None and r.op == "reshape" and len(g.aval(r.outputs[0]).shape) == 2:
            if g.aval(r.outputs[0]).shape[-1] == shape[-1]:
                sources.append(r.outputs[0])
    for src in sources:
        rank = len(g.aval(src).shape)
        for j in g.readers(src):
            r = g.instrs[j]
            if j <= after or r is None or r.op != "reduce_sum":
                continue
            axes = sorted(a % rank for a in r.attrs["axes"])
            out = g.aval(r.outputs[0]).shape
            if axes == list(range(rank - 1)) and out[-1:] == shape[-1:] and prod(out) == shape[-1]:
                return j, r
    return None


def take_column_sum(g: Graph, slot: int, after: int) -> int:
    """A new ``[n]`` slot for the column sums of ``slot``: an existing column sum after
    ``after`` becomes a reshape (a view) of it; otherwise nothing reads the new slot."""
    aval = g.aval(slot)
    new = g.program.new_slot(aval.shape[-1:], aval.dtype)
    found = column_sum(g, slot, after)
    if found is not None:
        j, r = found
        shape = g.aval(r.outputs[0]).shape
        g.set(j, Instr("reshape", (new,), r.outputs, {"shape": tuple(shape)}))
    return new
