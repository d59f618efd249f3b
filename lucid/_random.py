"""The process-wide random state and the counter-based stream every random op draws from.

Random ops never hold hidden state. Each takes an explicit ``rng`` operand, an int64 tensor of
shape (2,) holding (key, counter), and derives its draws from that pair alone. A front takes the
current pair and advances the counter by one, so ``manual_seed`` reproduces eager runs, and a
compiled graph can take the pair as a feed and be random per call.

The stream is Philox-4x32-10 (Salmon et al., SC'11), laid out as the native CPU backend's
``random_words``: word ``i`` is lane ``i % 4`` of the block whose 128-bit counter is
``(i // 4, counter)`` under the 64-bit ``key``. Uniforms take the top 24 bits of one word (below
float64) or 53 bits of two (float64); normals are Box-Muller pairs. Eager and compiled draws from
the same state are therefore the same numbers.

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


_MASK32 = 0xFFFFFFFF
_PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox4x32(blocks: np.ndarray, key: int, counter: int) -> np.ndarray:
    """Philox-4x32-10 of the counters ``(block, counter)`` (two 64-bit halves) under ``key``:
    uint32 of shape ``(len(blocks), 4)``. Lanes live in uint64 so the 32 x 32-bit products fit."""
    blocks = np.asarray(blocks, dtype=np.uint64)
    shift, mask = np.uint64(32), np.uint64(_MASK32)
    c0, c1 = blocks & mask, blocks >> shift
    c2 = np.full_like(blocks, counter & _MASK32)
    c3 = np.full_like(blocks, (counter >> 32) & _MASK32)
    k0, k1 = key & _MASK32, (key >> 32) & _MASK32
    for _ in range(10):
        p0, p1 = np.multiply(c0, _PHILOX_M[0]), np.multiply(c2, _PHILOX_M[1])
        # In place: (c0, c1, c2, c3) <- (hi(p1) ^ c1 ^ k0, lo(p1), hi(p0) ^ c3 ^ k1, lo(p0))
        np.right_shift(p1, shift, out=c0)
        np.bitwise_xor(c0, c1, out=c0)
        np.bitwise_xor(c0, np.uint64(k0), out=c0)
        np.right_shift(p0, shift, out=c2)
        np.bitwise_xor(c2, c3, out=c2)
        np.bitwise_xor(c2, np.uint64(k1), out=c2)
        c1 = np.bitwise_and(p1, mask, out=p1)
        c3 = np.bitwise_and(p0, mask, out=p0)
        k0, k1 = (k0 + _PHILOX_W[0]) & _MASK32, (k1 + _PHILOX_W[1]) & _MASK32
    out = np.empty((blocks.size, 4), np.uint32)
    out[:, 0], out[:, 1], out[:, 2], out[:, 3] = c0, c1, c2, c3
    return out


def random_words(rng: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` uint32 words of the stream of a (key, counter) state."""
    key, counter = (int(v) & _MASK64 for v in np.asarray(rng).reshape(2))
    blocks = np.arange((count + 3) // 4, dtype=np.uint64)
    return philox4x32(blocks, key, counter).reshape(-1)[:count]


def uniform01(rng: np.ndarray, n: int, double: bool) -> np.ndarray:
    """``n`` float64 uniforms in [0, 1) with 53 random bits (``double``) or 24."""
    if not double:
        return (random_words(rng, n) >> np.uint32(8)).astype(np.float64) * 2.0**-24
    w = random_words(rng, 2 * n).astype(np.uint64).reshape(n, 2)
    return ((w[:, 0] << np.uint64(21)) ^ (w[:, 1] >> np.uint64(11))).astype(np.float64) * 2.0**-53


def normal01(rng: np.ndarray, n: int, double: bool) -> np.ndarray:
    """``n`` standard normals: Box-Muller on consecutive pairs of uniforms."""
    pairs = (n + 1) // 2
    u = uniform01(rng, 2 * pairs, double).reshape(pairs, 2)
    radius = np.sqrt(-2.0 * np.log(1.0 - u[:, 0]))  # as the native kernel, for equal numbers
    theta = 2.0 * np.pi * u[:, 1]
    return np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=-1).reshape(-1)[:n]
