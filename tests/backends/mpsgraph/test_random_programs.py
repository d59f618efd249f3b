"""Random prim programs (hypothesis): a prim module of random elementwise, binary, reduction,
transpose and softmax steps, compiled by mpsgraph-reference, equals the prim interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir.prim.dialect import create_prim, prim_type
from lucid.ir.prim.interpreter import interpret_prim

UNARY = ["neg", "abs", "square", "relu", "exp", "tanh", "sigmoid", "erf", "floor", "sin"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "variance"]


@st.composite
def programs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    steps = []
    rank = len(shape)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "transpose", "softmax"]))
        if kind == "unary":
            steps.append((draw(st.sampled_from(UNARY)), {}))
        elif kind == "binary":
            steps.append((draw(st.sampled_from(BINARY)), {"other": True}))
        elif kind == "reduce" and rank > 1:
            axis = draw(st.integers(0, rank - 1))
            keep = draw(st.booleans())
            steps.append((draw(st.sampled_from(REDUCE)), {"axes": [axis], "keepdims": keep}))
            rank -= 0 if keep else 1
        elif kind == "transpose":
            steps.append(("transpose", {"perm": list(draw(st.permutations(range(rank))))}))
        elif kind == "softmax":
            steps.append(("softmax", {"axis": draw(st.integers(-rank, rank - 1))}))
    return shape, steps, draw(st.integers(0, 2**31 - 1))


def _module(shape, steps):
    """The prim module of ``steps`` (the input, then one feed per binary step's other operand),
    and the shapes of its feeds."""
    feed_shapes = [shape]
    cur = P.Aval(shape, "f32")
    for name, attrs in steps:
        attrs = {k: v for k, v in attrs.items() if k != "other"}
        operands = [cur]
        if name in BINARY:
            feed_shapes.append(cur.shape[1:])
            operands.append(P.Aval(cur.shape[1:], "f32"))
        (cur,) = P.infer(name, operands, attrs)
    types = [prim_type(s, "f32") for s in feed_shapes]
    block = x.Block(arg_types=types)
    value, k = block.args[0], 1
    for name, attrs in steps:
        attrs = {k2: v for k2, v in attrs.items() if k2 != "other"}
        operands = [value]
        if name in BINARY:
            operands.append(block.args[k])
            k += 1
        op = create_prim(name, operands, attrs)
        block.add_op(op)
        value = op.results[0]
    block.add_op(x.func.ReturnOp(value))
    fn = x.func.FuncOp("forward", (types, [value.type]), x.Region(block))
    return x.ModuleOp([fn]), feed_shapes


@settings(max_examples=30, deadline=None)
@given(programs())
def test_random_prim_program_matches_the_prim_interpreter(case):
    shape, steps, seed = case
    module, feed_shapes = _module(shape, steps)
    module.verify()
    rng = np.random.default_rng(seed)
    feeds = [rng.standard_normal(s).astype(np.float32) for s in feed_shapes]
    (want,) = interpret_prim(module, feeds)
    (got,) = MPSGraphReferenceBackend().compile(module).run(feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
