"""The worker processes of a ``DataLoader`` with ``num_workers > 0`` (torch's semantics).

Each worker owns a task queue; the main process sends it ``("task", epoch, task_index, indices)``
(``indices`` is None for an iterable dataset, which the worker iterates itself), and the worker
answers on the shared result queue with ``(epoch, task_index, worker_id, batch)``, where
``batch`` may be an ``ExceptionWrapper`` (re-raised in the main process, naming the worker and
the indices) or an ``IterableEnd`` (this worker's copy of an iterable dataset is exhausted).
``("resume", epoch)`` starts a new epoch of persistent workers; ``None`` or the done event stops
the worker.
"""

from __future__ import annotations

import os
import queue
import random
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# How long the main process waits on the result queue before checking that its workers are alive.
STATUS_CHECK_INTERVAL = 1.0
# How long a worker waits on its task queue before checking the done event and its parent. The
# event matters when the iterator is garbage-collected in a cycle: the queues' own finalizers
# may already have closed them, so the stop message (None) cannot be sent.
WORKER_POLL_INTERVAL = 0.1


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker: its ``id`` (0..num_workers-1),
    ``num_workers``, its ``seed`` (``base_seed + id``) and its copy of the ``dataset``."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The ``WorkerInfo`` of this worker process; None in the main process."""
    return _worker_info


class IterableEnd:
    """A worker's answer when its copy of an iterable dataset is exhausted."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


class ExceptionWrapper:
    """An exception raised in a worker, carried to the main process with its traceback."""

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc_type = type(exc)
        self.message = f"Caught {type(exc).__name__} {where}.\nOriginal " + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )

    def reraise(self) -> None:
        """Raise the worker's exception type with a message naming the worker and the indices
        (a RuntimeError when that type cannot be built from a message)."""
        try:
            exc = self.exc_type(self.message)
        except Exception:
            exc = RuntimeError(self.message)
        if isinstance(exc, KeyError):  # KeyError repr-quotes its message: keep it readable
            exc = RuntimeError(self.message)
        raise exc


def numpy_seed(base_seed: int, worker_id: int) -> np.ndarray:
    """numpy's global seed in a worker: mixed from the base seed and the worker id, so workers
    (and epochs) draw different numpy streams."""
    return np.random.SeedSequence([worker_id, base_seed & 0xFFFFFFFFFFFFFFFF]).generate_state(4)


@dataclass
class FetchSpec:
    """How a worker turns a task into a batch: the loader's batching options."""

    iterable: bool
    auto_collation: bool
    batch_size: int | None
    drop_last: bool
    collate_fn: Callable[[Any], Any]
    default_collate: bool


def worker_loop(
    dataset: Any,
    spec: FetchSpec,
    fetch_map: Callable[..., Any],
    next_stream_batch: Callable[..., Any],
    task_queue: Any,
    result_queue: Any,
    done_event: Any,
    worker_id: int,
    num_workers: int,
    base_seed: int,
    worker_init_fn: Callable[[int], None] | None,
) -> None:
    """The body of one worker process."""
    global _worker_info
    import lucid

    seed = base_seed + worker_id
    random.seed(seed)
    lucid.manual_seed(seed)
    np.random.seed(numpy_seed(base_seed, worker_id))
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    parent = os.getppid()

    init_error = None
    if worker_init_fn is not None:
        try:
            worker_init_fn(worker_id)
        except Exception as exc:
            init_error = ExceptionWrapper(
                exc, f"in DataLoader worker process {worker_id} (in worker_init_fn)"
            )
    stream: Iterator[Any] | None = None
    try:
        while True:
            if done_event.is_set():
                return
            try:
                task = task_queue.get(timeout=WORKER_POLL_INTERVAL)
            except queue.Empty:
                if os.getppid() != parent:  # the main process died: nobody will read results
                    return
                continue
            if task is None:
                return
            if task[0] == "resume":
                stream = None
                result_queue.put((task[1], -1, worker_id, "resumed"))
                continue
            _, epoch, task_index, indices = task
            if init_error is not None:
                result_queue.put((epoch, task_index, worker_id, init_error))
                continue
            try:
                if spec.iterable:
                    if stream is None:
                        stream = iter(dataset)
                    batch = next_stream_batch(stream, spec)
                    if batch is None:
                        batch = IterableEnd(worker_id)
                else:
                    batch = fetch_map(dataset, indices, spec)
            except Exception as exc:
                noun = "indices" if isinstance(indices, list) else "index"
                what = "" if spec.iterable else f" while loading {noun} {indices}"
                batch = ExceptionWrapper(exc, f"in DataLoader worker process {worker_id}{what}")
            result_queue.put((epoch, task_index, worker_id, batch))
    except KeyboardInterrupt:
        return
    finally:
        # Results the main process will never read must not keep this process from exiting.
        result_queue.cancel_join_thread()
