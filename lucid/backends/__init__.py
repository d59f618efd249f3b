"""Backends, reached by name: the compiler (``lucid/compile``) knows no backend but through this
registry (see ``lucid/backends/base.py`` for what a backend gives).

>>> from lucid.backends import get_backend, resolve_backend
>>> get_backend(resolve_backend("auto")).name      # "cpu" on Linux
>>> register_backend("mine", MyBackend)            # a factory: called once, on first use

Built-in backends are registered by import path and loaded on first use: ``cpu`` (the native CPU
runtime, every platform), ``mpsgraph`` (Apple Silicon, macOS 14+, native part built) and
``mpsgraph-reference`` (the MPSGraph emission run by a numpy builder, on any machine).
"""

from __future__ import annotations

import importlib
import platform
import sys
import threading
from collections.abc import Callable

from lucid.backends.base import Backend, BackendUnavailable, Executable, Unsupported

__all__ = [
    "Backend",
    "BackendUnavailable",
    "Executable",
    "Unsupported",
    "available_backends",
    "get_backend",
    "register_backend",
    "registered_backends",
    "reporting_backends",
    "resolve_backend",
]

_BUILTIN = {
    "cpu": "lucid.backends.cpu.backend:CPUBackend",
    "mpsgraph": "lucid.backends.mpsgraph.backend:MPSGraphBackend",
    "mpsgraph-reference": "lucid.backends.mpsgraph.backend:MPSGraphReferenceBackend",
}

# ``auto``: the first available of these.
AUTO_ORDER = ("mpsgraph", "cpu")


def _apple_silicon() -> tuple[bool, str]:
    where = f"{sys.platform}/{platform.machine()}"
    if sys.platform != "darwin":
        return False, f"MPSGraph needs macOS 14+ on Apple Silicon: not macOS ({where})"
    if platform.machine() != "arm64":
        return False, f"MPSGraph needs macOS 14+ on Apple Silicon: not Apple Silicon ({where})"
    return True, ""


# Cheap necessary conditions checked before a built-in backend is imported (importing the
# MPSGraph package only to learn that this is not a Mac would slow every first compile).
_PRECONDITIONS = {"mpsgraph": _apple_silicon}

_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
_LOCK = threading.Lock()


def _lazy(target: str) -> Callable[[], Backend]:
    module, _, attr = target.partition(":")
    return lambda: getattr(importlib.import_module(module), attr)()


for _name, _target in _BUILTIN.items():
    _FACTORIES[_name] = _lazy(_target)
_BUILTIN_FACTORIES = dict(_FACTORIES)


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Make ``factory()`` (called once, on first use) the backend called ``name``."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"a backend name must be a non-empty string other than 'auto': {name!r}")
    if not callable(factory):
        raise TypeError(f"register_backend needs a factory (callable), got {factory!r}")
    with _LOCK:
        if name in _FACTORIES and not replace:
            raise ValueError(f"a backend named {name!r} is already registered")
        _FACTORIES[name] = factory
        _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget the backend called ``name`` (tests register toy backends and remove them)."""
    with _LOCK:
        _FACTORIES.pop(name, None)
        _INSTANCES.pop(name, None)


def registered_backends() -> tuple[str, ...]:
    """Every registered backend name, available here or not."""
    return tuple(_FACTORIES)


def _instance(name: str) -> Backend:
    backend = _INSTANCES.get(name)
    if backend is not None:
        return backend
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(["auto", *_FACTORIES])
        raise ValueError(f"unknown backend {name!r}; expected one of: {known}")
    with _LOCK:
        backend = _INSTANCES.get(name)
        if backend is None:
            try:
                backend = factory()
            except ImportError as e:
                raise BackendUnavailable(f"backend {name!r} cannot be loaded: {e}") from e
            if not isinstance(backend, Backend):
                raise TypeError(f"the factory of backend {name!r} returned {backend!r}")
            _INSTANCES[name] = backend
    return backend


def _status(name: str) -> tuple[bool, str]:
    precondition = _PRECONDITIONS.get(name)
    if precondition is not None and _FACTORIES.get(name) is _BUILTIN_FACTORIES.get(name):
        ok, why = precondition()
        if not ok:
            return False, why
    try:
        return _instance(name).available()
    except BackendUnavailable as e:
        return False, str(e)


def available_backends() -> tuple[str, ...]:
    """The registered backends that can run on this machine."""
    return tuple(n for n in _FACTORIES if _status(n)[0])


def reporting_backends() -> dict[str, tuple[Backend, str]]:
    """For reports (``diagnose``): every registered backend available here, and every one whose
    ``refusal`` holds without running (``reports_when_unavailable``) even where it cannot run,
    by name: ``(backend, "")`` when available, else ``(backend, why not)``."""
    out: dict[str, tuple[Backend, str]] = {}
    for name in tuple(_FACTORIES):
        ok, why = _status(name)
        if ok:
            out[name] = (_instance(name), "")
            continue
        try:
            backend = _instance(name)
        except BackendUnavailable:
            continue  # cannot even be loaded: nothing to report with
        if backend.reports_when_unavailable:
            out[name] = (backend, why)
    return out


def resolve_backend(name: str) -> str:
    """The backend ``name`` stands for: ``auto`` is MPSGraph where it runs (Apple Silicon, macOS
    14+, native part built), the CPU everywhere else. An unknown name is a ValueError; an
    unavailable backend a ``BackendUnavailable`` saying why."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string, got {type(name).__name__}")
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate in _FACTORIES and _status(candidate)[0]:
                return candidate
        reasons = "; ".join(f"{n}: {_status(n)[1]}" for n in AUTO_ORDER if n in _FACTORIES)
        raise BackendUnavailable(f"no backend is available on this machine ({reasons})")
    if name not in _FACTORIES:
        _instance(name)  # raises: unknown backend, listing the known ones
    ok, why = _status(name)
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available here: {why}")
    return name


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``auto`` resolved), ready to use on this machine."""
    return _instance(resolve_backend(name))
