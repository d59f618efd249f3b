"""Non-contiguous arrays on the compiled paths (issue 15, items 3 and 8): an in-place edit of a
strided input reaches the caller's tensor; a strided parameter (``w.data = w.t()``) is bound
(re-laid out in place, same Parameter object) on every compiled path, with eager's results."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compile_optimizer, compiled_step, fused_step, make_step


def _close(a, b, tol=1e-5) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=tol, atol=tol)


def _bump(x):
    x.add_(1.0)
    return x * 2


def _bump_and_return(x):
    x.mul_(3.0)
    return x


@pytest.mark.parametrize("fn", [_bump, _bump_and_return])
def test_in_place_edit_of_a_strided_input_reaches_the_caller(fn):
    eager_in = lucid.arange(6.0).reshape(3, 2).T
    compiled_in = lucid.arange(6.0).reshape(3, 2).T
    assert not compiled_in._data.flags.c_contiguous
    cf = lucid.compile(fn)
    for _ in range(2):  # the miss, then the hit
        out_e = fn(eager_in)
        out_c = cf(compiled_in)
        _close(compiled_in, eager_in)
        _close(out_c, out_e)
        assert not compiled_in._data.flags.c_contiguous  # the caller's strides are kept
    if fn is _bump_and_return:
        assert out_c is compiled_in


def test_in_place_edit_of_a_strided_input_inside_a_tuple():
    def f(pair):
        pair[0].add_(1.0)
        return pair[0] + pair[1]

    a = lucid.zeros(3, 2).T
    b = lucid.ones(2, 3)
    out = lucid.compile(f)((a, b))
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 2.0))


def _transposed_linear(seed: int = 0) -> nn.Sequential:
    lucid.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3))
    w = model[0].weight
    w.data = w.t()
    assert not w._data.flags.c_contiguous
    return model


def _x():
    return lucid.tensor(np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32))


def _y():
    return lucid.tensor(np.array([0, 1, 2, 0]))


def test_strided_parameter_forward_and_grad_mode():
    model = _transposed_linear()
    ref = copy.deepcopy(model)
    w = model[0].weight
    cm = lucid.compile(model)
    x = _x()
    with lucid.no_grad():
        _close(cm(x), ref(x))
    assert model[0].weight is w  # the same Parameter object, now C-contiguous
    model2 = _transposed_linear()
    ref2 = copy.deepcopy(model2)
    cm2 = lucid.compile(model2)
    cm2(x).sum().backward()
    ref2(x).sum().backward()
    _close(model2[0].weight.grad, ref2[0].weight.grad)


def test_strided_parameter_training_entry_points():
    x, y = _x(), _y()
    ref = _transposed_linear()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    F.cross_entropy(ref(x), y).backward()
    ref_grad = ref[0].weight.grad.numpy().copy()
    ref_opt.step()

    m1 = _transposed_linear()
    loss = make_step(m1, F.cross_entropy)(x, y)
    loss.backward()
    np.testing.assert_allclose(m1[0].weight.grad.numpy(), ref_grad, rtol=1e-5, atol=1e-6)

    m2 = _transposed_linear()
    compiled_step(m2, x, F.cross_entropy, y)
    np.testing.assert_allclose(m2[0].weight.grad.numpy(), ref_grad, rtol=1e-5, atol=1e-6)

    m3 = _transposed_linear()
    w3 = m3[0].weight
    fused_step(m3, F.cross_entropy, optim.SGD(m3.parameters(), lr=0.1))(x, y)
    assert m3[0].weight is w3
    _close(w3, ref[0].weight)

    m4 = _transposed_linear()
    opt4 = compile_optimizer(optim.SGD(m4.parameters(), lr=0.1))
    F.cross_entropy(m4(x), y).backward()
    opt4.step()
    _close(m4[0].weight, ref[0].weight)


def test_a_remaining_feed_error_names_the_parameter():
    model = nn.Sequential(nn.Linear(6, 3))
    model[0].weight._data.flags.writeable = False  # updated in place by the step: refused
    step = fused_step(model, F.cross_entropy, optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"parameter '0\.weight' is updated in place") as info:
        step(_x(), _y())
    assert "feed " not in str(info.value)


def test_name_feeds():
    from lucid.compile._binding import name_feeds

    roles = ["input:0", "param:fc.weight", "buffer:bn.running_mean", "rng"]
    assert name_feeds("feed 1 must be C-contiguous", roles) == (
        "parameter 'fc.weight' must be C-contiguous"
    )
    assert name_feeds("feed 2 has dtype", roles) == "buffer 'bn.running_mean' has dtype"
    assert name_feeds("feed 3 x", roles) == "feed 'rng' x"
    assert name_feeds("feed 9 x", roles) == "feed 9 x"
