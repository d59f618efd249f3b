"""Random ops: registry ops with the RANDOM property and an explicit ``rng`` operand.

``rng`` is an int64 tensor of shape (2,) = (key, counter) (see ``lucid._random``). A kernel's draws
depend on that pair alone; the fronts take the global pair and advance its counter, so
``manual_seed`` reproduces every sequence of calls.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from lucid import _dtype, _random
from lucid._dispatch import apply
from lucid._random import get_rng_state, initial_seed, manual_seed, seed, set_rng_state
from lucid._tensor import Tensor
from lucid.ops._registry import (
    GRAD_SINK,
    RANDOM,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    register,
    shape_of,
)
from lucid.ops.creation import _check_device, _dtype_or, _finish, _scalar, _size
from lucid.ops.elementwise import lt, mul

__all__ = [
    "bernoulli",
    "dropout",
    "get_rng_state",
    "initial_seed",
    "manual_seed",
    "multinomial",
    "normal",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "randperm",
    "seed",
    "set_rng_state",
]

_RANDOM = frozenset({RANDOM, GRAD_SINK})


def _next_rng(generator: Any, op: str) -> Tensor:
    """The (key, counter) pair for one draw: from ``generator`` when given (a
    ``lucid.Generator``), else from the global stream."""
    if generator is None:
        return _random.next_rng()
    from lucid._generator import Generator

    if not isinstance(generator, Generator):
        raise TypeError(
            f"{op}(): generator must be a lucid.Generator, got {type(generator).__name__}"
        )
    return Tensor._wrap(generator.next_state())


def _check_rng(rng: Any, op: str) -> None:
    dt = getattr(rng, "dtype", None)
    if dt is not _dtype.int64 or tuple(shape_of(rng)) != (2,):
        raise TypeError(
            f"{op}: rng must be an int64 tensor of shape (2,) = (key, counter), "
            f"got {dt} of shape {tuple(shape_of(rng))}"
        )


def _factory_infer(op: str, float_only: bool):
    def infer(rng, shape, dtype, **_params):
        _check_rng(rng, op)
        if float_only and not dtype.is_floating_point:
            raise TypeError(f"{op}: dtype must be floating point, got {dtype}")
        if not float_only and dtype.is_floating_point:
            raise TypeError(f"{op}: dtype must be an integer type, got {dtype}")
        return AVal(tuple(shape), dtype)

    return infer


def _uniform_kernel(rng, shape, dtype, low, high):
    u = _random.uniform01(rng, math.prod(shape), double=dtype is _dtype.float64)
    out = (low + (high - low) * u).reshape(shape).astype(dtype.numpy)
    if high > low:  # rounding to a narrow dtype must not reach the open upper bound
        top = np.nextafter(dtype.numpy.type(high), dtype.numpy.type(low))
        out = np.minimum(out, top)
    return out


def _normal_kernel(rng, shape, dtype, mean, std):
    z = _random.normal01(rng, math.prod(shape), double=dtype is _dtype.float64)
    return (mean + std * z).reshape(shape).astype(dtype.numpy)


def _randint_kernel(rng, shape, dtype, low, high):
    n, span = math.prod(shape), high - low
    if span <= 2**53:  # floor of a float64 uniform: exact and the same numbers as compiled code
        u = low + span * _random.uniform01(rng, n, double=True)
        return np.minimum(np.floor(u), high - 1).astype(np.int64).reshape(shape)
    words = _random.random_words(rng, 2 * n).astype(np.uint64).reshape(n, 2)
    wide = (words[:, 0] << np.uint64(32)) | words[:, 1]
    # int64 arithmetic wraps modulo 2**64, and the true result lies in [low, high).
    return ((wide % np.uint64(span)).astype(np.int64) + np.int64(low)).reshape(shape)


register(
    OpDef(
        "uniform",
        ("rng",),
        _factory_infer("uniform", float_only=True),
        _uniform_kernel,
        None,
        attrs={"shape": (), "dtype": _dtype.float32, "low": 0.0, "high": 1.0},
        props=_RANDOM,
        doc="Uniform draws in [low, high).",
    )
)
register(
    OpDef(
        "normal",
        ("rng",),
        _factory_infer("normal", float_only=True),
        _normal_kernel,
        None,
        attrs={"shape": (), "dtype": _dtype.float32, "mean": 0.0, "std": 1.0},
        props=_RANDOM,
        doc="Normal draws with the given mean and standard deviation.",
    )
)
register(
    OpDef(
        "randint",
        ("rng",),
        _factory_infer("randint", float_only=False),
        _randint_kernel,
        None,
        attrs={"shape": (), "dtype": _dtype.int64, "low": 0, "high": 2},
        props=_RANDOM,
        doc="Integers drawn uniformly from [low, high).",
    )
)


def _randperm_infer(rng, n, dtype):
    _check_rng(rng, "randperm")
    return AVal((n,), dtype)


register(
    OpDef(
        "randperm",
        ("rng",),
        _randperm_infer,
        lambda rng, n, dtype: np.argsort(_random.random_words(rng, n), kind="stable").astype(
            dtype.numpy
        ),
        None,
        attrs={"n": 0, "dtype": _dtype.int64},
        props=_RANDOM,
        doc="A random permutation of 0..n-1.",
    )
)


def _bernoulli_mask_infer(rng, x, p):
    _check_rng(rng, "bernoulli_mask")
    if not 0 <= p <= 1:
        raise ValueError(f"bernoulli_mask: p must be in [0, 1], got {p}")
    dt = x.dtype if x.dtype.is_floating_point else _dtype.default_float
    return AVal(tuple(x.shape), dt)


def _bernoulli_mask_kernel(rng, x, p):
    dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
    if p >= 1:
        return np.zeros(x.shape, dt)
    draw = np.float64 if dt == np.float64 else np.float32
    u = _random.uniform01(rng, x.size, double=draw is np.float64).astype(draw)
    keep = (u >= draw(p)).reshape(x.shape)
    return keep.astype(dt) * dt.type(1 / (1 - p))


register(
    OpDef(
        "bernoulli_mask",
        ("rng", "x"),
        _bernoulli_mask_infer,
        _bernoulli_mask_kernel,
        None,
        attrs={"p": 0.5},
        props=_RANDOM | {SYMBOLIC_BATCH_SAFE},
        saves_inputs=False,
        saves_outputs=False,
        doc="Dropout's mask: x's shape, entries 0 (probability p) or 1/(1-p).",
    )
)


# --- multinomial: categorical draws from the rows of a probability tensor


def _multinomial_infer(rng, probs, num_samples, replacement):
    _check_rng(rng, "multinomial")
    if not probs.dtype.is_floating_point:
        raise TypeError(f"multinomial: probabilities must be floating point, got {probs.dtype}")
    if probs.ndim not in (1, 2):
        raise ValueError(f"multinomial: probabilities must be 1-d or 2-d, got {probs.ndim}-d")
    n = probs.shape[-1]
    if n == 0:
        raise ValueError("multinomial: the number of categories cannot be 0")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples <= 0:
        raise ValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
    if not replacement and n is not None and num_samples > n:
        raise ValueError(
            f"multinomial: cannot draw {num_samples} samples without replacement from {n} "
            "categories"
        )
    return AVal((*probs.shape[:-1], num_samples), _dtype.int64)


def _multinomial_kernel(rng, probs, num_samples, replacement):
    rows = np.asarray(probs, dtype=np.float64).reshape(-1, probs.shape[-1])
    m, n = rows.shape
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ValueError("multinomial: probabilities must be finite and non-negative")
    positive = np.count_nonzero(rows > 0, axis=1)
    if np.any(positive == 0):
        raise ValueError("multinomial: a row of probabilities sums to 0")
    if not replacement and np.any(positive < num_samples):
        raise ValueError(
            f"multinomial: cannot draw {num_samples} samples without replacement from a row with "
            f"only {int(positive.min())} non-zero probabilities"
        )
    if replacement:
        # Inverse CDF: the number of cumulative sums at or below u * total. A category of
        # probability 0 spans an empty interval, so it is never drawn.
        cdf = np.cumsum(rows, axis=1)
        u = _random.uniform01(rng, m * num_samples, double=True).reshape(m, num_samples)
        target = u * cdf[:, -1:]
        drawn = np.sum(cdf[:, None, :] <= target[:, :, None], axis=2)
        last = np.max(np.where(rows > 0, np.arange(n), 0), axis=1, keepdims=True)
        out = np.minimum(drawn, last)
    else:
        # PyTorch's algorithm: the top num_samples of p / E with E ~ Exp(1) (exponential races).
        from lucid.ops.sorting import stable_order

        u = _random.uniform01(rng, m * n, double=True).reshape(m, n)
        race = -np.log1p(-u)
        with np.errstate(divide="ignore"):  # a race of 0 (u == 0) wins: p / 0 = inf
            keys = np.where(rows > 0, rows / race, -1.0)
        if num_samples == 1:  # the first largest key, without sorting (as PyTorch)
            out = np.argmax(keys, axis=1)[:, None]
        else:
            out = stable_order(keys, 1, True)[:, :num_samples]
    return out.astype(np.int64).reshape(*probs.shape[:-1], num_samples)


register(
    OpDef(
        "multinomial",
        ("rng", "probs"),
        _multinomial_infer,
        _multinomial_kernel,
        None,
        attrs={"num_samples": 1, "replacement": False},
        props=_RANDOM,
        saves_inputs=False,
        saves_outputs=False,
        doc="Category indices drawn from each row of (unnormalised) probabilities.",
    )
)


def multinomial(
    input: Tensor,  # noqa: A002
    num_samples: int,
    replacement: bool = False,
    *,
    generator: Any = None,
) -> Tensor:
    """``num_samples`` category indices (int64) per row of the non-negative weights ``input``
    (1-d or 2-d, rows need not sum to 1), with or without replacement, as PyTorch. Draws from
    the global stream (``lucid.manual_seed``) unless a ``lucid.Generator`` is given."""
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial(): expected a Tensor, got {type(input).__name__}")
    return apply(
        "multinomial",
        _next_rng(generator, "multinomial"),
        input,
        num_samples=operator.index(num_samples),
        replacement=bool(replacement),
    )


Tensor.multinomial = multinomial

# --- fronts


def _float_dtype(dtype: Any, op: str) -> _dtype.dtype:
    dt = _dtype_or(dtype, _dtype.default_float)
    if not dt.is_floating_point:
        raise TypeError(f"{op}(): dtype must be floating point, got {dt}")
    return dt


def rand(
    *shape, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """Uniform samples in [0, 1); float32 unless ``dtype`` says otherwise."""
    shp, dt = _size(shape, "rand", size), _float_dtype(dtype, "rand")
    _check_device(device)
    out = apply("uniform", _next_rng(generator, "rand"), shape=shp, dtype=dt, low=0.0, high=1.0)
    return _finish(out, requires_grad)


def randn(
    *shape, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """Standard normal samples; float32 unless ``dtype`` says otherwise."""
    shp, dt = _size(shape, "randn", size), _float_dtype(dtype, "randn")
    _check_device(device)
    out = apply("normal", _next_rng(generator, "randn"), shape=shp, dtype=dt, mean=0.0, std=1.0)
    return _finish(out, requires_grad)


def normal(
    mean: float = 0.0,
    std: float = 1.0,
    size=None,
    *,
    generator=None,
    dtype=None,
    device=None,
    requires_grad: bool = False,
) -> Tensor:
    """Normal samples of the given shape with scalar ``mean`` and ``std``."""
    if size is None:
        raise TypeError("normal(): pass size= (tensor-valued mean/std are not supported)")
    mean, std = _scalar(mean, "normal"), _scalar(std, "normal")
    if std < 0:
        raise ValueError(f"normal(): std must be non-negative, got {std}")
    shp, dt = _size((size,), "normal"), _float_dtype(dtype, "normal")
    _check_device(device)
    rng = _next_rng(generator, "normal")
    out = apply("normal", rng, shape=shp, dtype=dt, mean=mean, std=std)
    return _finish(out, requires_grad)


def _randint_bounds(low: Any, high: Any) -> tuple[int, int]:
    low, high = operator.index(low), operator.index(high)
    if high <= low:
        raise ValueError(f"randint(): expected low < high, got low={low}, high={high}")
    return low, high


def randint(
    *args, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """Integers uniform in [low, high): ``randint(high, size)`` or ``randint(low, high, size)``."""
    args = list(args)
    if size is None:
        if not args:
            raise TypeError("randint(): missing the size argument")
        size = args.pop()
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError("randint(): expected randint(high, size) or randint(low, high, size)")
    low, high = _randint_bounds(low, high)
    shp = _size((size,), "randint")
    _check_device(device)
    dt = _dtype_or(dtype, _dtype.int64)
    if not dt.is_floating_point and requires_grad:
        raise RuntimeError("randint(): only floating point tensors can require gradients")
    rng = _next_rng(generator, "randint")
    if dt.is_floating_point:
        out = apply("randint", rng, shape=shp, dtype=_dtype.int64, low=low, high=high)
        return _finish(out.type(dt), requires_grad)
    return apply("randint", rng, shape=shp, dtype=dt, low=low, high=high)


def randperm(
    n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False
) -> Tensor:
    """A random permutation of ``0 .. n-1``; int64 by default."""
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"randperm(): n must be non-negative, got {n}")
    _check_device(device)
    dt = _dtype_or(dtype, _dtype.int64)
    rng = _next_rng(generator, "randperm")
    return _finish(apply("randperm", rng, n=n, dtype=dt), requires_grad)


def _like_shape(x: Any, op: str) -> tuple:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): expected a Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def rand_like(x, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``rand`` with ``x``'s shape and (unless given) dtype."""
    return rand(
        _like_shape(x, "rand_like"),
        dtype=dtype or x.dtype,
        device=device,
        requires_grad=requires_grad,
    )


def randn_like(x, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``randn`` with ``x``'s shape and (unless given) dtype."""
    return randn(
        _like_shape(x, "randn_like"),
        dtype=dtype or x.dtype,
        device=device,
        requires_grad=requires_grad,
    )


def randint_like(x, low: int = 0, high: int | None = None, *, dtype=None, device=None) -> Tensor:
    """``randint`` with ``x``'s shape and (unless given) dtype; ``randint_like(x, high)`` too."""
    if high is None:
        low, high = 0, low
    return randint(low, high, _like_shape(x, "randint_like"), dtype=dtype or x.dtype, device=device)


def bernoulli(input: Tensor, p: float | None = None, *, generator=None) -> Tensor:  # noqa: A002
    """0/1 draws: 1 with probability ``input`` (elementwise), or ``p`` when given."""
    probs = input if p is None else p
    if p is None and not input.dtype.is_floating_point:
        raise TypeError(f"bernoulli(): probabilities must be floating point, got {input.dtype}")
    dt = input.dtype if input.dtype.is_floating_point else _dtype.default_float
    rng = _next_rng(generator, "bernoulli")
    u = apply("uniform", rng, shape=tuple(input.shape), dtype=_dtype.float64)
    return lt(u, probs).type(dt)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    Returns ``x`` itself when not training or when ``p == 0``.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return x
    if inplace:
        return x._apply_inplace(
            lambda a: mul(a, apply("bernoulli_mask", _random.next_rng(), a, p=p))
        )
    return mul(x, apply("bernoulli_mask", _random.next_rng(), x, p=p))


def feature_dropout(
    x: Tensor,
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
    spatial_dims: int = 2,
    name: str = "dropout2d",
) -> Tensor:
    """Zero each whole channel of ``x`` ((N, C, *spatial) or unbatched (C, *spatial)) with
    probability ``p`` and scale the kept ones by ``1/(1-p)``, when training."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if x.ndim not in (spatial_dims + 1, spatial_dims + 2):
        raise ValueError(
            f"{name}: expected {spatial_dims + 1}D (unbatched) or {spatial_dims + 2}D (batched) "
            f"input, got {x.ndim}D input of shape {tuple(x.shape)}"
        )
    if not training or p == 0:
        return x
    # One mask entry per (sample, channel), broadcast over the spatial dims; the slice keeps
    # symbolic batch sizes symbolic.
    keep_one = (slice(None),) * (x.ndim - spatial_dims) + (slice(0, 1),) * spatial_dims

    def dropped(a: Tensor) -> Tensor:
        return mul(a, apply("bernoulli_mask", _random.next_rng(), a[keep_one], p=p))

    return x._apply_inplace(dropped) if inplace else dropped(x)


# --- in-place fills: the drawn values overwrite the tensor through the "fill" op, so the old
# value gets a zero gradient as in PyTorch.


def _fill_from(self: Tensor, op: str, generator: Any, **attrs: Any) -> Tensor:
    if not self.dtype.is_floating_point:
        raise TypeError(f"{op}_(): the tensor must be floating point, got {self.dtype}")
    rng = _next_rng(generator, f"{op}_")
    return self._apply_inplace(
        lambda a: apply("fill", a, apply(op, rng, shape=tuple(a.shape), dtype=a.dtype, **attrs))
    )


def _normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """Fill with normal samples."""
    if std < 0:
        raise ValueError(f"normal_(): std must be non-negative, got {std}")
    return _fill_from(self, "normal", generator, mean=float(mean), std=float(std))


def _uniform_(
    self: Tensor, from_: float = 0.0, to: float = 1.0, *, generator=None, **kwargs: Any
) -> Tensor:
    """Fill with uniform samples in ``[from, to)``."""
    from_ = kwargs.pop("from", from_)
    if kwargs:
        raise TypeError(f"uniform_() got unexpected arguments {sorted(kwargs)}")
    if from_ > to:
        raise ValueError(f"uniform_(): expected from <= to, got from={from_}, to={to}")
    return _fill_from(self, "uniform", generator, low=float(from_), high=float(to))


def _bernoulli_(self: Tensor, p: Any = 0.5, *, generator=None) -> Tensor:
    """Fill with 0/1 draws, 1 with probability ``p`` (a number or a tensor)."""
    if isinstance(p, Tensor):
        draws = bernoulli(p.expand(*self.shape), generator=generator)
    else:
        draws = bernoulli(self, p, generator=generator)
    return self._apply_inplace(lambda a: apply("fill", a, draws))


def _random_(self: Tensor, low: int = 0, high: int | None = None, *, generator=None) -> Tensor:
    """Fill with integers uniform in ``[low, high)`` (``random_(high)`` means ``[0, high)``)."""
    if high is None:
        low, high = 0, low
    low, high = _randint_bounds(low, high)
    draws = apply(
        "randint",
        _next_rng(generator, "random_"),
        shape=tuple(self.shape),
        dtype=_dtype.int64,
        low=low,
        high=high,
    )
    return self._apply_inplace(lambda a: apply("fill", a, draws))


Tensor.normal_ = _normal_
Tensor.uniform_ = _uniform_
Tensor.bernoulli_ = _bernoulli_
Tensor.random_ = _random_
Tensor.bernoulli = bernoulli
