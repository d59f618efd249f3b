"""Muon: momentum orthogonalised by a Newton-Schulz iteration, for 2-d parameters."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import lucid
from lucid._tensor import Tensor
from lucid.optim.optimizer import Optimizer, check_nonnegative

_ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def lr_ratio(adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """torch's learning-rate scale for an (A, B) matrix: sqrt(max(1, A / B)) (``"original"``)
    or 0.2 sqrt(max(A, B)) (``"match_rms_adamw"``)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


def orthogonalize(
    update: Tensor, a: float, b: float, c: float, ns_steps: int, eps: float
) -> Tensor:
    """The quintic Newton-Schulz iteration X <- a X + (b G + c G^2) X, G = X X^T, from
    ``update / ||update||``: an approximation of the orthogonal factor U V^T of the SVD. Lucid
    keeps the parameter's precision (torch iterates in bfloat16)."""
    if ns_steps >= 100:
        raise ValueError("Muon: ns_steps must be less than 100 for computational efficiency")
    tall = update.shape[0] > update.shape[1]
    x = update.mT if tall else update
    norm = x.norm()
    x = x / lucid.maximum(norm, lucid.ones_like(norm) * eps)
    for _ in range(ns_steps):
        gram = x @ x.mT
        x = x * a + (gram * b + (gram @ gram) * c) @ x
    return x.mT if tall else x


def muon_update(
    param: Tensor,
    grad: Tensor,
    state: dict[str, Tensor],
    *,
    nesterov: bool,
    ns_steps: int,
    adjust_lr_fn: str | None,
    lr: float,
    decay_factor: float,
    momentum: float,
    one_minus_momentum: float,
    a: float,
    b: float,
    c: float,
    eps: float,
) -> None:
    """One Muon update of ``param`` and its momentum buffer in place (PyTorch's algorithm)."""
    buf = state["momentum_buffer"]
    buf.copy_(buf + (grad - buf) * one_minus_momentum)
    update = grad + (buf - grad) * momentum if nesterov else buf
    direction = orthogonalize(update, a, b, c, ns_steps, eps)
    ratio = lr_ratio(adjust_lr_fn, tuple(param.shape))
    param.copy_(param * decay_factor - direction * ratio * lr)


class Muon(Optimizer):
    """Muon (``torch.optim.Muon``) for 2-d parameters: (Nesterov) momentum, orthogonalised by
    ``ns_steps`` Newton-Schulz steps with ``ns_coefficients``, decoupled ``weight_decay``, the
    learning rate scaled by the matrix shape (``adjust_lr_fn``)."""

    _static_keys = frozenset({"nesterov", "ns_steps", "adjust_lr_fn"})
    _update = staticmethod(muon_update)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ):
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=tuple(ns_coefficients),
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
        )
        self._check_group(defaults)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(
                        "Muon only supports 2D parameters whereas we found a parameter with "
                        f"size: {tuple(p.shape)}"
                    )

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group, "lr", "weight_decay", "momentum", "eps")
        if group["adjust_lr_fn"] not in _ADJUST_LR_FNS:
            raise ValueError(
                f"Adjust learning rate function {group['adjust_lr_fn']!r} is not supported "
                "(use None, 'original' or 'match_rms_adamw')"
            )
        if len(group["ns_coefficients"]) != 3:
            raise ValueError("Muon: ns_coefficients must hold exactly 3 values (a, b, c)")

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        if state:
            return False
        state["momentum_buffer"] = lucid.zeros_like(p)
        return True

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        a, b, c = group["ns_coefficients"]
        return {
            "nesterov": bool(group["nesterov"]),
            "ns_steps": int(group["ns_steps"]),
            "adjust_lr_fn": group["adjust_lr_fn"],
            "lr": group["lr"],
            "decay_factor": 1.0 - group["lr"] * group["weight_decay"],
            "momentum": group["momentum"],
            "one_minus_momentum": 1.0 - group["momentum"],
            "a": a,
            "b": b,
            "c": c,
            "eps": group["eps"],
        }
