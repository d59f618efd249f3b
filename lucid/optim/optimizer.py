"""The optimizer base class, and the contract every optimizer follows so ``step()`` can be traced.

Each optimizer splits one step into three pieces:

1. ``_init_state(p, group, state) -> bool`` (eager): creates the state tensors a parameter is
   missing (``exp_avg``, ``momentum_buffer``, a float32 0-d ``step``, ...) with PyTorch's key names.
   Returns True when it created the state this call (SGD uses it for its first-step buffer).
2. ``_step_scalars(group, state, fresh) -> dict`` (eager, plain Python): everything the update
   needs that is not a tensor, for the step about to be taken: the group's options and the
   per-step scalars derived from them (bias corrections, step sizes, ...). It reads the current
   step count from ``state['step']`` (the step being taken is that value plus one). Keys listed in
   the class attribute ``_static_keys`` are Python bools the update branches on (``amsgrad``,
   ``nesterov``, ...): they change the structure of the update. Every other key is a number that
   the update only combines with tensors through the operators ``+ - * / **`` (not as an
   argument of a function or method: ``t.copy_(t * mu)``, not ``t.mul_(mu)``), so a compiler may
   feed it as a 0-d tensor in the dtype the Python float takes there and a learning rate
   scheduler never forces a recompile.
3. ``_update(param, grad, state, **scalars) -> None``: a pure function of its arguments that
   updates ``param`` and the state tensors in place (``state['step']`` included), written with
   Lucid ops and in-place tensor methods only, never numpy, so the same code runs eagerly and
   under ``lucid.compile``'s tracer. It writes each tensor exactly once (``t.copy_(new value)``
   rather than a chain such as ``t.mul_(a).add_(b)``), so a traced step has one update output per
   tensor, and it never branches on a tensor's value.

``step()`` is those three pieces run under ``lucid.no_grad()`` for every parameter that has a
gradient; ``_param_updates()`` yields the pieces' inputs for a tracer to drive the same loop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from copy import deepcopy
from typing import Any

import numpy as np

import lucid
from lucid._tensor import Tensor, _tensor_from


class _RequiredParameter:
    """Marks a hyperparameter with no default (``lr`` of SGD in old PyTorch versions)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    """Base class of every optimizer (``torch.optim.Optimizer``).

    Args:
        params: an iterable of Tensors, or of dicts defining parameter groups (each a dict with
            ``params`` and any per-group option overriding ``defaults``).
        defaults: the default value of every option of the optimizer.
    """

    _static_keys: frozenset[str] = frozenset()

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {type(params).__name__}"
            )
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # --- the per-optimizer pieces (see the module docstring) -------------------------------------
    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError naming the option when a group's hyperparameter is invalid."""

    def _init_state(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> bool:
        raise TypeError(f"{type(self).__name__} does not define its state (_init_state)")

    def _step_scalars(
        self, group: dict[str, Any], state: dict[str, Any], fresh: bool
    ) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} does not define its step scalars (_step_scalars)")

    @staticmethod
    def _update(param: Tensor, grad: Tensor, state: dict[str, Tensor], **scalars: Any) -> None:
        raise TypeError("this optimizer does not define its update (_update)")

    # --- public API ------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group (a dict with ``params`` and optional per-group options)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if params is None:
            raise ValueError("a parameter group needs a 'params' entry")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"optimizer can only optimize Tensors, but one of the params is "
                    f"{type(p).__name__}"
                )
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
            if not p.dtype.is_floating_point:
                raise TypeError(
                    f"optimizer can only optimize floating point Tensors, not {p.dtype}"
                )
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter group contains the same parameter more than once")
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(
                    f"parameter group didn't specify a value of required optimization parameter "
                    f"{name}"
                )
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self._check_group(group)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradient of every parameter: to None (default) or to zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    g = p.grad
                    if g.grad_fn is not None:
                        g.detach_()
                    g.requires_grad_(False)
                    with lucid.no_grad():
                        g.zero_()

    def _param_updates(self) -> Iterator[tuple[Tensor, Tensor, dict[str, Any], dict[str, Any]]]:
        """Yield ``(param, grad, state, scalars)`` for every parameter that has a gradient,
        creating missing state first. ``self._update(*item[:3], **item[3])`` applies one."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p] if p in self.state else {}
                fresh = self._init_state(p, group, state)
                if state and p not in self.state:  # no empty entries (plain SGD), like torch
                    self.state[p] = state
                yield p, p.grad, state, self._step_scalars(group, state, fresh)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Take one optimization step; ``closure`` (re-evaluating the loss) runs first, with
        gradients enabled, and its result is returned."""
        loss = None
        if closure is not None:
            with lucid.enable_grad():
                loss = closure()
        with lucid.no_grad():
            for param, grad, state, scalars in self._param_updates():
                self._update(param, grad, state, **scalars)
        return loss

    # --- serialization ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{'state': {index: {name: Tensor}}, 'param_groups': [...]}``; parameters are replaced
        by their integer index in group order, state tensors are copies."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: deepcopy(v) for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {}
        for p, st in self.state.items():
            key = index[id(p)] if isinstance(p, Tensor) and id(p) in index else p
            state[key] = {k: _copy_value(v) for k, v in st.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``: group options and state, matched to this optimizer's
        parameters by position. Raises ValueError when the groups do not match."""
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError(
                "an optimizer state dict is a dict with exactly the keys 'state' and 'param_groups'"
            )
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer has "
                f"{len(self.param_groups)}"
            )
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    f"loaded state dict's parameter group {i} has {len(saved['params'])} "
                    f"parameters, the optimizer's group has {len(group['params'])}"
                )
        by_index = {
            i: p
            for group, saved in zip(self.param_groups, saved_groups, strict=True)
            for i, p in zip(saved["params"], group["params"], strict=True)
        }
        new_groups = []
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            new_group = {k: deepcopy(v) for k, v in saved.items() if k != "params"}
            new_group["params"] = group["params"]
            self._check_group(new_group)
            new_groups.append(new_group)
        new_state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for key, st in state_dict["state"].items():
            if key not in by_index:
                raise ValueError(f"loaded state dict has state for unknown parameter index {key}")
            p = by_index[key]
            new_state[p] = {k: _load_value(k, v, p) for k, v in st.items()}
        self.param_groups = new_groups
        self.state = new_state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {group[k]}" for k in sorted(group) if k != "params")
        lines.append(")")
        return "\n".join(lines)


def _copy_value(v: Any) -> Any:
    if isinstance(v, Tensor):
        return _tensor_from(v)  # a copy with the same dtype
    return deepcopy(v)


def _load_value(key: str, v: Any, param: Tensor) -> Any:
    """A loaded state entry, copied so the optimizer never aliases the dict; floating state
    follows the parameter's dtype, except ``step`` which stays float32 like torch. numpy arrays
    (and numpy scalars) are accepted as tensors."""
    if isinstance(v, (np.ndarray, np.generic)):
        v = _tensor_from(np.asarray(v))
    if not isinstance(v, Tensor):
        return deepcopy(v)
    if key not in _SCALAR_STATE and tuple(v.shape) != tuple(param.shape):
        raise ValueError(
            f"loaded state {key!r} has shape {tuple(v.shape)}, its parameter has "
            f"{tuple(param.shape)}"
        )
    if key not in _SCALAR_STATE and v.dtype.is_floating_point and v.dtype != param.dtype:
        return Tensor(v, dtype=param.dtype)
    return _tensor_from(v)


# 0-d state entries: kept float32 whatever the parameter's dtype, like torch.
_SCALAR_STATE = frozenset({"step", "mu_product"})


def new_step_tensor() -> Tensor:
    """The step counter every stateful optimizer keeps: a float32 0-d tensor, like torch."""
    return lucid.tensor(0.0, dtype=lucid.float32)


def check_nonnegative(group: dict[str, Any], *names: str) -> None:
    """ValueError naming the option when one of ``names`` is negative in ``group``."""
    messages = {"lr": "learning rate", "eps": "epsilon value"}
    for name in names:
        value = group[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not value >= 0.0:
            raise ValueError(f"Invalid {messages.get(name, name + ' value')}: {value} ({name})")


def check_betas(group: dict[str, Any]) -> None:
    """ValueError unless both betas are in [0, 1)."""
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Invalid betas: {betas!r}; expected a pair of floats")
    for i, b in enumerate(betas):
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise TypeError(f"betas[{i}] must be a number, got {type(b).__name__}")
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b} (betas must be in [0, 1))")


def next_step(state: dict[str, Any]) -> float:
    """The number of the step about to be taken (1 for the first), from ``state['step']``."""
    return float(state["step"].item()) + 1.0
