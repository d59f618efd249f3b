"""Reductions over empty axes compiled vs eager (issue 15, item 4): same values (NaN, -inf, 0, 1,
empty softmax) or the same exception, with the graph compiled (strict: no eager fallback)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import lucid
import lucid.nn.functional as F

REDUCTIONS = {
    "sum": lambda t, d: t.sum(d),
    "prod": lambda t, d: t.prod(d),
    "mean": lambda t, d: t.mean(d, keepdim=True),
    "var": lambda t, d: t.var(d),
    "var_c0": lambda t, d: t.var(d, correction=0),
    "std": lambda t, d: t.std(d),
    "var_mean": lambda t, d: lucid.var_mean(t, d)[0] + lucid.var_mean(t, d)[1],
    "logsumexp": lambda t, d: t.logsumexp(d),
    "softmax": lambda t, d: F.softmax(t, dim=d),
    "log_softmax": lambda t, d: F.log_softmax(t, dim=d),
    "norm": lambda t, d: t.norm(dim=d),
    "norm1": lambda t, d: t.norm(p=1, dim=d),
    "cumsum": lambda t, d: t.cumsum(d),
    "all": lambda t, d: (t > 0).all(d),
    "any": lambda t, d: (t > 0).any(d),
}
RAISING = {
    "amax": lambda t, d: t.amax(d),
    "amin": lambda t, d: t.amin(d),
    "max": lambda t, d: t.max(d)[0],
    "argmin": lambda t, d: t.argmin(d),
    "norm_inf": lambda t, d: t.norm(p=float("inf"), dim=d),
}


def _with_empty_axis(draw):
    shape = draw(array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3))
    empty = [i for i, n in enumerate(shape) if n == 0]
    if not empty:
        shape = (*shape, 0)
        empty = [len(shape) - 1]
    return shape, draw(st.sampled_from(empty))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(REDUCTIONS)), data=st.data())
def test_empty_axis_reductions_compiled_equal_eager(name, data):
    shape, axis = _with_empty_axis(data.draw)
    fn = REDUCTIONS[name]
    x = lucid.zeros(*shape)
    want = fn(x, axis)
    got = lucid.compile(lambda t: fn(t, axis), strict=True)(x)
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # NaN == NaN here


@pytest.mark.parametrize("name", sorted(RAISING))
def test_empty_axis_extreme_reductions_raise_compiled_as_eager(name):
    fn = RAISING[name]
    x = lucid.zeros(3, 0)
    with pytest.raises(IndexError, match="non-zero size") as eager:
        fn(x, 1)
    with pytest.raises(IndexError) as compiled:
        lucid.compile(lambda t: fn(t, 1), strict=True)(x)
    assert str(compiled.value) == str(eager.value)


def test_empty_axis_var_and_softmax_in_a_training_step_match_eager():
    # gradients through the compiled backward: an empty softmax axis gives an empty gradient
    x = lucid.zeros(2, 0, requires_grad=True)
    y = lucid.ones(2, 3, requires_grad=True)

    def f(a, b):
        return F.softmax(a, dim=1).sum() + b.var(1).sum() + a.logsumexp(1).exp().sum()

    want = f(x, y)
    want.backward()
    gx, gy = x.grad.numpy().copy(), y.grad.numpy().copy()
    x.grad = y.grad = None
    got = lucid.compile(f, strict=True)(x, y)
    got.backward()
    np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
    assert x.grad.shape == gx.shape
    np.testing.assert_allclose(y.grad.numpy(), gy)
