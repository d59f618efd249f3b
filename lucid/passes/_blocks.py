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


# Per op class: an op's traits are its class's, and asking xDSL walks them (per op, in every
# sweep of every pass that asks).
_PURE_CLASSES: dict[type, bool] = {}


def _is_pure(op: x.Operation) -> bool:
    pure = _PURE_CLASSES.get(type(op))
    if pure is None:
        pure = _PURE_CLASSES[type(op)] = op.has_trait(x.Pure)
    return pure and not op.regions


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
    # Keyed by name and operands (values hash by identity); the properties, attributes and
    # result types are hashed only for ops that share those with an earlier op (then each of
    # them is keyed by its details in a dict of its own: a value sliced at T offsets is T ops
    # of one name and operand). Hashing them for every op (nested attribute dataclasses, none
    # of which caches its hash) was most of the sweep. Ops without operands (constants)
    # differ only in those, so they are keyed by all of it.
    seen: dict[tuple, x.Operation | dict[tuple, x.Operation]] = {}
    op = block.first_op
    while op is not None:
        visits.count(stage)
        nxt = op.next_op
        if op.results and _is_pure(op):
            operands = tuple(op.operands)
            first = None
            if not operands:
                key = (op.name, *_details(op))
                first = seen.get(key)  # type: ignore[assignment]
                if first is None:
                    seen[key] = op
            else:
                key = (op.name, operands)
                entry = seen.get(key)
                if entry is None:
                    seen[key] = op
                else:
                    if not isinstance(entry, dict):
                        entry = seen[key] = {_details(entry): entry}
                    details = _details(op)
                    first = entry.get(details)
                    if first is None:
                        entry[details] = op
            if first is not None:
                for old, new in zip(op.results, first.results, strict=True):
                    old.replace_all_uses_with(new)
                block.erase_op(op)
        op = nxt


def _details(op: x.Operation) -> tuple:
    """What besides its name and operands makes an op compute what another does."""
    return (
        tuple(op.properties.items()),
        tuple(op.attributes.items()),
        tuple(op.result_types),
    )
