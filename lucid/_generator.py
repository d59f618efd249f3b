"""``lucid.Generator``: a random stream of its own, as ``torch.Generator``, for the APIs that take
``generator=`` (``DataLoader``, ``random_split``, samplers).

It is the same counter-based Philox stream as the global state in ``lucid._random`` (a 64-bit
key and a counter), kept per object: ``Generator().manual_seed(s)`` draws the same permutation
as ``lucid.randperm`` right after ``lucid.manual_seed(s)``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid._tensor import device as Device

__all__ = ["Generator"]


class Generator:
    """An independent random stream: ``g = lucid.Generator().manual_seed(0)``."""

    def __init__(self, device: Any = "cpu") -> None:
        self._device = Device(device)
        self._lock = threading.Lock()
        self._initial_seed = _random.DEFAULT_SEED
        self._key = _random.DEFAULT_SEED
        self._counter = 0

    @property
    def device(self) -> Device:
        return self._device

    def manual_seed(self, seed: int) -> Generator:
        """Reset the stream from ``seed``; returns the generator (so it chains, as torch's)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed expected an int seed, got {type(seed).__name__}")
        seed = int(seed)
        if not -(1 << 63) <= seed < 1 << 64:
            raise ValueError(f"manual_seed: seed must fit in 64 bits, got {seed}")
        with self._lock:
            self._initial_seed, self._key, self._counter = seed, _random._to_int64(seed), 0
        return self

    def seed(self) -> int:
        """Seed from OS entropy; returns the seed used."""
        s = int.from_bytes(os.urandom(8), "little") >> 1
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._initial_seed

    def get_state(self) -> Tensor:
        """The stream's state, an int64 tensor ``[key, counter]`` (a copy)."""
        with self._lock:
            return Tensor._wrap(np.array([self._key, self._counter], dtype=np.int64))

    def set_state(self, new_state: Tensor) -> Generator:
        """Restore a state from ``get_state``."""
        arr = np.asarray(getattr(new_state, "_data", new_state))
        if arr.shape != (2,) or arr.dtype.kind not in "iu":
            raise ValueError(
                "Generator.set_state: expected an integer tensor of shape (2,) = (key, counter), "
                f"got shape {arr.shape} and dtype {arr.dtype}"
            )
        with self._lock:
            self._key = _random._to_int64(int(arr[0]))
            self._counter = _random._to_int64(int(arr[1]))
        return self

    def next_state(self) -> np.ndarray:
        """The (key, counter) pair for one draw; advances the counter by one."""
        with self._lock:
            out = np.array([self._key, self._counter], dtype=np.int64)
            self._counter = _random._to_int64(self._counter + 1)
        return out

    def __repr__(self) -> str:
        return f"<lucid.Generator device={self._device} initial_seed={self._initial_seed}>"


def randperm(n: int, generator: Generator | None = None) -> list[int]:
    """A random permutation of ``range(n)`` from ``generator`` or the global stream, as a list;
    the same numbers ``lucid.randperm`` draws from the same state."""
    if generator is None:
        rng = _random.next_rng()._data
    elif isinstance(generator, Generator):
        rng = generator.next_state()
    else:
        raise TypeError(f"generator must be a lucid.Generator, got {type(generator).__name__}")
    return np.argsort(_random.random_words(rng, n), kind="stable").tolist()


def randint(high: int, size: int, generator: Generator | None = None) -> list[int]:
    """``size`` integers uniform in ``[0, high)`` from ``generator`` or the global stream."""
    if generator is None:
        rng = _random.next_rng()._data
    elif isinstance(generator, Generator):
        rng = generator.next_state()
    else:
        raise TypeError(f"generator must be a lucid.Generator, got {type(generator).__name__}")
    words = _random.random_words(rng, 2 * size).astype(np.uint64).reshape(size, 2)
    # 53 random bits scaled to [0, high): the bias is below 2**-20 for any realistic high.
    u = ((words[:, 0] << np.uint64(21)) ^ (words[:, 1] >> np.uint64(11))).astype(np.float64)
    return np.minimum((u * 2.0**-53 * high).astype(np.int64), high - 1).tolist()
