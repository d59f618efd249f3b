"""Embedding lookup (with its scatter-add backward as an op) and one_hot."""

from __future__ import annotations

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid.ops._registry import GRAD_SINK, SYMBOLIC_BATCH_SAFE, AVal, OpDef, register

__all__: list[str] = []


def _check_indices(op: str, indices) -> None:
    if indices.dtype.category != 1:
        raise TypeError(f"{op}: indices must be an integer tensor, got {indices.dtype}")


def _embedding_infer(indices, weight, padding_idx, scale_grad_by_freq):
    _check_indices("embedding", indices)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-d (num_embeddings, dim), got {weight.shape}")
    return AVal((*indices.shape, weight.shape[1]), weight.dtype)


def out_of_range_message(op: str, n: int) -> str:
    """The message of an index outside [0, n) (``{}`` stands for the index): eager raises it, and
    the lowering hands it to ``prim.check_index``."""
    if op == "one_hot":
        return f"one_hot: class value {{}} is out of bounds for {n} classes"
    return f"{op}: index {{}} is out of range for {n} embeddings"


def _check_range(op: str, indices: np.ndarray, n: int) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        bad = indices[(indices < 0) | (indices >= n)].flat[0]
        raise IndexError(out_of_range_message(op, n).format(int(bad)))


def _embedding_kernel(indices, weight, padding_idx, scale_grad_by_freq):
    _check_range("embedding", indices, weight.shape[0])
    return weight[indices]


def _embedding_vjp(c, g):
    indices, weight = c.inputs
    return None, apply(
        "embedding_backward",
        g,
        indices,
        num_weights=weight.shape[0],
        padding_idx=c.attrs["padding_idx"],
        scale_grad_by_freq=c.attrs["scale_grad_by_freq"],
    )


register(
    OpDef(
        "embedding",
        ("indices", "weight"),
        _embedding_infer,
        _embedding_kernel,
        _embedding_vjp,
        attrs={"padding_idx": None, "scale_grad_by_freq": False},
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
        doc="Rows of ``weight`` at ``indices``; padding_idx's row gets no gradient.",
    )
)


def _embedding_backward_infer(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    return AVal((num_weights, grad.shape[-1]), grad.dtype)


def _embedding_backward_kernel(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    _check_range("embedding", indices, num_weights)
    flat_idx = indices.reshape(-1)
    rows = grad.reshape(-1, grad.shape[-1])
    if scale_grad_by_freq:
        counts = np.bincount(flat_idx, minlength=num_weights)
        rows = rows / counts[flat_idx][:, None]
    out = np.zeros((num_weights, grad.shape[-1]), dtype=grad.dtype)
    np.add.at(out, flat_idx, rows)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def _embedding_backward_vjp(c, gg):
    grad, indices = c.inputs
    attrs = c.attrs
    if attrs["scale_grad_by_freq"]:
        raise RuntimeError("embedding: double backward with scale_grad_by_freq is not supported")
    picked = apply("embedding", indices, gg)
    if attrs["padding_idx"] is not None:
        keep = (indices != attrs["padding_idx"]).reshape(*indices.shape, 1)
        picked = picked * keep
    return picked, None


register(
    OpDef(
        "embedding_backward",
        ("grad", "indices"),
        _embedding_backward_infer,
        _embedding_backward_kernel,
        _embedding_backward_vjp,
        attrs={"num_weights": None, "padding_idx": None, "scale_grad_by_freq": False},
        saves_outputs=False,
        doc="Scatter-add of the rows' gradients into a (num_weights, dim) gradient.",
    )
)


def _one_hot_infer(x, num_classes):
    _check_indices("one_hot", x)
    return AVal((*x.shape, num_classes), _dtype.int64)


def _one_hot_kernel(x, num_classes):
    _check_range("one_hot", x, num_classes)
    return (x[..., None] == np.arange(num_classes)).astype(np.int64)


register(
    OpDef(
        "one_hot",
        ("x",),
        _one_hot_infer,
        _one_hot_kernel,
        None,
        attrs={"num_classes": None},
        props=frozenset({GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
        doc="int64 one-hot encoding along a new last dim.",
    )
)
