"""What a compiled executable is specialised on: ``CacheKey`` and the argument signatures it is
made of, computed once per call by ``cache_key``.

A tensor's signature is ``(shape, numpy dtype, requires_grad)``; any other argument's is
``(type, value)``; a tuple, list or dict holding tensors is ``(type, _TreeSig)`` over its
elements' signatures. With a symbolic batch the tensors' shared leading dim is None.
A training step keys its inputs with ``step_input_sig``: ``(shape, numpy dtype)`` per tensor.
Every key also holds ``lucid.amp.autocast_key()``: the same function traces to a different
graph inside an autocast region.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lucid._state import state
from lucid._tensor import Tensor
from lucid.amp import autocast_key
from lucid.compile._binding import mode_repr

__all__ = ["CacheKey", "cache_key", "step_input_sig"]


class CacheKey(tuple):
    """What a compiled executable is specialised on: the tensor arguments' shapes, dtypes and
    ``requires_grad``, the values of the other arguments, keyword names, the training modes
    (the model's flag, or ``(flag, names of submodules in the other mode)`` when they differ),
    whether gradients are needed, the parameters' dtypes and the autocast region."""

    __slots__ = ()

    def __repr__(self) -> str:
        args, kwargs, training, grad, params, autocast = self
        parts = [_sig_repr(a) for a in args] + [f"{k}={_sig_repr(v)}" for k, v in kwargs]
        mode = mode_repr(training)
        region = f", autocast({autocast[0]}, {autocast[1]})" if autocast is not None else ""
        return f"CacheKey(({', '.join(parts)}), {mode}{', grad' if grad else ''}{region})"


def _sig_repr(sig: tuple) -> str:
    if len(sig) == 3:
        shape, dt, rg = sig
        dims = "x".join("?" if d is None else str(d) for d in shape)
        return f"tensor<{dims}x{np.dtype(dt).name}>{'+grad' if rg else ''}"
    return repr(sig[1])


class _Unhashable(Exception):
    pass


class _NaN:
    """The key of every NaN scalar argument (NaN != NaN would make a new entry per call)."""

    def __repr__(self) -> str:
        return "nan"


_NAN = _NaN()


class _TreeSig(tuple):
    """The signature of a tuple, list or dict argument holding tensors: its elements'
    signatures (the tensors are fed, not baked in)."""

    __slots__ = ()

    def __repr__(self) -> str:
        kind, items = self
        if kind is dict or (isinstance(kind, type) and issubclass(kind, dict)):
            body = ", ".join(f"{k!r}: {_sig_repr(s)}" for k, s in items)
            return "{" + body + "}"
        body = ", ".join(_sig_repr(s) for s in items)
        return f"[{body}]" if issubclass(kind, list) else f"({body})"


def _has_tensor(a: Any) -> bool:
    if isinstance(a, Tensor):
        return True
    if isinstance(a, (tuple, list)):
        return any(_has_tensor(e) for e in a)
    if isinstance(a, dict):
        return any(_has_tensor(e) for e in a.values())
    return False


def _arg_sig(a: Any) -> tuple:
    """A tensor's signature is ``(shape, numpy dtype, requires_grad)``; any other argument's is
    ``(type, value)`` (so 1, 1.0 and True differ; every NaN is the same). A tuple, list or dict
    holding tensors is ``(type, _TreeSig)`` over its elements' signatures."""
    if isinstance(a, Tensor):
        d = a._data
        if d is None:
            raise _Unhashable("a trace tensor")
        return (d.shape, d.dtype, a._requires_grad)
    if isinstance(a, (tuple, list, dict)) and _has_tensor(a):
        if isinstance(a, dict):
            items = tuple([(k, _arg_sig(v)) for k, v in a.items()])
        else:
            items = tuple([_arg_sig(e) for e in a])
        return (type(a), _TreeSig((type(a), items)))
    if isinstance(a, (float, np.floating)) and a != a:
        return (type(a), _NAN)
    try:
        hash(a)
    except TypeError:
        raise _Unhashable(type(a).__name__) from None
    return (type(a), a)


def _sig_requires_grad(sig: tuple) -> bool:
    if len(sig) == 3:
        return bool(sig[2])
    tree = sig[1]
    if isinstance(tree, _TreeSig):
        kind, items = tree
        if isinstance(kind, type) and issubclass(kind, dict):
            return any(_sig_requires_grad(s) for _, s in items)
        return any(_sig_requires_grad(s) for s in items)
    return False


class _NotSymbolic(Exception):
    """The graph cannot share one executable across batch sizes (served per shape instead)."""


def _symbolic_sig(sig: tuple) -> tuple:
    """``sig`` with the leading dim of every tensor argument set to None, when all tensor
    arguments share one leading dim; else unchanged."""
    leads = {s[0][0] if s[0] else -1 for s in sig if len(s) == 3}
    if len(leads) != 1 or -1 in leads or None in leads:
        return sig
    return tuple((((None,) + s[0][1:]), s[1], s[2]) if len(s) == 3 else s for s in sig)


def _is_symbolic(key: tuple) -> bool:
    return any(len(s) == 3 and s[0] and s[0][0] is None for s in key[0])


@functools.cache
def _SYMBOLIC_SAFE_OPS() -> frozenset[str]:  # noqa: N802
    from lucid.ops import REGISTRY
    from lucid.ops._registry import SYMBOLIC_BATCH_SAFE

    return frozenset(n for n, op in REGISTRY.items() if SYMBOLIC_BATCH_SAFE in op.props)


def cache_key(
    args: tuple, kwargs: dict, params: list, training: Any, fingerprint: Any, symbolic: bool = False
) -> tuple:
    """The cache key of a call as a plain tuple (hashes and compares like the ``CacheKey``
    stored): ``params`` are the wrapper's parameters, ``training`` its training modes,
    ``fingerprint`` its parameters' dtypes; the active autocast region is read here. With
    ``symbolic``, the tensor arguments' shared leading dim is None. Raises ``_Unhashable`` for an
    argument that cannot be part of a key.

    This runs on every call, the cache hits included: the common case (concrete tensors of the
    exact Tensor class) is written out here rather than called."""
    sig = []
    any_rg = False
    for a in args:
        data = a._data if type(a) is Tensor else None
        if data is not None:
            rg = a._requires_grad
            sig.append((data.shape, data.dtype, rg))
        else:
            s = _arg_sig(a)
            sig.append(s)
            rg = _sig_requires_grad(s)
        any_rg = any_rg or rg
    sig = tuple(sig)
    if symbolic:
        sig = _symbolic_sig(sig)
    kw = ()
    if kwargs:
        kw = tuple(sorted([(k, _arg_sig(v)) for k, v in kwargs.items()]))
        any_rg = any_rg or any([_sig_requires_grad(s) for _, s in kw])
    grad = state.grad_enabled and (any_rg or any([p._requires_grad for p in params]))
    region = None if state.autocast is None else autocast_key()
    return (sig, kw, training, grad, fingerprint, region)


def step_input_sig(inputs: tuple) -> tuple:
    """A training step's key of its inputs: ``(shape, numpy dtype)`` per tensor (a step's
    gradients are always taken), ``(type, value)`` per other input."""
    try:  # the hot path: every input a concrete tensor
        sig = tuple([(a._data.shape, a._data.dtype) for a in inputs])
    except AttributeError:
        return _input_sig_slow(inputs)
    for i, a in enumerate(inputs):
        if a._requires_grad:
            _refuse_grad_input(i)
    return sig


def _refuse_grad_input(i: int) -> None:
    from lucid.compile.errors import CompileError

    raise CompileError(
        f"a training step's input {i} requires grad (a parameter, or a tensor computed from "
        "one): the compiled step feeds its inputs as constants, so no gradient would reach it "
        "or what it was computed from. Pass it detached (x.detach()), or train eagerly"
    )


def _input_sig_slow(inputs: tuple) -> tuple:
    sig = []
    for i, a in enumerate(inputs):
        if isinstance(a, Tensor):
            d = a._data
            if d is None:
                raise TypeError("a training step cannot take a trace tensor as input")
            if a._requires_grad:
                _refuse_grad_input(i)
            sig.append((d.shape, d.dtype))
        else:
            try:
                hash(a)
            except TypeError:
                raise TypeError(
                    f"a training step's non-tensor inputs must be hashable (they are baked into "
                    f"the compiled step), got {type(a).__name__}"
                ) from None
            if _holds_tensor(a):
                # Hashable by the tensors' identities: baked in, every call would compile anew.
                raise TypeError(
                    f"a training step's inputs are tensors or hashable constants, not a "
                    f"{type(a).__name__} holding tensors (they would be baked into the compiled "
                    "step as constants, compiled anew each call): give the model one tensor "
                    "(concatenate the parts and split them in forward), or train it eagerly"
                )
            sig.append((type(a), a))
    return tuple(sig)


def _holds_tensor(obj: Any) -> bool:
    if isinstance(obj, Tensor):
        return True
    if isinstance(obj, (tuple, list, set, frozenset)):
        return any(_holds_tensor(e) for e in obj)
    if isinstance(obj, dict):
        return any(_holds_tensor(v) for v in obj.values())
    return False
