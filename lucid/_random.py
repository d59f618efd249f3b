"""The process-wide random state: a counter-based generator's (key, counter) pair.

Random ops never hold hidden state. Each takes an explicit ``rng`` operand, an int64 tensor of
shape (2,) holding (key, counter), and derives its draws from that pair alone (numpy's Philox, the
counter in the second 64-bit word, so each counter value owns a stream of 2**64 blocks). A front
takes the current pair and advances the counter by one. The same pair always gives the same
numbers, so ``manual_seed`` reproduces eager runs, and a compiled graph can take the pair as a feed
and be random per call.

Under a tracer that offers ``next_rng()``, the fronts ask it for the state tensor instead, so the
compiled graph reads the RNG state as a feed rather than baking in a constant.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from lucid._state import state
from lucid._tensor import Tensor

DEFAULT_SEED = 67280421310721  # PyTorch's default, so a fresh process is deterministic too
_MASK64 = (1 << 64) - 1

_lock = threading.Lock()
_initial_seed = DEFAULT_SEED
_key = DEFAULT_SEED
_counter = 0


def _to_int64(value: int) -> int:
    """A 64-bit pattern as the signed int64 that stores it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def manual_seed(seed: int) -> None:
    """Reset the global random state: the same seed reproduces the same random numbers."""
    global _initial_seed, _key, _counter
    seed = int(seed)
    if not -(1 << 63) <= seed <= _MASK64:
        raise ValueError(f"manual_seed: seed must fit in 64 bits, got {seed}")
    with _lock:
        _initial_seed, _key, _counter = seed, _to_int64(seed), 0


def seed() -> int:
    """Seed the global state from OS entropy and return the seed used."""
    s = int.from_bytes(os.urandom(8), "little") >> 1
    manual_seed(s)
    return s


def initial_seed() -> int:
    """The seed last given to ``manual_seed`` (or ``seed``)."""
    return _initial_seed


def get_rng_state() -> Tensor:
    """The global state as an int64 tensor ``[key, counter]`` (a copy)."""
    with _lock:
        return Tensor._wrap(np.array([_key, _counter], dtype=np.int64))


def set_rng_state(new_state: Tensor) -> None:
    """Restore a state returned by ``get_rng_state``."""
    global _key, _counter
    arr = np.asarray(getattr(new_state, "_data", new_state))
    if arr.shape != (2,) or arr.dtype.kind not in "iu":
        raise ValueError(
            f"set_rng_state: expected an integer tensor of shape (2,) = (key, counter), "
            f"got shape {arr.shape} and dtype {arr.dtype}"
        )
    with _lock:
        _key, _counter = _to_int64(int(arr[0])), _to_int64(int(arr[1]))


def next_rng() -> Tensor:
    """The state tensor for one random op; advances the global counter by one."""
    global _counter
    tracer = state.tracer
    if tracer is not None and hasattr(tracer, "next_rng"):
        return tracer.next_rng()
    with _lock:
        out = np.array([_key, _counter], dtype=np.int64)
        _counter = _to_int64(_counter + 1)
    return Tensor._wrap(out)


def generator(rng: np.ndarray) -> np.random.Generator:
    """The numpy generator a kernel draws from: a pure function of the (key, counter) pair."""
    key, counter = (int(v) & _MASK64 for v in np.asarray(rng).reshape(2))
    return np.random.Generator(np.random.Philox(key=key, counter=counter << 64))
