"""``paused_gc()``: the cyclic garbage collector off while a compile stage runs.

A compile builds a large graph of live objects (xDSL operations, values, uses, attributes) and
frees few of them. Python's collector runs a full collection each time the long-lived objects
grow by a quarter, and each one walks every live object: on a 20,000-instruction training step
that was about 40% of the compile (6 of 17 s) and most of its growth beyond linear, while
finding almost nothing to free. Reference counting still frees acyclic garbage at once; the
cycles a stage drops (erased operations) wait for the first collection after it.

A whole compile (tracing to the executable) runs inside one pause, and ends with
``promote_young()``: everything the compile allocated and keeps (the executable, the trace, a
training step's lowered module) moves to the oldest generation without being scanned. Left to
the collector, the first automatic collection after a pause scans all of it, the next
generation's collection scans the survivors again, and stages outside a pause (tracing, import,
binding) pay full collections whenever the heap grew by a quarter. Collecting the young
generations at the end instead (what this did first) scans each kept object once, but finds
nothing to free (see below) and costs more than linear time in the program: a pointer chase
over a heap that outgrows the caches (103 ms for a 96-block ResNet's training step, growth
exponent 1.57). Promoting is two list splices (``gc.freeze`` then ``gc.unfreeze``). Its price: a
cycle that became garbage in the young generations during the compile (the user's own, or a
handful of the compile's) waits for the next full collection. When the user froze objects
themselves (``gc.freeze``), unfreezing would release theirs too, so the young generations are
collected as before.

What a compile drops is made acyclic first, so reference counting frees it at once and leaves no
garbage for a collection (a training step of any size left none): an erased operation is
released by ``Operation.erase`` itself (see ``lucid.ir._xdsl.release``), a module nothing reads
any more by ``release_ir``. Without that, every erased ``lucid`` op and the whole lowered module
(operations, results, uses: tens of objects per op) waited for a collection, which spent most of
its time freeing them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lucid.ir import _xdsl as x

__all__ = ["paused_gc", "promote_young", "release_ir"]

_lock = threading.Lock()
_depth = 0  # stages inside paused_gc, on any thread
_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector for the block (nested and concurrent blocks: until the last
    one ends); it comes back on only if it was on when the first block began."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def release_ir(module: x.Operation) -> None:
    """Break the reference cycles of ``module`` (an operation and all the IR nested in it), which
    nothing may read afterwards: it is freed when its last reference goes (one visit per
    operation, block and use; see ``lucid.ir._xdsl.release``)."""
    from lucid.ir import _xdsl

    _xdsl.release(module)


def promote_young() -> bool:
    """At the end of the only running ``paused_gc`` block (entered with the collector on): move
    every object of the young generations to the oldest one without scanning them (a collection
    of the young generations if the user has frozen objects of their own). Anywhere else (no
    block, a nested or concurrent one still running, or a collector the user turned off) it does
    nothing. True when it promoted or collected."""
    with _lock:
        if _depth != 1 or not _was_enabled:
            return False
    if gc.get_freeze_count():
        gc.collect(1)
    else:
        gc.freeze()
        gc.unfreeze()
    return True
