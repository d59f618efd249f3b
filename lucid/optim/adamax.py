"""Adamax: Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim._functional import BetasOptimizer, begin_step, init_zero_state
from lucid.optim.optimizer import next_step


def adamax_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    weight_decay: float,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    eps: float,
    clr: float,
) -> None:
    """One Adamax update of ``param`` and its state in place (PyTorch's algorithm);
    ``clr = lr / (1 - beta1 ** step)``."""
    grad, _ = begin_step(
        param,
        grad,
        state,
        maximize=maximize,
        use_weight_decay=use_weight_decay,
        weight_decay=weight_decay,
    )
    exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
    exp_avg.copy_(exp_avg * beta1 + grad * one_minus_beta1)
    exp_inf.copy_(lucid.maximum(exp_inf * beta2, lucid.abs(grad) + eps))
    param.sub_(exp_avg / exp_inf * clr)


def adamax_scalars(group: dict[str, Any], step: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``adamax_update`` for step number ``step``."""
    beta1, beta2 = group["betas"]
    return {
        "maximize": bool(group["maximize"]),
        "use_weight_decay": group["weight_decay"] != 0,
        "weight_decay": group["weight_decay"],
        "beta1": beta1,
        "one_minus_beta1": 1.0 - beta1,
        "beta2": beta2,
        "eps": group["eps"],
        "clr": group["lr"] / (1.0 - beta1**step),
    }


class Adamax(BetasOptimizer):
    """Adamax (``torch.optim.Adamax``) with L2 weight decay and maximization."""

    _static_keys = frozenset({"maximize", "use_weight_decay"})
    _update = staticmethod(adamax_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        *,
        maximize: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, maximize=maximize)

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        return init_zero_state(p, state, "exp_avg", "exp_inf")

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return adamax_scalars(group, next_step(state))
