"""matmul, and matmul_accumulate (a GEMM that adds a scaled product into an operand)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    FLOAT,
    NUMERIC,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _need,
    _register,
    _same_dtype,
    broadcast,
)


# --- matmul -------------------------------------------------------------------------------------
def _matmul_dims(avals: list[Aval], attrs: dict[str, Any]) -> tuple[int, int, int, tuple]:
    a, b = avals
    if a.ndim < 2 or b.ndim < 2:
        raise _fail("matmul", f"operands need rank >= 2, got shapes {a.shape} and {b.shape}")
    m, ka = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    kb, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if ka != kb:
        raise _fail("matmul", f"contraction sizes differ: {a.shape} @ {b.shape} (K {ka} vs {kb})")
    return m, n, ka, broadcast("matmul", a.shape[:-2], b.shape[:-2])


def _matmul_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    dtype = _same_dtype("matmul", avals)
    _need("matmul", avals[0], NUMERIC)
    m, n, _, batch = _matmul_dims(avals, attrs)
    return [Aval((*batch, m, n), dtype)]


def _matmul_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = xs
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    if a.dtype.kind == "f":
        return [np.matmul(a.astype(np.float64), b.astype(np.float64))]
    return [np.matmul(a, b)]


_register(
    PrimOp(
        "matmul", ("a", "b"),
        {"transpose_a": Attr("bool", False), "transpose_b": Attr("bool", False)},
        _matmul_infer, _matmul_ref, "linalg", "linalg.cpp: sgemm/dgemm per batch",
    )
)  # fmt: skip


# --- matmul_accumulate: out = c + alpha * (op(a) @ op(b)), BLAS's beta = 1 ---------------------
# What prim-simplify makes of ``c - s * matmul(a, b)`` (an SGD update of a weight from its
# gradient GEMM): one pass over the weight instead of a GEMM into a scratch buffer and an
# elementwise pass over both.
def _matmul_acc_infer(avals: list[Aval], attrs: dict[str, Any]) -> list[Aval]:
    a, b, c, alpha = avals
    dtype = _same_dtype("matmul_accumulate", avals)
    _need("matmul_accumulate", a, FLOAT)
    if a.ndim != 2 or b.ndim != 2:
        raise _fail("matmul_accumulate", f"operands need rank 2, got {a.shape} and {b.shape}")
    m, n, _, _ = _matmul_dims([a, b], attrs)
    if c.shape != (m, n):
        raise _fail("matmul_accumulate", f"accumulator has shape {c.shape}, the product {(m, n)}")
    if alpha.shape != ():
        raise _fail("matmul_accumulate", f"alpha must be 0-d, got shape {alpha.shape}")
    return [Aval((m, n), dtype)]


def _matmul_acc_ref(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b, c, alpha = xs
    (prod,) = _matmul_ref([a, b], attrs)
    return [c.astype(np.float64) + np.float64(alpha) * prod]


_register(
    PrimOp(
        "matmul_accumulate", ("a", "b", "c", "alpha"),
        {"transpose_a": Attr("bool", False), "transpose_b": Attr("bool", False)},
        _matmul_acc_infer, _matmul_acc_ref, "linalg",
        "linalg.cpp: sgemm/dgemm with alpha and beta = 1",
    )
)  # fmt: skip
