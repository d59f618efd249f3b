"""Composite prim ops: prim ops that carry their decomposition into other prim ops.

MLX's ``fast`` ops are the model. Lowering emits a composite whole (``gelu`` instead of the five
ops of its erf form, ``layer_norm`` instead of four), so a backend with a kernel for it runs that
kernel without re-finding the tree; any backend without one expands the decomposition
(``lucid.ir.prim.expand``), and the op's reference semantics are its decomposition evaluated on
the table's references, so the prim interpreter needs nothing of its own.

A decomposition is written once against two callables and is used for every target:
``emit(name, *operands, **attrs)`` appends a prim op and returns its value, ``const(value, like)``
is a 0-d constant of ``like``'s dtype. Numpy arrays (the reference), IR values (the expansion)
and lowering's values (a case the composite does not take) all fit. A composite may have several
results (``layer_norm_grad``, ``attention_grad``). Like every table module, this one is pure
Python: no xDSL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid.ir.prim._core import (
    COMPOSITE_OPS,
    FLOAT,
    PRIM_OPS,
    Attr,
    Aval,
    PrimOp,
    _fail,
    _need,
    evaluate,
)

Emit = Callable[..., Any]
Const = Callable[[float, Any], Any]
Decomposition = Callable[[Emit, Const, Sequence[Any], dict[str, Any]], list[Any]]

SQRT_HALF = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class CompositeOp(PrimOp):
    """A prim op with a decomposition into other prim ops (which may be composites too)."""

    decomposition: Decomposition | None = None

    def decompose(self, emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
        """The op's results, built from other prim ops through ``emit`` and ``const``."""
        assert self.decomposition is not None, self.name
        return self.decomposition(emit, const, operands, attrs)


def _numpy_emit(name: str, *operands: np.ndarray, **attrs: Any) -> np.ndarray:
    (out,) = evaluate(name, list(operands), attrs)
    return out


def _numpy_const(value: float, like: np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=like.dtype)


def _register_composite(
    name: str,
    operands: tuple[str, ...],
    infer: Callable[[list[Aval], dict[str, Any]], list[Aval]],
    decomposition: Decomposition,
    cpu_kernel: str,
    attrs: dict[str, Attr] | None = None,
) -> None:
    assert name not in PRIM_OPS and name not in COMPOSITE_OPS, name

    def reference(arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return decomposition(_numpy_emit, _numpy_const, arrays, attrs)

    COMPOSITE_OPS[name] = CompositeOp(
        name, operands, attrs or {}, infer, reference, "composite", cpu_kernel,
        decomposition=decomposition,
    )  # fmt: skip


# --- GELU, erf form: x * Phi(x), and its gradient dy * (Phi(x) + x * phi(x))


def _gelu_cdf(emit: Emit, const: Const, x: Any) -> Any:
    erf = emit("erf", emit("mul", x, const(SQRT_HALF, x)))
    return emit("mul", emit("add", erf, const(1.0, x)), const(0.5, x))


def _gelu(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    (x,) = operands
    return [emit("mul", x, _gelu_cdf(emit, const, x))]


def _gelu_grad(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    dy, x = operands
    square = emit("mul", x, x)
    pdf = emit("mul", emit("exp", emit("mul", square, const(-0.5, x))), const(INV_SQRT_2PI, x))
    slope = emit("add", _gelu_cdf(emit, const, x), emit("mul", x, pdf))
    return [emit("mul", dy, slope)]


def _gelu_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    (x,) = avals
    _need("gelu", x, FLOAT)
    return [x]


def _gelu_grad_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    dy, x = avals
    _need("gelu_grad", x, FLOAT)
    if dy != x:
        raise _fail("gelu_grad", f"the gradient {dy} and the input {x} differ")
    if not x.shape:  # the CPU kernel works on rows
        raise _fail("gelu_grad", "needs an input of rank >= 1")
    return [x]


_register_composite("gelu", ("x",), _gelu_rule, _gelu, "norm_gelu.cpp")
_register_composite("gelu_grad", ("dy", "x"), _gelu_grad_rule, _gelu_grad, "norm_gelu.cpp")

# --- layer norm over the last axis: (x - mean) / sqrt(var + epsilon) * gamma + beta


def _layer_norm(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    x, gamma, beta = operands
    mean = emit("reduce_mean", x, axes=(-1,), keepdims=True)
    centered = emit("sub", x, mean)
    var = emit("reduce_mean", emit("mul", centered, centered), axes=(-1,), keepdims=True)
    return [emit("normalize", x, mean, var, gamma, beta, epsilon=attrs["epsilon"])]


def _layer_norm_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    x, gamma, beta = avals
    _need("layer_norm", x, FLOAT)
    if not x.shape:
        raise _fail("layer_norm", "needs an input of rank >= 1")
    row = Aval(x.shape[-1:], x.dtype)
    if gamma != row or beta != row:
        raise _fail("layer_norm", f"weight and bias must be {row}, got {gamma} and {beta}")
    return [x]


_register_composite(
    "layer_norm",
    ("x", "weight", "bias"),
    _layer_norm_rule,
    _layer_norm,
    "norm_gelu.cpp",
    {"epsilon": Attr("float")},
)

# --- layer norm's backward over the last axis, statistics recomputed: with xhat = (x - mean) * rstd
# and g = dy * gamma, dx = rstd (g - mean(g) - xhat mean(g xhat)), dgamma and dbeta the column
# sums of dy * xhat and dy


def _rank(value: Any) -> int:
    """The rank of a decomposition's operand: a numpy array or lowering's value (``.shape``), or
    an IR value (its tensor type's shape)."""
    shape = value.shape if hasattr(value, "shape") else value.type.get_shape()
    return len(shape)


def _column_sum(emit: Emit, value: Any, rank: int) -> Any:
    if rank == 1:
        return value
    return emit("reduce_sum", value, axes=tuple(range(rank - 1)), keepdims=False)


def _layer_norm_grad(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    dy, x, gamma = operands
    mean = emit("reduce_mean", x, axes=(-1,), keepdims=True)
    centered = emit("sub", x, mean)
    var = emit("reduce_mean", emit("mul", centered, centered), axes=(-1,), keepdims=True)
    rstd = emit("rsqrt", emit("add", var, const(attrs["epsilon"], x)))
    xhat = emit("mul", centered, rstd)
    g = emit("mul", dy, gamma)
    g_mean = emit("reduce_mean", g, axes=(-1,), keepdims=True)
    gx_mean = emit("reduce_mean", emit("mul", g, xhat), axes=(-1,), keepdims=True)
    dx = emit("mul", rstd, emit("sub", emit("sub", g, g_mean), emit("mul", xhat, gx_mean)))
    rank = _rank(x)
    dgamma = _column_sum(emit, emit("mul", dy, xhat), rank)
    return [dx, dgamma, _column_sum(emit, dy, rank)]


def _layer_norm_grad_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    dy, x, gamma = avals
    _need("layer_norm_grad", x, FLOAT)
    if not x.shape:
        raise _fail("layer_norm_grad", "needs an input of rank >= 1")
    if dy != x:
        raise _fail("layer_norm_grad", f"the gradient {dy} and the input {x} differ")
    row = Aval(x.shape[-1:], x.dtype)
    if gamma != row:
        raise _fail("layer_norm_grad", f"weight must be {row}, got {gamma}")
    return [x, row, row]


_register_composite(
    "layer_norm_grad",
    ("dy", "x", "weight"),
    _layer_norm_grad_rule,
    _layer_norm_grad,
    "norm_gelu.cpp",
    {"epsilon": Attr("float")},
)

# --- scaled dot-product attention over [B, H, L, D] heads: softmax(alpha * Q Kᵀ) V, with
# ``causal`` the scores of keys after the query (j > i, top-left aligned as PyTorch's is_causal)
# at -inf first


def _shape(value: Any) -> tuple[int, ...]:
    """The shape of a decomposition's operand: a numpy array or lowering's value (``.shape``),
    or an IR value (its tensor type's shape)."""
    return tuple(value.shape if hasattr(value, "shape") else value.type.get_shape())


def attention_scores(emit: Emit, const: Const, q: Any, k: Any, alpha: float) -> Any:
    """``alpha * Q Kᵀ``: the scores, where lowering adds a mask before the softmax (a case the
    composite does not take)."""
    return emit("mul", emit("matmul", q, k, transpose_b=True), const(alpha, q))


def _positions(n: int) -> tuple[float, ...]:
    return tuple(float(i) for i in range(n))


def causal_keep(emit: Emit, queries: int, keys: int) -> Any:
    """The [Lq, Lk] bool mask of the scores a causal query keeps: key j <= query i, from two
    broadcasting ranges (Lq + Lk constant entries, not Lq * Lk)."""
    rows = emit("constant", shape=(queries, 1), dtype="i64", value=_positions(queries))
    cols = emit("constant", shape=(1, keys), dtype="i64", value=_positions(keys))
    return emit("le", cols, rows)


def attention_weights(
    emit: Emit, const: Const, q: Any, k: Any, alpha: float, causal: bool = False
) -> Any:
    """``softmax(alpha * Q Kᵀ)`` over the keys, the causal mask applied first when asked: the
    weights P that the gradient reads."""
    scores = attention_scores(emit, const, q, k, alpha)
    if causal:
        keep = causal_keep(emit, _shape(q)[-2], _shape(k)[-2])
        scores = emit("select", keep, scores, const(-math.inf, q))
    return emit("softmax", scores, axis=-1)


def attention_output(emit: Emit, scores: Any, v: Any) -> Any:
    """``softmax(scores) V`` over the last axis of the scores."""
    return emit("matmul", emit("softmax", scores, axis=-1), v)


def _attention(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    q, k, v = operands
    probs = attention_weights(emit, const, q, k, attrs["alpha"], attrs["causal"])
    return [emit("matmul", probs, v)]


def _attention_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    q, k, v = avals
    _need("attention", q, FLOAT)
    if len(q.shape) != 4 or k.dtype != q.dtype or v.dtype != q.dtype:
        raise _fail("attention", f"needs [B, H, L, D] operands of one dtype, got {q}, {k}, {v}")
    batch, heads, length, dim = q.shape
    if (
        len(k.shape) != 4
        or len(v.shape) != 4
        or k.shape[:2] != (batch, heads)
        or v.shape[:3] != k.shape[:3]
        or k.shape[3] != dim
    ):
        raise _fail("attention", f"Q {q}, K {k} and V {v} are not [B, H, Lq, D], [B, H, Lk, D], "
                    "[B, H, Lk, Dv]")  # fmt: skip
    return [Aval((batch, heads, length, v.shape[3]), q.dtype)]


_register_composite(
    "attention",
    ("q", "k", "v"),
    _attention_rule,
    _attention,
    "attention.cpp",
    {"alpha": Attr("float"), "causal": Attr("bool", False)},
)


# --- attention's gradient given its weights P = softmax(scores) (the mask, if any, is in P):
# dV = Pᵀ dO, dS = P (dO Vᵀ - rowsum(dO Vᵀ P)), dQ = alpha dS K, dK = alpha dSᵀ Q. ``causal``
# states that P is zero above the diagonal (a kernel may skip those products); the decomposition
# needs no mask of its own, P's zeros make dS zero there.


def _attention_grad(emit: Emit, const: Const, operands: Sequence[Any], attrs: dict) -> list:
    d_out, q, k, v, probs = operands
    dv = emit("matmul", probs, d_out, transpose_a=True)
    dp = emit("matmul", d_out, v, transpose_b=True)
    row = emit("reduce_sum", emit("mul", dp, probs), axes=(-1,), keepdims=True)
    ds = emit("mul", probs, emit("sub", dp, row))
    alpha = const(attrs["alpha"], q)
    dq = emit("mul", emit("matmul", ds, k), alpha)
    dk = emit("mul", emit("matmul", ds, q, transpose_a=True), alpha)
    return [dq, dk, dv]


def _attention_grad_rule(avals: list[Aval], attrs: dict) -> list[Aval]:
    d_out, q, k, v, probs = avals
    _attention_rule([q, k, v], attrs)
    batch, heads, length, _ = q.shape
    want = {
        "the output's gradient": (d_out, Aval((batch, heads, length, v.shape[3]), q.dtype)),
        "the weights": (probs, Aval((batch, heads, length, k.shape[2]), q.dtype)),
    }
    for what, (got, aval) in want.items():
        if got != aval:
            raise _fail("attention_grad", f"{what} must be {aval}, got {got}")
    return [q, k, v]


_register_composite(
    "attention_grad",
    ("d_out", "q", "k", "v", "probs"),
    _attention_grad_rule,
    _attention_grad,
    "attention.cpp",
    {"alpha": Attr("float"), "causal": Attr("bool", False)},
)


__all__ = [
    "COMPOSITE_OPS",
    "INV_SQRT_2PI",
    "SQRT_HALF",
    "CompositeOp",
    "attention_output",
    "attention_scores",
    "attention_weights",
    "causal_keep",
]
