"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from lucid.nn.modules.module import Module
from lucid.nn.parameter import Parameter

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]


def _index(idx: Any, n: int, what: str) -> int:
    i = operator.index(idx)
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for a {what} of length {n}")
    return i % n


class _ModuleSequence(Module):
    """What Sequential and ModuleList share: submodules named ``"0"``, ``"1"``, ... in order."""

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def _renumber(self, items: list[Module]) -> None:
        """Re-register ``items`` as the submodules, named by position."""
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def append(self, module: Module) -> Self:
        self.add_module(str(len(self)), module)
        return self

    def pop(self, idx: int = -1) -> Module:
        m = self[idx]
        del self[idx]
        return m


class Sequential(_ModuleSequence):
    """Modules applied in order: ``Sequential(a, b)(x) == b(a(x))``.

    Takes modules as arguments or one ``OrderedDict`` of name -> module.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def forward(self, input: Any) -> Any:  # noqa: A002
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[_index(idx, len(self), "Sequential")]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[_index(idx, len(self), "Sequential")]
        self.add_module(key, module)

    def __delitem__(self, idx: int | slice) -> None:
        keys = list(self._modules)
        targets = keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self), "list")]]
        for k in targets:
            del self._modules[k]
        # Keep integer names contiguous, as torch does.
        if all(k.isdigit() for k in keys):
            self._renumber(list(self._modules.values()))

    def insert(self, index: int, module: Module) -> Sequential:
        if not isinstance(module, Module):
            raise TypeError(f"module should be of type Module, got {type(module).__name__}")
        n = len(self)
        if not -n <= index <= n:
            raise IndexError(f"index {index} is out of range for insert into length {n}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._renumber(items)
        return self

    def extend(self, modules: Iterable[Module]) -> Sequential:
        for m in modules:
            self.append(m)
        return self

    def __add__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise TypeError(f"can only add Sequential to Sequential, not {type(other).__name__}")
        return Sequential(*self, *other)


class ModuleList(_ModuleSequence):
    """A list of submodules, registered so their parameters are found. Has no ``forward``."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self), "ModuleList"))]

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(str(_index(idx, len(self), "ModuleList")), module)

    def __delitem__(self, idx: int | slice) -> None:
        items = list(self._modules.values())
        if isinstance(idx, slice):
            del items[idx]
        else:
            del items[_index(idx, len(self), "ModuleList")]
        self._renumber(items)

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self, *other])

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, Sequential)):
            raise TypeError("ModuleList.extend should be called with an iterable of modules")
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)


class _RegistryDict(Module):
    """The mapping methods ModuleDict and ParameterDict share, over the registry named by
    ``_registry`` (``_modules`` or ``_parameters``)."""

    _registry: str

    def _entries(self) -> dict[str, Any]:
        return getattr(self, self._registry)

    def __getitem__(self, key: str) -> Any:
        return self._entries()[key]

    def __delitem__(self, key: str) -> None:
        del self._entries()[key]

    def __len__(self) -> int:
        return len(self._entries())

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def __contains__(self, key: object) -> bool:
        return key in self._entries()

    def keys(self) -> Iterable[str]:
        return self._entries().keys()

    def values(self) -> Iterable[Any]:
        return self._entries().values()

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._entries().items()


class ModuleDict(_RegistryDict):
    """An ordered dict of submodules, registered so their parameters are found."""

    _registry = "_modules"

    def __init__(self, modules: Mapping[str, Module] | Iterable | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        m = self[key]
        del self[key]
        return m

    def update(self, modules: Mapping[str, Module] | Iterable) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for i, pair in enumerate(pairs):
            if isinstance(modules, Mapping):
                key, module = pair
            else:
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise ValueError(
                        f"ModuleDict.update: element #{i} should be a (key, module) pair"
                    )
                key, module = pair
            self[key] = module


class ParameterList(Module):
    """A list of Parameters registered as ``"0"``, ``"1"``, ..."""

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        for v in values or ():
            self.append(v)

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._parameters.values())

    def __getitem__(self, idx: int) -> Parameter:
        return self._parameters[str(_index(idx, len(self), "ParameterList"))]

    def __setitem__(self, idx: int, value: Any) -> None:
        key = str(_index(idx, len(self), "ParameterList"))
        self.register_parameter(key, value if isinstance(value, Parameter) else Parameter(value))

    def append(self, value: Any) -> ParameterList:
        p = value if isinstance(value, Parameter) else Parameter(value)
        self.register_parameter(str(len(self)), p)
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        for v in values:
            self.append(v)
        return self


class ParameterDict(_RegistryDict):
    """An ordered dict of Parameters."""

    _registry = "_parameters"

    def __init__(self, parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        for k, v in (parameters or {}).items():
            self[k] = v

    def __setitem__(self, key: str, value: Any) -> None:
        self.register_parameter(key, value if isinstance(value, Parameter) else Parameter(value))
