"""ASGD: SGD with a decaying step and a running (Polyak) average of the iterates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative, new_step_tensor, next_step


def asgd_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    use_weight_decay: bool,
    average_is_param: bool,
    weight_decay: float,
    decay: float,
    eta: float,
    mu: float,
) -> None:
    """One ASGD update (PyTorch's algorithm): ``param *= decay`` (``1 - lambd * eta``),
    ``param -= eta * grad``, then the average ``ax`` moves towards ``param`` by ``mu`` (becomes
    it while ``average_is_param``, before ``t0`` steps)."""
    state["step"].add_(1)
    if maximize:
        grad = -grad
    if use_weight_decay:
        grad = grad + param * weight_decay
    param.copy_(param * decay - grad * eta)
    ax = state["ax"]
    if average_is_param:
        ax.copy_(param)
    else:
        ax.copy_(ax + (param - ax) * mu)


class ASGD(Optimizer):
    """Averaged SGD (``torch.optim.ASGD``): step ``eta_t = lr / (1 + lambd * lr * t)^alpha``;
    from step ``t0`` on, ``state['ax']`` holds the running average of the iterates."""

    _static_keys = frozenset({"maximize", "use_weight_decay", "average_is_param"})
    _update = staticmethod(asgd_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        *,
        maximize: bool = False,
    ):
        defaults = dict(
            lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize
        )
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "weight_decay")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        state["ax"] = lucid.zeros_like(p)
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        done = next_step(state) - 1  # steps already taken: eta and mu as torch left them
        mu = 1.0 / max(1.0, done - group["t0"])
        eta = group["lr"] / (1 + group["lambd"] * group["lr"] * done) ** group["alpha"]
        return {
            "maximize": bool(group["maximize"]),
            "use_weight_decay": group["weight_decay"] != 0,
            "average_is_param": mu == 1.0,
            "weight_decay": group["weight_decay"],
            "decay": 1 - group["lambd"] * eta,
            "eta": eta,
            "mu": mu,
        }
