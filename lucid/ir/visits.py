"""Visit counters: how many instructions each compile stage looks at.

A stage calls ``count(stage, n)`` where it walks ``n`` instructions (or ops, or values): once
per instruction a linear pass touches, again for every rescan. The counts are the compile-time
complexity made observable without a clock: ``tests/passes/test_compile_complexity.py`` compiles
programs of growing size and asserts the visits per instruction stay bounded, so a stage that
rebuilds a whole-program table per rewrite (quadratic) fails a test instead of a benchmark.

>>> from lucid.ir import visits
>>> with visits.counting() as counts:
...     visits.count("my-pass", 3)
>>> counts["my-pass"]
3
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["count", "counting"]

# Counting is off (None) unless a ``counting()`` block is open on this thread: a compile then
# pays one attribute lookup per counted walk.
_local = threading.local()


def count(stage: str, n: int = 1) -> None:
    """Record that ``stage`` visited ``n`` more instructions (no-op outside ``counting()``)."""
    counts = getattr(_local, "counts", None)
    if counts is not None:
        counts[stage] += n


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count the visits of every stage run on this thread inside the block; yields the
    ``Counter`` (stage name -> instructions visited), filled as the block runs."""
    previous = getattr(_local, "counts", None)
    counts: Counter[str] = Counter()
    _local.counts = counts
    try:
        yield counts
    finally:
        _local.counts = previous
        if previous is not None:  # a nested block's visits count in the outer one too
            previous.update(counts)
