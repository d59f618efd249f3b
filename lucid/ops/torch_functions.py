"""The rest of torch's tensor functions, as composites of registry ops (so gradients and
``lucid.compile`` follow from the ops they run): inverse trigonometric and hyperbolic functions,
small pointwise helpers, stacking and splitting spellings, NaN-aware and order-statistic
reductions, cumulative maxima, windows, and the legacy BLAS/LAPACK names of ``torch``.

Functions whose result depends on the values' count or on integer arithmetic numpy owns
(``gcd``, ``histc``, ``unique_consecutive``, ...) read their input, which is a graph break under
``lucid.compile`` (the call then runs eagerly, with the reason).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid._tensor import Tensor, _tensor_from

__all__ = [
    # pointwise
    "acos", "arccos", "acosh", "arccosh", "asin", "arcsin", "asinh", "arcsinh", "atan",
    "arctan", "atanh", "arctanh", "atan2", "arctan2", "cosh", "sinh", "exp2", "log2", "log10",
    "logaddexp2", "sinc", "logit", "xlogy", "copysign", "signbit", "fmod", "frac", "fix",
    "deg2rad", "rad2deg", "sgn", "positive", "float_power", "ldexp", "heaviside", "angle",
    "real", "conj", "conj_physical", "resolve_conj", "resolve_neg", "isreal", "isposinf",
    "isneginf", "fmax", "fmin", "isin", "gcd", "lcm",
    # creation
    "asarray", "as_tensor", "logspace", "empty_strided", "frombuffer", "from_dlpack",
    "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
    # indexing, joining, splitting
    "adjoint", "argwhere", "moveaxis", "dsplit", "hsplit", "vsplit", "column_stack", "dstack",
    "hstack", "vstack", "row_stack", "take", "narrow_copy", "unravel_index", "slice_scatter",
    "select_scatter", "diagonal_scatter", "broadcast_tensors", "broadcast_shapes", "ravel",
    "fliplr", "flipud", "diagflat", "combinations",
    # reductions and order statistics
    "aminmax", "nansum", "nanmean", "median", "nanmedian", "quantile", "nanquantile",
    "kthvalue", "cummax", "cummin", "logcumsumexp", "unique_consecutive", "histc", "histogram",
    "cov", "corrcoef", "renorm", "frexp", "nextafter", "bitwise_left_shift",
    "bitwise_right_shift", "gradient", "histogramdd", "scatter_reduce", "index_reduce",
    "lgamma", "digamma", "mvlgamma", "erfc", "polygamma", "i0", "erfinv",
    "geqrf", "ormqr", "svd_lowrank", "pca_lowrank", "igamma", "igammac",
    # BLAS and LAPACK
    "addbmm", "addr", "chain_matmul", "cholesky", "cholesky_inverse", "cholesky_solve", "ger",
    "inverse", "det", "logdet", "slogdet", "lu", "lu_solve", "lu_unpack", "matrix_power",
    "matrix_exp", "mv", "orgqr", "pinverse", "qr", "svd", "trapezoid", "trapz",
    "cumulative_trapezoid", "triangular_solve", "vdot", "vander",
]  # fmt: skip


def _lucid():
    import lucid

    return lucid


def _as_tensor_like(x: Any, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    return _tensor_from(np.asarray(x, dtype=like.dtype.numpy))


def _float(x: Tensor) -> Tensor:
    """Integer and bool inputs promote to the default float dtype, as torch's float functions."""
    return x if x.dtype.is_floating_point else x.type(_lucid().float32)


# --- inverse trigonometric and hyperbolic functions ---------------------------------------------

_TAN_PI_16 = math.tan(math.pi / 16)


def atan(input: Tensor) -> Tensor:  # noqa: A002
    """The arctangent. Range reduction (|x| > 1 through pi/2 - atan(1/x), then two half-angle
    steps atan(x) = 2 atan(x / (1 + sqrt(1 + x^2))) to |x| <= tan(pi/16)) and an odd Taylor
    series of 13 terms: exact to double precision, and its gradient is autograd's."""
    lucid = _lucid()
    x = _float(input)
    big = x.abs() > 1
    safe = lucid.where(x == 0, 1.0, x)  # 1/x only where |x| > 1 is used
    y = lucid.where(big, 1.0 / safe, x)
    for _ in range(2):
        y = y / (1.0 + (1.0 + y * y).sqrt())
    y2 = y * y
    series = y * 0
    for k in reversed(range(13)):
        series = series * y2 + ((-1.0) ** k) / (2 * k + 1)
    reduced = 4.0 * y * series
    return lucid.where(big, x.sign() * (math.pi / 2) - reduced, reduced)


def atan2(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The angle of the point (other, input) in (-pi, pi], as C's atan2 (signed zeros aside)."""
    lucid = _lucid()
    y, x = _float(input), _float(_as_tensor_like(other, input))
    safe_x = lucid.where(x == 0, 1.0, x)
    base = atan(y / safe_x)
    left = lucid.where(y < 0, base - math.pi, base + math.pi)
    on_axis = y.sign() * (math.pi / 2)
    return lucid.where(x > 0, base, lucid.where(x < 0, left, on_axis))


def asin(input: Tensor) -> Tensor:  # noqa: A002
    """The arcsine on [-1, 1] (NaN outside)."""
    x = _float(input)
    return atan2(x, (1.0 - x * x).sqrt())


def acos(input: Tensor) -> Tensor:  # noqa: A002
    """The arccosine on [-1, 1] (NaN outside)."""
    x = _float(input)
    return atan2((1.0 - x * x).sqrt(), x)


def sinh(input: Tensor) -> Tensor:  # noqa: A002
    """The hyperbolic sine, (expm1(x) - expm1(-x)) / 2 (accurate near 0)."""
    x = _float(input)
    return (x.expm1() - (-x).expm1()) * 0.5


def cosh(input: Tensor) -> Tensor:  # noqa: A002
    """The hyperbolic cosine."""
    x = _float(input)
    return (x.exp() + (-x).exp()) * 0.5


def asinh(input: Tensor) -> Tensor:  # noqa: A002
    """The inverse hyperbolic sine, odd: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) with x's sign."""
    lucid = _lucid()
    x = _float(input)
    negative = x < 0
    a = lucid.where(negative, -x, x)  # |x|, with slope 1 at 0 (abs has 0 there)
    magnitude = (a + a * a / (1.0 + (1.0 + a * a).sqrt())).log1p()
    return lucid.where(negative, -magnitude, magnitude)


def acosh(input: Tensor) -> Tensor:  # noqa: A002
    """The inverse hyperbolic cosine on [1, inf): log(x + sqrt(x^2 - 1))."""
    x = _float(input)
    return (x + (x * x - 1.0).sqrt()).log()


def atanh(input: Tensor) -> Tensor:  # noqa: A002
    """The inverse hyperbolic tangent on (-1, 1): (log1p(x) - log1p(-x)) / 2."""
    x = _float(input)
    return (x.log1p() - (-x).log1p()) * 0.5


arccos, arccosh, arcsin, arcsinh = acos, acosh, asin, asinh
arctan, arctanh, arctan2 = atan, atanh, atan2


# --- small pointwise helpers ----------------------------------------------------------------

_LN2, _LN10 = math.log(2.0), math.log(10.0)


def exp2(input: Tensor) -> Tensor:  # noqa: A002
    """2 ** x."""
    return (_float(input) * _LN2).exp()


def log2(input: Tensor) -> Tensor:  # noqa: A002
    """The base-2 logarithm."""
    return _float(input).log() / _LN2


def log10(input: Tensor) -> Tensor:  # noqa: A002
    """The base-10 logarithm."""
    return _float(input).log() / _LN10


def logaddexp2(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """log2(2^x + 2^y) without overflow."""
    lucid = _lucid()
    return lucid.logaddexp(_float(input) * _LN2, _as_tensor_like(other, input) * _LN2) / _LN2


def sinc(input: Tensor) -> Tensor:  # noqa: A002
    """The normalised sinc sin(pi x) / (pi x), 1 at 0."""
    lucid = _lucid()
    x = _float(input)
    zero = x == 0
    scaled = lucid.where(zero, 1.0, x) * math.pi
    return lucid.where(zero, 1.0, scaled.sin() / scaled)


def logit(input: Tensor, eps: float | None = None) -> Tensor:  # noqa: A002
    """log(p / (1 - p)), with p clamped to [eps, 1 - eps] when ``eps`` is given."""
    p = _float(input)
    if eps is not None:
        p = p.clamp(eps, 1.0 - eps)
    return p.log() - (1.0 - p).log()


def xlogy(input: Any, other: Any) -> Tensor:  # noqa: A002
    """x * log(y), 0 where x is 0 (unless y is NaN)."""
    lucid = _lucid()
    x = input if isinstance(input, Tensor) else _tensor_from(input)
    y = _as_tensor_like(other, x)
    x, y = _float(x), _float(y)
    product = x * lucid.where(x == 0, 1.0, y).log()
    return lucid.where((x == 0) & ~y.isnan(), 0.0 * product, product)


def signbit(input: Tensor) -> Tensor:  # noqa: A002
    """Whether the sign bit is set (negative numbers and -0.0)."""
    x = input
    if not x.dtype.is_floating_point:
        return x < 0
    return (x < 0) | ((x == 0) & ((1.0 / x) < 0))


def copysign(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """|x| with the sign (bit) of ``other``."""
    lucid = _lucid()
    x = _float(input)
    y = _as_tensor_like(other, x)
    return lucid.where(signbit(y), -x.abs(), x.abs())


def fmod(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """The C remainder x - trunc(x / y) * y: its sign follows x (``remainder`` follows y)."""
    x = input
    y = _as_tensor_like(other, x)
    if not x.dtype.is_floating_point and not y.dtype.is_floating_point:
        quotient = (x.type(_lucid().float64) / y.type(_lucid().float64)).trunc().type(x.dtype)
        return x - quotient * y
    return x - (x / y).trunc() * y


def frac(input: Tensor) -> Tensor:  # noqa: A002
    """x - trunc(x)."""
    return input - input.trunc()


def fix(input: Tensor) -> Tensor:  # noqa: A002
    """``trunc``."""
    return input.trunc()


def deg2rad(input: Tensor) -> Tensor:  # noqa: A002
    """Degrees to radians."""
    return _float(input) * (math.pi / 180.0)


def rad2deg(input: Tensor) -> Tensor:  # noqa: A002
    """Radians to degrees."""
    return _float(input) * (180.0 / math.pi)


def sgn(input: Tensor) -> Tensor:  # noqa: A002
    """``sign`` (real tensors)."""
    return input.sign()


def positive(input: Tensor) -> Tensor:  # noqa: A002
    """The input itself."""
    return input


def float_power(input: Any, exponent: Any) -> Tensor:  # noqa: A002
    """``pow`` in float64."""
    lucid = _lucid()
    base = input if isinstance(input, Tensor) else _tensor_from(input)
    base = base.type(lucid.float64)
    if isinstance(exponent, Tensor):
        exponent = exponent.type(lucid.float64)
    return base**exponent


def ldexp(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """x * 2 ** other."""
    x = _float(input)
    return x * exp2(_as_tensor_like(other, x).type(x.dtype))


def heaviside(input: Tensor, values: Tensor) -> Tensor:  # noqa: A002
    """0 for x < 0, ``values`` at 0, 1 for x > 0 (not differentiable)."""
    lucid = _lucid()
    positive_part = (input > 0).type(input.dtype)
    return lucid.where(input == 0, _as_tensor_like(values, input).type(input.dtype), positive_part)


def angle(input: Tensor) -> Tensor:  # noqa: A002
    """The argument of a real number: pi for negatives, 0 otherwise (NaN stays NaN)."""
    lucid = _lucid()
    x = _float(input)
    return lucid.where(x.isnan(), x, (x < 0).type(x.dtype) * math.pi)


def real(input: Tensor) -> Tensor:  # noqa: A002
    """The real part: a real tensor itself."""
    return input


def conj(input: Tensor) -> Tensor:  # noqa: A002
    """The complex conjugate: a real tensor itself."""
    return input


conj_physical = resolve_conj = resolve_neg = conj


def isreal(input: Tensor) -> Tensor:  # noqa: A002
    """True everywhere (Lucid's tensors are real)."""
    return (input == input) | (input != input)


def isposinf(input: Tensor) -> Tensor:  # noqa: A002
    """Whether each element is +inf."""
    return input == math.inf


def isneginf(input: Tensor) -> Tensor:  # noqa: A002
    """Whether each element is -inf."""
    return input == -math.inf


def fmax(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """Elementwise maximum that ignores a NaN operand (NaN only when both are)."""
    lucid = _lucid()
    y = _as_tensor_like(other, input)
    both = lucid.maximum(input, y)
    return lucid.where(input.isnan(), y, lucid.where(y.isnan(), input, both))


def fmin(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """Elementwise minimum that ignores a NaN operand (NaN only when both are)."""
    lucid = _lucid()
    y = _as_tensor_like(other, input)
    both = lucid.minimum(input, y)
    return lucid.where(input.isnan(), y, lucid.where(y.isnan(), input, both))


def isin(
    elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False
) -> Tensor:
    """Whether each element of ``elements`` occurs in ``test_elements``."""
    x = elements if isinstance(elements, Tensor) else _tensor_from(elements)
    tests = test_elements if isinstance(test_elements, Tensor) else _tensor_from(test_elements)
    found = (x.unsqueeze(-1) == tests.reshape(-1)).any(-1)
    return ~found if invert else found


def _integer_pair(name: str, a: Tensor, b: Any) -> tuple[np.ndarray, np.ndarray]:
    b = _as_tensor_like(b, a)
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        raise TypeError(f"{name}: expected integer tensors, got {a.dtype} and {b.dtype}")
    return a.numpy(), b.numpy()


def gcd(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The greatest common divisor of integer tensors (reads the values)."""
    x, y = _integer_pair("gcd", input, other)
    return _tensor_from(np.gcd(x, y))


def lcm(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The least common multiple of integer tensors (reads the values)."""
    x, y = _integer_pair("lcm", input, other)
    return _tensor_from(np.lcm(x, y))


# --- creation ---------------------------------------------------------------------------------


def asarray(
    obj: Any, *, dtype: Any = None, device: Any = None, copy: bool | None = None, **_: Any
) -> Tensor:
    """A tensor from ``obj``: a tensor is returned as is unless a dtype change or ``copy``
    asks for a new one; anything else is converted."""
    if isinstance(obj, Tensor):
        out = obj if dtype is None or dtype == obj.dtype else obj.type(dtype)
        return out.clone() if copy and out is obj else out
    if isinstance(obj, np.ndarray) and not copy and dtype is None:
        return _lucid().from_numpy(obj)
    return _tensor_from(obj, dtype)


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``asarray`` without a forced copy (a numpy array of a Lucid dtype is shared)."""
    return asarray(data, dtype=dtype)


def logspace(
    start: float,
    end: float,
    steps: int,
    base: float = 10.0,
    *,
    dtype: Any = None,
    **_: Any,
) -> Tensor:
    """``steps`` values from base**start to base**end, evenly spaced in the exponent."""
    lucid = _lucid()
    exponents = np.linspace(start, end, steps)
    return lucid.tensor(np.power(base, exponents), dtype=dtype or lucid.float32)


def empty_strided(size: Sequence[int], stride: Sequence[int], *, dtype: Any = None, **_: Any):
    """An uninitialised tensor of ``size`` (Lucid's tensors are contiguous: ``stride`` is only
    checked for length)."""
    if len(size) != len(stride):
        raise ValueError(f"empty_strided: {len(size)} sizes but {len(stride)} strides")
    return _lucid().empty(*size, dtype=dtype)


def frombuffer(
    buffer: Any, *, dtype: Any, count: int = -1, offset: int = 0, requires_grad: bool = False
) -> Tensor:
    """A 1-d tensor over the bytes of a Python buffer (shared, like torch)."""
    array = np.frombuffer(buffer, dtype=dtype.numpy, count=count, offset=offset)
    out = _lucid().from_numpy(array)
    return out.requires_grad_(True) if requires_grad else out


def from_dlpack(ext_tensor: Any) -> Tensor:
    """A tensor from any object with ``__dlpack__`` (through numpy's DLPack import)."""
    if isinstance(ext_tensor, Tensor):
        return ext_tensor
    return _lucid().from_numpy(np.from_dlpack(ext_tensor))


def _window(length: int, periodic: bool, dtype: Any, fn, name: str) -> Tensor:
    lucid = _lucid()
    if length < 0:
        raise ValueError(f"{name}: window_length must be non-negative, got {length}")
    if length == 0:
        return lucid.zeros(0, dtype=dtype or lucid.float32)
    if length == 1:
        return lucid.ones(1, dtype=dtype or lucid.float32)
    n = length + 1 if periodic else length
    values = fn(np.arange(n, dtype=np.float64), n)[:length]
    return lucid.tensor(values, dtype=dtype or lucid.float32)


def _cosine_window(a0: float, a1: float, a2: float = 0.0):
    def fn(k, n):
        phase = 2 * math.pi * k / (n - 1)
        return a0 - a1 * np.cos(phase) + a2 * np.cos(2 * phase)

    return fn


def hann_window(window_length: int, periodic: bool = True, *, dtype: Any = None, **_: Any):
    """0.5 - 0.5 cos(2 pi k / (N - 1)) (N = length + 1 when ``periodic``)."""
    return _window(window_length, periodic, dtype, _cosine_window(0.5, 0.5), "hann_window")


def hamming_window(
    window_length: int,
    periodic: bool = True,
    alpha: float = 0.54,
    beta: float = 0.46,
    *,
    dtype: Any = None,
    **_: Any,
) -> Tensor:
    """alpha - beta cos(2 pi k / (N - 1))."""
    fn = _cosine_window(alpha, beta)
    return _window(window_length, periodic, dtype, fn, "hamming_window")


def blackman_window(window_length: int, periodic: bool = True, *, dtype: Any = None, **_: Any):
    """0.42 - 0.5 cos(2 pi k / (N - 1)) + 0.08 cos(4 pi k / (N - 1))."""
    fn = _cosine_window(0.42, 0.5, 0.08)
    return _window(window_length, periodic, dtype, fn, "blackman_window")


def bartlett_window(window_length: int, periodic: bool = True, *, dtype: Any = None, **_: Any):
    """The triangular window 1 - |2k / (N - 1) - 1|."""

    def fn(k, n):
        return 1.0 - np.abs(2.0 * k / (n - 1) - 1.0)

    return _window(window_length, periodic, dtype, fn, "bartlett_window")


def kaiser_window(
    window_length: int,
    periodic: bool = True,
    beta: float = 12.0,
    *,
    dtype: Any = None,
    **_: Any,
) -> Tensor:
    """I0(beta sqrt(1 - (2k / (N - 1) - 1)^2)) / I0(beta)."""

    def fn(k, n):
        ratio = 2.0 * k / (n - 1) - 1.0
        return np.i0(beta * np.sqrt(np.clip(1.0 - ratio * ratio, 0.0, None))) / np.i0(beta)

    return _window(window_length, periodic, dtype, fn, "kaiser_window")


# --- indexing, joining, splitting ------------------------------------------------------------


def adjoint(input: Tensor) -> Tensor:  # noqa: A002
    """The conjugate transpose of the last two dims (the transpose, for real tensors)."""
    return input.mT


def argwhere(input: Tensor) -> Tensor:  # noqa: A002
    """The indices of the nonzero elements, one row each: (count, ndim)."""
    return _lucid().nonzero(input)


def moveaxis(input: Tensor, source: Any, destination: Any) -> Tensor:  # noqa: A002
    """``movedim``."""
    return _lucid().movedim(input, source, destination)


def _split_along(input: Tensor, sections: Any, dim: int, name: str, min_dims: int) -> tuple:  # noqa: A002
    if input.ndim < min_dims:
        raise ValueError(f"{name}: expected at least {min_dims} dims, got {tuple(input.shape)}")
    if isinstance(sections, int) and input.shape[dim] % sections:
        raise ValueError(
            f"{name}: dim {dim} of size {input.shape[dim]} does not split into {sections} equal "
            "parts"
        )
    return _lucid().tensor_split(input, sections, dim)


def hsplit(input: Tensor, indices_or_sections: Any) -> tuple:  # noqa: A002
    """Split along dim 1 (dim 0 of a 1-d tensor)."""
    dim = 1 if input.ndim > 1 else 0
    return _split_along(input, indices_or_sections, dim, "hsplit", 1)


def vsplit(input: Tensor, indices_or_sections: Any) -> tuple:  # noqa: A002
    """Split along dim 0 of a tensor with at least 2 dims."""
    return _split_along(input, indices_or_sections, 0, "vsplit", 2)


def dsplit(input: Tensor, indices_or_sections: Any) -> tuple:  # noqa: A002
    """Split along dim 2 of a tensor with at least 3 dims."""
    return _split_along(input, indices_or_sections, 2, "dsplit", 3)


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate along dim 1 (dim 0 for 1-d tensors)."""
    lucid = _lucid()
    ts = [lucid.atleast_1d(t) for t in tensors]
    return lucid.cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate along dim 0 after making every tensor at least 2-d."""
    lucid = _lucid()
    return lucid.cat([lucid.atleast_2d(t) for t in tensors], 0)


row_stack = vstack


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenate along dim 2 after making every tensor at least 3-d."""
    lucid = _lucid()
    return lucid.cat([lucid.atleast_3d(t) for t in tensors], 2)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    """Stack as columns: 0-d and 1-d tensors become (n, 1) columns, then ``hstack``."""
    lucid = _lucid()
    cols = [t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors]
    return lucid.cat(cols, 1)


def take(input: Tensor, index: Tensor) -> Tensor:  # noqa: A002
    """Elements of the flattened input at ``index`` (shape of ``index``; negatives count from
    the end)."""
    flat = input.reshape(-1)
    n = flat.shape[0]
    wrapped = (index + n) % n if n else index
    return flat.index_select(0, wrapped.reshape(-1)).reshape(*index.shape)


def narrow_copy(input: Tensor, dim: int, start: int, length: int) -> Tensor:  # noqa: A002
    """A copy of ``narrow``."""
    return input.narrow(dim, start, length).clone()


def unravel_index(indices: Any, shape: Any) -> tuple[Tensor, ...]:
    """The coordinates of flat ``indices`` in a tensor of ``shape`` (C order)."""
    idx = indices if isinstance(indices, Tensor) else _tensor_from(indices)
    if idx.dtype.is_floating_point:
        raise TypeError("unravel_index: expected an integer tensor of indices")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    total = math.prod(shape)
    if idx.numel() and bool(((idx < -total) | (idx >= total)).any()):
        raise ValueError(f"unravel_index: an index is out of bounds for shape {shape}")
    idx = (idx + total) % max(total, 1)
    out = []
    for k, size in enumerate(shape):
        stride = math.prod(shape[k + 1 :])
        out.append((idx // stride) % size)
    return tuple(out)


def _scatter_into(input: Tensor, src: Tensor, key: tuple) -> Tensor:  # noqa: A002
    out = input.clone()
    out[key] = src
    return out


def slice_scatter(
    input: Tensor,  # noqa: A002
    src: Tensor,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Tensor:
    """A copy of ``input`` with ``input[..., start:end:step, ...]`` (along ``dim``) = src."""
    key = (slice(None),) * (dim % input.ndim) + (slice(start, end, step),)
    return _scatter_into(input, src, key)


def select_scatter(input: Tensor, src: Tensor, dim: int, index: int) -> Tensor:  # noqa: A002
    """A copy of ``input`` with ``input.select(dim, index)`` = src."""
    key = (slice(None),) * (dim % input.ndim) + (index,)
    return _scatter_into(input, src, key)


def diagonal_scatter(
    input: Tensor,  # noqa: A002
    src: Tensor,
    offset: int = 0,
    dim1: int = 0,
    dim2: int = 1,
) -> Tensor:
    """A copy of ``input`` whose diagonal over (dim1, dim2) at ``offset`` is ``src``."""
    lucid = _lucid()
    d1, d2 = dim1 % input.ndim, dim2 % input.ndim
    rows, cols = input.shape[d1], input.shape[d2]
    mask = np.eye(rows, cols, k=offset, dtype=bool)
    shape = [1] * input.ndim
    shape[d1], shape[d2] = rows, cols
    placed = lucid.diag_embed(src, offset, d1, d2)
    placed = placed[tuple(slice(0, n) for n in input.shape)]
    if tuple(placed.shape) != tuple(input.shape):
        placed = placed.expand(*input.shape)
    return lucid.where(lucid.tensor(mask.reshape(shape)), placed, input)


def broadcast_shapes(*shapes: Any) -> tuple[int, ...]:
    """The shape the given shapes broadcast to (ValueError when they do not)."""
    try:
        return tuple(
            np.broadcast_shapes(*((s,) if isinstance(s, int) else tuple(s) for s in shapes))
        )
    except ValueError:
        raise ValueError(f"broadcast_shapes: shapes {shapes} do not broadcast") from None


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors expanded to their common broadcast shape."""
    shape = broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(t.expand(*shape) for t in tensors)


def ravel(input: Tensor) -> Tensor:  # noqa: A002
    """The tensor flattened to 1-d."""
    return input.reshape(-1)


def fliplr(input: Tensor) -> Tensor:  # noqa: A002
    """Reverse dim 1 (at least 2-d)."""
    if input.ndim < 2:
        raise ValueError("fliplr: expected a tensor with at least 2 dims")
    return _lucid().flip(input, (1,))


def flipud(input: Tensor) -> Tensor:  # noqa: A002
    """Reverse dim 0 (at least 1-d)."""
    if input.ndim < 1:
        raise ValueError("flipud: expected a tensor with at least 1 dim")
    return _lucid().flip(input, (0,))


def diagflat(input: Tensor, offset: int = 0) -> Tensor:  # noqa: A002
    """A 2-d matrix with the flattened input on its ``offset`` diagonal."""
    return _lucid().diag(input.reshape(-1), offset)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:  # noqa: A002
    """Every length-``r`` combination of a 1-d tensor's elements, one per row (itertools'
    order)."""
    if input.ndim != 1:
        raise ValueError(f"combinations: expected a 1-d tensor, got {tuple(input.shape)}")
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(range(input.shape[0]), r))
    if not rows:
        return input[:0].reshape(0, r) if r else input[:0]
    index = _tensor_from(np.asarray(rows, dtype=np.int64).reshape(-1))
    return input.index_select(0, index).reshape(len(rows), r)


# --- reductions and order statistics ----------------------------------------------------------


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False) -> tuple:  # noqa: A002
    """``(amin, amax)`` over ``dim`` (every element when None)."""
    from collections import namedtuple

    pair = namedtuple("aminmax", ["min", "max"])
    if dim is None:
        return pair(input.amin(), input.amax())
    return pair(input.amin(dim, keepdim=keepdim), input.amax(dim, keepdim=keepdim))


def nansum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """The sum with NaNs counted as zero."""
    lucid = _lucid()
    x = input if dtype is None else input.type(dtype)
    clean = lucid.where(x.isnan(), lucid.zeros_like(x), x) if x.dtype.is_floating_point else x
    return clean.sum() if dim is None and not keepdim else clean.sum(_dims(dim, x), keepdim=keepdim)


def _dims(dim: Any, x: Tensor) -> Any:
    return tuple(range(x.ndim)) if dim is None else dim


def nanmean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """The mean of the non-NaN elements."""
    x = input if dtype is None else input.type(dtype)
    counts = (~x.isnan()).type(x.dtype)
    total = nansum(x, dim, keepdim)
    return total / (
        counts.sum() if dim is None and not keepdim else counts.sum(_dims(dim, x), keepdim=keepdim)
    )


def _order_values(input: Tensor, dim: int | None, nan_last: bool) -> tuple[Tensor, Tensor, int]:  # noqa: A002
    x = input.reshape(-1) if dim is None else input
    d = 0 if dim is None else dim % max(x.ndim, 1)
    values, indices = _lucid().sort(x, d, stable=True)
    return values, indices, d


def median(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    """The lower median (the smaller of the two middle values); with ``dim`` also its index.
    A slice holding NaN has median NaN."""
    return _median(input, dim, keepdim, ignore_nan=False)


def nanmedian(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:  # noqa: A002
    """``median`` of the non-NaN elements (NaN only for an all-NaN slice)."""
    return _median(input, dim, keepdim, ignore_nan=True)


def _median(input: Tensor, dim: int | None, keepdim: bool, ignore_nan: bool) -> Any:  # noqa: A002
    from collections import namedtuple

    lucid = _lucid()
    values, indices, d = _order_values(input, dim, True)
    n = values.shape[d] if values.ndim else 1
    if n == 0:
        raise ValueError("median: cannot take the median of an empty tensor")
    if values.ndim == 0:
        values, indices = values.reshape(1), indices.reshape(1)
    if ignore_nan and values.dtype.is_floating_point:
        valid = (~values.isnan()).type(lucid.int64).sum(d, keepdim=True)
        pos = ((valid - 1).clamp_min(0)) // 2
    elif values.dtype.is_floating_point:  # NaN sorts last: any NaN makes the median NaN
        has_nan = values.isnan().any(d, keepdim=True)
        pos = lucid.where(has_nan, n - 1, (n - 1) // 2 + 0 * has_nan.type(lucid.int64))
    else:
        pos = lucid.full(
            tuple(values.shape[:d]) + (1,) + tuple(values.shape[d + 1 :]),
            (n - 1) // 2,
            dtype=lucid.int64,
        )
    picked = values.gather(d, pos)
    picked_index = indices.gather(d, pos)
    if dim is None:
        return picked.reshape(())
    if not keepdim:
        picked, picked_index = picked.squeeze(d), picked_index.squeeze(d)
    return namedtuple("median", ["values", "indices"])(picked, picked_index)


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> Any:  # noqa: A002
    """The ``k``-th smallest element (1-based) along ``dim`` and its index."""
    from collections import namedtuple

    values, indices, d = _order_values(input, dim, True)
    n = values.shape[d] if values.ndim else 1
    if not 1 <= k <= n:
        raise ValueError(f"kthvalue: k = {k} is out of range for a dim of size {n}")
    v = values.narrow(d, k - 1, 1) if values.ndim else values
    i = indices.narrow(d, k - 1, 1) if indices.ndim else indices
    if not keepdim and values.ndim:
        v, i = v.squeeze(d), i.squeeze(d)
    return namedtuple("kthvalue", ["values", "indices"])(v, i)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile(
    input: Tensor,  # noqa: A002
    q: Any,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    interpolation: str = "linear",
) -> Tensor:
    """The ``q``-quantiles (a float or a 1-d tensor in [0, 1]) along ``dim``, interpolating
    between order statistics as numpy's ``quantile``; NaN when a slice holds NaN."""
    return _quantile(input, q, dim, keepdim, interpolation, ignore_nan=False)


def nanquantile(
    input: Tensor,  # noqa: A002
    q: Any,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    interpolation: str = "linear",
) -> Tensor:
    """``quantile`` of the non-NaN elements."""
    return _quantile(input, q, dim, keepdim, interpolation, ignore_nan=True)


def _quantile(input, q, dim, keepdim, interpolation, ignore_nan):  # noqa: A002
    lucid = _lucid()
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"quantile: interpolation must be one of {_INTERPOLATIONS}")
    if not input.dtype.is_floating_point:
        raise TypeError(f"quantile: expected a floating point tensor, got {input.dtype}")
    scalar_q = not isinstance(q, Tensor) and np.ndim(q) == 0
    qs = np.atleast_1d(q.numpy() if isinstance(q, Tensor) else np.asarray(q, dtype=np.float64))
    if np.any((qs < 0) | (qs > 1)):
        raise ValueError("quantile: q must be in [0, 1]")
    values, _, d = _order_values(input, dim, True)
    n = values.shape[d]
    if n == 0:
        raise ValueError("quantile: the input is empty")
    if ignore_nan:
        count = (~values.isnan()).type(values.dtype).sum(d, keepdim=True)
    else:
        count = lucid.full_like(values.narrow(d, 0, 1), float(n))
    results = []
    for qv in qs:
        rank = (count - 1).clamp_min(0) * float(qv)
        low = rank.floor()
        high = rank.ceil()
        if interpolation == "lower":
            high = low
        elif interpolation == "higher":
            low = high
        elif interpolation == "nearest":
            low = high = rank.round()
        lo = values.gather(d, low.type(lucid.int64))
        hi = values.gather(d, high.type(lucid.int64))
        if interpolation == "midpoint":
            out = lo + (hi - lo) * 0.5
        elif interpolation == "linear":
            out = lo + (hi - lo) * (rank - low)
        else:
            out = lo
        if not ignore_nan:
            out = lucid.where(values.isnan().any(d, keepdim=True), math.nan, out)
        else:
            out = lucid.where(count == 0, math.nan, out)
        if dim is None:
            out = out.reshape(()) if not keepdim else out.reshape(*([1] * input.ndim))
        elif not keepdim:
            out = out.squeeze(d)
        results.append(out)
    return results[0] if scalar_q else lucid.stack(results, 0)


def _cumulative_extreme(input: Tensor, dim: int, larger: bool, name: str) -> Any:  # noqa: A002
    from collections import namedtuple

    lucid = _lucid()
    d = dim % max(input.ndim, 1)
    if input.ndim == 0:
        return namedtuple(name, ["values", "indices"])(input, lucid.zeros((), dtype=lucid.int64))
    values, indices = [], []
    best = best_index = None
    for i in range(input.shape[d]):
        x = input.select(d, i)
        if best is None:
            best, best_index = x, lucid.zeros_like(x, dtype=lucid.int64)
        else:
            # torch keeps the later index on ties and lets NaN win
            take = (x >= best) if larger else (x <= best)
            if x.dtype.is_floating_point:
                take = take | x.isnan()
                take = take & ~best.isnan() | (x.isnan())
            best = lucid.where(take, x, best)
            best_index = lucid.where(take, i, best_index)
        values.append(best)
        indices.append(best_index)
    return namedtuple(name, ["values", "indices"])(lucid.stack(values, d), lucid.stack(indices, d))


def cummax(input: Tensor, dim: int) -> Any:  # noqa: A002
    """Running maximum along ``dim`` and where it was found (the later index on ties)."""
    return _cumulative_extreme(input, dim, True, "cummax")


def cummin(input: Tensor, dim: int) -> Any:  # noqa: A002
    """Running minimum along ``dim`` and where it was found (the later index on ties)."""
    return _cumulative_extreme(input, dim, False, "cummin")


def logcumsumexp(input: Tensor, dim: int) -> Tensor:  # noqa: A002
    """log(cumsum(exp(x))) along ``dim``, one ``logaddexp`` per step (no underflow)."""
    lucid = _lucid()
    x = _float(input)
    if x.ndim == 0:
        return x
    d = dim % x.ndim
    running, out = None, []
    for i in range(x.shape[d]):
        xi = x.select(d, i)
        running = xi if running is None else lucid.logaddexp(running, xi)
        out.append(running)
    return lucid.stack(out, d) if out else x


def unique_consecutive(
    input: Tensor,  # noqa: A002
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: int | None = None,
) -> Any:
    """Collapse runs of equal consecutive elements (of the flattened input, or of slices along
    ``dim``); optionally the inverse map and the run lengths (reads the values)."""
    x = input.numpy()
    if dim is None:
        flat = x.reshape(-1)
        starts = np.ones(flat.shape[0], dtype=bool)
        starts[1:] = flat[1:] != flat[:-1]
        out = flat[starts]
        inverse = (np.cumsum(starts) - 1).reshape(x.shape)
    else:
        d = dim % x.ndim
        moved = np.moveaxis(x, d, 0)
        starts = np.ones(moved.shape[0], dtype=bool)
        if moved.shape[0] > 1:
            starts[1:] = np.any((moved[1:] != moved[:-1]).reshape(moved.shape[0] - 1, -1), 1)
        out = np.moveaxis(moved[starts], 0, d)
        inverse = np.cumsum(starts) - 1
    counts = np.diff(np.append(np.flatnonzero(starts), starts.shape[0]))
    result = [_tensor_from(np.ascontiguousarray(out))]
    if return_inverse:
        result.append(_tensor_from(inverse.astype(np.int64)))
    if return_counts:
        result.append(_tensor_from(counts.astype(np.int64)))
    return result[0] if len(result) == 1 else tuple(result)


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """Counts in ``bins`` equal bins over [min, max] (the data's range when both are 0);
    values outside are ignored (reads the values)."""
    x = input.numpy().astype(np.float64).reshape(-1)
    low, high = float(min), float(max)
    if low == high and x.size:
        low, high = float(x.min()), float(x.max())
    if low == high:
        low, high = low - 1, high + 1
    if low > high:
        raise ValueError(f"histc: max must be larger than min, got min={min} max={max}")
    counts, _ = np.histogram(x, bins=bins, range=(low, high))
    return _tensor_from(counts.astype(input.dtype.numpy))


def histogram(
    input: Tensor,  # noqa: A002
    bins: Any = 100,
    *,
    range: Any = None,  # noqa: A002
    weight: Tensor | None = None,
    density: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(hist, bin_edges)`` as numpy's histogram (reads the values)."""
    from collections import namedtuple

    edges_in = bins.numpy() if isinstance(bins, Tensor) else bins
    w = None if weight is None else weight.numpy()
    hist, edges = np.histogram(
        input.numpy(), bins=edges_in, range=range, weights=w, density=density
    )
    pair = namedtuple("histogram", ["hist", "bin_edges"])
    return pair(
        _tensor_from(hist.astype(input.dtype.numpy)), _tensor_from(edges.astype(input.dtype.numpy))
    )


def cov(
    input: Tensor,  # noqa: A002
    *,
    correction: int = 1,
    fweights: Tensor | None = None,
    aweights: Tensor | None = None,
) -> Tensor:
    """The covariance matrix of the rows (variables) of a 2-d input over its columns
    (observations), with optional frequency and analytic weights (numpy's ``cov``)."""
    x = _float(input)
    if x.ndim > 2:
        raise ValueError(f"cov: expected at most 2 dims, got {tuple(x.shape)}")
    x = x.reshape(1, -1) if x.ndim < 2 else x
    n = x.shape[1]
    w = None
    if fweights is not None:
        w = fweights.type(x.dtype)
    if aweights is not None:
        w = aweights.type(x.dtype) if w is None else w * aweights.type(x.dtype)
    if w is None:
        mean = x.mean(1, keepdim=True)
        norm = float(n - correction)
        centred = x - mean
        out = centred @ centred.mT / norm
    else:
        total = w.sum()
        mean = (x * w).sum(1, keepdim=True) / total
        if aweights is None:
            norm = total - correction
        else:
            norm = total - correction * (w * aweights.type(x.dtype)).sum() / total
        centred = x - mean
        out = (centred * w) @ centred.mT / norm
    return out.squeeze() if input.ndim < 2 else out


def corrcoef(input: Tensor) -> Tensor:  # noqa: A002
    """Pearson correlation coefficients of the rows, clipped to [-1, 1]."""
    c = cov(input)
    if c.ndim == 0:
        return c / c
    d = c.diagonal().sqrt()
    return (c / d.unsqueeze(1) / d.unsqueeze(0)).clamp(-1.0, 1.0)


def renorm(input: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:  # noqa: A002
    """Each slice along ``dim`` rescaled so its p-norm is at most ``maxnorm`` (torch's 1e-7
    guard in the scale)."""
    lucid = _lucid()
    d = dim % input.ndim
    others = tuple(i for i in range(input.ndim) if i != d)
    norms = (input.abs() ** p).sum(others, keepdim=True) ** (1.0 / p)
    scale = lucid.where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0 + 0 * norms)
    return input * scale


# --- BLAS and LAPACK ------------------------------------------------------------------------


def addbmm(
    input: Tensor,  # noqa: A002
    batch1: Tensor,
    batch2: Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> Tensor:
    """beta * input + alpha * sum_b batch1[b] @ batch2[b]."""
    product = _lucid().bmm(batch1, batch2).sum(0) * alpha
    return product if beta == 0 else input * beta + product


def addr(
    input: Tensor,  # noqa: A002
    vec1: Tensor,
    vec2: Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> Tensor:
    """beta * input + alpha * outer(vec1, vec2)."""
    product = _lucid().outer(vec1, vec2) * alpha
    return product if beta == 0 else input * beta + product


def chain_matmul(*matrices: Tensor) -> Tensor:
    """``linalg.multi_dot`` of 2-d matrices."""
    from lucid import linalg

    if len(matrices) == 1:
        return matrices[0]
    return linalg.multi_dot(matrices)


def cholesky(input: Tensor, upper: bool = False) -> Tensor:  # noqa: A002
    """``linalg.cholesky``."""
    from lucid import linalg

    return linalg.cholesky(input, upper=upper)


def cholesky_inverse(L: Tensor, upper: bool = False) -> Tensor:  # noqa: N803
    """The inverse of A from its Cholesky factor (A = L L^T, or U^T U when ``upper``)."""
    from lucid import linalg

    a = L.mT @ L if upper else L @ L.mT
    return linalg.inv(a)


def cholesky_solve(B: Tensor, L: Tensor, upper: bool = False) -> Tensor:  # noqa: N803
    """X with A X = B, from A's Cholesky factor, by two triangular solves."""
    from lucid import linalg

    low = L.mT if upper else L
    y = linalg.solve_triangular(low, B, upper=False)
    return linalg.solve_triangular(low.mT, y, upper=True)


def ger(input: Tensor, vec2: Tensor) -> Tensor:  # noqa: A002
    """``outer``."""
    return _lucid().outer(input, vec2)


def inverse(input: Tensor) -> Tensor:  # noqa: A002
    """``linalg.inv``."""
    from lucid import linalg

    return linalg.inv(input)


def det(input: Tensor) -> Tensor:  # noqa: A002
    """``linalg.det``."""
    from lucid import linalg

    return linalg.det(input)


def logdet(input: Tensor) -> Tensor:  # noqa: A002
    """log(det(A)): NaN for a negative determinant, -inf for zero."""
    lucid = _lucid()
    d = det(input)
    return lucid.where(d < 0, math.nan, d.log())


def slogdet(input: Tensor) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``linalg.slogdet``."""
    from collections import namedtuple

    from lucid import linalg

    return namedtuple("slogdet", ["sign", "logabsdet"])(*linalg.slogdet(input))


def lu(A: Tensor, pivot: bool = True, get_infos: bool = False) -> tuple:  # noqa: N803
    """``(LU, pivots)`` of ``linalg.lu_factor`` (and ``info`` with ``get_infos``)."""
    from lucid import linalg

    packed, pivots, info = linalg.lu_factor_ex(A, pivot=pivot)
    return (packed, pivots, info) if get_infos else (packed, pivots)


def lu_solve(b: Tensor, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:  # noqa: N803
    """``linalg.lu_solve(LU_data, LU_pivots, b)`` (torch's older argument order)."""
    from lucid import linalg

    return linalg.lu_solve(LU_data, LU_pivots, b)


def lu_unpack(LU_data: Tensor, LU_pivots: Tensor, unpack_data: bool = True,  # noqa: N803
              unpack_pivots: bool = True) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``(P, L, U)`` from ``lu_factor``'s packed result."""
    from lucid import linalg
    from lucid.linalg import _pivot_matrix

    m, n = LU_data.shape[-2:]
    k = min(m, n)
    lucid = _lucid()
    low = lucid.tril(LU_data[..., :, :k], -1) + lucid.eye(m, k, dtype=LU_data.dtype)
    up = lucid.triu(LU_data[..., :k, :])
    p = _pivot_matrix(LU_pivots, m, LU_data.dtype)
    del linalg
    return p, low, up


def matrix_power(input: Tensor, n: int) -> Tensor:  # noqa: A002
    """``linalg.matrix_power``."""
    from lucid import linalg

    return linalg.matrix_power(input, n)


def matrix_exp(A: Tensor) -> Tensor:  # noqa: N803
    """``linalg.matrix_exp``."""
    from lucid import linalg

    return linalg.matrix_exp(A)


def mv(input: Tensor, vec: Tensor) -> Tensor:  # noqa: A002
    """A matrix times a vector."""
    if input.ndim != 2 or vec.ndim != 1:
        raise ValueError(
            f"mv: expected a matrix and a vector, got {tuple(input.shape)} and {tuple(vec.shape)}"
        )
    return input @ vec


def orgqr(input: Tensor, tau: Tensor) -> Tensor:  # noqa: A002
    """``linalg.householder_product``."""
    from lucid import linalg

    return linalg.householder_product(input, tau)


def pinverse(input: Tensor, rcond: float = 1e-15) -> Tensor:  # noqa: A002
    """``linalg.pinv`` with relative tolerance ``rcond``."""
    from lucid import linalg

    return linalg.pinv(input, rtol=rcond)


def qr(input: Tensor, some: bool = True) -> tuple[Tensor, Tensor]:  # noqa: A002
    """``linalg.qr`` (reduced when ``some``, complete otherwise)."""
    from lucid import linalg

    return linalg.qr(input, "reduced" if some else "complete")


def svd(input: Tensor, some: bool = True, compute_uv: bool = True) -> tuple:  # noqa: A002
    """``(U, S, V)`` with A = U diag(S) V^T (V, not V^T; reduced when ``some``). Without
    ``compute_uv`` U and V are zero matrices, as torch."""
    from lucid import linalg

    if not compute_uv:
        s = linalg.svdvals(input)
        m, n = input.shape[-2:]
        lucid = _lucid()
        u = lucid.zeros(*input.shape[:-2], m, m if not some else min(m, n), dtype=input.dtype)
        v = lucid.zeros(*input.shape[:-2], n, n if not some else min(m, n), dtype=input.dtype)
        return u, s, v
    u, s, vh = linalg.svd(input, full_matrices=not some)
    return u, s, vh.mT


def _trapezoid_parts(y: Tensor, x: Any, dx: Any, dim: int) -> tuple[Tensor, Any]:
    d = dim % y.ndim
    n = y.shape[d]
    heights = (y.narrow(d, 1, n - 1) + y.narrow(d, 0, n - 1)) * 0.5
    if x is None:
        return heights, 1.0 if dx is None else dx
    if not isinstance(x, Tensor):
        x = _tensor_from(x)
    if x.ndim == 1:
        shape = [1] * y.ndim
        shape[d] = n
        x = x.reshape(*shape)
    widths = x.narrow(d if x.ndim == y.ndim else 0, 1, n - 1) - x.narrow(
        d if x.ndim == y.ndim else 0, 0, n - 1
    )
    return heights, widths


def trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along ``dim``, with sample points ``x`` or a spacing ``dx``."""
    if y.shape[dim % y.ndim] == 0:
        return y.sum(dim)
    heights, widths = _trapezoid_parts(y, x, dx, dim)
    return (heights * widths).sum(dim)


def trapz(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """``trapezoid``."""
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """The running trapezoidal integral along ``dim`` (one element shorter than ``y``)."""
    heights, widths = _trapezoid_parts(y, x, dx, dim)
    return _lucid().cumsum(heights * widths, dim)


def triangular_solve(
    b: Tensor,
    A: Tensor,  # noqa: N803
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(solution, A's copy)`` of A X = b with triangular A (A^T with ``transpose``)."""
    from collections import namedtuple

    from lucid import linalg

    lucid = _lucid()
    tri = lucid.triu(A) if upper else lucid.tril(A)
    mat, up = (tri.mT, not upper) if transpose else (tri, upper)
    x = linalg.solve_triangular(mat, b, upper=up, unitriangular=unitriangular)
    return namedtuple("triangular_solve", ["solution", "cloned_coefficient"])(x, A.clone())


def vdot(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The dot product of two 1-d tensors (no conjugation needed for real ones)."""
    return _lucid().dot(input, other)


def vander(x: Tensor, N: int | None = None, increasing: bool = False) -> Tensor:  # noqa: N803
    """The Vandermonde matrix of a 1-d tensor: columns x^(N-1), ..., x^0 (reversed when
    ``increasing``)."""
    from lucid import linalg

    if x.ndim != 1:
        raise ValueError(f"vander: expected a 1-d tensor, got {tuple(x.shape)}")
    out = linalg.vander(x, N=N)
    return out if increasing else _lucid().flip(out, (-1,))


# --- floating point decomposition, bit shifts, numerical gradients, N-d histograms -------------


def frexp(input: Tensor) -> Any:  # noqa: A002
    """``(mantissa, exponent)`` with x = mantissa * 2**exponent and 0.5 <= |mantissa| < 1; the
    mantissa is x scaled by an exact power of two, so its gradient is 2**-exponent."""
    from collections import namedtuple

    if not input.dtype.is_floating_point:
        raise TypeError(f"frexp: expected a floating point tensor, got {input.dtype}")
    _, exponent = np.frexp(input.detach().numpy())
    scale = np.ldexp(np.ones((), dtype=input.dtype.numpy), -exponent)  # an exact power of two
    mantissa = input * _tensor_from(scale.astype(input.dtype.numpy))
    exponent = _tensor_from(exponent.astype(np.int32))
    return namedtuple("frexp", ["mantissa", "exponent"])(mantissa, exponent)


def nextafter(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """The next representable float after x towards ``other`` (reads the values; no gradient)."""
    y = _as_tensor_like(other, input)
    return _tensor_from(
        np.nextafter(input.detach().numpy(), y.detach().numpy().astype(input.dtype.numpy))
    )


def _shift(name: str, input: Any, other: Any, fn) -> Tensor:  # noqa: A002
    x = input if isinstance(input, Tensor) else _tensor_from(input)
    y = _as_tensor_like(other, x)
    if x.dtype.is_floating_point or y.dtype.is_floating_point:
        raise TypeError(f"{name}: expected integer tensors, got {x.dtype} and {y.dtype}")
    return _tensor_from(fn(x.numpy(), y.numpy()).astype(x.dtype.numpy))


def bitwise_left_shift(input: Any, other: Any) -> Tensor:  # noqa: A002
    """x << other for integer tensors (reads the values)."""
    return _shift("bitwise_left_shift", input, other, np.left_shift)


def bitwise_right_shift(input: Any, other: Any) -> Tensor:  # noqa: A002
    """x >> other (arithmetic for signed integers; reads the values)."""
    return _shift("bitwise_right_shift", input, other, np.right_shift)


def _coordinates(spacing: Any, n: int) -> np.ndarray:
    if isinstance(spacing, Tensor):
        coords = spacing.detach().numpy().astype(np.float64)
        if coords.shape != (n,):
            raise ValueError(
                f"gradient: a coordinate tensor must have {n} entries, got {coords.shape}"
            )
        return coords
    return np.arange(n, dtype=np.float64) * float(spacing)


def _gradient_along(f: Tensor, d: int, coords: np.ndarray, edge_order: int) -> Tensor:
    """numpy's second-order accurate differences along dim ``d`` at (possibly uneven)
    coordinates: central in the interior, one-sided of ``edge_order`` at both ends."""
    lucid = _lucid()
    n = f.shape[d]
    if n < edge_order + 1:
        raise ValueError(f"gradient: dim {d} of size {n} needs at least {edge_order + 1} points")

    def sl(start: int, stop: int | None) -> Tensor:
        return f.narrow(d, start, (n if stop is None else stop) - start)

    def along(values: np.ndarray) -> Tensor:
        shape = [1] * f.ndim
        shape[d] = values.shape[0]
        return lucid.tensor(values.reshape(shape), dtype=f.dtype)

    h = np.diff(coords)
    pieces = []
    if edge_order == 1:
        pieces.append((sl(1, 2) - sl(0, 1)) / float(h[0]))
    else:
        h1, h2 = h[0], h[1]
        a, b, c = -(2 * h1 + h2) / (h1 * (h1 + h2)), (h1 + h2) / (h1 * h2), -h1 / (h2 * (h1 + h2))
        pieces.append(sl(0, 1) * float(a) + sl(1, 2) * float(b) + sl(2, 3) * float(c))
    if n > 2:
        hs, hd = h[:-1], h[1:]
        a = -hd / (hs * (hd + hs))
        b = (hd - hs) / (hd * hs)
        c = hs / (hd * (hd + hs))
        pieces.append(sl(0, n - 2) * along(a) + sl(1, n - 1) * along(b) + sl(2, None) * along(c))
    if edge_order == 1:
        pieces.append((sl(n - 1, None) - sl(n - 2, n - 1)) / float(h[-1]))
    else:
        h1, h2 = h[-2], h[-1]
        a, b, c = h2 / (h1 * (h1 + h2)), -(h2 + h1) / (h1 * h2), (2 * h2 + h1) / (h2 * (h1 + h2))
        pieces.append(
            sl(n - 3, n - 2) * float(a) + sl(n - 2, n - 1) * float(b) + sl(n - 1, None) * float(c)
        )
    return lucid.cat(pieces, d)


def gradient(
    input: Tensor,  # noqa: A002
    *,
    spacing: Any = 1,
    dim: Any = None,
    edge_order: int = 1,
) -> tuple[Tensor, ...]:
    """The derivative estimate along each of ``dim`` (every dim when None), as numpy's
    ``gradient``: ``spacing`` is a step per dim (a number or a list) or coordinate tensors."""
    if edge_order not in (1, 2):
        raise ValueError(f"gradient: edge_order must be 1 or 2, got {edge_order}")
    x = _float(input)
    dims = list(range(x.ndim)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    dims = [d % x.ndim for d in dims]
    spacings = list(spacing) if isinstance(spacing, (list, tuple)) else [spacing] * len(dims)
    if len(spacings) != len(dims):
        raise ValueError(f"gradient: {len(spacings)} spacings for {len(dims)} dims")
    return tuple(
        _gradient_along(x, d, _coordinates(s, x.shape[d]), edge_order)
        for d, s in zip(dims, spacings, strict=True)
    )


def histogramdd(
    input: Tensor,  # noqa: A002
    bins: Any = 10,
    *,
    range: Any = None,  # noqa: A002
    weight: Tensor | None = None,
    density: bool = False,
) -> Any:
    """``(hist, bin_edges)`` of (N, D) points in D dims, as numpy's ``histogramdd`` (reads the
    values)."""
    from collections import namedtuple

    points = input.numpy()
    edges_in = (
        [b.numpy() for b in bins]
        if isinstance(bins, (list, tuple)) and bins and isinstance(bins[0], Tensor)
        else bins
    )
    ranges = range  # torch's flat (min_0, max_0, min_1, max_1, ...) or numpy's pairs
    if ranges is not None and not isinstance(ranges[0], (tuple, list)):
        ranges = [tuple(ranges[int(i) : int(i) + 2]) for i in np.arange(0, len(ranges), 2)]
    w = None if weight is None else weight.numpy()
    hist, edges = np.histogramdd(points, bins=edges_in, range=ranges, weights=w, density=density)
    dt = input.dtype.numpy
    pair = namedtuple("histogramdd", ["hist", "bin_edges"])
    return pair(_tensor_from(hist.astype(dt)), [_tensor_from(e.astype(dt)) for e in edges])


# --- scatter and index reductions --------------------------------------------------------------

_SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _extreme_fill(dtype: Any, largest: bool) -> float | int:
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    info = np.iinfo(dtype.numpy)
    return int(info.min if largest else info.max)


def scatter_reduce(
    input: Tensor,  # noqa: A002
    dim: int,
    index: Tensor,
    src: Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> Tensor:
    """``input`` with each ``src`` element reduced (``sum``, ``prod``, ``mean``, ``amax``,
    ``amin``) into the position its ``index`` names along ``dim``; positions no index names keep
    their value. Computed densely (each source element against every target position), so it
    composes ops ``lucid.compile`` lowers and autograd differentiates."""
    lucid = _lucid()
    if reduce not in _SCATTER_REDUCTIONS:
        raise ValueError(
            f"scatter_reduce: reduce must be one of {_SCATTER_REDUCTIONS}, got {reduce!r}"
        )
    if index.ndim != input.ndim or src.ndim != input.ndim:
        raise ValueError(
            f"scatter_reduce: input, index and src need the same number of dims, got "
            f"{tuple(input.shape)}, {tuple(index.shape)} and {tuple(src.shape)}"
        )
    d = dim % input.ndim
    for k, (i, s, n) in enumerate(zip(index.shape, src.shape, input.shape, strict=True)):
        if i > s or (k != d and i > n):
            raise ValueError(
                f"scatter_reduce: index {tuple(index.shape)} is larger than src "
                f"{tuple(src.shape)} or input {tuple(input.shape)} along dim {k}"
            )
    src = src[tuple(slice(0, i) for i in index.shape)]
    region_key = tuple(slice(0, i) if k != d else slice(None) for k, i in enumerate(index.shape))
    region = input[region_key].movedim(d, -1)  # (..., n)
    n = region.shape[-1]
    mask = index.movedim(d, -1).unsqueeze(-1) == lucid.arange(n)  # (..., k, n)
    values = src.movedim(d, -1).unsqueeze(-1).type(input.dtype)
    count = mask.type(input.dtype).sum(-2)
    if reduce in ("sum", "mean"):
        reduced = lucid.where(mask, values, 0).sum(-2)
    elif reduce == "prod":
        reduced = lucid.where(mask, values, 1).prod(-2)
    else:
        largest = reduce == "amax"
        picked = lucid.where(mask, values, _extreme_fill(input.dtype, largest))
        reduced = picked.amax(-2) if largest else picked.amin(-2)
    hit = count > 0
    if include_self:
        if reduce == "sum":
            out = region + reduced
        elif reduce == "prod":
            out = region * reduced
        elif reduce == "mean":
            out = (region + reduced) / (count + 1)
        else:
            out = (
                lucid.maximum(region, reduced)
                if reduce == "amax"
                else lucid.minimum(region, reduced)
            )
    else:
        if reduce == "mean":
            reduced = reduced / lucid.where(hit, count, 1)
        out = lucid.where(hit, reduced, region)
    if not input.dtype.is_floating_point and reduce == "mean":
        out = out.floor().type(input.dtype)
    result = input.clone()
    result[region_key] = out.movedim(-1, d)
    return result


def index_reduce(
    input: Tensor,  # noqa: A002
    dim: int,
    index: Tensor,
    source: Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> Tensor:
    """``scatter_reduce`` with one index per slice of ``source`` along ``dim`` (``prod``,
    ``mean``, ``amax``, ``amin``)."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise ValueError(f"index_reduce: reduce must be prod, mean, amax or amin, got {reduce!r}")
    if index.ndim != 1 or index.shape[0] != source.shape[dim % source.ndim]:
        raise ValueError(
            f"index_reduce: index must be 1-d with one entry per slice of source along dim "
            f"{dim}, got {tuple(index.shape)} for source {tuple(source.shape)}"
        )
    d = dim % source.ndim
    shape = [1] * source.ndim
    shape[d] = index.shape[0]
    full_index = index.reshape(*shape).expand(*source.shape)
    return scatter_reduce(input, d, full_index, source, reduce, include_self=include_self)


# --- special functions: lgamma, digamma, mvlgamma, erfc ----------------------------------------

# Lanczos' approximation (g = 7, 9 terms): |relative error| < 1e-15 for x >= 1/2.
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)  # fmt: skip


def _nonpositive_integer(x: Tensor) -> Tensor:
    return (x <= 0) & (x == x.floor())


def lgamma(input: Tensor) -> Tensor:  # noqa: A002
    """log|Gamma(x)|: Lanczos' approximation for x >= 1/2, the reflection formula
    log(pi / |sin(pi x)|) - lgamma(1 - x) below; +inf at 0, -1, -2, ..."""
    lucid = _lucid()
    x = _float(input)
    reflect = x < 0.5
    z = lucid.where(reflect, 1.0 - x, x) - 1.0  # z >= -1/2
    series = z * 0 + _LANCZOS[0]
    for i, c in enumerate(_LANCZOS[1:], 1):
        series = series + c / (z + float(i))
    t = z + (_LANCZOS_G + 0.5)
    direct = 0.5 * math.log(2 * math.pi) + (z + 0.5) * t.log() - t + series.log()
    sine = (lucid.where(reflect, x, 0.5 * (x * 0 + 1)) * math.pi).sin().abs()
    reflected = math.log(math.pi) - sine.log() - direct
    out = lucid.where(reflect, reflected, direct)
    return lucid.where(_nonpositive_integer(x), math.inf, out)


# Asymptotic series of digamma: ln y - 1/(2y) - sum_k B_2k / (2k y^2k), exact to double
# precision for y >= 10.
_DIGAMMA_TERMS = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
_DIGAMMA_SHIFT = 10


def digamma(input: Tensor) -> Tensor:  # noqa: A002
    """The logarithmic derivative of Gamma: the recurrence psi(x) = psi(x + 10) - sum 1/(x + i)
    then the asymptotic series, reflection psi(1 - x) - pi / tan(pi x) below 1/2; -inf at 0, NaN
    at the negative integers."""
    lucid = _lucid()
    x = _float(input)
    reflect = x < 0.5
    xr = lucid.where(reflect, 1.0 - x, x)
    y = xr + float(_DIGAMMA_SHIFT)
    inv2 = 1.0 / (y * y)
    tail = y * 0
    for c in reversed(_DIGAMMA_TERMS):
        tail = (tail + c) * inv2
    out = y.log() - 0.5 / y - tail
    for i in range(_DIGAMMA_SHIFT):
        out = out - 1.0 / (xr + float(i))
    angle = lucid.where(reflect, x, 0.25 * (x * 0 + 1)) * math.pi
    out = lucid.where(reflect, out - math.pi / angle.tan(), out)
    out = lucid.where(_nonpositive_integer(x), math.nan, out)
    return lucid.where(x == 0, -math.inf, out)


def mvlgamma(input: Tensor, p: int) -> Tensor:  # noqa: A002
    """The multivariate log-gamma of dimension ``p``: p(p-1)/4 log(pi) + sum_i lgamma(x - i/2);
    every element must exceed (p - 1) / 2."""
    if p < 1:
        raise ValueError(f"mvlgamma: p must be at least 1, got {p}")
    x = _float(input)
    if x.numel() and bool((x <= (p - 1) / 2).any()):
        raise ValueError(f"mvlgamma: all elements must be greater than (p-1)/2 = {(p - 1) / 2}")
    total = lgamma(x)
    for i in range(1, p):
        total = total + lgamma(x - i / 2)
    return total + p * (p - 1) / 4 * math.log(math.pi)


_ERFC_SWITCH, _ERFC_DEPTH = 1.5, 80


def erfc(input: Tensor) -> Tensor:  # noqa: A002
    """1 - erf(x), without the cancellation: 1 - erf below 1.5, above it Laplace's continued
    fraction exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))) (80 levels,
    exact to double precision there)."""
    lucid = _lucid()
    x = _float(input)
    small = x < _ERFC_SWITCH
    xs = lucid.where(small, _ERFC_SWITCH + x * 0, x)
    fraction = xs
    for k in range(_ERFC_DEPTH, 0, -1):
        fraction = xs + (k / 2) / fraction
    tail = (-(xs * xs)).exp() / math.sqrt(math.pi) / fraction
    return lucid.where(small, 1.0 - lucid.erf(x), tail)


# Bernoulli numbers B_2, B_4, ..., B_16 for the asymptotic series of the polygamma functions.
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)


def polygamma(n: int, input: Tensor) -> Tensor:  # noqa: A002
    """The n-th derivative of digamma (n = 0 is digamma): the recurrence up by 12 then the
    asymptotic series (-1)^(n+1) [(n-1)!/y^n + n!/(2 y^(n+1)) + sum B_2k (2k+n-1)!/((2k)!
    y^(2k+n))]; for x > 0 (n >= 1), where it is exact to double precision."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"polygamma: n must be a non-negative int, got {n!r}")
    if n == 0:
        return digamma(input)
    lucid = _lucid()
    x = _float(input)
    shift = 12
    y = x + float(shift)
    total = y * 0 + math.factorial(n - 1) / 1.0
    total = total / y**n + math.factorial(n) / 2.0 / y ** (n + 1)
    for k, b in enumerate(_BERNOULLI, 1):
        coefficient = b * math.factorial(2 * k + n - 1) / math.factorial(2 * k)
        total = total + coefficient / y ** (2 * k + n)
    for i in range(shift):
        total = total + math.factorial(n) / (x + float(i)) ** (n + 1)
    out = total * float((-1) ** (n + 1))
    return lucid.where(_nonpositive_integer(x), math.nan, out)


_I0_SWITCH, _I0_SERIES_TERMS, _I0_ASYMPTOTIC_TERMS = 20.0, 60, 30


def i0(input: Tensor) -> Tensor:  # noqa: A002
    """The modified Bessel function of the first kind of order 0: its power series
    sum ((x/2)^k / k!)^2 up to |x| = 20 (positive terms, no cancellation), the asymptotic
    series e^|x| / sqrt(2 pi |x|) sum ((2k-1)!!)^2 / (k! (8|x|)^k) beyond."""
    lucid = _lucid()
    x = _float(input)
    a = x.abs()
    small = a <= _I0_SWITCH
    s = lucid.where(small, a, a * 0) * 0.5
    term, series = s * 0 + 1.0, s * 0 + 1.0
    for k in range(1, _I0_SERIES_TERMS):
        term = term * (s / k) * (s / k)
        series = series + term
    big = lucid.where(small, a * 0 + (_I0_SWITCH + 1.0), a)
    term, tail = big * 0 + 1.0, big * 0 + 1.0
    for k in range(1, _I0_ASYMPTOTIC_TERMS):
        term = term * ((2 * k - 1) ** 2 / (8.0 * k)) / big
        tail = tail + term
    asymptotic = big.exp() / (2 * math.pi * big).sqrt() * tail
    return lucid.where(small, series, asymptotic)


def erfinv(input: Tensor) -> Tensor:  # noqa: A002
    """The inverse error function on (-1, 1) (+-inf at +-1, NaN outside): Winitzki's closed
    form refined by four Newton steps on erf; autograd through the last step gives the
    derivative sqrt(pi)/2 exp(x^2)."""
    lucid = _lucid()
    y = _float(input)
    inside = y.abs() < 1
    ys = lucid.where(inside, y, y * 0)
    a = 0.147
    guess = ys.detach()  # the start needs no gradient: the Newton steps carry 1 / erf'(x)
    log_term = (1.0 - guess * guess).log()
    first = 2.0 / (math.pi * a) + log_term * 0.5
    x = guess.sign() * ((first * first - log_term / a).sqrt() - first).sqrt()
    for _ in range(4):
        x = x - (lucid.erf(x) - ys) / ((-(x * x)).exp() * (2.0 / math.sqrt(math.pi)))
    fixed = y.detach()  # the edge values carry no gradient (inf * 0 would leak NaN into it)
    edge = lucid.where(fixed.abs() == 1, fixed * math.inf, fixed * math.nan)
    return lucid.where(inside, x, edge)


# --- Householder QR in LAPACK's format, and low-rank SVD / PCA --------------------------------


def geqrf(input: Tensor) -> Any:  # noqa: A002
    """``(a, tau)``: LAPACK geqrf's QR in Householder form, R on and above the diagonal of ``a``,
    the reflectors' tails v_i (v_i[i] = 1) below it, H_i = I - tau_i v_i v_i^T (reads the
    values; not differentiable, as in torch). ``orgqr``/``ormqr`` apply Q."""
    from collections import namedtuple

    if input.ndim < 2 or not input.dtype.is_floating_point:
        raise ValueError(
            f"geqrf: expected a floating point (*, m, n) tensor, got {tuple(input.shape)}"
        )
    a = input.detach().numpy().astype(np.float64)
    flat = a.reshape((-1,) + a.shape[-2:]).copy()
    m, n = a.shape[-2:]
    k = min(m, n)
    taus = np.zeros((flat.shape[0], k))
    for b, mat in enumerate(flat):
        for i in range(k):
            alpha, x = mat[i, i], mat[i + 1 :, i]
            norm_x = np.linalg.norm(x)
            if norm_x == 0.0:  # dlarfg: H = I
                continue
            beta = -math.copysign(math.hypot(alpha, norm_x), alpha)
            taus[b, i] = (beta - alpha) / beta
            v = x / (alpha - beta)
            mat[i + 1 :, i] = v
            mat[i, i] = beta
            tail = mat[i:, i + 1 :]
            full_v = np.concatenate([[1.0], v])
            tail -= taus[b, i] * np.outer(full_v, full_v @ tail)
    dt = input.dtype.numpy
    out = namedtuple("geqrf", ["a", "tau"])
    return out(_tensor_from(flat.reshape(a.shape).astype(dt)),
               _tensor_from(taus.reshape(a.shape[:-2] + (k,)).astype(dt)))  # fmt: skip


def ormqr(
    input: Tensor,  # noqa: A002
    tau: Tensor,
    other: Tensor,
    left: bool = True,
    transpose: bool = False,
) -> Tensor:
    """Q @ other (``other @ Q`` when not ``left``; Q^T with ``transpose``), Q = H_1 ... H_k from
    geqrf's reflectors, applied one reflector at a time (differentiable in all three)."""
    lucid = _lucid()
    m = input.shape[-2]
    k = tau.shape[-1]
    if other.shape[-2 if left else -1] != m:
        raise ValueError(
            f"ormqr: other {tuple(other.shape)} does not match the reflectors' length {m}"
        )
    vectors = lucid.tril(input[..., :, :k], -1) + lucid.eye(m, k, dtype=input.dtype)
    # Q C = H_1 (H_2 (... H_k C)); Q^T C = H_k (... H_1 C); C Q = ((C H_1) H_2) ...
    order = range(k - 1, -1, -1) if left != transpose else range(k)
    out = other
    for i in order:
        v = vectors[..., :, i : i + 1]
        t = tau[..., i : i + 1].unsqueeze(-1)
        out = out - (v * t) @ (v.mT @ out) if left else out - ((out @ v) * t) @ v.mT
    return out


def svd_lowrank(
    A: Tensor,  # noqa: N803
    q: int | None = 6,
    niter: int = 2,
    M: Tensor | None = None,  # noqa: N803
) -> tuple[Tensor, Tensor, Tensor]:
    """``(U, S, V)`` of the rank-``q`` truncated SVD of A - M, A ~ U diag(S) V^T. Lucid
    computes the exact truncation (torch approximates it with ``niter`` randomized subspace
    iterations; its result tends to this one)."""
    from lucid import linalg

    a = A if M is None else A - M
    q = min(6 if q is None else q, *a.shape[-2:])
    u, s, vh = linalg.svd(a, full_matrices=False)
    return u[..., :q], s[..., :q], vh[..., :q, :].mT


def pca_lowrank(
    A: Tensor,  # noqa: N803
    q: int | None = None,
    center: bool = True,
    niter: int = 2,
) -> tuple[Tensor, Tensor, Tensor]:
    """``svd_lowrank`` of A with its column means subtracted (``center``); q defaults to
    min(6, m, n)."""
    q = min(6, *A.shape[-2:]) if q is None else q
    centred = A - A.mean(-2, keepdim=True) if center else A
    return svd_lowrank(centred, q, niter)


# --- regularized incomplete gamma functions -----------------------------------------------------

_IGAMMA_SERIES_TERMS, _IGAMMA_FRACTION_DEPTH = 300, 120


def _igamma_parts(a: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(use the series, P from the series, Q from the continued fraction), each branch fed safe
    inputs where the other one is used (series below x = a + 1, fraction above)."""
    lucid = _lucid()
    series_side = x < a + 1.0
    prefactor_x = lucid.where(x > 0, x, x * 0 + 1.0)
    log_prefactor = a * prefactor_x.log() - x - lgamma(a)
    # the series of P: x^a e^-x / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n))
    xs = lucid.where(series_side, x, x * 0)
    term = 1.0 / a
    total = term
    for n in range(1, _IGAMMA_SERIES_TERMS):
        term = term * xs / (a + float(n))
        total = total + term
    p_series = lucid.where(x == 0, x * 0, total * log_prefactor.exp())
    # the continued fraction of Q (modified Lentz, fixed depth)
    xc = lucid.where(series_side, a + 1.0, x)
    b = xc + 1.0 - a
    c = b * 0 + 1e300
    d = 1.0 / b
    h = d
    for i in range(1, _IGAMMA_FRACTION_DEPTH):
        an = -float(i) * (float(i) - a)
        b = b + 2.0
        d = 1.0 / (an * d + b)
        c = b + an / c
        h = h * d * c
    q_fraction = h * (a * xc.log() - xc - lgamma(a)).exp()
    return series_side, p_series, q_fraction


def igamma(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The regularized lower incomplete gamma function P(a, x) (a = ``input`` > 0, x =
    ``other`` >= 0): its series below x = a + 1, 1 - Q from the continued fraction above."""
    lucid = _lucid()
    a, x = _float(input), _float(_as_tensor_like(other, input))
    series_side, p_series, q_fraction = _igamma_parts(a, x)
    out = lucid.where(series_side, p_series, 1.0 - q_fraction)
    return lucid.where((a <= 0) | (x < 0), math.nan, out)


def igammac(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """The regularized upper incomplete gamma function Q(a, x) = 1 - P(a, x), from the
    continued fraction above x = a + 1 (no cancellation there)."""
    lucid = _lucid()
    a, x = _float(input), _float(_as_tensor_like(other, input))
    series_side, p_series, q_fraction = _igamma_parts(a, x)
    out = lucid.where(series_side, 1.0 - p_series, q_fraction)
    return lucid.where((a <= 0) | (x < 0), math.nan, out)
