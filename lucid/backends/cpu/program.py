"""The native program model, built in Python: typed value slots + instructions + feeds and results.

A :class:`Program` is what the CPU backend hands to ``lucid._native.compile`` in one call (through
:meth:`Program.describe`). Building it runs each op's shape/dtype rule from ``lucid.ir.prim`` so
mistakes surface early with the op's name; the native validator checks the same rules again, so a
description assembled by hand can never crash the process either.

:meth:`Program.interpret` is the numpy reference interpreter: it runs every instruction through the
op's reference semantics in ``lucid.ir.prim`` (``reference`` for the CPU-only instructions) and is
what native results are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import FrozenInstanceError
from typing import Any

import numpy as np

from lucid.backends.cpu.reference import CPU_ONLY_REFERENCES
from lucid.ir import prim as prim_ops
from lucid.ir.prim import NUMPY_DTYPES, Aval, PrimError

FUSED = "fused"


# FusedNode and Instr are written out rather than made by ``dataclasses``: generating a
# dataclass's methods compiles their source when the module is imported, and this module is
# imported by the first compile of a process (about a millisecond of it, a fifth of the backend's
# own work on a small model).
class FusedNode:
    """One sub-op of a fused instruction; args index the instruction's inputs, then its nodes.
    Immutable; equal when its fields are."""

    __slots__ = ("op", "args", "dtype", "attrs")
    op: str
    args: tuple[int, ...]
    dtype: str
    attrs: dict[str, Any]

    def __init__(
        self, op: str, args: tuple[int, ...], dtype: str, attrs: dict[str, Any] | None = None
    ) -> None:
        _set_field(self, "op", op)
        _set_field(self, "args", args)
        _set_field(self, "dtype", dtype)
        _set_field(self, "attrs", {} if attrs is None else attrs)

    def _fields(self) -> tuple:
        return (self.op, self.args, self.dtype, self.attrs)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"FusedNode(op={self.op!r}, args={self.args!r}, dtype={self.dtype!r}, "
            f"attrs={self.attrs!r})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple:
        return (FusedNode, self._fields())


_set_field = object.__setattr__

# The attributes of every instruction that has none: one dict, not one each (most of a training
# step's instructions; each was an allocation, and a deallocation when the program is dropped).
# Nothing edits an instruction's attributes in place: rewrites build new dicts.
_NO_ATTRS: dict[str, Any] = {}


class Instr:
    """One instruction: an opcode, input and output slots, attributes (defaults filled in)."""

    __slots__ = ("op", "inputs", "outputs", "attrs", "nodes", "out_nodes")
    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict[str, Any]
    nodes: tuple[FusedNode, ...]  # only for `fused`
    # Only for `fused`: the node each output takes (None: one output, the last node).
    out_nodes: tuple[int, ...] | None

    def __init__(
        self,
        op: str,
        inputs: tuple[int, ...],
        outputs: tuple[int, ...],
        attrs: dict[str, Any],
        nodes: tuple[FusedNode, ...] = (),
        out_nodes: tuple[int, ...] | None = None,
    ) -> None:
        self.op = op
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs
        self.nodes = nodes
        self.out_nodes = out_nodes

    def _fields(self) -> tuple:
        return (self.op, self.inputs, self.outputs, self.attrs, self.nodes, self.out_nodes)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq

    def __repr__(self) -> str:
        return (
            f"Instr(op={self.op!r}, inputs={self.inputs!r}, outputs={self.outputs!r}, "
            f"attrs={self.attrs!r}, nodes={self.nodes!r}, out_nodes={self.out_nodes!r})"
        )

    def output_nodes(self) -> tuple[int, ...]:
        return self.out_nodes if self.out_nodes is not None else (len(self.nodes) - 1,)


# Half precision is storage only in the native runtime: lowering computes every op on half
# values in float32 between casts, so ``cast`` (and ``constant``) are the only instructions that
# read or write f16/bf16 slots.
HALF_STORAGE = frozenset({"f16", "bf16"})
COMPUTE_DTYPES = tuple(d for d in prim_ops.DTYPES if d not in HALF_STORAGE)
_HALF_OPS = frozenset({"cast", "constant"})


def half_operand_problem(op: str, dtypes: Sequence[str]) -> str | None:
    """Why the native runtime cannot run prim ``op`` on operands of ``dtypes``, or None."""
    half = [d for d in dtypes if d in HALF_STORAGE]
    if half and op not in _HALF_OPS:
        return (
            f"cpu backend: {op} does not take {half[0]} operands (half precision is storage "
            "only: cast them to f32)"
        )
    return None


class Program:
    """A straight-line program over typed value slots with static shapes."""

    def __init__(self) -> None:
        self.slots: list[Aval] = []
        self.instrs: list[Instr] = []
        self.feeds: list[int] = []
        self.results: list[int] = []
        self.inplace: dict[int, int] = {}
        # One Aval per distinct (shape, dtype): a program has few, and one object per slot
        # spread the slots over memory (the backend's walks read one per instruction).
        self._avals: dict[tuple[tuple[int, ...], str], Aval] = {}

    def new_slot(self, shape: Sequence[int], dtype: str) -> int:
        if dtype not in NUMPY_DTYPES:
            raise PrimError(f"unknown dtype {dtype!r}; expected one of {prim_ops.DTYPES}")
        key = (tuple(map(int, shape)), dtype)
        aval = self._avals.get(key)
        if aval is None:
            aval = self._avals[key] = Aval(*key)
        self.slots.append(aval)
        return len(self.slots) - 1

    def feed(self, shape: Sequence[int], dtype: str = "f32") -> int:
        """A new input slot; feeds are passed to ``run`` in creation order."""
        slot = self.new_slot(shape, dtype)
        self.feeds.append(slot)
        return slot

    def op(self, name: str, *inputs: int, **attrs: Any) -> int:
        """Append prim op ``name`` on ``inputs``; returns its output slot."""
        (slot,) = self.op_results(name, *inputs, **attrs)
        return slot

    def op_results(self, name: str, *inputs: int, **attrs: Any) -> tuple[int, ...]:
        """Append prim op ``name`` (composites with several results too); its output slots."""
        return self.append(name, inputs, attrs)

    def append(self, name: str, inputs: Sequence[int], attrs: dict[str, Any]) -> tuple[int, ...]:
        """``op_results`` with the operands and attributes as they are held (no packing into
        ``*args`` and ``**kwargs`` per instruction: the emitter's path)."""
        op = prim_ops.lookup(name)
        full = prim_ops.check_attrs(op, attrs)
        avals = [self._aval(s) for s in inputs]
        if any(a.dtype in HALF_STORAGE for a in avals):
            problem = half_operand_problem(name, [a.dtype for a in avals])
            if problem:
                raise PrimError(problem)
        # The attributes just checked are not checked again (the emitter's largest cost per
        # instruction): ``infer_checked``, not ``infer``.
        outs = prim_ops.infer_checked(op, avals, full)
        known = self._avals
        made: list[int] = []
        for out in outs:
            aval = known.get((out.shape, out.dtype)) if type(out.shape) is tuple else None
            if aval is None:  # a new (shape, dtype): checked and normalized by new_slot
                made.append(self.new_slot(out.shape, out.dtype))
            else:
                self.slots.append(aval)
                made.append(len(self.slots) - 1)
        slots = tuple(made)
        self.instrs.append(Instr(name, tuple(inputs), slots, full or _NO_ATTRS))
        return slots

    def fused(self, inputs: Sequence[int], nodes: Sequence[FusedNode]) -> int:
        """Append a fused elementwise instruction (its value is the last node's)."""
        (slot,) = self.fused_outputs(inputs, nodes, None)
        return slot

    def fused_outputs(
        self, inputs: Sequence[int], nodes: Sequence[FusedNode], outputs: Sequence[int] | None
    ) -> tuple[int, ...]:
        """Append a fused instruction with one output slot per entry of ``outputs`` (node
        indices, all of one shape; ``None``: the last node only); returns the output slots."""
        avals = [self._aval(s) for s in inputs]
        values = list(avals)
        for k, node in enumerate(nodes):
            if node.op not in prim_ops.ELEMENTWISE_OPS:
                raise PrimError(f"fused node {k}: {node.op!r} is not an elementwise prim op")
            if any(not 0 <= a < len(values) for a in node.args):
                raise PrimError(f"fused node {k}: arguments {node.args} out of range")
            problem = half_operand_problem(node.op, [values[a].dtype for a in node.args])
            if problem:
                raise PrimError(f"fused node {k}: {problem}")
            (out,) = prim_ops.infer(node.op, [values[a] for a in node.args], node.attrs)
            if out.dtype != node.dtype:
                raise PrimError(
                    f"fused node {k}: dtype {node.dtype} but {node.op} gives {out.dtype}"
                )
            values.append(out)
        picks = (len(nodes) - 1,) if outputs is None else tuple(int(k) for k in outputs)
        if not picks or any(not 0 <= k < len(nodes) for k in picks):
            raise PrimError(f"fused outputs {picks} must name nodes 0..{len(nodes) - 1}")
        outs = [values[len(inputs) + k] for k in picks]
        if any(o.shape != outs[-1].shape for o in outs):
            raise PrimError(f"fused outputs have different shapes: {[o.shape for o in outs]}")
        slots = tuple(self.new_slot(o.shape, o.dtype) for o in outs)
        self.instrs.append(
            Instr(FUSED, tuple(inputs), slots, {}, tuple(nodes), None if outputs is None else picks)
        )
        return slots

    def result(self, *slots: int) -> None:
        """Mark slots as results, in order."""
        for s in slots:
            self._aval(s)
            self.results.append(s)

    def inplace_result(self, result_index: int, feed_index: int) -> None:
        """Result ``result_index`` is written into feed ``feed_index``'s array after the run."""
        self.inplace[result_index] = feed_index

    def _aval(self, slot: int) -> Aval:
        if not isinstance(slot, int) or not 0 <= slot < len(self.slots):
            raise PrimError(f"slot {slot!r} does not exist")
        return self.slots[slot]

    # -- the description passed to C++ --------------------------------------------------------
    def describe(self, *, copy: bool = True) -> dict[str, Any]:
        """The compact description ``lucid._native.compile`` takes (plain lists, tuples and
        dicts: what ``export_program`` writes as JSON). ``copy=False`` hands over the program's
        own lists of Avals and Instrs, which the native compile reads in place: for a caller that
        only reads it (the backend's native compile; building a description of a large program
        was a walk over cold objects and as much garbage again)."""
        shared = {
            "slots": self.slots,
            "instrs": self.instrs,
            "feeds": self.feeds,
            "results": self.results,
            "inplace": self.inplace,
        }
        return shared if not copy else plain_description(shared)

    def dump(self) -> str:
        """Readable text, one instruction a line."""

        def slot(s: int) -> str:
            return f"%{s}"

        def ty(s: int) -> str:
            a = self.slots[s]
            return f"{a.dtype}[{','.join(map(str, a.shape))}]"

        lines = ["program(" + ", ".join(f"{slot(s)}: {ty(s)}" for s in self.feeds) + ")"]
        for ins in self.instrs:
            attrs = ", ".join(f"{k}={v}" for k, v in ins.attrs.items())
            if ins.nodes:
                attrs = "; ".join(f"{n.op}{list(n.args)}" for n in ins.nodes)
                if ins.out_nodes is not None:
                    attrs += f"; outputs={list(ins.out_nodes)}"
            args = ", ".join(map(slot, ins.inputs))
            outs = ", ".join(f"{slot(o)}: {ty(o)}" for o in ins.outputs)
            lines.append(f"  {outs} = {ins.op}" + (f"{{{attrs}}}" if attrs else "") + f"({args})")
        lines.append("  return " + ", ".join(map(slot, self.results)))
        return "\n".join(lines)

    # -- the numpy reference interpreter -------------------------------------------------------
    def interpret(self, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run with numpy reference semantics; same contract as the native ``run``."""
        if len(feeds) != len(self.feeds):
            raise ValueError(f"expected {len(self.feeds)} feed(s), got {len(feeds)}")
        env: dict[int, np.ndarray] = {}
        for i, (slot, array) in enumerate(zip(self.feeds, feeds, strict=True)):
            aval = self.slots[slot]
            if array.dtype != NUMPY_DTYPES[aval.dtype]:
                raise TypeError(f"feed {i} has dtype {array.dtype}, expected {aval.dtype}")
            if array.shape != aval.shape:
                raise ValueError(f"feed {i} has shape {array.shape}, expected {aval.shape}")
            env[slot] = array
        for ins in self.instrs:
            args = [env[s] for s in ins.inputs]
            if ins.op == FUSED:
                values = list(args)
                for node in ins.nodes:
                    values.extend(
                        prim_ops.evaluate(node.op, [values[a] for a in node.args], node.attrs)
                    )
                for o, k in zip(ins.outputs, ins.output_nodes(), strict=True):
                    out = np.broadcast_to(values[len(args) + k], self.slots[o].shape)
                    env[o] = np.array(out, order="C")
                continue
            if ins.op in CPU_ONLY_REFERENCES:
                out = CPU_ONLY_REFERENCES[ins.op](args, ins.attrs)
                # A multi-output kernel may compute more values than the instruction keeps.
                outs, strict = (out, False) if isinstance(out, tuple) else ((out,), True)
            else:
                outs, strict = (
                    prim_ops.evaluate(ins.op, args, ins.attrs),
                    True,
                )  # composites: several
            for o, value in zip(ins.outputs, outs, strict=strict):
                env[o] = np.array(value, order="C")
        results = [env[s].copy() for s in self.results]
        for r, f in self.inplace.items():
            np.copyto(feeds[f], results[r])
            results[r] = feeds[f]
        return results


def plain_description(desc: dict[str, Any]) -> dict[str, Any]:
    """``desc`` in the plain form ``describe()`` gives (pairs and 4-tuples in new lists), also
    when it holds the program's own Avals and Instrs (``describe(copy=False)``): for a caller
    that keeps or edits what the native compile was handed (the program fuzzer's seeds)."""
    return {
        **desc,
        "slots": [s if isinstance(s, tuple | list) else (s.shape, s.dtype) for s in desc["slots"]],
        "instrs": [
            i if isinstance(i, tuple | list) else _describe_instr(i) for i in desc["instrs"]
        ],
        "feeds": list(desc["feeds"]),
        "results": list(desc["results"]),
        "inplace": dict(desc.get("inplace", {})),
    }


def _describe_instr(ins: Instr) -> tuple[str, list[int], list[int], dict[str, Any]]:
    if ins.op != FUSED:
        return (ins.op, list(ins.inputs), list(ins.outputs), dict(ins.attrs))
    return (FUSED, list(ins.inputs), list(ins.outputs), _fused_attrs(ins))


def _fused_attrs(ins: Instr) -> dict[str, Any]:
    """A fused instruction's nodes as the native runtime's ``sub_*`` attributes."""
    attrs = {
        "sub_ops": [n.op for n in ins.nodes],
        "sub_args": [a for n in ins.nodes for a in n.args],
        "sub_dtypes": [n.dtype for n in ins.nodes],
        "sub_floats": [float(n.attrs.get("epsilon", 0.0)) for n in ins.nodes],
    }
    if ins.out_nodes is not None:
        attrs["sub_outputs"] = list(ins.out_nodes)
    return attrs


__all__ = [
    "COMPUTE_DTYPES",
    "FUSED",
    "HALF_STORAGE",
    "FusedNode",
    "Instr",
    "Program",
    "plain_description",
]
