"""Gradient clipping (``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``), eager.

The arithmetic follows torch's: the total norm is the ``norm_type``-norm of the per-gradient
norms, each gradient is multiplied by ``min(max_norm / (total_norm + 1e-6), 1)`` computed as a
tensor in the gradients' dtype, and every gradient is scaled (by 1 when under the limit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import lucid
from lucid._tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]

_Tensors = Tensor | Iterable[Tensor]


def _as_list(tensors: _Tensors, what: str) -> list[Tensor]:
    items = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    for t in items:
        if not isinstance(t, Tensor):
            raise TypeError(f"{what}: expected Tensors, got {type(t).__name__}")
        if t.is_traced:
            raise RuntimeError(
                f"{what} is eager only: it got a trace tensor (inside lucid.compile); clip "
                "outside the compiled function"
            )
    return items


def _grads(parameters: _Tensors, what: str) -> list[Tensor]:
    grads = [p.grad for p in _as_list(parameters, what) if p.grad is not None]
    for g in grads:
        if g.is_traced:
            raise RuntimeError(f"{what} is eager only: a gradient is a trace tensor")
    return grads


def parse_norm_type(norm_type: float | int | str) -> float:
    """``norm_type`` as a float (``'inf'``/``'-inf'`` accepted); TypeError for anything else."""
    if norm_type in ("inf", "-inf"):
        return float(norm_type)
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)):
        raise TypeError(f"norm_type must be a number or 'inf', got {norm_type!r}")
    return float(norm_type)


def total_norm_of(tensors: list[Tensor], norm_type: float) -> Tensor:
    """The norm of the tensors' norms (torch's formula); Lucid ops only, so a compiled training
    step traces the same arithmetic (``fused_step(..., max_grad_norm=)``)."""
    return lucid.norm(lucid.stack([lucid.norm(t, norm_type) for t in tensors]), norm_type)


def clip_coefficient(max_norm: float, total_norm: Tensor) -> Tensor:
    """``min(max_norm / (total_norm + 1e-6), 1)`` as a 0-d tensor in ``total_norm``'s dtype."""
    return lucid.clamp(max_norm / (total_norm + 1e-6), max=1.0)


def get_total_norm(
    tensors: _Tensors,
    norm_type: float | int | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together, as if concatenated into one vector
    (``inf`` for the largest absolute value). A 0-d tensor; ``tensor(0.)`` for no tensors."""
    items = _as_list(tensors, "get_total_norm")
    p = parse_norm_type(norm_type)
    if not items:
        return lucid.tensor(0.0)
    with lucid.no_grad():
        total = total_norm_of([t.detach() for t in items], p)
    if error_if_nonfinite and not math.isfinite(float(total.item())):
        raise RuntimeError(
            f"The total norm of order {p} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set `error_if_nonfinite=False`"
        )
    return total


def clip_grads_with_norm_(
    parameters: _Tensors,
    max_norm: float,
    total_norm: Tensor,
    foreach: bool | None = None,
) -> None:
    """Scale the gradients of ``parameters`` in place by ``min(max_norm / (total_norm + 1e-6),
    1)``; ``total_norm`` is usually ``get_total_norm`` of those gradients."""
    grads = _grads(parameters, "clip_grads_with_norm_")
    max_norm = float(max_norm)
    if not grads:
        return
    if not isinstance(total_norm, Tensor):
        total_norm = lucid.tensor(float(total_norm))
    with lucid.no_grad():
        coef = clip_coefficient(max_norm, total_norm)
        for g in grads:
            g.mul_(coef.to(g.dtype))


def clip_grad_norm_(
    parameters: _Tensors,
    max_norm: float,
    norm_type: float | int | str = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Clip the gradients of ``parameters`` in place so their total ``norm_type``-norm is at most
    ``max_norm`` (about: the divisor is ``total_norm + 1e-6``); returns the total norm before
    clipping, a 0-d tensor. With ``error_if_nonfinite`` a NaN/inf total norm raises
    ``RuntimeError`` and leaves the gradients untouched; otherwise they are scaled by it (NaN).
    Parameters without a gradient are skipped. Eager only."""
    parameters = _as_list(parameters, "clip_grad_norm_")
    grads = _grads(parameters, "clip_grad_norm_")
    max_norm = float(max_norm)
    if not grads:
        return lucid.tensor(0.0)
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_value_(parameters: _Tensors, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` in place into ``[-clip_value, clip_value]``."""
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float)):
        raise TypeError(f"clip_value must be a number, got {type(clip_value).__name__}")
    clip_value = float(clip_value)
    with lucid.no_grad():
        for g in _grads(parameters, "clip_grad_value_"):
            g.clamp_(-clip_value, clip_value)
