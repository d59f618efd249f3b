"""``cse``: common-subexpression elimination.

Two ``Pure`` ops with the same name, operands, properties, attributes and result types compute
the same value; the later one is replaced by the earlier. Random ops are not ``Pure`` and are
never merged. Commutative operands are not reordered (``a + b`` and ``b + a`` stay two ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.passes._blocks import blocks_of, merge_common


@dataclass(frozen=True)
class CSE(x.ModulePass):
    """Merge identical pure ops."""

    name = "cse"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        for block in blocks_of(op):
            merge_common(block, self.name)
