"""``DataLoader``: batches of a dataset, in the main process, as ``torch.utils.data.DataLoader``
with ``num_workers=0``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import lucid
from lucid._generator import Generator
from lucid._tensor import Tensor
from lucid.utils.data.dataset import Dataset, IterableDataset
from lucid.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

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


def get_worker_info() -> None:
    """Information about the worker process loading this sample: always None, since Lucid's
    DataLoader loads in the calling process (torch returns None there too)."""
    return None


def _unsupported(option: str, why: str) -> ValueError:
    return ValueError(f"DataLoader: {option} is not supported: {why}")


class DataLoader:
    """Iterate over a dataset in batches, as ``torch.utils.data.DataLoader`` with
    ``num_workers=0``.

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
        generator: a ``lucid.Generator`` for the shuffling.

    Loading runs in the calling process: ``num_workers`` must be 0, and the options that only
    configure worker processes (``prefetch_factor``, ``persistent_workers``,
    ``multiprocessing_context``) raise ``ValueError`` when given, as torch does with
    ``num_workers=0``.
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
        if num_workers > 0:
            raise _unsupported(
                f"num_workers={num_workers}",
                "Lucid's DataLoader loads batches in the calling process; use num_workers=0 "
                "(loading from in-memory tensors is rarely the bottleneck)",
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing; Lucid's "
                "DataLoader has num_workers=0 only, so leave prefetch_factor as None"
            )
        if persistent_workers:
            raise ValueError("persistent_workers option needs num_workers > 0, which Lucid lacks")
        if multiprocessing_context is not None:
            raise _unsupported("multiprocessing_context", "there are no worker processes")
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

    def __iter__(self) -> Iterator[Any]:
        if self._iterable:
            return self._iter_stream()
        return self._iter_map()

    def _iter_map(self) -> Iterator[Any]:
        dataset = self.dataset
        if self.batch_sampler is None:
            for idx in self.sampler:  # type: ignore[union-attr]
                yield self.collate_fn(dataset[idx])  # type: ignore[index]
            return
        fetch = getattr(dataset, "_fetch_batch", None) if self._default_collate else None
        getitems = getattr(dataset, "__getitems__", None)
        for indices in self.batch_sampler:
            indices = list(indices)
            if fetch is not None:
                # One gather per tensor instead of stacking per-sample rows: the same batch.
                batch = fetch(indices)
                if batch is not None:
                    yield batch
                    continue
            if getitems is not None:
                samples = getitems(indices)
            else:
                samples = [dataset[i] for i in indices]  # type: ignore[index]
            yield self.collate_fn(samples)

    def _iter_stream(self) -> Iterator[Any]:
        it = iter(self.dataset)  # type: ignore[arg-type]
        if self.batch_size is None:
            for sample in it:
                yield self.collate_fn(sample)
            return
        while True:
            batch = []
            for sample in it:
                batch.append(sample)
                if len(batch) == self.batch_size:
                    break
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield self.collate_fn(batch)
            if len(batch) < self.batch_size:
                return

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
