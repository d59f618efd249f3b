"""``dce``: dead-code elimination.

Removes ops whose results are unused and that have no side effects (``Pure``), iterating until
nothing changes, so whole dead chains go at once. Random ops are kept (they are not ``Pure``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x


@dataclass(frozen=True)
class DCE(x.ModulePass):
    """Erase unused pure ops."""

    name = "dce"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for fn in op.ops:
            for region in fn.regions:
                x.region_dce(region)
