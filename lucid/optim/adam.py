"""Adam and AdamW (Adam with decoupled weight decay), with AMSGrad and maximization."""

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


def adam_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    amsgrad: bool,
    use_weight_decay: bool,
    decoupled_weight_decay: bool,
    weight_decay: float,
    decay_factor: float,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
    step_size: float,
    bias_correction2_sqrt: float,
    eps: float,
) -> None:
    """One Adam/AdamW update of ``param`` and its state in place (PyTorch's algorithm)."""
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
    second_moment = exp_avg_sq
    if amsgrad:
        second_moment = state["max_exp_avg_sq"]
        second_moment.copy_(lucid.maximum(second_moment, exp_avg_sq))
    denom = lucid.sqrt(second_moment) / bias_correction2_sqrt + eps
    param.copy_(decayed - exp_avg / denom * step_size)


def adam_scalars(group: dict[str, Any], step: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``adam_update`` for step number ``step``."""
    lr = group["lr"]
    beta1, beta2 = group["betas"]
    return {
        "maximize": bool(group["maximize"]),
        "amsgrad": bool(group["amsgrad"]),
        **weight_decay_scalars(group),
        **moment_scalars(beta1, beta2),
        "step_size": lr / (1.0 - beta1**step),
        "bias_correction2_sqrt": (1.0 - beta2**step) ** 0.5,
        "eps": group["eps"],
    }


class Adam(BetasOptimizer):
    """Adam (``torch.optim.Adam``): bias-corrected first and second moment estimates, optional
    AMSGrad, L2 weight decay (or decoupled weight decay, which is AdamW) and maximization."""

    _static_keys = frozenset({"maximize", "amsgrad", "use_weight_decay", "decoupled_weight_decay"})
    _update = staticmethod(adam_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        decoupled_weight_decay: bool = False,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled_weight_decay=decoupled_weight_decay,
        )

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        fresh = init_zero_state(p, state, "exp_avg", "exp_avg_sq")
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = lucid.zeros_like(p)
        return fresh

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return adam_scalars(group, next_step(state))


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): Adam whose weight decay shrinks the parameter directly
    (``p *= 1 - lr * weight_decay``) instead of being added to the gradient."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            maximize=maximize,
            decoupled_weight_decay=True,
        )
