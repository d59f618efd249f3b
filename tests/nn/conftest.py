"""Shared checks of the tests in tests/nn."""

import numpy as np
import pytest

import lucid


def _compiled_matches_eager(model, x, *, forward_atol=1e-12, rtol=1e-9, atol=1e-12):
    """``lucid.compile(model, strict=True)`` gives eager's output and parameter gradients, the
    gradients of a fixed random weighting of the output (``sum(y**2)`` can be invariant to
    parameters through a normalisation, leaving gradients that are rounding noise)."""
    compiled = lucid.compile(model, strict=True)
    np.testing.assert_allclose(
        compiled(x).detach().numpy(), model(x).detach().numpy(), atol=forward_atol
    )
    weights = lucid.randn(*model(x).shape, dtype=x.dtype)
    (model(x) * weights).sum().backward()
    want = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    (compiled(x) * weights).sum().backward()
    for p, w in zip(model.parameters(), want, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), w, rtol=rtol, atol=atol)


@pytest.fixture
def compiled_matches_eager():
    return _compiled_matches_eager
