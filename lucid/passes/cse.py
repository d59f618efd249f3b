"""``cse``: common-subexpression elimination.

Two ``Pure`` ops with the same name, operands, properties and result types compute the same
value; the later one is replaced by the earlier. Random ops are not ``Pure`` and are never merged.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x


@dataclass(frozen=True)
class CSE(x.ModulePass):
    """Merge identical pure ops (xDSL's CSE driver, which honours ``Pure``)."""

    name = "cse"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        x.cse(op)
