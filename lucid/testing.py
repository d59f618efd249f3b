"""Test helpers shared by Lucid's suites and by users checking their own ops (like torch.testing).

``gradcheck`` compares autograd's gradients with central finite differences in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lucid._tensor import Tensor


def _as_out(y: Any) -> Tensor:
    if isinstance(y, (tuple, list)):
        raise TypeError("gradcheck: fn must return one Tensor (use a lambda to pick an output)")
    return y


def numerical_grads(
    fn: Callable[..., Tensor], inputs: Sequence[Tensor], cotangent: np.ndarray, eps: float = 1e-6
) -> list[np.ndarray | None]:
    """Central differences of ``sum(fn(*inputs) * cotangent)`` for each input that requires grad."""
    grads: list[np.ndarray | None] = []
    for x in inputs:
        if not isinstance(x, Tensor) or not x.requires_grad:
            grads.append(None)
            continue
        base = x._data
        g = np.zeros(base.shape, dtype=np.float64)
        flat = base.reshape(-1)
        gflat = g.reshape(-1)
        for i in range(flat.size):
            orig = flat[i]
            flat[i] = orig + eps
            plus = float(np.sum(_as_out(fn(*inputs))._data * cotangent))
            flat[i] = orig - eps
            minus = float(np.sum(_as_out(fn(*inputs))._data * cotangent))
            flat[i] = orig
            gflat[i] = (plus - minus) / (2 * eps)
        grads.append(g)
    return grads


def gradcheck(
    fn: Callable[..., Tensor],
    *inputs: Any,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> None:
    """Assert autograd matches finite differences. Inputs should be float64 Tensors.

    >>> x = lucid.tensor([1.0, 2.0], dtype=lucid.float64, requires_grad=True)
    >>> gradcheck(lambda t: (t * t).sum(), x)
    """
    from lucid._autograd import grad

    for x in inputs:
        if isinstance(x, Tensor) and x.requires_grad and x.dtype.name != "float64":
            raise TypeError("gradcheck needs float64 inputs for a meaningful comparison")
    out = _as_out(fn(*inputs))
    rng = np.random.default_rng(seed)
    cot = rng.standard_normal(out.shape)
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    analytic = grad(out, wrt, grad_outputs=Tensor(cot, dtype=out.dtype), allow_unused=True)
    numeric = [g for g in numerical_grads(fn, inputs, cot, eps) if g is not None]
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        a_np = np.zeros_like(n) if a is None else a._data
        if a_np.shape != n.shape:
            raise AssertionError(f"gradient {i}: shape {a_np.shape} != expected {n.shape}")
        if not np.allclose(a_np, n, atol=atol, rtol=rtol):
            err = np.max(np.abs(a_np - n))
            raise AssertionError(
                f"gradient {i} differs from finite differences (max abs err {err:.3g})\n"
                f"analytic:\n{a_np}\nnumeric:\n{n}"
            )


def assert_close(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Values (and shapes) of two tensors/arrays agree within tolerance."""
    a = actual._data if isinstance(actual, Tensor) else np.asarray(actual)
    e = expected._data if isinstance(expected, Tensor) else np.asarray(expected)
    if a.shape != e.shape:
        raise AssertionError(f"shape {a.shape} != expected {e.shape}")
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
