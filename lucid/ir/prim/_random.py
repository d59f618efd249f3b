"""Factories (constant, fill) and counter-based random numbers (Philox-4x32-10)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    FLOAT,
    HALF,
    NUMPY_DTYPES,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _register,
)
from lucid.ir.prim._half import to_half


# --- factories and randomness -------------------------------------------------------------------
def _constant_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    shape = attrs["shape"]
    if any(d < 0 for d in shape):
        raise _fail("constant", f"negative dimension in shape {shape}")
    if len(attrs["value"]) not in (1, math.prod(shape)):
        raise _fail("constant", f"value needs 1 or {math.prod(shape)} entries")
    return [Aval(shape, attrs["dtype"])]


def _constant_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    values = np.array(attrs["value"], dtype=np.float64)
    dtype = attrs["dtype"]
    typed = to_half(values, dtype) if dtype in HALF else values.astype(NUMPY_DTYPES[dtype])
    return [np.broadcast_to(typed, math.prod(attrs["shape"])).reshape(attrs["shape"])]


def _fill_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    if avals[0].shape != ():
        raise _fail("fill", f"value must be a scalar (shape ()), got {avals[0].shape}")
    if any(d < 0 for d in attrs["shape"]):
        raise _fail("fill", f"negative dimension in shape {attrs['shape']}")
    return [Aval(attrs["shape"], avals[0].dtype)]


_register(
    PrimOp(
        "constant", (), {"shape": Attr("ints"), "dtype": Attr("dtype"), "value": Attr("floats")},
        _constant_infer, _constant_ref, "factory",
        "runtime.cpp: materialised once at compile time",
        props=frozenset({"GRAD_SINK", "HALF_AWARE"}),
    )
)  # fmt: skip
_register(
    PrimOp(
        "fill", ("value",), {"shape": Attr("ints")}, _fill_infer,
        lambda xs, at: [np.full(at["shape"], xs[0])], "factory", "shape.cpp: broadcast copy",
    )
)  # fmt: skip

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox4x32(counter_lo: np.ndarray, key: int, counter_hi: int) -> np.ndarray:
    """Philox-4x32-10 on counters (lo64, hi64) under a 64-bit key; returns uint32 [n, 4]."""
    mask = np.uint64(0xFFFFFFFF)
    lo = counter_lo.astype(np.uint64)
    c = [lo & mask, lo >> np.uint64(32)]
    c += [np.full_like(lo, counter_hi & 0xFFFFFFFF), np.full_like(lo, counter_hi >> 32)]
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [
            ((p1 >> np.uint64(32)) ^ c[1] ^ k0) & mask,
            p1 & mask,
            ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & mask,
            p0 & mask,
        ]
        k0 = (k0 + np.uint64(PHILOX_W[0])) & mask
        k1 = (k1 + np.uint64(PHILOX_W[1])) & mask
    return np.stack(c, axis=-1).astype(np.uint32)


def random_words(state: np.ndarray, count: int) -> np.ndarray:
    """``count`` uint32 words from an int64[2] (key, counter) state: block i//4, lane i%4."""
    key, counter = (int(v) & 0xFFFFFFFFFFFFFFFF for v in np.asarray(state).reshape(2))
    blocks = (count + 3) // 4
    return philox4x32(np.arange(blocks, dtype=np.uint64), key, counter).ravel()[:count]


def _uniform01(state: np.ndarray, n: int, dtype: str) -> np.ndarray:
    if dtype != "f64":  # 24 bits for float32 and the half formats, as eager draws them
        return (random_words(state, n) >> np.uint32(8)).astype(np.float64) * 2.0**-24
    w = random_words(state, 2 * n).astype(np.uint64).reshape(n, 2)
    return ((w[:, 0] << np.uint64(21)) ^ (w[:, 1] >> np.uint64(11))).astype(np.float64) * 2.0**-53


def _random_uniform_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    n = math.prod(attrs["shape"])
    u = _uniform01(xs[0], n, attrs["dtype"])
    out = attrs["low"] + (attrs["high"] - attrs["low"]) * u
    return [out.reshape(attrs["shape"])]


def _random_normal_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    n = math.prod(attrs["shape"])
    pairs = (n + 1) // 2
    u = _uniform01(xs[0], 2 * pairs, attrs["dtype"]).reshape(pairs, 2)
    radius = np.sqrt(-2.0 * np.log(1.0 - u[:, 0]))
    theta = 2.0 * np.pi * u[:, 1]
    z = np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=-1).ravel()[:n]
    return [(attrs["mean"] + attrs["std"] * z).reshape(attrs["shape"])]


def _random_infer(name: str) -> Callable[[list[Aval], dict[str, Any]], list[Aval]]:
    def rule(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
        if avals[0].shape != (2,) or avals[0].dtype != "i64":
            raise _fail(name, f"state must be i64[2] (key, counter), got {avals[0]}")
        if attrs["dtype"] not in FLOAT:
            raise _fail(name, f"dtype must be one of {sorted(FLOAT)}, got {attrs['dtype']}")
        if any(d < 0 for d in attrs["shape"]):
            raise _fail(name, f"negative dimension in shape {attrs['shape']}")
        return [Aval(attrs["shape"], attrs["dtype"])]

    return rule


# Random ops are HALF_AWARE: a half draw rounds once from its float64 value (eager's kernels).
_register(
    PrimOp(
        "random_uniform", ("state",),
        {"shape": Attr("ints"), "dtype": Attr("dtype", "f32"), "low": Attr("float", 0.0),
         "high": Attr("float", 1.0)},
        _random_infer("random_uniform"), _random_uniform_ref, "random",
        "shape.cpp: Philox-4x32-10", props=frozenset({"RANDOM", "GRAD_SINK", "HALF_AWARE"}),
    )
)  # fmt: skip
_register(
    PrimOp(
        "random_normal", ("state",),
        {"shape": Attr("ints"), "dtype": Attr("dtype", "f32"), "mean": Attr("float", 0.0),
         "std": Attr("float", 1.0)},
        _random_infer("random_normal"), _random_normal_ref, "random",
        "shape.cpp: Philox-4x32-10 + Box-Muller",
        props=frozenset({"RANDOM", "GRAD_SINK", "HALF_AWARE"}),
    )
)  # fmt: skip
