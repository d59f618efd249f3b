"""The ``nn.Module`` side of ``CompiledModule``: it takes the wrapped model's place in a module
tree, sharing its tables, so names, ``state_dict`` and hooks behave as the model's own."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from lucid.nn.modules.module import Module

__all__ = ["ModuleFacade"]


class ModuleFacade(Module):
    """Delegation to the wrapped model (``self._model``) and the ``nn.Module`` surface
    (``train``/``eval``, ``to``, ``state_dict``/``load_state_dict``, ``apply``); the compiled
    call itself is ``CompiledModule``'s."""

    # --- properties and delegation --------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self._model

    @property
    def dynamic(self) -> bool:
        """The requested flag (see the user guide: per-shape executables unless
        ``LUCID_COMPILE_DYNAMIC=1`` and the graph is proven safe)."""
        return self._dynamic

    @property
    def training(self) -> bool:
        """The wrapped model's flag (part of every cache key: both modes stay cached)."""
        return bool(getattr(self.__dict__.get("_model"), "training", False))

    @training.setter
    def training(self, mode: bool) -> None:
        # Module.train() sets it on every module it reaches, this one included.
        model = self.__dict__.get("_model")
        if isinstance(model, Module):
            model.training = mode

    @property
    def _orig_mod(self) -> Any:
        """The wrapped model (PyTorch's ``OptimizedModule`` name for it)."""
        return self.__dict__["_model"]

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_model" not in d:  # half-built (copy, unpickling)
            raise AttributeError(name)
        return getattr(d["_model"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The wrapper's own names (its properties: ``training``) stay here; any other
        # attribute is the model's.
        own = name in self.__dict__ or any(
            name in k.__dict__ for k in type(self).__mro__ if issubclass(k, ModuleFacade)
        )
        if own:
            object.__setattr__(self, name, value)
        else:
            setattr(self._model, name, value)

    def __repr__(self) -> str:
        return f"CompiledModule({self._model!r})"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled call (``cm.forward(x)`` is ``cm(x)``)."""
        return self(*args, **kwargs)

    # --- nn.Module surface ----------------------------------------------------------------------
    def _wrapped_module(self) -> Module | None:
        model = self.__dict__["_model"]
        return model if isinstance(model, Module) else None

    def apply(self, fn: Callable[[Module], Any]) -> ModuleFacade:
        """``fn`` on every submodule, on the wrapped model itself, then on this wrapper."""
        model = self._wrapped_module()
        if model is not None:
            model.apply(fn)
        fn(self)
        return self

    def _load_from_state_dict(self, *args: Any) -> None:
        model = self._wrapped_module()
        if model is not None:
            return model._load_from_state_dict(*args)
        return Module._load_from_state_dict(self, *args)

    def train(self, mode: bool = True) -> ModuleFacade:
        """Set the training flag of the model and every submodule. Nothing is recompiled or
        dropped: the flag is part of the cache key, so both modes' executables stay cached."""
        Module.train(self, mode)
        return self

    def eval(self) -> ModuleFacade:
        return self.train(False)

    def to(self, *args: Any, **kwargs: Any) -> ModuleFacade:
        """``Module.to``. The cache is dropped only when a parameter's or buffer's dtype or
        device really changes (``to(float64)``); the current dtype or device keeps it."""
        model = self._model_or_refuse("to")
        before = self._placement()
        model.to(*args, **kwargs)
        if self._placement() != before:
            self.clear_cache()
        return self

    def _placement(self) -> tuple:
        tensors = itertools.chain(self.parameters(), self.buffers())
        return tuple((t._data.dtype, str(t.device)) for t in tensors if t._data is not None)

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False):
        """The wrapped model's ``load_state_dict`` (keys may carry PyTorch's ``_orig_mod.``
        prefix). Values are copied in place, so cached executables stay valid; replaced
        tensors (``assign=True``) are noticed by the next call, which recompiles."""
        if isinstance(state_dict, dict) and any(
            isinstance(k, str) and k.startswith("_orig_mod.") for k in state_dict
        ):
            state_dict = type(state_dict)(
                (k.removeprefix("_orig_mod.") if isinstance(k, str) else k, v)
                for k, v in state_dict.items()
            )
        model = self._wrapped_module()
        if model is None:
            return Module.load_state_dict(self, state_dict, strict=strict, assign=assign)
        return model.load_state_dict(state_dict, strict=strict, assign=assign)

    def state_dict(
        self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ):
        """The wrapped model's state dict (its own key names, under ``prefix``)."""
        model = self._wrapped_module()
        if model is None:
            return Module.state_dict(
                self, *args, destination=destination, prefix=prefix, keep_vars=keep_vars
            )
        return model.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def register_forward_hook(self, hook: Callable) -> Any:
        """``hook(cm, args, output)`` after each compiled call (a non-None result replaces
        the output); hooks on the wrapped model run while it is traced instead."""
        handle = Module.register_forward_hook(self, hook)
        self._use_hooks()
        return handle

    def register_forward_pre_hook(self, hook: Callable) -> Any:
        """``hook(cm, args)`` before each compiled call (a non-None result replaces args)."""
        handle = Module.register_forward_pre_hook(self, hook)
        self._use_hooks()
        return handle

    def _model_or_refuse(self, what: str) -> Module:
        model = self._wrapped_module()
        if model is None:
            raise TypeError(
                f"{what}: the compiled {type(self._model).__name__} is not an nn.Module"
            )
        return model
