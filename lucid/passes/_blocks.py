"""Straight-line block helpers shared by the built-in passes.

Lucid's graphs are single-block functions, so dead-code and common-subexpression elimination are
one sweep each; these are several times cheaper than xDSL's general drivers, which handle
regions, side effects and worklists that such blocks do not need.
"""

from __future__ import annotations

from collections.abc import Iterator

from lucid.ir import _xdsl as x
from lucid.ir import visits


def blocks_of(module: x.ModuleOp) -> Iterator[x.Block]:
    """Every block of every function in ``module``."""
    for fn in module.ops:
        for region in fn.regions:
            yield from region.blocks


def _is_pure(op: x.Operation) -> bool:
    return not op.regions and op.has_trait(x.Pure)


def erase_dead(block: x.Block, stage: str) -> None:
    """Erase unused pure ops, last to first, so whole dead chains go in one sweep (``stage``:
    the pass, for the visit counters)."""
    # One sweep, each op looked at once: the cheapest tests first (most ops have a used result),
    # and the visits counted once for the sweep. The sweep touches every op of the block, so
    # its cost per op is mostly memory traffic: it reads as little of each op as it can.
    visited = 0
    op = block.last_op
    while op is not None:
        visited += 1
        prev = op.prev_op
        results = op.results
        if results and all(r.first_use is None for r in results) and _is_pure(op):
            block.erase_op(op)
        op = prev
    visits.count(stage, visited)


def merge_common(block: x.Block, stage: str) -> None:
    """Replace each pure op by an earlier identical one (same name, operands, properties,
    attributes and result types; ``stage``: the pass, for the visit counters)."""
    seen: dict[tuple, x.Operation] = {}
    op = block.first_op
    while op is not None:
        visits.count(stage)
        nxt = op.next_op
        if op.results and _is_pure(op):
            key = (
                op.name,
                tuple(op.operands),
                tuple(op.properties.items()),
                tuple(op.attributes.items()),
                tuple(op.result_types),
            )
            first = seen.get(key)
            if first is None:
                seen[key] = op
            else:
                for old, new in zip(op.results, first.results, strict=True):
                    old.replace_all_uses_with(new)
                block.erase_op(op)
        op = nxt
