"""diag, diagonal, diag_embed: values against numpy, gradients by finite differences, compiled
equal to eager; torch parity when torch is installed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid.testing import gradcheck

RNG = np.random.default_rng(11)


def _x(*shape):
    return lucid.tensor(RNG.standard_normal(shape), dtype=lucid.float64, requires_grad=True)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 4),
    cols=st.integers(0, 4),
    offset=st.integers(-5, 5),
    batch=st.integers(1, 2),
)
def test_diagonal_matches_numpy(rows, cols, offset, batch):
    a = RNG.standard_normal((batch, rows, cols))
    got = lucid.diagonal(lucid.tensor(a), offset, 1, 2)
    np.testing.assert_array_equal(got.numpy(), np.diagonal(a, offset, 1, 2))
    got_swapped = lucid.tensor(a).diagonal(offset, dim1=2, dim2=1)
    np.testing.assert_array_equal(got_swapped.numpy(), np.diagonal(a, offset, 2, 1))


@pytest.mark.parametrize("offset", [-2, 0, 1])
def test_diag_embed_places_values_and_round_trips(offset):
    v = RNG.standard_normal((2, 3))
    out = lucid.diag_embed(lucid.tensor(v), offset)
    assert out.shape == (2, 3 + abs(offset), 3 + abs(offset))
    for b in range(2):
        np.testing.assert_array_equal(out.numpy()[b], np.diag(v[b], offset))
    np.testing.assert_array_equal(lucid.diagonal(out, offset, -2, -1).numpy(), v)
    moved = lucid.diag_embed(lucid.tensor(v), offset, dim1=0, dim2=2)
    np.testing.assert_array_equal(moved.numpy(), np.moveaxis(out.numpy(), (1, 2), (0, 2)))


def test_diag_embed_keeps_infinities_off_the_diagonal_zero():
    out = lucid.diag_embed(lucid.tensor([float("inf"), 1.0]))
    assert out.tolist() == [[float("inf"), 0.0], [0.0, 1.0]]


def test_diag_of_vector_and_matrix():
    v = lucid.tensor([1.0, 2.0])
    np.testing.assert_array_equal(lucid.diag(v, -1).numpy(), np.diag([1.0, 2.0], -1))
    m = RNG.standard_normal((3, 4))
    np.testing.assert_array_equal(lucid.tensor(m).diag(1).numpy(), np.diag(m, 1))
    with pytest.raises(ValueError, match="1-d or 2-d"):
        lucid.diag(lucid.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="must differ"):
        lucid.diagonal(lucid.zeros(2, 2), 0, 1, -1)


def test_gradients_by_finite_differences():
    gradcheck(lambda t: lucid.diagonal(t, 1, 2, 0).square().sum(), _x(3, 2, 4))
    gradcheck(lambda t: lucid.diag_embed(t, -1, 0, 2).sin().sum(), _x(2, 3))
    gradcheck(lambda t: lucid.diag(t, 1).exp().sum(), _x(3))
    gradcheck(lambda t: lucid.diag(t, -1).exp().sum(), _x(3, 3))


def test_compiled_equals_eager_with_gradients():
    class Model(lucid.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lucid.nn.Parameter(lucid.randn(3, 4, dtype=lucid.float64))

        def forward(self, x):
            square = lucid.diag_embed(x @ self.w, 1)
            return lucid.diagonal(square @ square.mT, -1, -2, -1).sum(-1) + self.w.diag().sum()

    model = Model()
    x = lucid.randn(2, 3, dtype=lucid.float64)
    compiled = lucid.compile(model, strict=True)
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), atol=1e-12)
    model(x).square().sum().backward()
    want = model.w.grad.numpy().copy()
    model.zero_grad()
    compiled(x).square().sum().backward()
    np.testing.assert_allclose(model.w.grad.numpy(), want, atol=1e-10)


def test_torch_parity_values_and_gradients():
    torch = pytest.importorskip("torch")
    a = RNG.standard_normal((2, 3, 5))
    x, t = lucid.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    out = lucid.diag_embed(lucid.diagonal(x, -1, 0, 2), 2, 1, 0)
    ref = torch.diag_embed(torch.diagonal(t, -1, 0, 2), 2, 1, 0)
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    g = RNG.standard_normal(tuple(ref.shape))
    out.backward(lucid.tensor(g))
    ref.backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())
