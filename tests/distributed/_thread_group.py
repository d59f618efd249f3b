"""An in-process process group for tests: N threads are N ranks, exchanging arrays through
shared slots and a barrier. It implements the array-level methods ``lucid.distributed`` calls,
so the ``all_reduce`` op and the IR interpreter run a real N-way reduction without MPI."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.distributed._group import ReduceOp

_REDUCE = {
    ReduceOp.SUM: lambda xs: np.sum(xs, axis=0),
    ReduceOp.AVG: lambda xs: np.sum(xs, axis=0) / len(xs),
    ReduceOp.MAX: lambda xs: np.max(xs, axis=0),
    ReduceOp.MIN: lambda xs: np.min(xs, axis=0),
}


class ThreadGroup:
    """``size`` ranks, one per thread started by ``run``; ``reductions`` counts collectives."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._local = threading.local()
        self._barrier = threading.Barrier(size, timeout=60)
        self._slots: list[Any] = [None] * size
        self.reductions = 0

    @property
    def rank(self) -> int:
        return self._local.rank

    def error(self, message: str) -> str:
        return f"rank {self.rank} of {self.size}: {message}"

    def all_reduce_array(self, arr: np.ndarray, op: ReduceOp) -> None:
        self._slots[self.rank] = arr.copy()
        self._barrier.wait()
        result = _REDUCE[op](np.stack(self._slots))
        if self.rank == 0:
            self.reductions += 1
        self._barrier.wait()
        arr[...] = result

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` on every rank, each in its own thread; their results in rank order."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # re-raised on the caller's thread
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        if errors:
            raise errors[0]
        return results
