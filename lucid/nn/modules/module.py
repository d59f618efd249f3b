"""``Module``: the base class of every layer, as ``torch.nn.Module``.

A module owns three ordered name -> value tables: ``_parameters`` (Parameters), ``_buffers``
(Tensors that are state but not learnable, e.g. BatchNorm's running statistics) and ``_modules``
(submodules). Plain attribute assignment registers into the right table, so
``self.fc = Linear(2, 3)`` is all a layer writes. The compiler binds parameters and buffers by
object identity, which is why ``to(dtype)`` and ``load_state_dict`` change them in place.

Every change to one of these tables (in any module) bumps ``STRUCTURE_VERSION[0]``, so that a
compiled wrapper can tell in O(1) on each call whether the tensors it bound may have been
replaced (``model[2] = Linear(...)``, a new Parameter, ``load_state_dict(assign=True)``).
Likewise every assignment to a module's ``training`` flag (``train()``, ``eval()``,
``m.training = False``) bumps ``MODE_VERSION[0]``, so a wrapper re-reads its submodules' modes
only when one may have changed.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._autograd import no_grad
from lucid._tensor import Tensor, device
from lucid.nn.parameter import Parameter

__all__ = ["MODE_VERSION", "STRUCTURE_VERSION", "Module", "RemovableHandle"]

# Bumped by every change to a module's parameter, buffer or submodule table, in any module.
STRUCTURE_VERSION = [0]
# Bumped by every assignment to a module's ``training`` flag, in any module.
MODE_VERSION = [0]


class _Table(OrderedDict):
    """A module's name -> value table; each change bumps ``STRUCTURE_VERSION``."""

    def __setitem__(self, key: Any, value: Any) -> None:
        STRUCTURE_VERSION[0] += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        STRUCTURE_VERSION[0] += 1
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        STRUCTURE_VERSION[0] += 1
        return super().pop(*args)

    def popitem(self, last: bool = True) -> Any:
        STRUCTURE_VERSION[0] += 1
        return super().popitem(last)

    def clear(self) -> None:
        STRUCTURE_VERSION[0] += 1
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        STRUCTURE_VERSION[0] += 1
        super().update(*args, **kwargs)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        STRUCTURE_VERSION[0] += 1
        return super().setdefault(key, default)

    def move_to_end(self, key: Any, last: bool = True) -> None:
        STRUCTURE_VERSION[0] += 1
        super().move_to_end(key, last)


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by ``register_forward_hook``; ``remove()`` unregisters the hook."""

    _next_id = itertools.count()

    def __init__(self, hooks: dict):
        self._hooks = hooks
        self.id = next(RemovableHandle._next_id)

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _numpy_to_tensors(state_dict: dict) -> OrderedDict:
    """A copy of ``state_dict`` whose numpy arrays are tensors sharing their memory."""
    out = OrderedDict()
    for key, value in state_dict.items():
        if isinstance(value, (np.ndarray, np.generic)):
            if np.dtype(value.dtype) not in _dtype._BY_NUMPY:
                raise TypeError(
                    f'state_dict["{key}"] is a numpy array of dtype {value.dtype}, which Lucid '
                    "has no dtype for"
                )
            value = Tensor._wrap(np.asarray(value))
        out[key] = value
    return out


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


def _check_name(kind: str, name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got {name!r}')


def _parse_to(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """The (device, dtype) of ``Module.to(...)``'s PyTorch-style arguments."""
    dev = kwargs.pop("device", None)
    dt = kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, (str, device)) and not (isinstance(a, str) and a in _dtype._BY_NAME):
            dev = a
        elif isinstance(a, Tensor):
            dev, dt = a.device, a.dtype
        elif a is not None:
            dt = a
    if dev is not None:
        device(dev)  # an unknown or unavailable device raises here
    if dt is not None:
        dt = _dtype.canonical(dt)
        if not dt.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got {dt}")
    return dev, dt


class Module:
    """Base class of all layers. Subclasses call ``super().__init__()`` and define ``forward``.

    >>> class Net(lucid.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = lucid.nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.fc(x).relu()
    """

    training: bool
    _parameters: dict[str, Parameter | None]
    _buffers: dict[str, Tensor | None]
    _modules: dict[str, Module | None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise TypeError(
                f"{type(self).__name__}.__init__() got unexpected arguments; Module.__init__ "
                "takes none"
            )
        setattr_ = object.__setattr__
        setattr_(self, "training", True)
        setattr_(self, "_parameters", _Table())
        setattr_(self, "_buffers", _Table())
        setattr_(self, "_non_persistent_buffers_set", set())
        setattr_(self, "_modules", _Table())
        # Tables too: adding or removing a hook changes what a compiled wrapper traced.
        setattr_(self, "_forward_hooks", _Table())
        setattr_(self, "_forward_pre_hooks", _Table())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing "forward"')

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for hook in list(self._forward_pre_hooks.values()):
            res = hook(self, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            res = hook(self, args, out)
            if res is not None:
                out = res
        return out

    def register_forward_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, args, output)`` runs after ``forward``; a non-None result replaces it."""
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        return handle

    def register_forward_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(module, args)`` runs before ``forward``; a non-None result replaces ``args``."""
        handle = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[handle.id] = hook
        return handle

    # --- registration ---------------------------------------------------------------------------
    def _check_initialized(self, what: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or a None placeholder) under ``name``."""
        self._check_initialized("parameter")
        _check_name("parameter", name)
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                "(lucid.nn.Parameter or None required)"
            )
        if param is not None and param.grad_fn is not None:
            raise ValueError(
                f"cannot assign non-leaf Tensor to parameter '{name}'; model parameters must be "
                "created explicitly (compute the value, then wrap it with Parameter(t.detach()))"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: module state that is not a parameter (saved in ``state_dict`` unless
        ``persistent=False``)."""
        self._check_initialized("buffer")
        _check_name("buffer", name)
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                "(Tensor or None required)"
            )
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        """Add a child module under ``name``."""
        self._check_initialized("module")
        _check_name("module", name)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            self._check_initialized("parameters")
            self._remove_from(name, d, self._buffers, self._modules)
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                    "(lucid.nn.Parameter or None expected)"
                )
            params[name] = None
            return
        modules = d.get("_modules")
        if isinstance(value, Module):
            self._check_initialized("module")
            self._remove_from(name, d, self._parameters, self._buffers)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as child module '{name}' "
                    "(lucid.nn.Module or None expected)"
                )
            modules[name] = None
            return
        buffers = d.get("_buffers")
        if buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                    "(Tensor or None expected)"
                )
            buffers[name] = value
            return
        if name == "training":
            MODE_VERSION[0] += 1
        else:  # a plain attribute (a dropout rate, an eps) a compiled wrapper may have baked in
            STRUCTURE_VERSION[0] += 1
        object.__setattr__(self, name, value)

    @staticmethod
    def _remove_from(name: str, *tables: dict) -> None:
        for t in tables:
            t.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails; read the tables through __dict__ so that a
        # half-built object (copy, unpickling) does not recurse.
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                return t[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(set(keys))

    def get_submodule(self, target: str) -> Module:
        """The submodule at dotted path ``target`` ("" is ``self``)."""
        mod: Module = self
        if target == "":
            return mod
        for part in target.split("."):
            if part not in mod._modules or mod._modules[part] is None:
                raise AttributeError(f"{type(mod).__name__} has no submodule `{part}`")
            mod = mod._modules[part]
        return mod

    def get_parameter(self, target: str) -> Parameter:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter `{name}`")
        return mod._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._buffers:
            raise AttributeError(f"{type(mod).__name__} has no buffer `{name}`")
        return mod._buffers[name]

    # --- iteration ------------------------------------------------------------------------------
    def named_modules(
        self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Module]]:
        """``(dotted name, module)`` for ``self`` and every submodule, depth first, each once."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(
        self, table: str, prefix: str, recurse: bool, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        mods = (
            self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
            if recurse
            else [(prefix, self)]
        )
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, table).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield mod_prefix + ("." if mod_prefix else "") + name, value

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """``(dotted name, parameter)`` pairs; a parameter shared by two modules appears once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # --- state dict -----------------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(
        self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ) -> OrderedDict:
        """Parameters and persistent buffers by dotted name, in registration order, detached
        (sharing memory with the module's tensors)."""
        if args:
            raise TypeError("state_dict() takes keyword arguments only (destination, prefix, ...)")
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(
                    destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars
                )
        return destination

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        strict: bool,
        missing_keys: list,
        error_msgs: list,
        assign: bool,
    ) -> None:
        local = {k: v for k, v in self._parameters.items() if v is not None}
        local.update(
            (k, v)
            for k, v in self._buffers.items()
            if v is not None and k not in self._non_persistent_buffers_set
        )
        for name, current in local.items():
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected a Tensor from the '
                    f"checkpoint but received {type(value).__name__}"
                )
                continue
            if tuple(value.shape) != tuple(current.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} "
                    f"from checkpoint, the shape in current model is {tuple(current.shape)}."
                )
                continue
            if value.is_traced:
                error_msgs.append(f'"{key}" in the checkpoint is a trace tensor with no value')
                continue
            if assign:
                if isinstance(current, Parameter):
                    new = value if isinstance(value, Parameter) else Parameter(value)
                    new.requires_grad_(current.requires_grad)
                    setattr(self, name, new)
                else:
                    self._buffers[name] = value
            else:
                with no_grad():
                    np.copyto(current._data, value._data, casting="unsafe")
                current._version[0] += 1

    def load_state_dict(
        self, state_dict: dict, strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` into this module, in place.

        Returns ``(missing_keys, unexpected_keys)``. With ``strict`` either kind raises; a shape
        mismatch always raises. ``assign=True`` makes the module hold the given tensors instead of
        copying their values.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}")
        if any(isinstance(v, (np.ndarray, np.generic)) for v in state_dict.values()):
            state_dict = _numpy_to_tensors(state_dict)
        missing: list[str] = []
        errors: list[str] = []
        expected: set[str] = set()
        for prefix, module in self.named_modules(remove_duplicate=False):
            p = prefix + "." if prefix else ""
            module._load_from_state_dict(state_dict, p, strict, missing, errors, assign)
            expected.update(p + k for k, v in module._parameters.items() if v is not None)
            expected.update(
                p + k
                for k, v in module._buffers.items()
                if v is not None and k not in module._non_persistent_buffers_set
            )
        missing = list(dict.fromkeys(missing))
        unexpected = [k for k in state_dict if k not in expected]
        if strict:
            if unexpected:
                keys = ", ".join(f'"{k}"' for k in unexpected)
                errors.insert(0, f"Unexpected key(s) in state_dict: {keys}. ")
            if missing:
                keys = ", ".join(f'"{k}"' for k in missing)
                errors.insert(0, f"Missing key(s) in state_dict: {keys}. ")
        if errors:
            body = "\n\t".join(errors)
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}:\n\t{body}"
            )
        return _IncompatibleKeys(missing, unexpected)

    # --- modes and conversions ------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and every submodule (Dropout, BatchNorm read it)."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad`` to None (or to zeros, in place)."""
        for p in self.parameters():
            g = p.grad
            if g is None:
                continue
            if set_to_none or g._data is None:
                p.grad = None
            else:
                if g.grad_fn is not None:
                    g = g.detach()
                    p.grad = g
                g._data.fill(0)
                g._version[0] += 1

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every submodule (children first) and then on ``self``."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _cast_floating(self, dt: _dtype.dtype) -> None:
        """Cast every floating parameter, gradient and buffer to ``dt`` in place (identity kept)."""
        np_dt = dt.numpy
        for t in itertools.chain(self.parameters(), self.buffers()):
            if not t.dtype.is_floating_point or t._data is None or t._data.dtype == np_dt:
                continue
            t._data = t._data.astype(np_dt)
            t._version[0] += 1
            g = t._grad
            if g is not None and g._data is not None and g._data.dtype != np_dt:
                t._grad = Tensor._wrap(g._data.astype(np_dt))

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(tensor)``: casts floating
        parameters and buffers in place (the Parameter objects stay the same)."""
        _, dt = _parse_to(args, dict(kwargs))
        if dt is not None:
            self._cast_floating(dt)
        return self

    def cpu(self) -> Module:
        return self

    def float(self) -> Module:
        return self.to(_dtype.float32)

    def double(self) -> Module:
        return self.to(_dtype.float64)

    def half(self) -> Module:
        return self.to(_dtype.float16)

    def bfloat16(self) -> Module:
        return self.to(_dtype.bfloat16)

    def type(self, dst_type: Any) -> Module:
        return self.to(dst_type)

    # --- printing -------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text between the parentheses of this module's repr; override in layers."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        for name, module in self._modules.items():
            lines.append(f"({name}): " + _addindent(repr(module), 2))
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"
