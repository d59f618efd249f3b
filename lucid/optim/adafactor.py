"""Adafactor: Adam-like steps from factored (row and column) second-moment estimates."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative, new_step_tensor, next_step


def _at_least(x: Tensor, bound: float, squared: bool = False) -> Tensor:
    # Products with a tensor keep ``bound`` an operator operand, so a compiled step can feed it.
    floor = lucid.ones_like(x) * bound
    return lucid.maximum(x, floor * bound if squared else floor)


def adafactor_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    eps1_given: bool,
    eps1: float,
    eps2: float,
    one_minus_beta2: float,
    rho: float,
    decay_factor: float,
    d: float,
) -> None:
    """One Adafactor update of ``param`` and its state in place (PyTorch's algorithm): a matrix
    (or batch of matrices) keeps the running means of the squared gradient's rows and columns,
    anything smaller the full running mean; the step is relative to the parameter's RMS."""
    if maximize:
        grad = -grad
    state["step"].add_(1)
    if not eps1_given:  # the dtype's machine epsilon, as torch
        eps1 = float(np.finfo(param.dtype.numpy).eps)
    numel = max(param.numel(), 1)
    alpha = _at_least(param.norm() / math.sqrt(numel), eps2) * rho
    squared = grad * grad
    if grad.ndim > 1:
        row_var, col_var = state["row_var"], state["col_var"]
        row_var.copy_(row_var + (squared.mean(-1, keepdim=True) - row_var) * one_minus_beta2)
        col_var.copy_(col_var + (squared.mean(-2, keepdim=True) - col_var) * one_minus_beta2)
        variance = (row_var @ col_var) / _at_least(row_var.mean(-2, keepdim=True), eps1)
    else:
        variance = state["variance"]
        variance.copy_(variance + (squared - variance) * one_minus_beta2)
    update = _at_least(variance, eps1, squared=True).rsqrt() * grad
    denom = _at_least(update.norm() / math.sqrt(numel) / d, 1.0)
    param.copy_(param * decay_factor - update * (alpha / denom))


class Adafactor(Optimizer):
    """Adafactor (``torch.optim.Adafactor``): ``lr`` caps the relative step ``1/sqrt(t)``,
    ``beta2_decay`` sets the second-moment decay ``1 - t**beta2_decay``, ``eps = (eps1, eps2)``
    (eps1 None: the dtype's epsilon), ``d`` clips the update's RMS, decoupled ``weight_decay``."""

    _static_keys = frozenset({"maximize", "eps1_given"})
    _update = staticmethod(adafactor_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr,
            beta2_decay=beta2_decay,
            eps=tuple(eps),
            d=d,
            weight_decay=weight_decay,
            maximize=maximize,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "weight_decay", "d")
        eps = group["eps"]
        if len(eps) != 2:
            raise ValueError(f"Invalid eps: {eps!r}; expected a pair (eps1 or None, eps2)")
        if eps[0] is not None and not eps[0] >= 0.0:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not eps[1] >= 0.0:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not group["beta2_decay"] <= 0:
            raise ValueError(f"beta2_decay should be <= 0 but is: {group['beta2_decay']}")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        if p.ndim > 1:
            state["row_var"] = lucid.zeros(*p.shape[:-1], 1, dtype=p.dtype)
            state["col_var"] = lucid.zeros(*p.shape[:-2], 1, p.shape[-1], dtype=p.dtype)
        else:
            state["variance"] = lucid.zeros_like(p)
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        step = next_step(state)
        eps1, eps2 = group["eps"]
        return {
            "maximize": bool(group["maximize"]),
            "eps1_given": eps1 is not None,
            "eps1": 0.0 if eps1 is None else eps1,
            "eps2": eps2,
            "one_minus_beta2": step ** group["beta2_decay"],
            "rho": min(group["lr"], 1.0 / math.sqrt(step)),
            "decay_factor": 1.0 - group["lr"] * group["weight_decay"],
            "d": group["d"],
        }
