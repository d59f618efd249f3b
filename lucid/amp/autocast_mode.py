"""``lucid.autocast``: mixed precision by op, with ``torch.autocast``'s semantics.

Inside an autocast region the dispatch point asks the active policy to cast an op's floating
operands before the op runs (``lucid/amp/_policy.py`` holds the table). The casts are ordinary
``cast`` ops: autograd differentiates them (a float32 weight gets a float32 gradient) and a tracer
records them, so a function compiled under autocast computes what eager autocast computes.

Lucid's eager tensors stand in for both the CPU and the Metal (MPSGraph) device, so both
``autocast("cpu")`` (bfloat16 by default) and ``autocast("mps")`` (float16 by default) act on them,
each with PyTorch's op lists for that device; when regions of both kinds nest, the innermost one
decides.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from lucid import _dtype
from lucid._state import state
from lucid._tensor import Tensor
from lucid.amp._policy import DEVICE_TYPES, FP32, LOWER, NONE, PROMOTE, policy

_DEFAULT_DTYPES = {"cpu": _dtype.bfloat16, "mps": _dtype.float16}
# Device types PyTorch knows that Lucid has no tensors for: autocast warns and stays off.
_ABSENT_DEVICE_TYPES = ("cuda", "xpu", "hpu", "xla", "mtia", "maia")


class _ThreadAutocast(threading.local):
    def __init__(self) -> None:
        self.enabled = dict.fromkeys(DEVICE_TYPES, False)
        self.dtype = dict(_DEFAULT_DTYPES)
        self.cache_enabled = True
        self.nesting = 0
        # id(source) -> (weakref to source, version, target dtype, cast tensor)
        self.cache: dict[int, tuple] = {}


_local = _ThreadAutocast()


def _eligible(x: Any) -> bool:
    # PyTorch casts floating tensors only, and never float64 ones.
    return isinstance(x, Tensor) and x.dtype.is_floating_point and x.dtype is not _dtype.float64


class _ActivePolicy:
    """What the dispatch point consults inside an enabled region (``state.autocast``)."""

    __slots__ = ("device_type", "dtype", "cache_enabled")

    def __init__(self, device_type: str, dt: _dtype.dtype, cache_enabled: bool):
        self.device_type = device_type
        self.dtype = dt
        self.cache_enabled = cache_enabled

    def cast_operands(self, opdef: Any, operands: tuple, attrs: dict) -> tuple:
        rule = policy(opdef.name, self.device_type)
        if rule == NONE:
            return operands
        if rule == FP32:
            if attrs.get("dtype") is not None:
                return operands  # an explicit output dtype wins (fp32_set_opt_dtype)
            target = _dtype.float32
        elif rule == LOWER:
            target = self.dtype
        else:
            assert rule == PROMOTE, rule
            target = self.dtype
            for x in _flatten(operands):
                if _eligible(x):
                    target = _dtype._higher(target, x.dtype)
        cast = self._cast
        return tuple(
            [cast(e, target) for e in x] if isinstance(x, (list, tuple)) else cast(x, target)
            for x in operands
        )

    def _cast(self, x: Any, target: _dtype.dtype) -> Any:
        if not _eligible(x) or x.dtype is target:
            return x
        # As PyTorch (and Apex): lower-precision casts of float32 leaf weights are cached for the
        # region, so a weight used by several ops is cast once. Never while tracing (a trace value
        # must not outlive its trace) and only with grad on (the cast must carry its graph).
        cacheable = (
            self.cache_enabled
            and target is self.dtype
            and x.dtype is _dtype.float32
            and x._requires_grad
            and x._node is None
            and x._data is not None
            and state.tracer is None
            and state.grad_enabled
        )
        if not cacheable:
            return x.type(target)
        hit = _local.cache.get(id(x))
        if hit is not None:
            ref, version, dt, cast = hit
            node = cast._node
            if (
                ref() is x
                and version == x._version[0]
                and dt is target
                and (node is None or not node.released)
            ):
                return cast
        cast = x.type(target)
        _local.cache[id(x)] = (weakref.ref(x), x._version[0], target, cast)
        return cast


def _flatten(operands: tuple):
    for x in operands:
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


def _check_device_type(device_type: Any) -> str:
    if not isinstance(device_type, str):
        raise TypeError(
            f"autocast: device_type must be a string such as 'cpu' or 'mps', "
            f"not {type(device_type).__name__}"
        )
    if device_type == "metal":
        return "mps"
    if device_type not in DEVICE_TYPES and device_type not in _ABSENT_DEVICE_TYPES:
        raise ValueError(
            f"autocast: unsupported device_type {device_type!r}; expected 'cpu' or 'mps' "
            "(Lucid's Metal device)"
        )
    return device_type


class autocast:  # noqa: N801  (torch.autocast)
    """Run ops in mixed precision inside a ``with`` block or a decorated function.

    ``device_type`` is ``"cpu"`` (default dtype bfloat16) or ``"mps"`` (default float16), each
    with PyTorch's op lists for that device. ``dtype`` is ``lucid.bfloat16`` or
    ``lucid.float16``; ``enabled=False`` switches autocast off inside an enclosing region;
    ``cache_enabled`` caches the casts of float32 weights for the region.

    >>> with lucid.autocast("cpu"):
    ...     y = model(x)            # linear/matmul/conv run in bfloat16
    """

    def __init__(
        self,
        device_type: str,
        dtype: Any = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ):
        self.device = _check_device_type(device_type)
        self.fast_dtype = None if dtype is None else _dtype.canonical(dtype)
        self._enabled = bool(enabled)
        self._cache_enabled = cache_enabled
        if self.device in _ABSENT_DEVICE_TYPES:
            if self._enabled:
                warnings.warn(
                    f"autocast: Lucid has no {self.device!r} device; autocast is disabled "
                    "(use device_type 'cpu' or 'mps')",
                    stacklevel=2,
                )
            self._enabled = False
        elif self.fast_dtype is not None and self.fast_dtype not in _dtype.HALF_DTYPES:
            if self._enabled:
                # PyTorch's behaviour: warn and switch this region off.
                warnings.warn(
                    f"autocast: the target dtype {self.fast_dtype} is not supported; "
                    f"{self.device} autocast supports lucid.bfloat16 and lucid.float16 only. "
                    "Disabling autocast.",
                    stacklevel=2,
                )
            self._enabled = False
        self._saved: list[tuple] = []

    def __enter__(self) -> autocast:
        if self.device in _ABSENT_DEVICE_TYPES:
            self._saved.append(None)
            return self
        dt = self.fast_dtype if self.fast_dtype in _dtype.HALF_DTYPES else None
        dt = dt or _local.dtype[self.device]
        cache = _local.cache_enabled if self._cache_enabled is None else bool(self._cache_enabled)
        self._saved.append(
            (
                _local.enabled[self.device],
                _local.dtype[self.device],
                _local.cache_enabled,
                state.autocast,
            )
        )
        _local.enabled[self.device] = self._enabled
        _local.dtype[self.device] = dt
        _local.cache_enabled = cache
        _local.nesting += 1
        state.autocast = _ActivePolicy(self.device, dt, cache) if self._enabled else None
        return self

    def __exit__(self, *exc: Any) -> None:
        saved = self._saved.pop()
        if saved is None:
            return
        _local.nesting -= 1
        if _local.nesting == 0:
            _local.cache.clear()  # cast weights must not outlive the outermost region
        (
            _local.enabled[self.device],
            _local.dtype[self.device],
            _local.cache_enabled,
            state.autocast,
        ) = saved

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether autocast is on for ``device_type`` on this thread; without an argument, whether
    eager ops are being autocast right now."""
    if device_type is None:
        return state.autocast is not None
    device_type = _check_device_type(device_type)
    return _local.enabled.get(device_type, False)


def get_autocast_dtype(device_type: str) -> _dtype.dtype:
    """The dtype ``autocast(device_type)`` casts to on this thread (its default outside)."""
    device_type = _check_device_type(device_type)
    if device_type in _ABSENT_DEVICE_TYPES:
        raise ValueError(f"get_autocast_dtype: Lucid has no {device_type!r} device")
    return _local.dtype[device_type]


def autocast_key() -> tuple[str, str] | None:
    """What the active autocast region changes about the ops it runs, as a hashable value:
    ``(device_type, dtype name)``, or None outside autocast. A cache of compiled graphs keys on
    it, since the same function traces to different graphs inside and outside a region."""
    active = state.autocast
    return None if active is None else (active.device_type, active.dtype.name)


def is_autocast_available(device_type: str) -> bool:
    """Whether ``autocast(device_type)`` can be enabled ('cpu' and 'mps')."""
    return device_type in DEVICE_TYPES or device_type == "metal"


def is_autocast_cache_enabled() -> bool:
    """Whether autocast caches the casts of float32 weights within a region."""
    return _local.cache_enabled


def clear_autocast_cache() -> None:
    """Drop the cached weight casts of this thread."""
    _local.cache.clear()
