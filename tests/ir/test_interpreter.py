"""The reference interpreter runs imported modules to the eager result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lucid
from lucid.ir import import_trace, interpret, parse_ir, print_ir
from lucid.trace import trace


def _run_both(fn, *arrays, captured=()):
    inputs = [lucid.tensor(a) for a in arrays]
    eager = fn(*inputs)
    tr = trace(fn, *inputs)
    module = import_trace(tr)
    module.verify()
    feeds = {f"input:{i}": a for i, a in enumerate(arrays)}
    feeds.update({f"capture:{i}": c.numpy() for i, c in enumerate(captured)})
    # the printed module runs the same as the in-memory one
    reparsed = parse_ir(print_ir(module))
    return eager, interpret(module, feeds), interpret(reparsed, feeds)


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4))
def test_broadcast_arithmetic_matches_eager(shapes):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shapes.input_shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes.input_shapes[1]).astype(np.float32)
    eager, got, got_text = _run_both(lambda p, q: (p * q - 0.5 * p).exp() + 1, a, b)
    np.testing.assert_allclose(got[0], eager.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got_text[0], got[0])
    assert got[0].dtype == eager.numpy().dtype


@pytest.mark.parametrize(
    "dtype, scalar",
    [(np.int32, 2), (np.int64, 2.5), (np.float16, 3.0), (np.float64, 0.1), (np.bool_, True)],
)
def test_weak_scalar_promotion_matches_eager(dtype, scalar):
    a = np.arange(6).reshape(2, 3).astype(dtype)
    eager, got, _ = _run_both(lambda p: p * scalar + scalar, a)
    assert got[0].dtype == eager.numpy().dtype
    np.testing.assert_array_equal(got[0], eager.numpy())


def test_reductions_and_shapes_match_eager():
    a = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)

    def f(t):
        s = t.sum((0, 2), keepdim=True)
        return (t * s).reshape(6, 4).sum(1), t.expand(5, 2, 3, 4).sum(0)

    eager, got, _ = _run_both(f, a)
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5)


def test_captured_tensor_is_fed_by_role():
    w = lucid.tensor(np.random.default_rng(2).standard_normal((3,)).astype(np.float32))
    a = np.ones((2, 3), np.float32)
    eager, got, _ = _run_both(lambda t: t * w, a, captured=(w,))
    np.testing.assert_array_equal(got[0], eager.numpy())


def test_missing_feed_and_wrong_count_are_clear_errors():
    module = import_trace(trace(lambda t: t * 2, lucid.tensor([1.0])))
    with pytest.raises(ValueError, match=r"no value given for the feeds \['input:0'\]"):
        interpret(module, {})
    with pytest.raises(ValueError, match="takes 1 inputs, got 2"):
        interpret(module, [np.ones(1), np.ones(1)])


@given(st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_symbolic_trace_runs_on_any_size(shape):
    from lucid.trace import _tracing

    with _tracing() as tr:
        a = tr.input((None, *shape[1:]))
        t = tr.finish((a * 3).sum(0))
    arr = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    got = interpret(import_trace(t), [arr])[0]
    np.testing.assert_allclose(got, (arr * 3).sum(0), rtol=1e-5)
