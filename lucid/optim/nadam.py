"""NAdam: Adam with Nesterov momentum and a momentum-decay schedule."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim._functional import (
    BetasOptimizer,
    begin_step,
    moment_scalars,
    update_moments,
    weight_decay_scalars,
)
from lucid.optim.optimizer import new_step_tensor, next_step


def nadam_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    decoupled_weight_decay: bool,
    weight_decay: float,
    decay_factor: float,
    mu: float,
    beta1: float,
    one_minus_beta1: float,
    beta2: float,
    one_minus_beta2: float,
    bias_correction2: float,
    eps: float,
    grad_step_size: float,
    exp_avg_step_size: float,
) -> None:
    """One NAdam update of ``param`` and its state in place (PyTorch's algorithm).

    ``mu`` is the momentum coefficient of this step; ``grad_step_size = lr (1 - mu_t) /
    (1 - prod_{i<=t} mu_i)`` and ``exp_avg_step_size = lr mu_{t+1} / (1 - prod_{i<=t+1} mu_i)``.
    """
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
    mu_product = state["mu_product"]
    mu_product.copy_(mu_product * mu)
    exp_avg, exp_avg_sq = update_moments(
        state, grad, beta1, one_minus_beta1, beta2, one_minus_beta2
    )
    denom = lucid.sqrt(exp_avg_sq / bias_correction2) + eps
    param.copy_(decayed - grad / denom * grad_step_size - exp_avg / denom * exp_avg_step_size)


def nadam_scalars(group: dict[str, Any], step: float, mu_product: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``nadam_update`` for step number ``step``;
    ``mu_product`` is the product of the momentum coefficients of the steps already taken."""
    lr = group["lr"]
    beta1, beta2 = group["betas"]
    psi = group["momentum_decay"]
    mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * psi))
    mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * psi))
    mu_product = mu_product * mu
    return {
        "maximize": bool(group["maximize"]),
        **weight_decay_scalars(group),
        "mu": mu,
        **moment_scalars(beta1, beta2),
        "bias_correction2": 1.0 - beta2**step,
        "eps": group["eps"],
        "grad_step_size": lr * (1.0 - mu) / (1.0 - mu_product),
        "exp_avg_step_size": lr * mu_next / (1.0 - mu_product * mu_next),
    }


class NAdam(BetasOptimizer):
    """NAdam (``torch.optim.NAdam``) with momentum decay, L2 or decoupled weight decay and
    maximization."""

    _static_keys = frozenset({"maximize", "use_weight_decay", "decoupled_weight_decay"})
    _update = staticmethod(nadam_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum_decay: float = 4e-3,
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
            momentum_decay=momentum_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )

    _nonnegative_options = ("lr", "eps", "weight_decay", "momentum_decay")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        state["mu_product"] = lucid.tensor(1.0, dtype=lucid.float32)
        state["exp_avg"] = lucid.zeros_like(p)
        state["exp_avg_sq"] = lucid.zeros_like(p)
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return nadam_scalars(group, next_step(state), float(state["mu_product"].item()))
