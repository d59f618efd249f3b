"""Elementwise ops: one registry entry each, sharing the broadcasting inference rule."""

from __future__ import annotations

import numpy as np

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import inplace_method, tensor_method
from lucid.ops._registry import (
    ELEMENTWISE,
    GRAD_SINK,
    PROMOTE,
    SYMBOLIC_BATCH_SAFE,
    OpDef,
    elementwise_infer,
    register,
)

__all__ = ["add", "sub", "mul", "neg", "exp"]

_EW = frozenset({ELEMENTWISE, PROMOTE, SYMBOLIC_BATCH_SAFE})


def _binary(name, kernel, vjp, out=None, **kw):
    return register(OpDef(name, ("x", "y"), elementwise_infer(out), kernel, vjp, props=_EW, **kw))


def _unary(name, kernel, vjp, out=None, **kw):
    return register(OpDef(name, ("x",), elementwise_infer(out), kernel, vjp, props=_EW, **kw))


# --- arithmetic
_binary("add", np.add, lambda c, g: (g, g), saves_inputs=False, saves_outputs=False)
_binary("sub", np.subtract, lambda c, g: (g, neg(g)), saves_inputs=False, saves_outputs=False)
_binary("mul", np.multiply, lambda c, g: (g * c.inputs[1], g * c.inputs[0]), saves_outputs=False)
_unary("neg", np.negative, lambda c, g: (neg(g),), saves_inputs=False, saves_outputs=False)
_unary("exp", np.exp, lambda c, g: (g * c.outputs[0],), out="float", saves_inputs=False)


def add(x, y, *, alpha=1) -> Tensor:
    """``x + alpha * y`` with broadcasting."""
    return apply("add", x, y if alpha == 1 else apply("mul", y, alpha))


def sub(x, y, *, alpha=1) -> Tensor:
    return apply("sub", x, y if alpha == 1 else apply("mul", y, alpha))


def mul(x, y) -> Tensor:
    return apply("mul", x, y)


@tensor_method("neg", "__neg__")
def neg(x) -> Tensor:
    return apply("neg", x)


@tensor_method()
def exp(x) -> Tensor:
    return apply("exp", x)


Tensor.add = add
Tensor.sub = sub
Tensor.mul = mul
Tensor.__add__ = lambda s, o: apply("add", s, o)
Tensor.__radd__ = lambda s, o: apply("add", o, s)
Tensor.__sub__ = lambda s, o: apply("sub", s, o)
Tensor.__rsub__ = lambda s, o: apply("sub", o, s)
Tensor.__mul__ = lambda s, o: apply("mul", s, o)
Tensor.__rmul__ = lambda s, o: apply("mul", o, s)
for _name, _fn in (("add_", add), ("sub_", sub), ("mul_", mul), ("exp_", exp), ("neg_", neg)):
    inplace_method(_name, _fn)
Tensor.__iadd__ = Tensor.add_
Tensor.__isub__ = Tensor.sub_
Tensor.__imul__ = Tensor.mul_

# --- structural helpers autograd needs
register(
    OpDef(
        "cast",
        ("x",),
        lambda x, dtype: elementwise_infer(dtype)(x),
        lambda x, dtype: x.astype(dtype.numpy),
        lambda c, g: (g.type(c.inputs[0].dtype) if c.inputs[0].dtype.is_floating_point else None,),
        attrs={"dtype": None},
        props=frozenset({ELEMENTWISE, SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
    )
)
register(
    OpDef(
        "detach",
        ("x",),
        elementwise_infer(),
        lambda x: x,
        None,
        props=frozenset({ELEMENTWISE, GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
    )
)
register(
    OpDef(
        "zeros_like",
        ("x",),
        elementwise_infer(),
        np.zeros_like,
        None,
        props=frozenset({GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
    )
)
register(
    OpDef(
        "ones_like",
        ("x",),
        elementwise_infer(),
        np.ones_like,
        None,
        props=frozenset({GRAD_SINK, SYMBOLIC_BATCH_SAFE}),
    )
)
