"""RAdam: Adam with a rectified (variance-corrected) adaptive learning rate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import (
    Optimizer,
    check_betas,
    check_nonnegative,
    new_step_tensor,
    next_step,
)


def radam_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    decoupled_weight_decay: bool,
    rectify: bool,
    weight_decay: float,
    decay_factor: float,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
    lr: float,
    bias_correction1: float,
    bias_correction2_sqrt: float,
    rect: float,
    eps: float,
) -> None:
    """One RAdam update of ``param`` and its state in place (PyTorch's algorithm). While the
    variance of the adaptive learning rate is intractable (``rho_t <= 5``, ``rectify`` False)
    the update is plain bias-corrected momentum."""
    if maximize:
        grad = -grad
    state["step"].add_(1)
    decayed = param
    if use_weight_decay:
        if decoupled_weight_decay:
            decayed = param * decay_factor
        else:
            grad = grad + param * weight_decay
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.copy_(exp_avg * beta1 + grad * one_minus_beta1)
    exp_avg_sq.copy_(exp_avg_sq * beta2 + grad * grad * one_minus_beta2)
    update = exp_avg / bias_correction1 * lr
    if rectify:
        adaptive_lr = bias_correction2_sqrt / (lucid.sqrt(exp_avg_sq) + eps)
        update = update * adaptive_lr * rect
    param.copy_(decayed - update)


def radam_scalars(group: dict[str, Any], step: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``radam_update`` for step number ``step``."""
    lr, wd = group["lr"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    bias_correction2 = 1.0 - beta2**step
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * step * beta2**step / bias_correction2
    rectify = rho_t > 5.0
    rect = 0.0
    if rectify:
        rect = (
            (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
        ) ** 0.5
    return {
        "maximize": bool(group["maximize"]),
        "use_weight_decay": wd != 0,
        "decoupled_weight_decay": bool(group["decoupled_weight_decay"]),
        "rectify": rectify,
        "weight_decay": wd,
        "decay_factor": 1.0 - lr * wd,
        "beta1": beta1,
        "one_minus_beta1": 1.0 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1.0 - beta2,
        "lr": lr,
        "bias_correction1": 1.0 - beta1**step,
        "bias_correction2_sqrt": bias_correction2**0.5,
        "rect": rect,
        "eps": group["eps"],
    }


class RAdam(Optimizer):
    """RAdam (``torch.optim.RAdam``) with L2 or decoupled weight decay and maximization."""

    _static_keys = frozenset({"maximize", "use_weight_decay", "decoupled_weight_decay", "rectify"})
    _update = staticmethod(radam_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        decoupled_weight_decay: bool = False,
        *,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "eps", "weight_decay")
        check_betas(group)

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        state["exp_avg"] = lucid.zeros_like(p)
        state["exp_avg_sq"] = lucid.zeros_like(p)
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return radam_scalars(group, next_step(state))
