"""Shape ops."""

from __future__ import annotations

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import tensor_method
from lucid.ops._registry import AVal, OpDef, register

__all__ = ["reshape", "expand"]


def _resolve_shape(numel_shape, shape, op):
    shape = list(shape)
    neg = [i for i, d in enumerate(shape) if d == -1]
    if len(neg) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {tuple(shape)}")
    total = 1
    for d in numel_shape:
        total *= d
    known = 1
    for d in shape:
        if d != -1:
            known *= d
    if neg:
        if known == 0 or total % known:
            raise ValueError(f"{op}: cannot reshape {tuple(numel_shape)} into {tuple(shape)}")
        shape[neg[0]] = total // known
    elif known != total:
        raise ValueError(
            f"{op}: cannot reshape {tuple(numel_shape)} ({total} elements) into "
            f"{tuple(shape)} ({known} elements)"
        )
    return tuple(shape)


register(
    OpDef(
        "reshape",
        ("x",),
        lambda x, shape: AVal(_resolve_shape(x.shape, shape, "reshape"), x.dtype),
        lambda x, shape: np.reshape(x, shape),
        lambda c, g: (g.reshape(c.inputs[0].shape),),
        attrs={"shape": None},
        saves_outputs=False,
    )
)


def _expand_infer(x, shape):
    shape = tuple(shape)
    if len(shape) < x.ndim:
        raise ValueError(f"expand: target {shape} has fewer dims than the tensor {x.shape}")
    lead = len(shape) - x.ndim
    out = []
    for i, d in enumerate(shape):
        src = x.shape[i - lead] if i >= lead else 1
        if d == -1:
            if i < lead:
                raise ValueError(f"expand: -1 is not allowed in a new leading dim ({shape})")
            d = src
        if src != 1 and src != d:
            raise ValueError(
                f"expand: the size {src} of dim {i - lead} must match {d} "
                f"(tensor {tuple(x.shape)} -> {shape})"
            )
        out.append(d)
    return AVal(tuple(out), x.dtype)


register(
    OpDef(
        "expand",
        ("x",),
        _expand_infer,
        lambda x, shape: np.broadcast_to(x, _expand_infer(x_aval(x), shape).shape),
        lambda c, g: (g,),  # autograd reduces the broadcast gradient to the operand's shape
        attrs={"shape": None},
        saves_inputs=False,
        saves_outputs=False,
    )
)


def x_aval(a: np.ndarray) -> AVal:
    from lucid._dtype import from_numpy

    return AVal(a.shape, from_numpy(a.dtype))


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


@tensor_method("reshape")
def reshape(x, *shape) -> Tensor:
    return apply("reshape", x, shape=_shape_args(shape))


Tensor.view = reshape


@tensor_method()
def expand(x, *shape) -> Tensor:
    return apply("expand", x, shape=_shape_args(shape))
