"""Pieces shared by the optimizers' updates, step scalars and state (mostly the Adam family:
Adam, AdamW, RAdam, NAdam, Adamax). Every update piece follows the optimizer contract of
``lucid.optim.optimizer``: Lucid ops and ``copy_`` only, one write per tensor, no branching on a
tensor's value."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_betas, check_nonnegative, new_step_tensor


def begin_step(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    weight_decay: float,
    decoupled_weight_decay: bool = False,
    decay_factor: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Count the step and return ``(grad, decayed)``: the gradient negated when maximizing and
    with L2 weight decay added, and the parameter value the update is subtracted from (shrunk
    by ``decay_factor = 1 - lr * weight_decay`` under decoupled weight decay)."""
    if maximize:
        grad = -grad
    state["step"].add_(1)
    decayed = param
    if use_weight_decay:
        if decoupled_weight_decay:
            decayed = param * decay_factor
        else:
            grad = grad + param * weight_decay
    return grad, decayed


def update_moments(
    state: dict[str, Tensor],
    grad: Tensor,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
) -> tuple[Tensor, Tensor]:
    """Update the running means of the gradient (``exp_avg``) and of its square
    (``exp_avg_sq``) in place and return both."""
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.copy_(exp_avg * beta1 + grad * one_minus_beta1)
    exp_avg_sq.copy_(exp_avg_sq * beta2 + grad * grad * one_minus_beta2)
    return exp_avg, exp_avg_sq


def weight_decay_scalars(group: dict[str, Any]) -> dict[str, Any]:
    """The weight decay inputs of ``begin_step`` (L2 or decoupled) for a parameter group."""
    lr, wd = group["lr"], group["weight_decay"]
    return {
        "use_weight_decay": wd != 0,
        "decoupled_weight_decay": bool(group["decoupled_weight_decay"]),
        "weight_decay": wd,
        "decay_factor": 1.0 - lr * wd,
    }


def moment_scalars(beta1: float, beta2: float) -> dict[str, float]:
    """The inputs of ``update_moments`` for the betas ``(beta1, beta2)``."""
    return {
        "beta1": beta1,
        "one_minus_beta1": 1.0 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1.0 - beta2,
    }


def init_zero_state(p: Tensor, state: dict[str, Any], *names: str) -> bool:
    """On a parameter's first step, create its step counter and a zero buffer like ``p`` for
    each of ``names``; True when it created them."""
    if state:
        return False
    state["step"] = new_step_tensor()
    for name in names:
        state[name] = lucid.zeros_like(p)
    return True


class BetasOptimizer(Optimizer):
    """Base of the Adam family: validates ``lr``, ``eps``, ``weight_decay`` (and the extra
    options named in ``_nonnegative_options``) and ``betas``."""

    _nonnegative_options: tuple[str, ...] = ("lr", "eps", "weight_decay")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        **options: Any,
    ):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, **options)
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, *self._nonnegative_options)
        check_betas(group)
