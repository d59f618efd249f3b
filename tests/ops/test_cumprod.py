"""cumprod: values against numpy, gradients (zeros included) against float64 finite differences
and PyTorch, the compiled Hillis-Steele scan against eager."""

import numpy as np
import pytest

import lucid
from lucid.testing import assert_close, gradcheck

# Row 0 has two zeros (the first gets a gradient, everything after it none), row 1 one zero at
# the start, row 2 none.
WITH_ZEROS = np.array(
    [
        [1.5, -2.0, 0.0, 3.0, 0.0, 0.5],
        [0.0, 2.0, -1.5, 0.5, 1.2, 2.0],
        [0.7, -1.1, 2.0, 0.9, 1.3, -0.4],
    ]
)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_values_match_numpy(dim):
    x = np.random.default_rng(3).standard_normal((4, 5))
    assert_close(lucid.tensor(x).cumprod(dim), np.cumprod(x, axis=dim))
    assert_close(lucid.cumprod(lucid.tensor(WITH_ZEROS), dim), np.cumprod(WITH_ZEROS, axis=dim))


def test_integer_inputs_accumulate_in_int64_and_dtype_overrides():
    t = lucid.tensor([1, 2, 3, 4], dtype=lucid.int16)
    assert t.cumprod(0).dtype == lucid.int64
    assert t.cumprod(0).tolist() == [1, 2, 6, 24]
    assert t.cumprod(0, dtype=lucid.float32).dtype == lucid.float32


def test_bad_dim_is_refused():
    with pytest.raises((ValueError, IndexError), match="cumprod"):
        lucid.ones(2, 3).cumprod(2)


@pytest.mark.parametrize("dim", [0, 1])
def test_gradient_with_zeros_against_finite_differences(dim):
    gradcheck(lambda t: lucid.cumprod(t, dim), lucid.tensor(WITH_ZEROS, requires_grad=True))


def test_second_order_gradient_with_zeros():
    # The VJP is itself built of differentiable registry ops (cumprod included).
    def first_grad(t):
        (g,) = lucid.autograd.grad((lucid.cumprod(t, 1) ** 2).sum(), t, create_graph=True)
        return g

    gradcheck(first_grad, lucid.tensor(WITH_ZEROS[:2], requires_grad=True))


def test_torch_parity_values_and_gradients():
    torch = pytest.importorskip("torch")
    weights = np.random.default_rng(5).standard_normal(WITH_ZEROS.shape)
    for dim in (0, 1):
        ours = lucid.tensor(WITH_ZEROS, requires_grad=True)
        theirs = torch.tensor(WITH_ZEROS, requires_grad=True)
        out, ref = ours.cumprod(dim), theirs.cumprod(dim)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
        (out * lucid.tensor(weights)).sum().backward()
        (ref * torch.tensor(weights)).sum().backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 9])
def test_compiled_scan_matches_eager(n):
    x = lucid.tensor(np.random.default_rng(n).uniform(0.5, 1.5, (3, n)))
    compiled = lucid.compile(lambda t: t.cumprod(1))
    np.testing.assert_allclose(compiled(x).numpy(), x.cumprod(1).numpy(), rtol=1e-13)
    assert not compiled.cache_info()["reasons"]
