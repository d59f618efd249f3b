"""Random prim programs (hypothesis): each op's emission run by the reference builder, chained,
equals the same chain under the prim table's numpy semantics (what the prim interpreter runs)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid.backends import prim_ops as P
from lucid.backends.mpsgraph.emit import Val, emit_op
from lucid.backends.mpsgraph.reference import ReferenceBuilder, run_program

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


@settings(max_examples=30, deadline=None)
@given(programs())
def test_random_prim_program_matches_the_prim_semantics(case):
    shape, steps, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    b = ReferenceBuilder()
    cur = Val(b.placeholder(shape, "f32", "input:0"), shape, "f32")
    want = x
    feeds = [x]
    for name, attrs in steps:
        attrs = dict(attrs)
        if attrs.pop("other", False):
            other = rng.standard_normal(want.shape[1:]).astype(np.float32)
            feeds.append(other)
            o = Val(
                b.placeholder(other.shape, "f32", f"input:{len(feeds) - 1}"), other.shape, "f32"
            )
            (cur,), _ = emit_op(b, name, [cur, o], attrs)
            (want,) = P.evaluate(name, [want, other], attrs)
        else:
            (cur,), _ = emit_op(b, name, [cur], attrs)
            (want,) = P.evaluate(name, [want], attrs)
    (got,) = run_program(b.program([cur.id], []), feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
