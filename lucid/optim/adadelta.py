"""Adadelta: step sizes from running averages of squared gradients and squared updates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim._functional import init_zero_state
from lucid.optim.optimizer import Optimizer, check_nonnegative


def adadelta_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    lr: float,
    rho: float,
    one_minus_rho: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One Adadelta update of ``param`` and its state in place (PyTorch's algorithm)."""
    state["step"].add_(1)
    if maximize:
        grad = -grad
    if use_weight_decay:
        grad = grad + param * weight_decay
    square_avg, acc_delta = state["square_avg"], state["acc_delta"]
    square_avg.copy_(square_avg * rho + grad * grad * one_minus_rho)
    std = lucid.sqrt(square_avg + eps)
    delta = lucid.sqrt(acc_delta + eps) / std * grad
    acc_delta.copy_(acc_delta * rho + delta * delta * one_minus_rho)
    param.sub_(delta * lr)


def adadelta_scalars(group: dict[str, Any]) -> dict[str, Any]:
    """Static options and scalars of ``adadelta_update`` for one group."""
    return {
        "maximize": bool(group["maximize"]),
        "use_weight_decay": group["weight_decay"] != 0,
        "lr": group["lr"],
        "rho": group["rho"],
        "one_minus_rho": 1.0 - group["rho"],
        "eps": group["eps"],
        "weight_decay": group["weight_decay"],
    }


class Adadelta(Optimizer):
    """Adadelta (``torch.optim.Adadelta``) with a learning-rate factor, L2 weight decay and
    maximization."""

    _static_keys = frozenset({"maximize", "use_weight_decay"})
    _update = staticmethod(adadelta_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
        *,
        maximize: bool = False,
    ):
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "eps", "weight_decay")
        if not 0.0 <= group["rho"] <= 1.0:
            raise ValueError(f"Invalid rho value: {group['rho']} (rho must be in [0, 1])")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        return init_zero_state(p, state, "square_avg", "acc_delta")

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return adadelta_scalars(group)
