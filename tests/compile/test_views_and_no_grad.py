"""Compiled code sees in-place writes through views as eager does, a ``no_grad`` block inside
``forward`` stops gradients as in eager, and an input no output depends on keeps ``grad`` None.

Eager views share memory with their base (numpy), so a write through ``a[:, 1]`` changes ``a``.
The tracer writes a slice's in-place update back into its base, marks the base's other views
stale (reading one is a graph break), and breaks the graph on writes through other views
(a transpose, a reshape): the call then runs eagerly, with the reason logged."""

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid import nn


def _slice_add(x):
    a = x * 1.0
    a[:, 1].add_(10.0)
    return a


def _chained_setitem(x):
    a = x * 1.0
    a[1][2] = 7.0
    return a


def _copy_into_slice(x):
    a = x * 1.0
    a[:, 0].copy_(x[:, 3])
    return a


def _relu_of_slice(x):
    a = x - 0.5
    F.relu_(a[:, :2])
    return a


def _augmented_slice(x):
    a = x * 2.0
    a[:, 1:3] += 1.0
    return a


def _view_read_after_base_write(x):
    a = x * 1.0
    v = a[:, 1]
    a.mul_(2.0)
    return v + 1.0


def _transpose_write(x):
    a = x * 1.0
    a.t().mul_(3.0)
    return a


CASES = [
    (_slice_add, False),
    (_chained_setitem, False),
    (_copy_into_slice, False),
    (_relu_of_slice, False),
    (_augmented_slice, False),
    (_view_read_after_base_write, True),
    (_transpose_write, True),
]


@pytest.mark.parametrize(("fn", "eager_only"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_in_place_writes_through_views_match_eager(fn, eager_only):
    x = lucid.tensor(np.arange(16, dtype=np.float32).reshape(4, 4) / 7)
    compiled = lucid.compile(fn)
    with lucid.no_grad():
        want = fn(x.clone())
        got = compiled(x.clone())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    # A graph break runs the signature eagerly (correct, and said); a slice write compiles.
    assert bool(compiled.cache_info()["eager_only"]) == eager_only


class _SliceOfInput(nn.Module):
    def forward(self, x):
        x[:, 1].add_(10.0)
        return x * 1.0


class _CacheWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", lucid.zeros(3, 6))

    def forward(self, x):
        self.cache[:, 2].copy_(x[:, 0])
        return self.cache.sum(1)


@pytest.mark.parametrize("cls", [_SliceOfInput, _CacheWrite])
def test_a_write_to_a_slice_of_an_input_or_buffer_is_written_back(cls):
    x = lucid.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    eager, comp = cls(), cls()
    xe, xc = x.clone(), x.clone()
    compiled = lucid.compile(comp)
    with lucid.no_grad():
        want = eager(xe)
        got = compiled(xc)
    np.testing.assert_allclose(got.numpy(), want.numpy())
    np.testing.assert_allclose(xc.numpy(), xe.numpy())
    if cls is _CacheWrite:
        np.testing.assert_allclose(comp.cache.numpy(), eager.cache.numpy())
    assert not compiled.cache_info()["eager_only"]


class _FrozenBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 3)

    def forward(self, x):
        with lucid.no_grad():
            h = self.a(x)
        return self.b(F.relu(h))


def _frozen_twins():
    lucid.manual_seed(0)
    return _FrozenBranch(), _FrozenBranch()


def test_no_grad_inside_forward_stops_the_gradient_in_make_step_and_fused_step():
    x, y = lucid.randn(6, 4), lucid.randint(0, 3, (6,))
    lucid.manual_seed(0)
    eager = _FrozenBranch()
    F.cross_entropy(eager(x), y).backward()
    assert eager.a.weight.grad is None

    lucid.manual_seed(0)
    m = _FrozenBranch()
    loss = lucid.compile.make_step(m, F.cross_entropy)(x, y)
    loss.backward()
    assert m.a.weight.grad is None
    np.testing.assert_allclose(m.b.weight.grad.numpy(), eager.b.weight.grad.numpy(), rtol=1e-5)

    lucid.manual_seed(0)
    m = _FrozenBranch()
    before = m.a.weight.numpy().copy()
    opt = lucid.optim.SGD(m.parameters(), lr=0.1)
    lucid.compile.fused_step(m, F.cross_entropy, opt)(x, y)
    np.testing.assert_array_equal(m.a.weight.numpy(), before)  # not trained, as in eager
    assert not np.allclose(m.b.weight.numpy(), eager.b.weight.numpy())  # trained


def test_an_input_no_output_depends_on_keeps_grad_none_as_in_eager():
    def f(a, b):
        return (a * 2.0).sum()

    a, b = lucid.randn(3).requires_grad_(), lucid.randn(3).requires_grad_()
    lucid.compile(f)(a, b).backward()
    np.testing.assert_allclose(a.grad.numpy(), np.full(3, 2.0, np.float32))
    assert b.grad is None  # was a zeros tensor


def _writes_its_first_argument(a, b):
    a.add_(1.0)
    return a + b


class _WritesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(lucid.zeros(3))

    def forward(self, x):
        x.add_(1.0)
        return x + self.w


@pytest.mark.parametrize("case", ["same_tensor", "overlapping_views", "a_parameter", "distinct"])
def test_an_argument_aliasing_what_the_model_writes_runs_eagerly(case):
    # The trace takes each argument as its own value; eager sees a write through every alias.
    def args(base):
        if case == "same_tensor":
            return base, base
        if case == "overlapping_views":
            return base[:2], base[:2]
        return base[:2], base[2:]

    with lucid.no_grad():
        if case == "a_parameter":
            eager, comp = _WritesItsInput(), _WritesItsInput()
            want, got = eager(eager.w), lucid.compile(comp)(comp.w)
            np.testing.assert_array_equal(comp.w.numpy(), eager.w.numpy())
        else:
            xe, xc = lucid.zeros(4), lucid.zeros(4)
            compiled = lucid.compile(_writes_its_first_argument)
            compiled(*args(lucid.zeros(4)))  # compiled and cached, then the checked calls
            want = _writes_its_first_argument(*args(xe))
            got = compiled(*args(xc))
            np.testing.assert_array_equal(xc.numpy(), xe.numpy())
            assert compiled.cache_info()["entries"] == 1
    np.testing.assert_array_equal(got.numpy(), want.numpy())
