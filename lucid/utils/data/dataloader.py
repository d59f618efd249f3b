"""``DataLoader``: batches of a dataset, as ``torch.utils.data.DataLoader``: in the calling
process (``num_workers=0``) or in worker processes (``lucid.utils.data._worker``)."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import lucid
from lucid._generator import Generator
from lucid._tensor import Tensor
from lucid.utils.data import _worker
from lucid.utils.data._worker import ExceptionWrapper, FetchSpec, IterableEnd, WorkerInfo
from lucid.utils.data.dataset import Dataset, IterableDataset
from lucid.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader", "WorkerInfo", "default_collate", "default_convert", "get_worker_info"]

_COLLATE_TYPES = "tensors, numpy arrays, numbers, strings, dicts or lists/tuples"


def default_collate(batch: Sequence[Any]) -> Any:
    """Merge a list of samples into a batch, as torch's ``default_collate``: tensors (and numpy
    arrays) are stacked on a new first dimension, Python floats become a float64 tensor, ints an
    int64 tensor, bools a bool tensor, strings stay a list; dicts, tuples and lists are collated
    field by field (a tuple of fields becomes a list, a namedtuple stays one)."""
    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)) or not batch:
        raise TypeError(f"default_collate expects a non-empty list of samples, got {batch!r}")
    elem = batch[0]
    if isinstance(elem, Tensor):
        return lucid.stack(list(batch), 0)
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "OSUV":
            raise TypeError(
                f"default_collate: batch must contain {_COLLATE_TYPES}; found a numpy array of "
                f"dtype {elem.dtype}"
            )
        return lucid.stack([lucid.from_numpy(np.asarray(b)) for b in batch], 0)
    if isinstance(elem, np.generic):
        return lucid.tensor(np.stack(batch))
    if isinstance(elem, bool):
        return lucid.tensor(list(batch), dtype=lucid.bool_)
    if isinstance(elem, int):
        return lucid.tensor(list(batch), dtype=lucid.int64)
    if isinstance(elem, float):
        return lucid.tensor(list(batch), dtype=lucid.float64)
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(collated)
        except TypeError:
            return collated
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch, strict=True)))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(b) != size for b in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = [default_collate(list(s)) for s in zip(*batch, strict=True)]
        if isinstance(elem, tuple):
            return transposed  # a list, as torch (backwards compatibility there)
        try:
            return type(elem)(transposed)
        except TypeError:
            return transposed
    raise TypeError(f"default_collate: batch must contain {_COLLATE_TYPES}; found {type(elem)}")


def default_convert(data: Any) -> Any:
    """What a DataLoader with ``batch_size=None`` does to each sample: numpy arrays become
    tensors (recursively in dicts, lists and tuples); everything else is kept."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray) and data.dtype.kind not in "OSUV":
        return lucid.from_numpy(data)
    if isinstance(data, np.generic) and data.dtype.kind not in "OSUV":
        return lucid.tensor(data)
    if isinstance(data, Mapping):
        converted = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        converted_items = [default_convert(d) for d in data]
        try:
            return type(data)(converted_items)
        except TypeError:
            return converted_items
    return data


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker process, its ``WorkerInfo`` (``id``, ``num_workers``, ``seed``,
    ``dataset``: the worker's copy, e.g. to shard an ``IterableDataset``); None in the main
    process, as torch."""
    return _worker.get_worker_info()


def _fetch_map(dataset: Any, indices: Any, spec: FetchSpec) -> Any:
    """One batch of a map-style dataset: ``indices`` is a list (auto-collation) or one index."""
    if not spec.auto_collation:
        return spec.collate_fn(dataset[indices])
    indices = list(indices)
    if spec.default_collate:
        fetch = getattr(dataset, "_fetch_batch", None)
        if fetch is not None:
            # One gather per tensor instead of stacking per-sample rows: the same batch.
            batch = fetch(indices)
            if batch is not None:
                return batch
    getitems = getattr(dataset, "__getitems__", None)
    samples = getitems(indices) if getitems is not None else [dataset[i] for i in indices]
    return spec.collate_fn(samples)


def _next_stream_batch(it: Iterator[Any], spec: FetchSpec) -> Any:
    """The next batch of an iterable dataset's iterator, or None when it has no more."""
    if spec.batch_size is None:
        for sample in it:
            return spec.collate_fn(sample)
        return None
    batch = list(itertools.islice(it, spec.batch_size))
    if not batch or (spec.drop_last and len(batch) < spec.batch_size):
        return None
    return spec.collate_fn(batch)


class DataLoader:
    """Iterate over a dataset in batches, as ``torch.utils.data.DataLoader``.

    Args:
        dataset: a map-style ``Dataset`` (``__getitem__`` and ``__len__``) or an
            ``IterableDataset``.
        batch_size: samples per batch (``None``: yield the samples one by one, unbatched).
        shuffle: a new random order every epoch, drawn from ``generator`` or from the global
            stream (``lucid.manual_seed``) without one.
        sampler / batch_sampler: any iterable of indices / of lists of indices, instead of
            ``shuffle`` / ``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``.
        collate_fn: merges a list of samples into a batch (``default_collate``).
        drop_last: drop the last batch when it is shorter than ``batch_size``.
        generator: a ``lucid.Generator`` for the shuffling and the workers' base seed.
        num_workers: 0 loads in the calling process; more starts that many worker processes
            per iteration (once with ``persistent_workers``). Worker ``i`` seeds Python's
            ``random``, Lucid and numpy from ``base_seed + i`` (``base_seed`` drawn from
            ``generator`` or the global stream), then calls ``worker_init_fn(i)``; each keeps
            up to ``prefetch_factor`` (default 2) batches in flight; batches arrive in sampler
            order (``in_order``); a worker's exception is re-raised naming the worker and the
            indices; ``timeout`` > 0 bounds the wait for a batch. An ``IterableDataset`` is
            iterated by every worker on its own copy: shard it with ``get_worker_info()``.
    """

    def __init__(
        self,
        dataset: Dataset | Iterable[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable[Any] | None = None,
        batch_sampler: Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be non-negative, got {num_workers!r}")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing. let "
                "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and (
            isinstance(prefetch_factor, bool)
            or not isinstance(prefetch_factor, int)
            or prefetch_factor <= 0
        ):
            raise ValueError(
                f"prefetch_factor option should be a positive integer, got {prefetch_factor!r}"
            )
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if multiprocessing_context is not None:
            if num_workers == 0:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process loading "
                    "(num_workers > 0), but got num_workers=0"
                )
            if isinstance(multiprocessing_context, str):
                methods = multiprocessing.get_all_start_methods()
                if multiprocessing_context not in methods:
                    raise ValueError(
                        f"multiprocessing_context option should specify a valid start method in "
                        f"{methods!r}, but got {multiprocessing_context!r}"
                    )
                multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
            elif not hasattr(multiprocessing_context, "Process"):
                raise TypeError(
                    "multiprocessing_context option should be a valid context object or a "
                    f"string specifying the start method, but got {multiprocessing_context!r}"
                )
        if generator is not None and not isinstance(generator, Generator):
            raise TypeError(f"generator must be a lucid.Generator, got {type(generator).__name__}")
        if pin_memory:
            warnings.warn(
                "pin_memory=True has no effect: Lucid tensors live in ordinary CPU memory",
                UserWarning,
                stacklevel=2,
            )
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise ValueError(
                f"batch_size should be a positive integer value or None, got {batch_size!r}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, got {drop_last!r}")

        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        self._persistent_iterator: _MultiProcessingIter | None = None
        self._iterable = isinstance(dataset, IterableDataset) or (
            not hasattr(dataset, "__getitem__") and hasattr(dataset, "__iter__")
        )

        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, but "
                    f"got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified sampler option, but "
                    f"got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                    f"but got batch_sampler={batch_sampler}"
                )
        else:
            if not hasattr(dataset, "__getitem__"):
                raise TypeError(
                    f"DataLoader: dataset must be a map-style dataset (with __getitem__) or an "
                    f"iterable one, got {type(dataset).__name__}"
                )
            if shuffle and sampler is not None:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if batch_sampler is not None:
                if batch_size != 1 or shuffle or sampler is not None or drop_last:
                    raise ValueError(
                        "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                        "sampler, and drop_last"
                    )
                batch_size = None
                drop_last = False
            elif batch_size is None and drop_last:
                raise ValueError(
                    "batch_size=None option disables auto-batching and is mutually exclusive "
                    "with drop_last"
                )
            if sampler is None:
                sampler = (
                    RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
                    if shuffle
                    else SequentialSampler(dataset)  # type: ignore[arg-type]
                )
            if batch_size is not None and batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._default_collate = collate_fn is None
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    def _fetch_spec(self) -> FetchSpec:
        return FetchSpec(
            self._iterable,
            self._auto_collation,
            self.batch_size,
            self.drop_last,
            self.collate_fn,
            self._default_collate,
        )

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers > 0:
            if not self.persistent_workers:
                return _MultiProcessingIter(self)
            if self._persistent_iterator is None:
                self._persistent_iterator = _MultiProcessingIter(self)
            else:
                self._persistent_iterator.reset()
            return self._persistent_iterator
        spec = self._fetch_spec()
        if self._iterable:
            return self._iter_stream(spec)
        return self._iter_map(spec)

    def _iter_map(self, spec: FetchSpec) -> Iterator[Any]:
        tasks = self.sampler if self.batch_sampler is None else self.batch_sampler
        for indices in tasks:  # type: ignore[union-attr]
            yield _fetch_map(self.dataset, indices, spec)

    def _iter_stream(self, spec: FetchSpec) -> Iterator[Any]:
        it = iter(self.dataset)  # type: ignore[arg-type]
        while (batch := _next_stream_batch(it, spec)) is not None:
            yield batch

    def __len__(self) -> int:
        if self._iterable:
            try:
                n = len(self.dataset)  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(
                    f"the IterableDataset {type(self.dataset).__name__} has no __len__, so its "
                    "DataLoader has none"
                ) from None
            if self.batch_size is None:
                return n
            if self.drop_last:
                return n // self.batch_size
            return (n + self.batch_size - 1) // self.batch_size
        if self.batch_sampler is not None:
            return len(self.batch_sampler)  # type: ignore[arg-type]
        return len(self.sampler)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (
            f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"drop_last={self.drop_last})"
        )


def _base_seed(generator: Generator | None) -> int:
    """The workers' base seed for one iterator: a draw from ``generator`` or the global stream."""
    return int(lucid.randint(0, 2**62, (1,), generator=generator).item())


class _MultiProcessingIter:
    """One pass (or, with ``persistent_workers``, every pass) over a DataLoader with worker
    processes: tasks go out round-robin to workers with room (``prefetch_factor`` each),
    results come back through one queue and are delivered in task order (``in_order``)."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor or 2
        self._timeout = loader.timeout
        self._persistent = loader.persistent_workers
        self._in_order = loader.in_order
        self._shut_down = False
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        self._result_queue = ctx.Queue()
        self._done_event = ctx.Event()
        self._task_queues = []
        self._workers = []
        spec = loader._fetch_spec()
        base_seed = _base_seed(loader.generator)
        try:
            for worker_id in range(self._num_workers):
                task_queue = ctx.Queue()
                task_queue.cancel_join_thread()
                worker = ctx.Process(
                    target=_worker.worker_loop,
                    args=(
                        loader.dataset,
                        spec,
                        _fetch_map,
                        _next_stream_batch,
                        task_queue,
                        self._result_queue,
                        self._done_event,
                        worker_id,
                        self._num_workers,
                        base_seed,
                        loader.worker_init_fn,
                    ),  # fmt: skip
                    daemon=True,
                )
                worker.start()
                self._task_queues.append(task_queue)
                self._workers.append(worker)
        except BaseException:
            self._shutdown()
            raise
        self._epoch = 0
        self._start_epoch()

    # --- epochs
    def _start_epoch(self) -> None:
        loader = self._loader
        if loader._iterable:
            self._tasks: Iterator[Any] | None = None
        else:
            tasks = loader.sampler if loader.batch_sampler is None else loader.batch_sampler
            self._tasks = iter(tasks)  # type: ignore[arg-type]
        self._send_index = 0
        self._receive_index = 0
        # task index -> (worker id, indices) while in flight, plus the batch once it arrived
        self._task_info: dict[int, tuple] = {}
        self._outstanding = 0
        self._active = [True] * self._num_workers
        self._next_worker = itertools.cycle(range(self._num_workers))
        for _ in range(self._prefetch_factor * self._num_workers):
            self._send_task()

    def reset(self) -> None:
        """A new epoch on the same (persistent) workers; results of the last one are dropped."""
        if self._shut_down:
            raise RuntimeError("DataLoader: this iterator's workers were shut down")
        self._epoch += 1
        for task_queue in self._task_queues:
            task_queue.put(("resume", self._epoch))
        resumed = 0
        while resumed < self._num_workers:
            epoch, _, _, data = self._get_result()
            resumed += epoch == self._epoch and isinstance(data, str)
        self._start_epoch()

    def _send_task(self) -> None:
        if self._outstanding >= self._prefetch_factor * self._num_workers:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._next_worker)
            if self._active[worker_id]:
                break
        else:
            return
        if self._tasks is None:
            indices = None
        else:
            indices = next(self._tasks, _EXHAUSTED)
            if indices is _EXHAUSTED:
                return
        self._task_queues[worker_id].put(("task", self._epoch, self._send_index, indices))
        self._task_info[self._send_index] = (worker_id, indices)
        self._outstanding += 1
        self._send_index += 1

    # --- receiving
    def _get_result(self) -> tuple:
        """The next message of the result queue, checking for dead workers and ``timeout``."""
        start = time.monotonic()
        while True:
            wait = _worker.STATUS_CHECK_INTERVAL
            if self._timeout > 0:
                wait = min(wait, max(self._timeout - (time.monotonic() - start), 0.0))
            try:
                return self._result_queue.get(timeout=wait)
            except queue.Empty:
                pass
            dead = [w.pid for w in self._workers if not w.is_alive()]
            if dead:
                self._shutdown()
                raise RuntimeError(
                    f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited unexpectedly"
                )
            if self._timeout > 0 and time.monotonic() - start >= self._timeout:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    def __iter__(self) -> _MultiProcessingIter:
        return self

    def __next__(self) -> Any:
        while True:
            if self._shut_down:
                raise StopIteration
            # Skip tasks that will never be answered: sent to a worker whose stream ended.
            while self._receive_index < self._send_index:
                info = self._task_info[self._receive_index]
                if len(info) == 3 or self._active[info[0]]:
                    break
                del self._task_info[self._receive_index]
                self._receive_index += 1
            else:
                if not self._persistent:
                    self._shutdown()
                raise StopIteration
            info = self._task_info[self._receive_index]
            if len(info) == 3:
                del self._task_info[self._receive_index]
                self._receive_index += 1
                if info[2] is _DELIVERED:
                    continue
                return self._deliver(info[2])
            epoch, task_index, worker_id, data = self._get_result()
            if epoch != self._epoch or task_index < 0:
                continue
            self._outstanding -= 1
            if isinstance(data, IterableEnd):
                self._active[worker_id] = False
                continue
            if task_index == self._receive_index or not self._in_order:
                self._task_info.pop(task_index, None)
                if task_index == self._receive_index:
                    self._receive_index += 1
                else:
                    self._task_info[task_index] = (worker_id, None, _DELIVERED)
                return self._deliver(data)
            self._task_info[task_index] += (data,)

    def _deliver(self, data: Any) -> Any:
        self._send_task()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def __len__(self) -> int:
        return len(self._loader)

    # --- shutdown
    def _shutdown(self) -> None:
        """Stop every worker (asking first, then terminating), close the queues."""
        if self._shut_down:
            return
        self._shut_down = True
        self._done_event.set()
        for task_queue in self._task_queues:
            try:
                task_queue.put(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.join(timeout=_SHUTDOWN_GRACE)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        for q in (*self._task_queues, self._result_queue):
            q.cancel_join_thread()
            q.close()

    def __del__(self) -> None:
        if getattr(self, "_workers", None) is not None:
            self._shutdown()


_EXHAUSTED = object()
_DELIVERED = object()  # an out-of-order batch already handed out (in_order=False)
_SHUTDOWN_GRACE = 5.0  # seconds a worker gets to leave by itself before it is terminated
