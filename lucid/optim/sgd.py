"""Stochastic gradient descent, optionally with momentum (heavy ball or Nesterov)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative


def sgd_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    nesterov: bool,
    use_momentum: bool,
    use_weight_decay: bool,
    lr: float,
    weight_decay: float,
    momentum: float,
    buf_keep: float,
    buf_grad_scale: float,
) -> None:
    """One SGD update of ``param`` in place (PyTorch's documented algorithm).

    The momentum buffer update is ``b = buf_keep * b + buf_grad_scale * g``: on the first step
    (``buf_keep = 0``, ``buf_grad_scale = 1``) that is ``b = g``, afterwards it is
    ``b = momentum * b + (1 - dampening) * g``; one formula, so one traced graph for every step.
    """
    if maximize:
        grad = -grad
    if use_weight_decay:
        grad = grad + param * weight_decay
    if use_momentum:
        buf = state["momentum_buffer"]
        buf.copy_(buf * buf_keep + grad * buf_grad_scale)
        grad = grad + buf * momentum if nesterov else buf
    param.sub_(grad * lr)


def sgd_scalars(group: dict[str, Any], first_momentum_step: bool) -> dict[str, Any]:
    """The static options and per-step scalars of ``sgd_update`` for one group."""
    momentum = group["momentum"]
    return {
        "maximize": bool(group["maximize"]),
        "nesterov": bool(group["nesterov"]),
        "use_momentum": momentum != 0,
        "use_weight_decay": group["weight_decay"] != 0,
        "lr": group["lr"],
        "weight_decay": group["weight_decay"],
        "momentum": momentum,
        "buf_keep": 0.0 if first_momentum_step else momentum,
        "buf_grad_scale": 1.0 if first_momentum_step else 1.0 - group["dampening"],
    }


class SGD(Optimizer):
    """Stochastic gradient descent (``torch.optim.SGD``): momentum, dampening, Nesterov momentum,
    L2 weight decay and maximization, as in PyTorch's documented algorithm."""

    _static_keys = frozenset({"maximize", "nesterov", "use_momentum", "use_weight_decay"})
    _update = staticmethod(sgd_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "momentum", "weight_decay")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                "Nesterov momentum requires a momentum and zero dampening (nesterov=True with "
                f"momentum={group['momentum']}, dampening={group['dampening']})"
            )

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if group["momentum"] != 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = lucid.zeros_like(p)
            return True
        return False

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return sgd_scalars(group, fresh)
