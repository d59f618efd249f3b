"""Datasets (``torch.utils.data.Dataset`` and friends) and ``random_split``."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from lucid._generator import Generator, randperm
from lucid._tensor import Tensor

__all__ = [
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(index)`` and usually ``__len__``.
    ``a + b`` concatenates two datasets."""

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(f"{type(self).__name__} must define __getitem__ (a map-style dataset)")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream-style dataset: subclasses define ``__iter__``. A DataLoader batches what it
    yields, in order (no shuffling or samplers)."""

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"{type(self).__name__} must define __iter__ (an iterable dataset)")

    def __add__(self, other: Dataset):  # type: ignore[override]
        raise TypeError("IterableDatasets cannot be concatenated with +; chain their iterators")


class TensorDataset(Dataset):
    """Samples are ``(t[i] for t in tensors)``: every tensor must have the same first dimension."""

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"TensorDataset: argument {i} is a {type(t).__name__}, not a Tensor"
                )
            if t.ndim == 0:
                raise ValueError(f"TensorDataset: tensor {i} is 0-d; samples index dimension 0")
        sizes = [t.shape[0] for t in tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"Size mismatch between tensors: first dimensions are {sizes}")
        self.tensors = tuple(tensors)

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def _fetch_batch(self, indices: list[int]) -> tuple[Tensor, ...] | None:
        """The default-collated batch of ``indices`` in one gather per tensor (what stacking
        the samples would give), or None when that shortcut does not apply."""
        if any(t.requires_grad or t.is_traced for t in self.tensors):
            return None
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.max() >= n or idx.min() < -n):
            return None  # let the per-sample path raise its IndexError
        return tuple(Tensor._wrap(t._data[idx]) for t in self.tensors)


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __len__(self) -> int:
        return len(self.indices)

    def _fetch_batch(self, indices: list[int]) -> Any:
        fetch = getattr(self.dataset, "_fetch_batch", None)
        if fetch is None:
            return None
        return fetch([self.indices[i] for i in indices])


class ConcatDataset(Dataset):
    """The samples of several map-style datasets, one after the other."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> Any:
        idx = operator.index(idx)
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        if which == len(self.datasets):
            raise IndexError(f"index {idx} is out of range for a dataset of length {len(self)}")
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][idx - start]


def random_split(
    dataset: Dataset,
    lengths: Sequence[int | float],
    generator: Generator | None = None,
) -> list[Subset]:
    """Split ``dataset`` into non-overlapping random subsets of the given ``lengths``, or of the
    given fractions (summing to 1: each split gets ``floor(len * fraction)`` items and the
    remainder goes round-robin to the first splits, as torch). The permutation comes from
    ``generator`` or, without one, from the global stream (``lucid.manual_seed``)."""
    lengths = list(lengths)
    n = len(dataset)  # type: ignore[arg-type]
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(int(math.floor(n * frac)))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    UserWarning,
                    stacklevel=2,
                )
        lengths = sizes
    for i, size in enumerate(lengths):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(
                f"random_split: lengths must be non-negative ints or fractions summing to 1, "
                f"got {lengths[i]!r} at index {i}"
            )
    if sum(lengths) != n:
        raise ValueError(
            f"Sum of input lengths ({sum(lengths)}) does not equal the length of the input "
            f"dataset ({n})!"
        )
    indices = randperm(n, generator)
    return [
        Subset(dataset, indices[end - size : end])
        for end, size in zip(itertools.accumulate(lengths), lengths, strict=True)
    ]
