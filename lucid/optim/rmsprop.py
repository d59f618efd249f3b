"""RMSprop, optionally centered and with momentum."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim._functional import begin_step, init_zero_state
from lucid.optim.optimizer import Optimizer, check_nonnegative


def rmsprop_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    centered: bool,
    use_momentum: bool,
    use_weight_decay: bool,
    lr: float,
    alpha: float,
    one_minus_alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
) -> None:
    """One RMSprop update of ``param`` and its state in place (PyTorch's algorithm)."""
    grad, _ = begin_step(
        param,
        grad,
        state,
        maximize=maximize,
        use_weight_decay=use_weight_decay,
        weight_decay=weight_decay,
    )
    square_avg = state["square_avg"]
    square_avg.copy_(square_avg * alpha + grad * grad * one_minus_alpha)
    if centered:
        grad_avg = state["grad_avg"]
        grad_avg.copy_(grad_avg * alpha + grad * one_minus_alpha)
        avg = lucid.sqrt(square_avg - grad_avg * grad_avg) + eps
    else:
        avg = lucid.sqrt(square_avg) + eps
    if use_momentum:
        buf = state["momentum_buffer"]
        buf.copy_(buf * momentum + grad / avg)
        param.sub_(buf * lr)
    else:
        param.sub_(grad / avg * lr)


def rmsprop_scalars(group: dict[str, Any]) -> dict[str, Any]:
    """Static options and scalars of ``rmsprop_update`` for one group (none depend on the step)."""
    return {
        "maximize": bool(group["maximize"]),
        "centered": bool(group["centered"]),
        "use_momentum": group["momentum"] > 0,
        "use_weight_decay": group["weight_decay"] != 0,
        "lr": group["lr"],
        "alpha": group["alpha"],
        "one_minus_alpha": 1.0 - group["alpha"],
        "eps": group["eps"],
        "weight_decay": group["weight_decay"],
        "momentum": group["momentum"],
    }


class RMSprop(Optimizer):
    """RMSprop (``torch.optim.RMSprop``): divides the gradient by a running root mean square;
    ``centered`` subtracts the squared running mean of the gradient first; ``momentum`` adds a
    heavy-ball buffer."""

    _static_keys = frozenset({"maximize", "centered", "use_momentum", "use_weight_decay"})
    _update = staticmethod(rmsprop_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        *,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
            maximize=maximize,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "eps", "momentum", "weight_decay", "alpha")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        fresh = init_zero_state(p, state, "square_avg")
        if group["momentum"] > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = lucid.zeros_like(p)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = lucid.zeros_like(p)
        return fresh

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        return rmsprop_scalars(group)
