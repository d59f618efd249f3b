"""``DistributedSampler``: each rank reads its own share of a dataset, with PyTorch's rules."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

from lucid._generator import Generator, randperm
from lucid.utils.data.sampler import Sampler

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler):
    """The indices of ``dataset`` that rank ``rank`` of ``num_replicas`` reads this epoch.

    Every rank draws the same permutation (seeded with ``seed + epoch``; call ``set_epoch`` at
    the start of each epoch for a new order) and takes every ``num_replicas``-th index from
    position ``rank``. Without ``drop_last`` the index list is padded with its own first indices
    to a multiple of ``num_replicas`` (ranks see equally many samples, a few twice); with it, the
    tail that does not divide evenly is dropped. ``num_replicas`` and ``rank`` default to the
    default process group's.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            from lucid import distributed

            if not distributed.is_initialized():
                raise RuntimeError(
                    "DistributedSampler: pass num_replicas and rank, or call "
                    "lucid.distributed.init_process_group first"
                )
            num_replicas = distributed.get_world_size() if num_replicas is None else num_replicas
            rank = distributed.get_rank() if rank is None else rank
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be >= 1, got {num_replicas!r}")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(
                f"Invalid rank {rank!r}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            generator = Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = randperm(n, generator)
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding > 0 and indices:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` in the seed of the next shuffle, so that each epoch has its own order."""
        self.epoch = epoch
