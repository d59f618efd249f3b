"""Scaled dot-product attention as one op, with its backward as one op.

softmax(q @ k^T * scale + mask) @ v over the last two dims; leading (batch, head) dims broadcast.
The mask operand is a boolean tensor (True = attend), an additive float tensor, or the scalar 0.0
when there is none. The backward op recomputes the attention weights from q and k (as flash
attention does) instead of saving the (L, S) matrix.
"""

from __future__ import annotations

import math

import numpy as np

from lucid.ops._registry import SYMBOLIC_BATCH_SAFE, AVal, OpDef, broadcast_shapes, register

__all__: list[str] = []

_OP = "scaled_dot_product_attention"


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check(q, k, v, mask, is_causal):
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.ndim < 2:
            raise ValueError(f"{_OP}: {name} must have at least 2 dims (..., L, E), got {t.shape}")
        if t.dtype is not q.dtype or not t.dtype.is_floating_point:
            raise TypeError(
                f"{_OP}: query, key and value must share one floating dtype, got "
                f"{q.dtype}, {k.dtype}, {v.dtype}"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{_OP}: query's embedding dim {q.shape[-1]} does not match key's {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{_OP}: key has {k.shape[-2]} positions but value has {v.shape[-2]}")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], op=_OP)
    scores = (*batch, q.shape[-2], k.shape[-2])
    if _is_tensor(mask):
        if is_causal:
            raise ValueError(f"{_OP}: pass either attn_mask or is_causal=True, not both")
        if mask.dtype.category == 1:
            raise TypeError(f"{_OP}: attn_mask must be bool or floating point, got {mask.dtype}")
        try:
            broadcast_shapes(mask.shape, scores, op=_OP)
        except ValueError:
            raise ValueError(
                f"{_OP}: attn_mask of shape {tuple(mask.shape)} does not broadcast to the "
                f"attention scores {scores}"
            ) from None
    return batch


def _infer(q, k, v, mask, is_causal, scale):
    batch = _check(q, k, v, mask, is_causal)
    return AVal((*batch, q.shape[-2], v.shape[-1]), q.dtype)


def _weights(q, k, mask, is_causal, scale):
    """The attention weights softmax(q k^T * scale + mask), shape (..., L, S)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask.ndim:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    if is_causal:
        length, size = s.shape[-2:]
        s = np.where(np.tril(np.ones((length, size), dtype=bool)), s, -np.inf)
    if s.shape[-1] == 0:  # no keys: no weights, and the output is zeros (PyTorch's answer)
        return s, scale
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True), scale


def _kernel(q, k, v, mask, is_causal, scale):
    p, _ = _weights(q, k, mask, is_causal, scale)
    return np.matmul(p, v).astype(q.dtype)


def _vjp(c, g):
    from lucid._dispatch import apply

    q, k, v, mask = c.inputs
    dq, dk, dv = apply(f"{_OP}_backward", g, q, k, v, mask, **c.attrs)
    dmask = None
    if c.needs_input_grad[3]:
        # A float mask is added to the scores: its gradient is the scores' (autograd sums it
        # over the broadcast dims). Composed from registry ops, so it also traces.
        scale = c.attrs["scale"]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        from lucid.ops.activation import softmax
        from lucid.ops.linalg import matmul
        from lucid.ops.reduction import sum as reduce_sum
        from lucid.ops.shape import transpose

        p = softmax(matmul(q, transpose(k, -1, -2)) * scale + mask, dim=-1)
        dp = matmul(g, transpose(v, -1, -2))
        dmask = p * (dp - reduce_sum(dp * p, -1, keepdim=True))
    return dq, dk, dv, dmask


register(
    OpDef(
        _OP,
        ("query", "key", "value", "attn_mask"),
        _infer,
        _kernel,
        _vjp,
        attrs={"is_causal": False, "scale": None},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="softmax(q @ k^T * scale + mask) @ v; bool masks say where to attend.",
    )
)


def _backward_infer(grad, q, k, v, mask, is_causal, scale):
    batch = _check(q, k, v, mask, is_causal)
    return (
        AVal((*batch, *q.shape[-2:]), q.dtype),
        AVal((*batch, *k.shape[-2:]), q.dtype),
        AVal((*batch, *v.shape[-2:]), q.dtype),
    )


def _backward_kernel(grad, q, k, v, mask, is_causal, scale):
    p, scale = _weights(q, k, mask, is_causal, scale)
    dv = np.matmul(np.swapaxes(p, -1, -2), grad)
    dp = np.matmul(grad, np.swapaxes(v, -1, -2))
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dq = np.matmul(ds, k) * scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), q) * scale
    batch = ds.shape[:-2]

    def full(a, shape):
        return np.ascontiguousarray(np.broadcast_to(a, (*batch, *shape[-2:]))).astype(q.dtype)

    return full(dq, q.shape), full(dk, k.shape), full(dv, v.shape)


register(
    OpDef(
        f"{_OP}_backward",
        ("grad", "query", "key", "value", "attn_mask"),
        _backward_infer,
        _backward_kernel,
        None,
        attrs={"is_causal": False, "scale": None},
        n_outputs=3,
        saves_outputs=False,
        unsupported={"vjp": "double backward through attention is not implemented"},
        doc="Gradients of scaled_dot_product_attention for query, key and value (in the "
        "broadcast batch shape; autograd reduces them).",
    )
)
