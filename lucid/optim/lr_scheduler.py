"""Learning-rate schedulers (``torch.optim.lr_scheduler``).

A scheduler writes ``group['lr']`` of its optimizer's parameter groups on every ``step()``. The
schedules use PyTorch's recursive forms in ``get_lr`` (each new rate from the group's current
one, so schedulers can be chained on one optimizer) and keep the closed forms for
``step(epoch)``. Learning rates stay Python floats: a compiled optimizer step takes them as
feeds, so a schedule never forces a recompile.
"""

from __future__ import annotations

import math
import types
import warnings
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lucid.optim.optimizer import Optimizer

__all__ = [
    "LRScheduler",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "LambdaLR",
    "LinearLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
]


class LRScheduler(ABC):
    """Base class of the schedulers: subclasses define ``get_lr`` (the recursive form) and may
    define ``_get_closed_form_lr`` (used by the deprecated ``step(epoch)``).

    Args:
        optimizer: the optimizer whose ``group['lr']`` values are scheduled.
        last_epoch: the index of the last epoch; -1 (default) starts a new schedule and records
            each group's ``initial_lr``. Any other value resumes one and needs ``initial_lr``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when resuming "
                        f"a scheduler with last_epoch={last_epoch}"
                    )
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    @abstractmethod
    def get_lr(self) -> list[float]:
        """The learning rate of every group for epoch ``self.last_epoch``."""

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` wrote, one per parameter group."""
        return list(self._last_lr)

    def step(self, epoch: int | None = None) -> None:
        """Advance the schedule by one epoch (or jump to ``epoch``, deprecated as in torch) and
        write the new rates into the optimizer's groups."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            warnings.warn(
                "passing an epoch to scheduler.step() is deprecated; call step() once per epoch",
                UserWarning,
                stacklevel=2,
            )
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute except the optimizer."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the attributes saved by ``state_dict``."""
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Multiply each group's rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(
        self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ):
        if not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"step_size must be a positive integer, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [
            base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs
        ]


class MultiStepLR(LRScheduler):
    """Multiply each group's rate by ``gamma`` at every milestone epoch (a milestone given
    twice multiplies by ``gamma ** 2``)."""

    def __init__(
        self,
        optimizer: Optimizer,
        milestones: Iterable[int],
        gamma: float = 0.1,
        last_epoch: int = -1,
    ):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return [group["lr"] for group in self.optimizer.param_groups]
        factor = self.gamma ** self.milestones[self.last_epoch]
        return [group["lr"] * factor for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [
            base_lr * self.gamma ** bisect_right(milestones, self.last_epoch)
            for base_lr in self.base_lrs
        ]


class ExponentialLR(LRScheduler):
    """Multiply each group's rate by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base_lr * self.gamma**self.last_epoch for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from each group's initial rate to ``eta_min`` over ``T_max`` epochs
    (SGDR without restarts): ``eta_min + (base - eta_min) (1 + cos(pi t / T_max)) / 2`` when
    stepped normally, computed recursively like torch so it composes with other schedulers."""

    def __init__(
        self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1
    ):  # noqa: N803  (torch's argument name)
        if not T_max > 0:
            raise ValueError(f"T_max must be positive, got {T_max!r}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        t, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return [group["lr"] for group in groups]
        if self._step_count == 1 and t > 0:
            return [
                eta_min + (base_lr - eta_min) * (1 + math.cos(t * math.pi / t_max)) / 2
                for base_lr in self.base_lrs
            ]
        if (t - 1 - t_max) % (2 * t_max) == 0:
            return [
                group["lr"] + (base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                for base_lr, group in zip(self.base_lrs, groups, strict=True)
            ]
        return [
            (1 + math.cos(math.pi * t / t_max))
            / (1 + math.cos(math.pi * (t - 1) / t_max))
            * (group["lr"] - eta_min)
            + eta_min
            for group in groups
        ]

    def _get_closed_form_lr(self) -> list[float]:
        return [
            self.eta_min
            + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
            for base_lr in self.base_lrs
        ]


class LambdaLR(LRScheduler):
    """Each group's rate is its initial rate times ``lr_lambda(epoch)`` (one function, or one per
    group)."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
        last_epoch: int = -1,
    ):
        n_groups = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n_groups:
                raise ValueError(f"Expected {n_groups} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n_groups
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda must be callable, got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [
            base_lr * fn(self.last_epoch)
            for fn, base_lr in zip(self.lr_lambdas, self.base_lrs, strict=True)
        ]

    def state_dict(self) -> dict[str, Any]:
        """Like the base, but functions are not saved: a callable object's attributes are."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None if isinstance(fn, types.FunctionType) else dict(fn.__dict__)
            for fn in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        saved = state.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        self.__dict__.update(state)
        for fn, attrs in zip(self.lr_lambdas, saved, strict=True):
            if attrs is not None:
                fn.__dict__.update(attrs)


class LinearLR(LRScheduler):
    """Scale each group's rate by a factor moving linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` epochs, then keep it."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(
                f"start_factor must be in (0, 1], got {start_factor} (starting multiplicative "
                "factor)"
            )
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(
                f"end_factor must be in [0, 1], got {end_factor} (ending multiplicative factor)"
            )
        if not isinstance(total_iters, int) or total_iters <= 0:
            raise ValueError(f"total_iters must be a positive integer, got {total_iters!r}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [group["lr"] * self.start_factor for group in groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [group["lr"] for group in groups]
        delta = self.end_factor - self.start_factor
        ratio = 1.0 + delta / (self.total_iters * self.start_factor + (self.last_epoch - 1) * delta)
        return [group["lr"] * ratio for group in groups]

    def _get_closed_form_lr(self) -> list[float]:
        frac = min(self.total_iters, self.last_epoch) / self.total_iters
        factor = self.start_factor + (self.end_factor - self.start_factor) * frac
        return [base_lr * factor for base_lr in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the rate rises from ``max_lr / div_factor`` to ``max_lr`` over the
    first ``pct_start`` of ``total_steps``, then anneals to ``initial_lr / final_div_factor``
    (``three_phase``: back down to the initial rate first, then to the minimum). With
    ``cycle_momentum`` the momentum (SGD/RMSprop ``momentum``, Adam-family ``betas[0]``) moves
    inversely between ``max_momentum`` and ``base_momentum``. Stepped once per batch."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | Sequence[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(
                    f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}"
                )
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if not isinstance(pct_start, float) or not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}"
            )
        self.anneal_strategy = anneal_strategy
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                _phase(float(pct_start * n) - 1, "initial_lr", "max_lr", "max", "base"),
                _phase(float(2 * pct_start * n) - 2, "max_lr", "initial_lr", "base", "max"),
                _phase(n - 1, "initial_lr", "min_lr", "max", "max"),
            ]
        else:
            self._schedule_phases = [
                _phase(float(pct_start * n) - 1, "initial_lr", "max_lr", "max", "base"),
                _phase(n - 1, "max_lr", "min_lr", "base", "max"),
            ]
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for m, group in zip(max_lrs, optimizer.param_groups, strict=True):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(
                    "optimizer must support momentum or beta1 with `cycle_momentum` option enabled"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            max_ms = _per_group("max_momentum", optimizer, max_momentum)
            base_ms = _per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for m, b, group in zip(max_ms, base_ms, optimizer.param_groups, strict=True):
                    self._set_momentum(group, m)
                    group["max_momentum"] = m
                    group["base_momentum"] = b
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(
                f"Tried to step {step_num} times. The specified number of total steps is "
                f"{self.total_steps}"
            )
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == last:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lrs.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        momentum = self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct
                        )
                        self._set_momentum(group, momentum)
                    break
                start_step = end_step
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """Multiply each group's rate by ``factor`` once a metric has stopped improving for more than
    ``patience`` epochs, as ``torch.optim.lr_scheduler.ReduceLROnPlateau``.

    ``step(metric)`` takes the epoch's metric (a number or a 0-d tensor). A metric is an
    improvement when it beats the best so far by the threshold: ``rel`` mode compares with
    ``best * (1 -/+ threshold)``, ``abs`` with ``best -/+ threshold`` (minus for ``mode='min'``,
    plus for ``'max'``). After a reduction ``cooldown`` epochs pass with bad epochs ignored. A rate
    never goes below its ``min_lr`` (one number, or one per group), and a reduction smaller than
    ``eps`` is skipped.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float | Sequence[float] = 0,
        eps: float = 1e-8,
    ):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        if factor >= 1.0:
            raise ValueError(f"Factor should be < 1.0, got {factor}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"patience must be a non-negative int, got {patience!r}")
        if isinstance(cooldown, bool) or not isinstance(cooldown, int) or cooldown < 0:
            raise ValueError(f"cooldown must be a non-negative int, got {cooldown!r}")
        self.factor = factor
        self.optimizer = optimizer
        n_groups = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n_groups:
                raise ValueError(f"expected {n_groups} min_lrs, got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * n_groups
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self.patience = patience
        self.cooldown = cooldown
        self.cooldown_counter = 0
        self.eps = eps
        self.last_epoch = 0
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode!r} is unknown! (expected 'min' or 'max')")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(
                f"threshold mode {threshold_mode!r} is unknown! (expected 'rel' or 'abs')"
            )
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        """Whether metric ``a`` improves on ``best`` by the threshold."""
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def get_lr(self) -> list[float]:
        """The groups' current rates (this scheduler changes them only in ``step(metric)``)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        """Record one epoch's metric; reduce the rates when it has plateaued."""
        try:
            current = float(metrics)
        except (TypeError, ValueError):
            raise TypeError(
                "ReduceLROnPlateau.step expects the metric (a number or a one-element tensor), "
                f"got {type(metrics).__name__}"
            ) from None
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(
                "passing an epoch to scheduler.step() is deprecated; call step(metric) once per "
                "epoch",
                UserWarning,
                stacklevel=2,
            )
        self.last_epoch = epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs during cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"The number of param groups in the optimizer ({len(groups)}) differs from "
                    f"when ReduceLROnPlateau was initialized ({len(self.min_lrs)}), usually "
                    "because a param group was added; set `min_lrs` to one value per group."
                )
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs, strict=True):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, min_lr)
            if old_lr - new_lr > self.eps:
                group["lr"] = new_lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the attributes saved by ``state_dict`` (and re-check mode and threshold)."""
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


def _phase(end_step: float, start_lr: str, end_lr: str, start_m: str, end_m: str) -> dict:
    return {
        "end_step": end_step,
        "start_lr": start_lr,
        "end_lr": end_lr,
        "start_momentum": f"{start_m}_momentum",
        "end_momentum": f"{end_m}_momentum",
    }


def _per_group(name: str, optimizer: Optimizer, value: Any) -> list[Any]:
    """One value per parameter group: a list/tuple must have exactly one per group."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"expected {n} values for {name}, got {len(value)}")
        return list(value)
    return [value] * n
