"""Adagrad: per-coordinate learning rates from the sum of squared gradients."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative, new_step_tensor, next_step


def adagrad_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    weight_decay: float,
    clr: float,
    eps: float,
) -> None:
    """One Adagrad update of ``param`` and its state in place (PyTorch's algorithm);
    ``clr = lr / (1 + (step - 1) * lr_decay)``."""
    state["step"].add_(1)
    if maximize:
        grad = -grad
    if use_weight_decay:
        grad = grad + param * weight_decay
    state_sum = state["sum"]
    state_sum.copy_(state_sum + grad * grad)
    std = lucid.sqrt(state_sum) + eps
    param.sub_(grad / std * clr)


def adagrad_scalars(group: dict[str, Any], step: float) -> dict[str, Any]:
    """Static options and per-step scalars of ``adagrad_update`` for step number ``step``."""
    return {
        "maximize": bool(group["maximize"]),
        "use_weight_decay": group["weight_decay"] != 0,
        "weight_decay": group["weight_decay"],
        "clr": group["lr"] / (1 + (step - 1) * group["lr_decay"]),
        "eps": group["eps"],
    }


class Adagrad(Optimizer):
    """Adagrad (``torch.optim.Adagrad``) with learning-rate decay, L2 weight decay, an initial
    accumulator value and maximization. Like torch, its state exists from construction on."""

    _static_keys = frozenset({"maximize", "use_weight_decay"})
    _update = staticmethod(adagrad_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            eps=eps,
            maximize=maximize,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group, self.state[p])

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(
            group, "lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"
        )

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        state["sum"] = lucid.full_like(p, group["initial_accumulator_value"])
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return adagrad_scalars(group, next_step(state))
