"""Rprop: per-coordinate step sizes, grown while the gradient keeps its sign, shrunk when it
flips."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative, new_step_tensor


def rprop_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    maximize: bool,
    eta_minus: float,
    eta_plus: float,
    step_size_min: float,
    step_size_max: float,
) -> None:
    """One Rprop update of ``param`` and its state in place (PyTorch's algorithm): where the
    gradient kept its sign the step grows by ``eta_plus``, where it flipped the step shrinks by
    ``eta_minus`` and that coordinate does not move this step (its gradient counts as 0)."""
    state["step"].add_(1)
    if maximize:
        grad = -grad
    prev, step_size = state["prev"], state["step_size"]
    agreement = (grad * prev).sign()
    # The factors in the parameters' dtype (a where of Python numbers would be float32), made by
    # products so that a compiled step can feed eta_plus and eta_minus as scalars.
    ones = lucid.ones_like(step_size)
    grow, shrink = ones * eta_plus, ones * eta_minus
    factor = lucid.where(agreement > 0, grow, lucid.where(agreement < 0, shrink, 1.0))
    grown = step_size * factor
    step_size.copy_(lucid.minimum(lucid.maximum(grown, ones * step_size_min), ones * step_size_max))
    grad = lucid.where(agreement < 0, 0.0, grad)
    param.sub_(grad.sign() * step_size)
    prev.copy_(grad)


class Rprop(Optimizer):
    """Resilient backpropagation (``torch.optim.Rprop``): ``etas = (eta_minus, eta_plus)``,
    ``step_sizes = (min, max)``, every step size starting at ``lr``."""

    _static_keys = frozenset({"maximize"})
    _update = staticmethod(rprop_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        maximize: bool = False,
    ):
        defaults = dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes), maximize=maximize)
        self._check_group(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr")
        eta_minus, eta_plus = group["etas"]
        if not 0.0 < eta_minus < 1.0 < eta_plus:
            raise ValueError(f"Invalid eta values: {eta_minus}, {eta_plus} (need 0 < - < 1 < +)")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["step"] = new_step_tensor()
        state["prev"] = lucid.zeros_like(p)
        state["step_size"] = lucid.full_like(p, group["lr"])
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        (eta_minus, eta_plus), (low, high) = group["etas"], group["step_sizes"]
        return {
            "maximize": bool(group["maximize"]),
            "eta_minus": eta_minus,
            "eta_plus": eta_plus,
            "step_size_min": low,
            "step_size_max": high,
        }
