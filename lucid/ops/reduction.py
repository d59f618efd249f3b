"""Reductions: one registry entry each, sharing the reduced-shape inference rule.

``dim`` is None (every dim), an int or a tuple of ints; negative dims count from the end.
``std``, ``count_nonzero``, ``var_mean`` and ``std_mean`` are compositions.
"""

from __future__ import annotations

import builtins
import math
from collections import namedtuple
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import tensor_method
from lucid.ops._registry import (
    GRAD_SINK,
    REQUIRED,
    AVal,
    OpDef,
    normalize_dim,
    normalize_dims,
    register,
)
from lucid.ops.elementwise import (
    abs,
    div,
    eq,
    exp,
    isclose,
    logical_and,
    maximum,
    minimum,
    ne,
    pow,
    sign,
    sqrt,
    where,
)

__all__ = [
    "all",
    "allclose",
    "amax",
    "amin",
    "any",
    "argmax",
    "argmin",
    "count_nonzero",
    "cumprod",
    "cumsum",
    "equal",
    "logsumexp",
    "max",
    "mean",
    "min",
    "norm",
    "prod",
    "std",
    "std_mean",
    "sum",
    "var",
    "var_mean",
]

# PyTorch's torch.return_types.max / min
max_result = namedtuple("max", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def _axis(dim):
    """The numpy ``axis`` for a reduction attribute (None, an int or a tuple)."""
    return dim if dim is None or isinstance(dim, int) else tuple(dim)


def _check_nonempty(x, dims, op):
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{op}(): expected reduction dim {d} to have non-zero size")
    if not dims and 0 in x.shape:
        raise RuntimeError(f"{op}(): cannot reduce an empty tensor without an identity")


def _float_only(x, op):
    if not x.dtype.is_floating_point:
        raise RuntimeError(
            f"{op}(): input dtype must be floating point, got {x.dtype}; pass dtype= or cast first"
        )


def _reduce_infer(op, dtype_rule=None, nonempty=False):
    """Inference shared by reductions; ``dtype_rule(x, attrs) -> dtype`` picks the output dtype."""

    def infer(x, dim=None, keepdim=False, **attrs):
        dims = normalize_dims(dim, x.ndim, op)
        if nonempty:
            _check_nonempty(x, dims, op)
        dt = dtype_rule(x, attrs) if dtype_rule else x.dtype
        return AVal(_reduced_shape(tuple(x.shape), dims, keepdim), dt)

    return infer


def _n_reduced(x, dim):
    n = 1
    for d in normalize_dims(dim, x.ndim):
        n *= x.shape[d]
    return n


def _expand_back(g, x, dim, keepdim):
    """Broadcast a reduced gradient (or value) back to ``x``'s shape."""
    if not keepdim and x.ndim:
        dims = normalize_dims(dim, x.ndim)
        shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        g = g.reshape(shape)
    return g.expand(*x.shape)


def _int_to_long(x, attrs):
    if attrs.get("dtype") is not None:
        return attrs["dtype"]
    return x.dtype if x.dtype.is_floating_point else _dtype.int64


def _mean_dtype(x, attrs):
    if attrs.get("dtype") is not None:
        return attrs["dtype"]
    _float_only(x, "mean")
    return x.dtype


def _var_dtype(x, attrs):
    _float_only(x, "var")
    return x.dtype


def _to_float(x, attrs):
    return x.dtype if x.dtype.is_floating_point else _dtype.default_float


# --- sum, mean, prod


def _sum_kernel(x, dim, keepdim, dtype):
    if dtype is None and x.dtype == np.float16:
        dtype = _dtype.float32  # accumulate in float32, as PyTorch; the result is cast back
    acc = _accumulate_dtype(x) if dtype is None else dtype.numpy
    return np.sum(x, axis=_axis(dim), keepdims=keepdim, dtype=acc)


register(
    OpDef(
        "sum",
        ("x",),
        _reduce_infer("sum", _int_to_long),
        _sum_kernel,
        lambda c, g: (_expand_back(g, c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]),),
        attrs={"dim": None, "keepdim": False, "dtype": None},
        saves_inputs=False,  # the rule reads only the input's shape
        saves_outputs=False,
    )
)


def _n_reduced_array(x: np.ndarray, dim) -> int:
    if dim is None:
        return x.size
    return math.prod(x.shape[d] for d in ((dim,) if isinstance(dim, int) else dim))


def _float_sum(x: np.ndarray, dim, keepdim: bool) -> np.ndarray:
    # float16 accumulates in float32, as PyTorch does.
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    return np.sum(x, axis=_axis(dim), keepdims=keepdim, dtype=acc)


def _mean_kernel(x, dim, keepdim, dtype):
    # sum / n rather than np.mean: an empty slice gives NaN silently, as PyTorch.
    if dtype is not None:
        x = x.astype(dtype.numpy)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _float_sum(x, dim, keepdim) / _n_reduced_array(x, dim)


def _mean_vjp(c, g):
    x, dim, keepdim = c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]
    return (div(_expand_back(g, x, dim, keepdim), _n_reduced(x, dim)),)


register(
    OpDef(
        "mean",
        ("x",),
        _reduce_infer("mean", _mean_dtype),
        _mean_kernel,
        _mean_vjp,
        attrs={"dim": None, "keepdim": False, "dtype": None},
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _accumulate_dtype(x: np.ndarray) -> np.dtype:
    """Integers and bools accumulate in int64, as PyTorch's sum/prod/cumsum."""
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.int64)


def _prod_kernel(x, dim, keepdim):
    return np.prod(x, axis=_axis(dim), keepdims=keepdim, dtype=_accumulate_dtype(x))


def _prod_vjp(c, g):
    # d prod / d x_i is the product of the other elements. Dividing by x_i breaks at zeros, so:
    # no zero in the slice -> prod / x_i; one zero -> the product of the rest at the zero only;
    # two or more -> 0.
    x, dim, keepdim = c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]
    is_zero = eq(x, 0)
    n_zeros = _expand_back(sum(is_zero, dim, keepdim=True), x, dim, True)
    nonzero = where(is_zero, 1.0, x)
    prod_nonzero = _expand_back(prod(nonzero, dim, keepdim=True), x, dim, True)
    others = where(
        eq(n_zeros, 0),
        div(prod_nonzero, nonzero),
        where(logical_and(eq(n_zeros, 1), is_zero), prod_nonzero, 0.0),
    )
    return (_expand_back(g, x, dim, keepdim) * others,)


register(
    OpDef(
        "prod",
        ("x",),
        _reduce_infer("prod", _int_to_long),
        _prod_kernel,
        _prod_vjp,
        attrs={"dim": None, "keepdim": False},
        saves_outputs=False,
    )
)


def _sum_to_size_infer(x, shape):
    return AVal(tuple(shape), x.dtype)


def _sum_to_size_kernel(x, shape):
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and x.shape[i + lead] != 1
    )
    out = np.sum(x, axis=axes, keepdims=True) if axes else x
    return out.reshape(shape)


register(
    OpDef(
        "sum_to_size",
        ("x",),
        _sum_to_size_infer,
        _sum_to_size_kernel,
        lambda c, g: (g.expand(*c.inputs[0].shape),),
        attrs={"shape": None},
        saves_outputs=False,
        doc="Sum a broadcast gradient back to ``shape`` (the inverse of broadcasting).",
    )
)

# --- var (std is sqrt(var))


def _var_vjp(c, g):
    x, dim, keepdim = c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]
    centered = x - mean(x, dim, keepdim=True)
    dof = builtins.max(_n_reduced(x, dim) - c.attrs["correction"], 0)
    scale = 2.0 / dof if dof else math.inf
    return (_expand_back(g, x, dim, keepdim) * centered * scale,)


def _var_kernel(x, dim, correction, keepdim):
    # Written out rather than np.var, which warns where PyTorch returns inf/NaN silently. The
    # divisor is PyTorch's max(n - correction, 0): an empty slice is 0 / 0 = NaN (not -0.0).
    n = _n_reduced_array(x, dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        centered = x - _float_sum(x, dim, True) / n
        return _float_sum(centered * centered, dim, keepdim) / builtins.max(n - correction, 0)


register(
    OpDef(
        "var",
        ("x",),
        _reduce_infer("var", _var_dtype),
        _var_kernel,
        _var_vjp,
        attrs={"dim": None, "correction": 1, "keepdim": False},
        saves_outputs=False,
    )
)

# --- max/min family


def _extreme_vjp(c, g):
    # Ties share the gradient evenly, as PyTorch's amax/amin and full max()/min().
    x, dim, keepdim = c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]
    out = _expand_back(c.outputs[0], x, dim, keepdim)
    hit = eq(x, out).type(g.dtype)
    count = _expand_back(sum(hit, dim, keepdim=True), x, dim, True)
    return (_expand_back(g, x, dim, keepdim) * hit / count,)


for _name, _kernel in (("amax", np.amax), ("amin", np.amin)):
    register(
        OpDef(
            _name,
            ("x",),
            _reduce_infer(_name, nonempty=True),
            lambda x, dim, keepdim, _k=_kernel: _k(x, axis=_axis(dim), keepdims=keepdim),
            _extreme_vjp,
            attrs={"dim": None, "keepdim": False},
        )
    )


def _arg_infer(op):
    def infer(x, dim=None, keepdim=False):
        if dim is None:
            _check_nonempty(x, (), op)
            shape = (1,) * x.ndim if keepdim else ()
            return AVal(shape, _dtype.int64)
        d = normalize_dim(dim, x.ndim, op)
        if x.ndim:
            _check_nonempty(x, (d,), op)
        return AVal(_reduced_shape(tuple(x.shape), (d,) if x.ndim else (), keepdim), _dtype.int64)

    return infer


def _arg_kernel(np_arg):
    def kernel(x, dim, keepdim):
        if x.ndim == 0:
            return np.zeros((), np.int64)
        return np_arg(x, axis=dim, keepdims=keepdim)

    return kernel


for _name, _np_arg in (("argmax", np.argmax), ("argmin", np.argmin)):
    register(
        OpDef(
            _name,
            ("x",),
            _arg_infer(_name),
            _arg_kernel(_np_arg),
            None,
            attrs={"dim": None, "keepdim": False},
            props=frozenset({GRAD_SINK}),
        )
    )


def _max_dim_infer(op):
    arg = _arg_infer(op)

    def infer(x, dim, keepdim):
        idx = arg(x, dim, keepdim)
        return AVal(idx.shape, x.dtype), idx

    return infer


def _max_dim_kernel(np_arg):
    def kernel(x, dim, keepdim):
        if x.ndim == 0:
            return x.copy(), np.zeros((), np.int64)
        idx = np_arg(x, axis=dim, keepdims=True)
        values = np.take_along_axis(x, idx, axis=dim)
        if not keepdim:
            values, idx = values.squeeze(dim), idx.squeeze(dim)
        return values, idx

    return kernel


def _max_dim_vjp(c, g, _g_indices=None):
    # The gradient goes to the one selected element (the index returned), as PyTorch.
    x, dim, keepdim = c.inputs[0], c.attrs["dim"], c.attrs["keepdim"]
    if x.ndim == 0:
        return (g,)
    chosen = eq(apply("iota", x, dim=dim), _expand_back(c.outputs[1], x, dim, keepdim))
    return (where(chosen, _expand_back(g, x, dim, keepdim), 0.0),)


for _name, _np_arg in (("max_dim", np.argmax), ("min_dim", np.argmin)):
    register(
        OpDef(
            _name,
            ("x",),
            _max_dim_infer(_name[:3]),
            _max_dim_kernel(_np_arg),
            _max_dim_vjp,
            attrs={"dim": REQUIRED, "keepdim": False},
            n_outputs=2,
            saves_inputs=False,
        )
    )


def _iota_infer(x, dim):
    normalize_dim(dim, x.ndim, "iota")
    return AVal(tuple(x.shape), _dtype.int64)


def _iota_kernel(x, dim):
    d = normalize_dim(dim, x.ndim, "iota")
    shape = [1] * x.ndim
    shape[d] = x.shape[d]
    return np.broadcast_to(np.arange(x.shape[d], dtype=np.int64).reshape(shape), x.shape).copy()


register(
    OpDef(
        "iota",
        ("x",),
        _iota_infer,
        _iota_kernel,
        None,
        attrs={"dim": 0},
        props=frozenset({GRAD_SINK}),
        saves_inputs=False,
        saves_outputs=False,
        doc="An int64 tensor of x's shape holding each element's index along ``dim``.",
    )
)

# --- logsumexp, cumsum


def _logsumexp_kernel(x, dim, keepdim):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # initial=-inf: an empty slice sums nothing, log(0) = -inf (PyTorch's answer).
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        m = np.amax(x, axis=_axis(dim), keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0)  # all -inf (or an inf) slices: no shift
        out = np.log(np.sum(np.exp(x - m), axis=_axis(dim), keepdims=True)) + m
    return out if keepdim else np.squeeze(out, axis=_axis(dim))


register(
    OpDef(
        "logsumexp",
        ("x",),
        _reduce_infer("logsumexp", _to_float),
        _logsumexp_kernel,
        lambda c, g: (
            _expand_back(g, c.inputs[0], c.attrs["dim"], c.attrs["keepdim"])
            * exp(
                c.inputs[0]
                - _expand_back(c.outputs[0], c.inputs[0], c.attrs["dim"], c.attrs["keepdim"])
            ),
        ),
        attrs={"dim": None, "keepdim": False},
    )
)


def _cumulative_infer(name):
    def infer(x, dim, dtype):
        normalize_dim(dim, x.ndim, name)
        return AVal(tuple(x.shape), _int_to_long(x, {"dtype": dtype}))

    return infer


def _cumsum_kernel(x, dim, dtype):
    if x.ndim == 0:
        return x.copy()
    return np.cumsum(x, axis=dim, dtype=_accumulate_dtype(x) if dtype is None else dtype.numpy)


def _cumsum_vjp(c, g):
    # The reversed cumulative sum: sum(g) - cumsum(g) + g.
    dim = c.attrs["dim"]
    if g.ndim == 0:
        return (g,)
    return (sum(g, dim, keepdim=True) - cumsum(g, dim) + g,)


register(
    OpDef(
        "cumsum",
        ("x",),
        _cumulative_infer("cumsum"),
        _cumsum_kernel,
        _cumsum_vjp,
        attrs={"dim": 0, "dtype": None},
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _cumprod_kernel(x, dim, dtype):
    out_dtype = _accumulate_dtype(x) if dtype is None else dtype.numpy
    return x.astype(out_dtype) if x.ndim == 0 else np.cumprod(x, axis=dim, dtype=out_dtype)


def _reversed_cumsum(v, dim):
    from lucid.ops.shape import flip  # shape builds on reductions

    return flip(cumsum(flip(v, (dim,)), dim), (dim,))


def _cumprod_vjp(c, g):
    # PyTorch's rule: dx_i = sum_{j>=i} g_j * out_j / x_i where x_i != 0. Past the first zero of a
    # slice every product vanishes, so later entries get 0; the first zero itself gets
    # sum_{j>=k} g_j * prod_{m<=j, m!=k} x_m, the reversed cumsum of g times the cumprod with
    # that zero replaced by one.
    x, out = c.inputs[0], c.outputs[0]
    if g.ndim == 0:
        return (g,)
    dim = c.attrs["dim"]
    is_zero = eq(x, 0)
    first_zero = logical_and(is_zero, eq(cumsum(is_zero, dim), 1))
    safe_x = where(is_zero, 1, x)
    nonzero_grad = where(is_zero, 0, _reversed_cumsum(g * out, dim) / safe_x)
    at_first_zero = _reversed_cumsum(g * cumprod(where(first_zero, 1, x), dim), dim)
    return (where(first_zero, at_first_zero, nonzero_grad),)


register(
    OpDef(
        "cumprod",
        ("x",),
        _cumulative_infer("cumprod"),
        _cumprod_kernel,
        _cumprod_vjp,
        attrs={"dim": 0, "dtype": None},
        saves_inputs=True,
        saves_outputs=True,
    )
)

# --- all / any


def _bool_dtype(x, attrs):
    return _dtype.bool_


for _name, _kernel in (("all", np.all), ("any", np.any)):
    register(
        OpDef(
            _name,
            ("x",),
            _reduce_infer(_name, _bool_dtype),
            lambda x, dim, keepdim, _k=_kernel: _k(x, axis=_axis(dim), keepdims=keepdim),
            None,
            attrs={"dim": None, "keepdim": False},
            props=frozenset({GRAD_SINK}),
        )
    )

# --- norm


def _norm_p(p: Any) -> float:
    if p == "fro" or p is None:
        return 2.0
    if isinstance(p, str) or isinstance(p, bool) or not isinstance(p, (int, float)):
        raise ValueError(f"norm: p must be a number, inf, -inf or 'fro', got {p!r}")
    return float(p)


def _norm_kernel(x, p, dim, keepdim):
    a = np.abs(x)
    axis, kd = _axis(dim), keepdim
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if p == 2:
            return np.sqrt(np.sum(a * a, axis=axis, keepdims=kd))
        if p == 1:
            return np.sum(a, axis=axis, keepdims=kd)
        if p == math.inf:
            return np.amax(a, axis=axis, keepdims=kd)
        if p == -math.inf:
            return np.amin(a, axis=axis, keepdims=kd)
        if p == 0:
            return np.sum(a != 0, axis=axis, keepdims=kd)
        return np.sum(a**p, axis=axis, keepdims=kd) ** (1 / p)


def _norm_infer(x, p, dim, keepdim):
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"norm(): input dtype must be floating point, got {x.dtype}")
    nonempty = p in (math.inf, -math.inf)
    return _reduce_infer("norm", nonempty=nonempty)(x, dim, keepdim)


def _norm_vjp(c, g):
    x, p, dim, keepdim = c.inputs[0], c.attrs["p"], c.attrs["dim"], c.attrs["keepdim"]
    g = _expand_back(g, x, dim, keepdim)
    out = _expand_back(c.outputs[0], x, dim, keepdim)
    if p == 0:
        return (g * 0.0,)
    if p == 1:
        return (g * sign(x),)
    if p in (math.inf, -math.inf):
        hit = eq(abs(x), out).type(g.dtype)
        count = _expand_back(sum(hit, dim, keepdim=True), x, dim, True)
        return (g * sign(x) * hit / count,)
    # A zero norm has a zero subgradient, as PyTorch.
    if p == 2:
        return (where(eq(out, 0), 0.0, g * div(x, out)),)
    scaled = sign(x) * pow(div(abs(x), out), p - 1)
    return (where(eq(out, 0), 0.0, g * scaled),)


register(
    OpDef(
        "norm",
        ("x",),
        _norm_infer,
        _norm_kernel,
        _norm_vjp,
        attrs={"p": 2.0, "dim": None, "keepdim": False},
    )
)

# --- fronts


def _dims(dim: Any) -> Any:
    """None, an int or a tuple; an empty tuple/list means every dim (as PyTorch)."""
    if isinstance(dim, (list, tuple)):
        return tuple(dim) if len(dim) else None
    if isinstance(dim, Tensor):
        return int(dim)
    return dim


def _dt(dtype: Any) -> Any:
    return None if dtype is None else _dtype.canonical(dtype)


@tensor_method()
def sum(x, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (every dim by default); integers and bools sum to int64."""
    return apply("sum", x, dim=_dims(dim), keepdim=keepdim, dtype=_dt(dtype))


@tensor_method()
def mean(x, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Arithmetic mean over ``dim``; needs a floating-point input (or ``dtype=``)."""
    return apply("mean", x, dim=_dims(dim), keepdim=keepdim, dtype=_dt(dtype))


@tensor_method()
def prod(x, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """Product over ``dim``; the gradient is exact where elements are zero."""
    if dtype is not None:
        x = x.type(dtype)
    return apply("prod", x, dim=_dims(dim), keepdim=keepdim)


def _correction(op: str, unbiased: Any, correction: Any) -> Any:
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}: pass either unbiased or correction, not both")
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@tensor_method()
def var(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Variance over ``dim`` with ``correction`` (default 1, Bessel's) or ``unbiased``."""
    if isinstance(dim, bool):  # the legacy var(x, unbiased) form
        dim, unbiased = None, dim
    corr = _correction("var", unbiased, correction)
    return apply("var", x, dim=_dims(dim), correction=corr, keepdim=keepdim)


@tensor_method()
def std(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """Standard deviation: ``sqrt(var(...))`` with the same arguments."""
    return sqrt(var(x, dim, unbiased, keepdim, correction=correction))


def var_mean(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """``(var, mean)`` over ``dim``."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return var(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


def std_mean(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """``(std, mean)`` over ``dim``."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return std(x, dim, unbiased, keepdim, correction=correction), mean(x, dim, keepdim)


@tensor_method()
def amax(x, dim=(), keepdim: bool = False) -> Tensor:
    """Maximum over ``dim`` (every dim by default); ties share the gradient evenly."""
    return apply("amax", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def amin(x, dim=(), keepdim: bool = False) -> Tensor:
    """Minimum over ``dim`` (every dim by default); ties share the gradient evenly."""
    return apply("amin", x, dim=_dims(dim), keepdim=keepdim)


def _extreme(op, elementwise, result, x, dim, keepdim, other):
    if isinstance(dim, Tensor):
        dim, other = None, dim
    if other is not None:
        return elementwise(x, other)
    if dim is None:
        if keepdim:
            raise TypeError(f"{op}(): keepdim needs a dim")
        return apply("a" + op, x, dim=None, keepdim=False)
    values, indices = apply(op + "_dim", x, dim=_dims(dim), keepdim=keepdim)
    return result(values, indices)


@tensor_method()
def max(x, dim=None, keepdim: bool = False, *, other=None):  # noqa: A001
    """``max(x)``: the 0-d maximum; ``max(x, dim)``: ``(values, indices)``; ``max(x, y)``:
    the elementwise maximum."""
    return _extreme("max", maximum, max_result, x, dim, keepdim, other)


@tensor_method()
def min(x, dim=None, keepdim: bool = False, *, other=None):  # noqa: A001
    """``min(x)``: the 0-d minimum; ``min(x, dim)``: ``(values, indices)``; ``min(x, y)``:
    the elementwise minimum."""
    return _extreme("min", minimum, min_result, x, dim, keepdim, other)


@tensor_method()
def argmax(x, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (of the flattened tensor when ``dim`` is None); int64."""
    return apply("argmax", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def argmin(x, dim=None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (of the flattened tensor when ``dim`` is None); int64."""
    return apply("argmin", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def logsumexp(x, dim=None, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``dim``, computed without overflow."""
    return apply("logsumexp", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def cumsum(x, dim: int, *, dtype=None) -> Tensor:
    """Cumulative sum along ``dim``; integers and bools accumulate in int64."""
    return apply("cumsum", x, dim=dim, dtype=_dt(dtype))


@tensor_method()
def cumprod(x, dim: int, *, dtype=None) -> Tensor:
    """Cumulative product along ``dim``; integers and bools accumulate in int64."""
    return apply("cumprod", x, dim=dim, dtype=_dt(dtype))


@tensor_method()
def all(x, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where every element over ``dim`` is nonzero."""
    return apply("all", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def any(x, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where some element over ``dim`` is nonzero."""
    return apply("any", x, dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def norm(x, p: Any = "fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """Vector p-norm over ``dim`` (every element by default): p = 2/'fro', 1, inf, -inf, 0 or
    any other number."""
    if dtype is not None:
        x = x.type(dtype)
    return apply("norm", x, p=_norm_p(p), dim=_dims(dim), keepdim=keepdim)


@tensor_method()
def count_nonzero(x, dim=None) -> Tensor:
    """Number of nonzero elements over ``dim``; int64."""
    return sum(ne(x, 0), dim)


def equal(x, y) -> bool:
    """True when both have the same shape and the same values (a Python bool)."""
    return tuple(x.shape) == tuple(y.shape) and builtins.bool(all(eq(x, y)))


def allclose(x, y, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """True when ``isclose`` holds everywhere (a Python bool)."""
    return builtins.bool(all(isclose(x, y, rtol, atol, equal_nan)))


Tensor.equal = equal
Tensor.allclose = allclose
Tensor.var_mean = var_mean
Tensor.std_mean = std_mean
