"""Stage 6 for the CPU backend: a ``prim`` module becomes a native :class:`Program`, then an
executable.

Each function argument becomes a feed slot, each prim op one instruction of the program builder
(``lucid.backends.cpu.program.Program``, which reruns the prim table's rule on every op), and the
returned values the results. Results whose role is ``update:<feed role>`` may be written back into
that feed in place. ``compile_program`` fuses it as the CPU backend does and compiles it through
``lucid._native`` (with its executable cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lucid._native_loader import _native
from lucid.backends.cpu.fuse_elementwise import fuse_elementwise
from lucid.backends.cpu.program import Program
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.ir.prim import PrimError
from lucid.ir.prim.dialect import PrimIROp, aval_of_type

__all__ = [
    "EmitError",
    "NativeProgram",
    "compile_program",
    "emit_program",
    "run_program",
]


class EmitError(ValueError):
    """The module cannot become a native program (an op that is not ``prim``, a bad type)."""


class NativeProgram:
    """A native program and the roles of its feeds and results."""

    __slots__ = ("program", "feed_roles", "result_roles")

    def __init__(self, program: Program, feed_roles: list[str], result_roles: list[str]) -> None:
        self.program = program
        self.feed_roles = feed_roles
        self.result_roles = result_roles

    def __repr__(self) -> str:
        return (
            f"NativeProgram(program={self.program!r}, feed_roles={self.feed_roles!r}, "
            f"result_roles={self.result_roles!r})"
        )

    @property
    def desc(self) -> dict[str, Any]:
        """The description ``lucid._native.compile`` takes (before fusion)."""
        return self.program.describe()

    def dump(self) -> str:
        """The program as readable text, one instruction a line."""
        return self.program.dump()


def emit_program(
    module: x.ModuleOp, *, func_name: str = "forward", inplace_updates: bool = False
) -> NativeProgram:
    """The native program of ``@func_name`` in a prim module.

    With ``inplace_updates``, a result with role ``update:R`` is written into the feed with role
    ``R`` (same shape and dtype), so running the executable updates that feed's array in place.
    """
    fn = forward_func(module, func_name)
    block = fn.body.blocks.first
    program = Program()
    # By the value's id (its hash, computed in C: SSAValue's own __hash__ is a Python call per
    # operand); the module keeps every value alive while this runs.
    slot_of: dict[int, int] = {}
    for a in block.args:
        try:
            aval = aval_of_type(a.type)
            slot_of[id(a)] = program.feed(aval.shape, aval.dtype)
        except (PrimError, ValueError) as e:
            raise EmitError(f"argument of type {a.type}: {e}") from None
    returned = False
    n_ops = 0
    append = program.append
    is_prim: dict[type, bool] = {}  # per op class: an ABC isinstance check per op cost more
    for op in block.ops:
        n_ops += 1
        prim = is_prim.get(type(op))
        if prim is None:
            prim = is_prim[type(op)] = isinstance(op, PrimIROp)
        if prim:
            try:
                outs = append(
                    op.PRIM.name, tuple([slot_of[id(v)] for v in op.operands]), op.given_attrs()
                )
            except PrimError as e:
                raise EmitError(f"{op.name}: {e}") from None
            slot_of.update(zip(map(id, op.results), outs, strict=True))
        elif isinstance(op, x.func.ReturnOp):
            program.result(*(slot_of[id(v)] for v in op.operands))
            returned = True
        else:
            raise EmitError(f"op {op.name} is not in the prim dialect; run lower-to-prim first")
    visits.count("emit", n_ops)
    if not returned:
        raise EmitError(f"@{func_name} has no func.return")
    f_roles, r_roles = feed_roles(fn), result_roles(fn)
    if inplace_updates:
        by_role = {r: i for i, r in enumerate(f_roles)}
        for j, role in enumerate(r_roles):
            target = role[len("update:") :] if role.startswith("update:") else None
            if target in by_role:
                program.inplace_result(j, by_role[target])
    return NativeProgram(program, f_roles, r_roles)


def compile_program(program: NativeProgram, *, cache: bool = True, fuse: bool = True) -> Any:
    """Compile ``program`` as the CPU backend does (kernel and elementwise fusion unless
    ``fuse=False``) into a ``lucid._native`` executable; ``ValueError`` names anything
    malformed."""
    fused = fuse_elementwise(fuse_kernels(program.program)) if fuse else program.program
    return _native.compile(fused.describe(copy=False), cache)


def run_program(executable: Any, feeds: Mapping[str, Any] | list, program: NativeProgram) -> list:
    """Run ``executable`` on feeds given in order or by role (numpy arrays of the exact dtype)."""
    if isinstance(feeds, Mapping):
        feeds = [feeds[r] for r in program.feed_roles]
    return executable.run(list(feeds))
