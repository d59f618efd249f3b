"""``dce``: dead-code elimination.

Removes ops whose results are unused and that have no side effects (``Pure``), last to first,
so whole dead chains go at once. Random ops are kept (they are not ``Pure``), and so is every
function result.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.passes._blocks import blocks_of, erase_dead


@dataclass(frozen=True)
class DCE(x.ModulePass):
    """Erase unused pure ops."""

    name = "dce"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            erase_dead(block, self.name)
