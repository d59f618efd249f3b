"""RAdam: Adam with a rectified (variance-corrected) adaptive learning rate."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim._functional import (
    BetasOptimizer,
    begin_step,
    init_zero_state,
    moment_scalars,
    update_moments,
    weight_decay_scalars,
)
from lucid.optim.optimizer import next_step


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
    grad, decayed = begin_step(
        param,
        grad,
        state,
        maximize=maximize,
        use_weight_decay=use_weight_decay,
        weight_decay=weight_decay,
        decoupled_weight_decay=decoupled_weight_decay,
        decay_factor=decay_factor,
    )
    exp_avg, exp_avg_sq = update_moments(
        state, grad, beta1, one_minus_beta1, beta2, one_minus_beta2
    )
    update = exp_avg / bias_correction1 * lr
    if rectify:
        adaptive_lr = bias_correction2_sqrt / (lucid.sqrt(exp_avg_sq) + eps)
        update = update * adaptive_lr * rect
    param.copy_(decayed - update)


def radam_scalars(group: dict[str, Any], step: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``radam_update`` for step number ``step``."""
    lr = group["lr"]
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
        "rectify": rectify,
        **weight_decay_scalars(group),
        **moment_scalars(beta1, beta2),
        "lr": lr,
        "bias_correction1": 1.0 - beta1**step,
        "bias_correction2_sqrt": bias_correction2**0.5,
        "rect": rect,
        "eps": group["eps"],
    }


class RAdam(BetasOptimizer):
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
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        return init_zero_state(p, state, "exp_avg", "exp_avg_sq")

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return radam_scalars(group, next_step(state))
