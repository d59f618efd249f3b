import numpy as np
import pytest

import lucid
from lucid.testing import gradcheck


def f64(*shape, seed=0):
    return lucid.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def test_broadcast_gradients_reduce_to_operand_shapes():
    x, y = f64(1, 3), f64(2, 1, seed=1)
    gradcheck(lambda a, b: (a * b).exp(), x, y)


def test_grad_accumulates_across_backward_calls():
    x = f64(3)
    (x * 2.0).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 5.0))


def test_backward_on_non_scalar_needs_gradient():
    x = f64(3)
    with pytest.raises(RuntimeError, match="scalar outputs"):
        (x * 2.0).backward()


def test_second_backward_without_retain_graph_raises():
    x = f64(3)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_retain_graph_allows_second_backward():
    x = f64(3)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def test_inplace_modification_of_saved_tensor_is_detected():
    x = f64(3)
    y = x.exp()
    z = y.sum()
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.backward()


def test_inplace_on_non_leaf_rebases_history():
    x = f64(3)
    a = x * 1.0
    a.mul_(2.0)
    a.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 2.0))


def test_inplace_on_leaf_requiring_grad_raises():
    x = f64(3)
    with pytest.raises(RuntimeError, match="leaf"):
        x.add_(1.0)


def test_no_grad_records_nothing():
    x = f64(3)
    with lucid.no_grad():
        y = x * 2.0
    assert y.grad_fn is None and not y.requires_grad


def test_autograd_grad_returns_without_accumulating():
    x = f64(3)
    (g,) = lucid.autograd.grad((x * x).sum(), x)
    np.testing.assert_allclose(g.numpy(), 2 * x.detach().numpy())
    assert x.grad is None


def test_create_graph_gives_second_derivative():
    x = f64(3)
    (g,) = lucid.autograd.grad((x * x * x).sum(), x, create_graph=True)
    (h,) = lucid.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(h.numpy(), 6 * x.detach().numpy())


def test_custom_function():
    class Square(lucid.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x * 2.0

    x = f64(4)
    Square.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy())


def test_detach_stops_gradient():
    x = f64(3)
    y = (x.detach() * x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), x.detach().numpy())
