"""Stage 6 for the CPU backend: a ``prim`` module becomes a native program, then an executable.

The program description is the one ``lucid._native.compile`` takes (see
``native/src/bind_runtime.cpp``): one slot ``(shape, dtype)`` per SSA value, one instruction
``(opcode, inputs, outputs, attrs)`` per prim op with every attribute spelled out (defaults filled
from the prim table), the argument slots as feeds and the returned slots as results. Results
whose role is ``update:<feed role>`` may be written back into that feed in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lucid.ir import _xdsl as x
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.ir.prim import PrimIROp, aval_of_type

__all__ = ["EmitError", "NativeProgram", "compile_program", "emit_program", "run_program"]


class EmitError(ValueError):
    """The module cannot become a native program (an op that is not ``prim``, a bad type)."""


@dataclass
class NativeProgram:
    """A program description for ``lucid._native`` and the roles of its feeds and results."""

    desc: dict[str, Any]
    feed_roles: list[str]
    result_roles: list[str]

    def dump(self) -> str:
        """The program as the native module prints it."""
        return _native().dump_program(self.desc)


def _native() -> Any:
    from lucid import _native

    if not hasattr(_native, "compile"):
        raise EmitError(
            "this build of lucid._native has no CPU runtime (lucid._native.compile is missing); "
            "rebuild the native module"
        )
    return _native


def _attr_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def emit_program(
    module: x.ModuleOp, *, func_name: str = "forward", inplace_updates: bool = False
) -> NativeProgram:
    """The native program description of ``@func_name`` in a prim module.

    With ``inplace_updates``, a result with role ``update:R`` is written into the feed with role
    ``R`` (same shape and dtype), so running the executable updates that feed's array in place.
    """
    fn = forward_func(module, func_name)
    block = fn.body.blocks.first
    slots: list[list[Any]] = []
    slot_of: dict[x.SSAValue, int] = {}

    def new_slot(v: x.SSAValue) -> int:
        try:
            aval = aval_of_type(v.type)
        except ValueError as e:
            raise EmitError(f"value of type {v.type}: {e}") from None
        slot_of[v] = len(slots)
        slots.append([list(aval.shape), aval.dtype])
        return slot_of[v]

    feeds = [new_slot(a) for a in block.args]
    instrs: list[tuple] = []
    results: list[int] | None = None
    for op in block.ops:
        if isinstance(op, PrimIROp):
            ins = [slot_of[v] for v in op.operands]
            outs = [new_slot(r) for r in op.results]
            attrs = {k: _attr_value(v) for k, v in op.prim_attrs().items()}
            instrs.append((op.PRIM.name, ins, outs, attrs))
        elif isinstance(op, x.func.ReturnOp):
            results = [slot_of[v] for v in op.operands]
        else:
            raise EmitError(f"op {op.name} is not in the prim dialect; run lower-to-prim first")
    if results is None:
        raise EmitError(f"@{func_name} has no func.return")
    f_roles, r_roles = feed_roles(fn), result_roles(fn)
    desc: dict[str, Any] = {"slots": slots, "instrs": instrs, "feeds": feeds, "results": results}
    if inplace_updates:
        by_role = {r: i for i, r in enumerate(f_roles)}
        desc["inplace"] = {
            j: by_role[role[len("update:") :]]
            for j, role in enumerate(r_roles)
            if role.startswith("update:") and role[len("update:") :] in by_role
        }
    return NativeProgram(desc, f_roles, r_roles)


def compile_program(program: NativeProgram, *, cache: bool = True) -> Any:
    """Validate and compile ``program`` into a ``lucid._native.Executable`` (``ValueError`` names
    anything malformed)."""
    return _native().compile(program.desc, cache)


def run_program(executable: Any, feeds: Mapping[str, Any] | list, program: NativeProgram) -> list:
    """Run ``executable`` on feeds given in order or by role (numpy arrays of the exact dtype)."""
    if isinstance(feeds, Mapping):
        feeds = [feeds[r] for r in program.feed_roles]
    return executable.run(list(feeds))
