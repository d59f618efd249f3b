"""Shape ops: reshape, permute, cat, pad, tril/triu, flip, roll, and composites built on them.

Registry ops are the few primitives a backend must provide (``reshape``, ``expand``, ``permute``,
``cat``, ``pad``, ``tril``, ``triu``, ``flip``, ``roll``); everything else here (``squeeze``,
``flatten``, ``transpose``, ``stack``, ``split``, ``tile``, ...) is a composite of them and of the
``index`` op of ``lucid.ops.indexing``, so it needs no kernel and no VJP of its own.

Symbolic dimensions (``None``, under a dynamic trace) pass through the shape rules wherever the
result does not depend on their value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid._dispatch import apply
from lucid._dtype import result_type
from lucid._tensor import Tensor
from lucid.ops._front import alias_version as _alias_version
from lucid.ops._front import tensor_method
from lucid.ops._registry import (
    PROMOTE,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    normalize_dim,
    normalize_dims,
    register,
)
from lucid.ops.indexing import index_select

__all__ = [
    "reshape",
    "expand",
    "expand_as",
    "broadcast_to",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "permute",
    "transpose",
    "swapaxes",
    "swapdims",
    "movedim",
    "t",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "narrow",
    "select",
    "split",
    "chunk",
    "unbind",
    "tile",
    "pad",
    "tril",
    "triu",
    "flip",
    "roll",
    "diagonal",
    "diag_embed",
    "diag",
    "meshgrid",
    "cartesian_prod",
    "tensor_split",
    "repeat_interleave",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "rot90",
    "diff",
    "tril_indices",
    "triu_indices",
]

_SAFE = frozenset({SYMBOLIC_BATCH_SAFE})


def _mul(*dims: Any) -> Any:
    """Product of sizes; None (symbolic) when any factor is symbolic."""
    out = 1
    for d in dims:
        if d is None:
            return None
        out *= d
    return out


def _add(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


def _shape_args(shape: tuple) -> tuple:
    """Accept ``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(d) if isinstance(d, (np.integer, Tensor)) else d for d in shape)


def _check_dims_arg(shape: tuple, op: str) -> None:
    for d in shape:
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < -1):
            raise ValueError(f"{op}: invalid size {d!r} in shape {tuple(shape)}")


# --- reshape -----------------------------------------------------------------------------------


def _resolve_shape(src: Sequence, shape: Sequence, op: str) -> tuple:
    """The target shape of a reshape, with its -1 resolved. Symbolic (None) dims of the source
    must reappear one for one in the target; the known dims must hold the same element count."""
    shape = list(shape)
    _check_dims_arg(tuple(shape), op)
    if None in shape and None not in src:
        # A symbolic-shape graph run at a concrete size: its symbolic dim is the unknown one.
        if shape.count(None) + shape.count(-1) > 1:
            raise ValueError(f"{op}: more than one unknown dim in {tuple(shape)}")
        shape = [-1 if d is None else d for d in shape]
    neg = [i for i, d in enumerate(shape) if d == -1]
    if len(neg) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {tuple(shape)}")
    total = _mul(*(d for d in src if d is not None))
    known = _mul(*(d for d in shape if d not in (-1, None)))
    n_symbolic = list(src).count(None)
    if n_symbolic == 1 and neg and None not in shape and known and total % known == 0:
        shape[neg[0]] = None  # the -1 absorbs the symbolic dim (x.reshape(-1, 12))
        return tuple(shape)
    if n_symbolic != shape.count(None):
        raise ValueError(
            f"{op}: cannot reshape {tuple(src)} into {tuple(shape)}: symbolic dims must be kept"
        )
    if neg:
        if known == 0 or total % known:
            raise ValueError(f"{op}: cannot reshape {tuple(src)} into {tuple(shape)}")
        shape[neg[0]] = total // known
    elif known != total:
        raise ValueError(
            f"{op}: cannot reshape {tuple(src)} ({total} elements) into "
            f"{tuple(shape)} ({known} elements)"
        )
    return tuple(shape)


def _reshape_kernel(x: np.ndarray, shape: tuple) -> np.ndarray:
    # A symbolic-shape trace writes its one symbolic dim as None: numpy infers it like -1.
    return np.reshape(x, tuple(-1 if d is None else d for d in shape))


register(
    OpDef(
        "reshape",
        ("x",),
        lambda x, shape: AVal(_resolve_shape(x.shape, shape, "reshape"), x.dtype),
        _reshape_kernel,
        lambda c, g: (g.reshape(c.inputs[0].shape),),
        attrs={"shape": None},
        saves_outputs=False,
    )
)


@tensor_method("reshape", "view")
def reshape(x: Tensor, *shape: Any) -> Tensor:
    """``x`` with a new shape holding the same elements; one dim may be -1."""
    shape = _shape_args(shape)
    if None in shape:
        # x.view(x.shape[0], -1) under a symbolic trace: record the symbolic dim as the one -1,
        # so the op runs at any size.
        if -1 in shape:
            shape = _resolve_shape(x.shape, shape, "reshape")
        if shape.count(None) == 1:
            shape = tuple(-1 if d is None else d for d in shape)
    return _alias_version(apply("reshape", x, shape=shape), x)


def _view_as(x: Tensor, other: Tensor) -> Tensor:
    return reshape(x, tuple(other.shape))


Tensor.view_as = _view_as
Tensor.reshape_as = _view_as


@tensor_method()
def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim..end_dim`` into one; a 0-d tensor becomes 1-d."""
    if x.ndim == 0:
        return reshape(x, (1,))
    s = normalize_dim(start_dim, x.ndim, "flatten")
    e = normalize_dim(end_dim, x.ndim, "flatten")
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = x.shape
    return reshape(x, (*shape[:s], _mul(*shape[s : e + 1]), *shape[e + 1 :]))


@tensor_method()
def unflatten(x: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split dim ``dim`` into ``sizes`` (one entry may be -1)."""
    d = normalize_dim(dim, x.ndim, "unflatten")
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("unflatten: sizes must not be empty")
    n = x.shape[d]
    if n is not None:
        sizes = _resolve_shape((n,), sizes, "unflatten")
    return reshape(x, (*x.shape[:d], *sizes, *x.shape[d + 1 :]))


@tensor_method()
def squeeze(x: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Remove size-1 dims (all of them, or those among ``dim``; other sizes are kept)."""
    if x.ndim == 0:
        if dim is not None:
            normalize_dims(dim, 0, "squeeze")
        return reshape(x, ())
    dims = normalize_dims(tuple(dim) if isinstance(dim, list) else dim, x.ndim, "squeeze")
    shape = tuple(d for i, d in enumerate(x.shape) if not (i in dims and d == 1))
    return reshape(x, shape)


@tensor_method()
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at ``dim`` (``-1`` appends)."""
    d = normalize_dim(dim, x.ndim + 1, "unsqueeze")
    shape = tuple(x.shape)
    return reshape(x, (*shape[:d], 1, *shape[d:]))


# --- expand --------------------------------------------------------------------------------------


def _expand_infer(x, shape):
    shape = tuple(shape)
    if len(shape) < x.ndim:
        raise ValueError(f"expand: target {shape} has fewer dims than the tensor {tuple(x.shape)}")
    lead = len(shape) - x.ndim
    out = []
    for i, d in enumerate(shape):
        src = x.shape[i - lead] if i >= lead else 1
        if d is None and i >= lead:
            d = -1  # a symbolic target dim is the operand's own dim (see ``expand``)
        if d == -1:
            if i < lead:
                raise ValueError(f"expand: -1 is not allowed in a new leading dim ({shape})")
            d = src
        if d is not None and d < 0:
            raise ValueError(f"expand: invalid size {d} in {shape}")
        if src != 1 and src is not None and d is not None and src != d:
            raise ValueError(
                f"expand: the size {src} of dim {i - lead} must match {d} "
                f"(tensor {tuple(x.shape)} -> {shape})"
            )
        out.append(d)
    return AVal(tuple(out), x.dtype)


def _expand_kernel(x: np.ndarray, shape: tuple) -> np.ndarray:
    # A symbolic dim (None, from a symbolic-shape trace) keeps the operand's size, like -1.
    shape = tuple(-1 if d is None else d for d in shape)
    return np.broadcast_to(x, _expand_infer(_aval(x), shape).shape)


register(
    OpDef(
        "expand",
        ("x",),
        _expand_infer,
        _expand_kernel,
        lambda c, g: (g,),  # autograd reduces the broadcast gradient to the operand's shape
        attrs={"shape": None},
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _aval(a: np.ndarray) -> AVal:
    from lucid._dtype import from_numpy

    return AVal(a.shape, from_numpy(a.dtype))


x_aval = _aval  # kept for callers of the scaffold's name


@tensor_method()
def expand(x: Tensor, *shape: Any) -> Tensor:
    """Broadcast ``x`` to ``shape`` without copying; -1 keeps a dim's size."""
    shape = _shape_args(shape)
    if None in shape:
        # Under a symbolic trace a None target is the operand's own symbolic dim (-1); growing a
        # concrete dim to a symbolic size cannot be written as a static attribute.
        lead = len(shape) - x.ndim
        fixed = []
        for i, d in enumerate(shape):
            if d is None:
                if i < lead or x.shape[i - lead] is not None:
                    raise ValueError(
                        f"expand: cannot broadcast {tuple(x.shape)} to the symbolic shape {shape}"
                    )
                d = -1
            fixed.append(d)
        shape = tuple(fixed)
    return _alias_version(apply("expand", x, shape=shape), x)


@tensor_method()
def expand_as(x: Tensor, other: Tensor) -> Tensor:
    return expand(x, tuple(other.shape))


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """``torch.broadcast_to``: ``x.expand(shape)``."""
    return expand(x, tuple(shape))


Tensor.broadcast_to = broadcast_to


# --- permute and its composites ----------------------------------------------------------------


def _permute_infer(x, dims):
    n = x.ndim
    if len(dims) != n or sorted(normalize_dim(d, n, "permute") for d in dims) != list(range(n)):
        raise ValueError(
            f"permute: dims {tuple(dims)} is not a permutation of the {n} dims of a tensor of "
            f"shape {tuple(x.shape)}"
        )
    return AVal(tuple(x.shape[normalize_dim(d, n)] for d in dims), x.dtype)


def _permute_kernel(x: np.ndarray, dims: tuple) -> np.ndarray:
    return np.transpose(x, dims)


def _permute_vjp(c, g):
    n = len(c.attrs["dims"])
    dims = [normalize_dim(d, n) for d in c.attrs["dims"]]
    inverse = [0] * n
    for i, d in enumerate(dims):
        inverse[d] = i
    return (permute(g, inverse),)


register(
    OpDef(
        "permute",
        ("x",),
        _permute_infer,
        _permute_kernel,
        _permute_vjp,
        attrs={"dims": None},
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)


@tensor_method()
def permute(x: Tensor, *dims: Any) -> Tensor:
    """Reorder the dims: output dim i is input dim ``dims[i]``."""
    dims = _shape_args(dims)
    if any(not isinstance(d, int) or isinstance(d, bool) for d in dims):
        raise TypeError(f"permute: dims must be ints, got {dims}")
    dims = tuple(normalize_dim(d, x.ndim, "permute") for d in dims)
    return _alias_version(apply("permute", x, dims=dims), x)


@tensor_method("transpose", "swapaxes", "swapdims")
def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dims."""
    if x.ndim == 0:
        normalize_dim(dim0, 0, "transpose"), normalize_dim(dim1, 0, "transpose")
        return apply("permute", x, dims=())
    a = normalize_dim(dim0, x.ndim, "transpose")
    b = normalize_dim(dim1, x.ndim, "transpose")
    dims = list(range(x.ndim))
    dims[a], dims[b] = b, a
    return _alias_version(apply("permute", x, dims=tuple(dims)), x)


swapaxes = swapdims = transpose


@tensor_method()
def movedim(x: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move dims ``source`` to positions ``destination``, keeping the others in order."""
    src = normalize_dims(source, x.ndim, "movedim")
    dst = normalize_dims(destination, x.ndim, "movedim")
    if len(src) != len(dst):
        raise ValueError(f"movedim: {len(src)} source dims but {len(dst)} destinations")
    rest = iter(d for d in range(x.ndim) if d not in src)
    where = dict(zip(dst, src, strict=True))
    dims = tuple(where[i] if i in where else next(rest) for i in range(x.ndim))
    return _alias_version(apply("permute", x, dims=dims), x)


@tensor_method()
def t(x: Tensor) -> Tensor:
    """Transpose a matrix; 0-d and 1-d tensors are returned as they are."""
    if x.ndim > 2:
        raise ValueError(f"t: expects a tensor with <= 2 dims, got {x.ndim} (shape {x.shape})")
    return transpose(x, 0, 1) if x.ndim == 2 else x


def _T(x: Tensor) -> Tensor:  # noqa: N802
    return _alias_version(apply("permute", x, dims=tuple(reversed(range(x.ndim)))), x)


def _mT(x: Tensor) -> Tensor:  # noqa: N802
    if x.ndim < 2:
        raise ValueError(f"mT: needs a tensor with at least 2 dims, got shape {tuple(x.shape)}")
    return transpose(x, -2, -1)


Tensor.T = property(_T, doc="All dims reversed (a matrix's transpose).")
Tensor.mT = property(_mT, doc="The last two dims swapped (a batch of matrices transposed).")


# --- cat and its composites --------------------------------------------------------------------


def _cat_infer(tensors, dim):
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    first = tensors[0]
    for i, x in enumerate(tensors):
        if getattr(x, "ndim", 0) == 0:
            raise ValueError(f"cat: zero-dimensional tensor {i} cannot be concatenated")
    n = first.ndim
    d = normalize_dim(dim, n, "cat")
    size: Any = 0
    for i, x in enumerate(tensors):
        if x.ndim != n:
            raise ValueError(
                f"cat: tensor {i} has {x.ndim} dims (shape {tuple(x.shape)}) but tensor 0 has "
                f"{n} (shape {tuple(first.shape)})"
            )
        for j in range(n):
            a, b = first.shape[j], x.shape[j]
            if j != d and a is not None and b is not None and a != b:
                raise ValueError(
                    f"cat: sizes must match except in dim {d}; got {b} instead of {a} in dim {j} "
                    f"for tensor {i} (shapes {tuple(first.shape)} and {tuple(x.shape)})"
                )
        size = _add(size, x.shape[d])
    shape = list(first.shape)
    shape[d] = size
    return AVal(tuple(shape), result_type(*tensors))


def _cat_kernel(tensors: list, dim: int) -> np.ndarray:
    return np.concatenate(tensors, axis=dim)


def _cat_vjp(c, g):
    tensors = c.inputs[0]
    d = normalize_dim(c.attrs["dim"], tensors[0].ndim)
    sizes = [x.shape[d] for x in tensors]
    if sizes.count(None) > 1:
        raise ValueError("cat: the gradient needs at most one symbolic size along the cat dim")
    # Offsets count from the front up to a symbolic piece, and from the end after it.
    split = sizes.index(None) if None in sizes else len(sizes)
    bounds, start = [], 0
    for n in sizes[:split]:
        bounds.append((start, start + n))
        start += n
    tail, stop = [], 0
    for n in reversed(sizes[split + 1 :]):
        tail.append((-stop - n, -stop or None))
        stop += n
    if split < len(sizes):
        bounds.append((start, -stop or None))
    bounds += reversed(tail)
    return (
        [
            _slice_dim(g, d, *b) if need else None
            for b, need in zip(bounds, c.needs_input_grad, strict=True)
        ],
    )


register(
    OpDef(
        "cat",
        ("tensors*",),
        _cat_infer,
        _cat_kernel,
        _cat_vjp,
        attrs={"dim": 0},
        props=frozenset({PROMOTE, SYMBOLIC_BATCH_SAFE}),
        saves_outputs=False,
    )
)


def _as_tensor_list(tensors: Any, op: str) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: expected a list or tuple of tensors, got {type(tensors).__name__}")
    for i, x in enumerate(tensors):
        if not isinstance(x, Tensor):
            raise TypeError(f"{op}: element {i} is a {type(x).__name__}, not a Tensor")
    return list(tensors)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate tensors along an existing dim; the others must match."""
    return apply("cat", _as_tensor_list(tensors, "cat"), dim=dim)


concat = concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join same-shape tensors along a new dim."""
    tensors = _as_tensor_list(tensors, "stack")
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    shape = tuple(tensors[0].shape)
    for i, x in enumerate(tensors):
        if tuple(x.shape) != shape:
            raise ValueError(
                f"stack: every tensor must have the same shape; tensor 0 has {shape}, "
                f"tensor {i} has {tuple(x.shape)}"
            )
    d = normalize_dim(dim, len(shape) + 1, "stack")
    return apply("cat", [unsqueeze(x, d) for x in tensors], dim=d)


def _slice_dim(x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    """``x`` restricted to ``start:stop`` along ``dim`` (the ``index`` op's attribute encoding)."""
    items = (("slice", None, None, None),) * dim + (("slice", start, stop, None),)
    return _alias_version(apply("index", x, [], index=items), x)


@tensor_method()
def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``length`` elements of dim ``dim`` from ``start`` (a negative start counts from the end)."""
    d = normalize_dim(dim, x.ndim, "narrow")
    n = x.shape[d]
    if start < 0:
        start += n
    if not 0 <= start <= n or length < 0 or start + length > n:
        raise IndexError(
            f"narrow: start {start} and length {length} are out of range for dim {d} of size {n}"
        )
    return _slice_dim(x, d, start, start + length)


@tensor_method()
def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple:
    """Pieces of ``split_size`` along ``dim`` (the last may be smaller), or pieces of the sizes in
    a list (which must add up to the dim's size)."""
    d = normalize_dim(dim, x.ndim, "split")
    n = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size <= 0 and n:
            raise ValueError(f"split: split_size must be positive, got {size}")
        sizes = [min(size, n - s) for s in range(0, n, size)] if n else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise ValueError(
                f"split: sizes {sizes} must be non-negative and add up to {n}, the size of dim {d}"
            )
    out, start = [], 0
    for s in sizes:
        out.append(_slice_dim(x, d, start, start + s))
        start += s
    return tuple(out)


@tensor_method()
def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple:
    """Split into ``chunks`` pieces of equal size (the last may be smaller, and there may be fewer
    pieces than asked), as ``torch.chunk``."""
    if not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    n = x.shape[normalize_dim(dim, x.ndim, "chunk")]
    return split(x, max(math.ceil(n / chunks), 1), dim)


@tensor_method()
def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The slice of ``x`` at position ``index`` of ``dim`` (that dim removed): ``x[..., index]``."""
    d = normalize_dim(dim, x.ndim, "select")
    out = apply("index", x, [], index=(*((("slice", None, None, None),) * d), ("int", int(index))))
    return _alias_version(out, x)


@tensor_method()
def unbind(x: Tensor, dim: int = 0) -> tuple:
    """The slices of ``x`` along ``dim``, each without that dim."""
    if x.ndim == 0:
        raise ValueError("unbind: a 0-d tensor has no dim to unbind")
    d = normalize_dim(dim, x.ndim, "unbind")
    pre = (("slice", None, None, None),) * d
    rows = (apply("index", x, [], index=(*pre, ("int", i))) for i in range(x.shape[d]))
    return tuple(_alias_version(r, x) for r in rows)


# --- tile / repeat ------------------------------------------------------------------------------


def _repeat(x: Tensor, sizes: tuple, op: str) -> Tensor:
    for s in sizes:
        if not isinstance(s, int) or s < 0:
            raise ValueError(f"{op}: repeats must be non-negative ints, got {sizes}")
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)
    interleaved = tuple(v for d in shape for v in (1, d))
    target = tuple(v for r in sizes for v in (r, -1))
    y = reshape(x, interleaved).expand(target)
    return reshape(y, tuple(_mul(r, d) for r, d in zip(sizes, shape, strict=True)))


def _tensor_repeat(x: Tensor, *sizes: Any) -> Tensor:
    """``Tensor.repeat``: tile ``x`` ``sizes[i]`` times along dim i (``len(sizes) >= x.ndim``)."""
    sizes = _shape_args(sizes)
    if len(sizes) < x.ndim:
        raise ValueError(
            f"repeat: the number of repeats ({len(sizes)}) can not be smaller than the number of "
            f"dims of the tensor ({x.ndim})"
        )
    return _repeat(x, sizes, "repeat")


Tensor.repeat = _tensor_repeat


@tensor_method()
def tile(x: Tensor, dims: Sequence[int]) -> Tensor:
    """Repeat ``x`` along each dim; missing leading repeats count as 1."""
    dims = _shape_args((dims,) if isinstance(dims, int) else tuple(dims))
    dims = (1,) * (x.ndim - len(dims)) + dims
    return _repeat(x, dims, "tile")


# --- pad ----------------------------------------------------------------------------------------


def _pad_pairs(pad: Sequence[int], ndim: int, op: str = "pad") -> list[tuple[int, int]]:
    """torch's pad tuple (last dim first) as one (before, after) pair per dim."""
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > ndim:
        raise ValueError(
            f"{op}: the padding {pad} must have an even length of at most 2 * {ndim} "
            f"(two entries per padded dim, last dim first)"
        )
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return pairs


def _pad_infer(x, pad, value):
    pairs = _pad_pairs(pad, x.ndim)
    shape = []
    for d, (lo, hi) in zip(x.shape, pairs, strict=True):
        size = None if d is None else d + lo + hi
        if size is not None and size < 0:
            raise ValueError(f"pad: padding {tuple(pad)} makes a dim of size {d} negative")
        shape.append(size)
    return AVal(tuple(shape), x.dtype)


def _pad_kernel(x: np.ndarray, pad: tuple, value: Any) -> np.ndarray:
    pairs = _pad_pairs(pad, x.ndim)
    crop = tuple(
        slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, pairs, strict=True)
    )
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    return np.pad(x[crop], grow, mode="constant", constant_values=value)


register(
    OpDef(
        "pad",
        ("x",),
        _pad_infer,
        _pad_kernel,
        # Cropping is padding by negative amounts, so the gradient crops the padding back off.
        lambda c, g: (apply("pad", g, pad=tuple(-p for p in c.attrs["pad"]), value=0),),
        attrs={"pad": (), "value": 0},
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _pad_source_index(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """For each output position of a padded dim, the input position it copies."""
    pos = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(pos, 0, n - 1)
    if mode == "circular":
        return pos % n
    period = 2 * (n - 1)  # reflect: mirror about the edges without repeating them
    pos = np.abs(pos) % period if period else np.zeros_like(pos)
    return np.where(pos >= n, period - pos, pos)


def pad(
    x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None
) -> Tensor:
    """Pad ``x`` as ``torch.nn.functional.pad``: ``pad`` lists (before, after) amounts from the
    last dim backwards. ``mode``: ``constant`` (with ``value``; negative amounts crop),
    ``reflect``, ``replicate`` or ``circular``."""
    pad = tuple(int(p) for p in pad)
    if mode == "constant":
        return apply("pad", x, pad=pad, value=0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ValueError(
            f"pad: unknown mode {mode!r}; expected 'constant', 'reflect', 'replicate' or 'circular'"
        )
    if value not in (None, 0):
        raise ValueError(f"pad: value is only used by mode 'constant', not {mode!r}")
    pairs = _pad_pairs(pad, x.ndim)
    for d, (lo, hi) in enumerate(pairs):
        if lo == hi == 0:
            continue
        n = x.shape[d]
        if lo < 0 or hi < 0:
            raise ValueError(f"pad: mode {mode!r} needs non-negative padding, got {pad}")
        limit = n - 1 if mode == "reflect" else n
        if n == 0 or lo > limit or hi > limit:
            raise ValueError(
                f"pad: {mode} padding ({lo}, {hi}) of dim {d} must be at most {limit} for a dim "
                f"of size {n}"
            )
        # A gather with a constant index: its gradient (a scatter-add) needs no rule of its own.
        index = Tensor._wrap(_pad_source_index(n, lo, hi, mode).astype(np.int64))
        x = index_select(x, d, index)
    return x


# --- diagonal / diag_embed / diag: composites of permute, flatten, a constant gather, where, pad --


def _diagonal_length(rows: int, cols: int, offset: int) -> int:
    return max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))


@tensor_method()
def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the 2-d slices over ``dim1`` and ``dim2`` (above it for ``offset > 0``,
    below for ``offset < 0``), as a new last dim. A copy, not a view as in PyTorch."""
    if x.ndim < 2:
        raise ValueError(f"diagonal: needs a tensor with at least 2 dims, got {tuple(x.shape)}")
    d1, d2 = normalize_dim(dim1, x.ndim, "diagonal"), normalize_dim(dim2, x.ndim, "diagonal")
    if d1 == d2:
        raise ValueError(f"diagonal: dim1 and dim2 must differ, both are {d1}")
    offset = int(offset)
    rows, cols = x.shape[d1], x.shape[d2]
    n = _diagonal_length(rows, cols, offset)
    first = -offset * cols if offset < 0 else offset
    # A gather with a constant index: compiles as it is, and its gradient is a scatter-add.
    index = Tensor._wrap(first + np.arange(n, dtype=np.int64) * (cols + 1))
    flat = flatten(movedim(x, (d1, d2), (-2, -1)), -2)
    return index_select(flat, flat.ndim - 1, index)


@tensor_method()
def diag_embed(x: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """A tensor whose 2-d slices over ``dim1`` and ``dim2`` (dims of the result) hold the last
    dim of ``x`` on their ``offset`` diagonal, zeros elsewhere."""
    if x.ndim < 1:
        raise ValueError("diag_embed: needs a tensor with at least 1 dim, got a 0-d tensor")
    out_ndim = x.ndim + 1
    d1 = normalize_dim(dim1, out_ndim, "diag_embed")
    d2 = normalize_dim(dim2, out_ndim, "diag_embed")
    if d1 == d2:
        raise ValueError(f"diag_embed: dim1 and dim2 must differ, both are {d1}")
    offset = int(offset)
    n = x.shape[-1]
    from lucid.ops.elementwise import where

    # where, not a product with an identity matrix: inf * 0 would put NaNs off the diagonal.
    on_diagonal = Tensor._wrap(np.eye(n, dtype=np.bool_))
    square = where(on_diagonal, unsqueeze(x, -1), Tensor._wrap(np.zeros((), x.dtype.numpy)))
    k = abs(offset)
    if k:
        square = apply("pad", square, pad=(k, 0, 0, k) if offset > 0 else (0, k, k, 0), value=0)
    return movedim(square, (-2, -1), (d1, d2))


@tensor_method()
def diag(x: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-d ``x`` as the ``diagonal``-th diagonal of a square matrix; the ``diagonal``-th
    diagonal of a 2-d ``x`` as a 1-d tensor."""
    if x.ndim == 1:
        return diag_embed(x, diagonal)
    if x.ndim == 2:
        return globals()["diagonal"](x, diagonal)
    raise ValueError(f"diag: expected a 1-d or 2-d tensor, got shape {tuple(x.shape)}")


# --- tril / triu / flip / roll ------------------------------------------------------------------


def _tri_infer(name):
    def infer(x, diagonal):
        if x.ndim < 2:
            raise ValueError(f"{name}: needs a tensor with at least 2 dims, got {tuple(x.shape)}")
        return AVal(tuple(x.shape), x.dtype)

    return infer


def _tril_kernel(x: np.ndarray, diagonal: int) -> np.ndarray:
    return np.tril(x, diagonal)


def _triu_kernel(x: np.ndarray, diagonal: int) -> np.ndarray:
    return np.triu(x, diagonal)


for _name, _kernel in (("tril", _tril_kernel), ("triu", _triu_kernel)):
    register(
        OpDef(
            _name,
            ("x",),
            _tri_infer(_name),
            _kernel,
            lambda c, g, _n=_name: (apply(_n, g, diagonal=c.attrs["diagonal"]),),
            attrs={"diagonal": 0},
            props=_SAFE,
            saves_inputs=False,
            saves_outputs=False,
        )
    )


@tensor_method()
def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (elements on and below ``diagonal``); rest zero."""
    return apply("tril", x, diagonal=int(diagonal))


@tensor_method()
def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (elements on and above ``diagonal``); rest zero."""
    return apply("triu", x, diagonal=int(diagonal))


def _flip_infer(x, dims):
    normalize_dims(dims, x.ndim, "flip")
    return AVal(tuple(x.shape), x.dtype)


def _flip_kernel(x: np.ndarray, dims: tuple) -> np.ndarray:
    axes = normalize_dims(dims, x.ndim) if x.ndim else ()
    return np.flip(x, axis=axes).copy() if axes else x.copy()  # a copy: torch.flip copies


register(
    OpDef(
        "flip",
        ("x",),
        _flip_infer,
        _flip_kernel,
        lambda c, g: (apply("flip", g, dims=c.attrs["dims"]),),
        attrs={"dims": ()},
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)


@tensor_method()
def flip(x: Tensor, *dims: Any) -> Tensor:
    """Reverse the order of elements along ``dims``."""
    dims = _shape_args(dims)
    return apply("flip", x, dims=normalize_dims(dims, x.ndim, "flip") if x.ndim else dims)


def _roll_args(x, shifts, dims, op="roll"):
    shifts = (shifts,) if isinstance(shifts, int) else tuple(int(s) for s in shifts)
    if dims is None:
        if len(shifts) != 1:
            raise ValueError(f"{op}: without dims, shifts must be a single int, got {shifts}")
        return shifts, None
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(dims) != len(shifts):
        raise ValueError(f"{op}: shifts {shifts} and dims {dims} must have the same length")
    return shifts, tuple(normalize_dim(d, x.ndim, op) for d in dims)


def _roll_infer(x, shifts, dims):
    _roll_args(x, shifts, dims)
    return AVal(tuple(x.shape), x.dtype)


def _roll_kernel(x: np.ndarray, shifts: tuple, dims: tuple | None) -> np.ndarray:
    if dims is None:
        return np.roll(x, shifts[0])
    return np.roll(x, shifts, axis=dims)


register(
    OpDef(
        "roll",
        ("x",),
        _roll_infer,
        _roll_kernel,
        lambda c, g: (
            apply("roll", g, shifts=tuple(-s for s in c.attrs["shifts"]), dims=c.attrs["dims"]),
        ),
        attrs={"shifts": (), "dims": None},
        props=_SAFE,
        saves_inputs=False,
        saves_outputs=False,
    )
)


@tensor_method()
def roll(x: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Shift elements cyclically along ``dims`` (or over the flattened tensor when None)."""
    shifts, dims = _roll_args(x, shifts, dims)
    return apply("roll", x, shifts=shifts, dims=dims)


# --- more composites: grids, splits, repeats, rotations, differences, triangle indices --------


def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple:
    """Coordinate grids of 1-d tensors: ``indexing="ij"`` (matrix, torch's default) or ``"xy"``
    (Cartesian: the first two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim > 1 for t in tensors):
        raise ValueError("meshgrid: expects 0-d or 1-d tensors")
    flat = [t.reshape(-1) for t in tensors]
    swap = indexing == "xy" and len(flat) >= 2
    if swap:
        flat[0], flat[1] = flat[1], flat[0]
    shape = tuple(t.shape[0] for t in flat)
    grids = [
        expand(t.reshape(*([1] * i), -1, *([1] * (len(flat) - i - 1))), *shape)
        for i, t in enumerate(flat)
    ]
    if swap:  # built "ij" over (y, x, ...): swapping back gives the Cartesian grids
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def cartesian_prod(*tensors: Tensor) -> Tensor:
    """Every combination of one element from each 1-d tensor, as rows (one input: itself)."""
    if len(tensors) == 1:
        return tensors[0]
    return stack([g.reshape(-1) for g in meshgrid(*tensors, indexing="ij")], 1)


@tensor_method()
def tensor_split(x: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple:
    """``n`` nearly equal pieces along ``dim`` (the first ``size % n`` one longer), or pieces
    cut at the given indices, as numpy's ``array_split``."""
    d = normalize_dim(dim, x.ndim, "tensor_split")
    size = x.shape[d]
    if isinstance(indices_or_sections, Tensor):
        indices_or_sections = indices_or_sections.tolist()
    if isinstance(indices_or_sections, (int, np.integer)):
        n = int(indices_or_sections)
        if n <= 0:
            raise ValueError(f"tensor_split: the number of sections must be positive, got {n}")
        q, r = divmod(size, n)
        bounds = [i * q + min(i, r) for i in range(n + 1)]
    else:
        cuts = [min(max(int(i) + (size if int(i) < 0 else 0), 0), size)
                for i in indices_or_sections]  # fmt: skip
        bounds = [0, *cuts, size]
    return tuple(
        _slice_dim(x, d, lo, max(lo, hi)) for lo, hi in zip(bounds, bounds[1:], strict=False)
    )


@tensor_method()
def repeat_interleave(
    x: Tensor, repeats: Any = None, dim: int | None = None, *, output_size: int | None = None
) -> Tensor:
    """Each element (along ``dim``; of the flattened tensor when None) repeated ``repeats``
    times (an int or one count per element); ``repeat_interleave(counts)`` gives the indices."""
    if repeats is None:  # torch.repeat_interleave(repeats): indices repeated by their counts
        counts = np.asarray(x.tolist(), dtype=np.int64).reshape(-1)
        return Tensor._wrap(np.repeat(np.arange(len(counts), dtype=np.int64), counts))
    if dim is None:
        x, d = x.reshape(-1), 0
    else:
        d = normalize_dim(dim, x.ndim, "repeat_interleave")
    counts = repeats.tolist() if isinstance(repeats, Tensor) else repeats
    counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), (x.shape[d],))
    if (counts < 0).any():
        raise ValueError("repeat_interleave: repeats must be non-negative")
    index = np.repeat(np.arange(x.shape[d], dtype=np.int64), counts)
    if output_size is not None and output_size != len(index):
        raise ValueError(f"repeat_interleave: output_size {output_size} != {len(index)}")
    # A gather with a constant index: differentiable, and compiled as it is.
    return index_select(x, d, Tensor._wrap(index))


def atleast_1d(*tensors: Any) -> Any:
    """Each tensor with at least 1 dim (a 0-d one becomes shape (1,))."""
    out = tuple(t.reshape(1) if t.ndim == 0 else t for t in _unpack(tensors))
    return out[0] if len(out) == 1 else out


def atleast_2d(*tensors: Any) -> Any:
    """Each tensor with at least 2 dims (leading dims of size 1 added)."""
    out = tuple(t.reshape(1, -1) if t.ndim < 2 else t for t in _unpack(tensors))
    return out[0] if len(out) == 1 else out


def atleast_3d(*tensors: Any) -> Any:
    """Each tensor with at least 3 dims: (n,) -> (1, n, 1), (m, n) -> (m, n, 1), as torch."""

    def lift(t: Tensor) -> Tensor:
        if t.ndim == 0:
            return t.reshape(1, 1, 1)
        if t.ndim == 1:
            return t.reshape(1, -1, 1)
        if t.ndim == 2:
            return unsqueeze(t, -1)
        return t

    out = tuple(lift(t) for t in _unpack(tensors))
    return out[0] if len(out) == 1 else out


def _unpack(tensors: tuple) -> tuple:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(tensors[0])
    return tensors


@tensor_method()
def rot90(x: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """Rotate by 90 degrees ``k`` times in the plane of ``dims``, from the first towards the
    second."""
    if len(dims) != 2:
        raise ValueError(f"rot90: dims must name two dims, got {tuple(dims)}")
    d0, d1 = (normalize_dim(d, x.ndim, "rot90") for d in dims)
    if d0 == d1:
        raise ValueError(f"rot90: the two dims must differ, both are {d0}")
    k %= 4
    if k == 0:
        return x
    if k == 2:
        return flip(x, d0, d1)
    if k == 1:
        return transpose(flip(x, d1), d0, d1)
    return flip(transpose(x, d0, d1), d1)


@tensor_method()
def diff(
    x: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
    append: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The ``n``-th forward difference along ``dim`` (after concatenating ``prepend`` and
    ``append``)."""
    d = normalize_dim(dim, x.ndim, "diff")
    if prepend is not None or append is not None:
        parts = [t for t in (prepend, x, append) if t is not None]
        x = cat(parts, d)
    for _ in range(n):
        size = x.shape[d]
        x = _slice_dim(x, d, 1, size) - _slice_dim(x, d, 0, max(size - 1, 0))
    return x


def _triangle_indices(row: int, col: int, offset: int, upper: bool, dtype: Any) -> Tensor:
    from lucid import _dtype

    r, c = np.triu_indices(row, offset, col) if upper else np.tril_indices(row, offset, col)
    dt = _dtype.canonical(dtype) if dtype is not None else _dtype.int64
    return Tensor._wrap(np.stack([r, c]).astype(dt.numpy))


def tril_indices(
    row: int, col: int, offset: int = 0, *, dtype: Any = None, device: Any = None
) -> Tensor:
    """The (2, n) coordinates of the lower triangle (on and below the ``offset`` diagonal) of a
    ``row x col`` matrix, row by row."""
    return _triangle_indices(row, col, offset, False, dtype)


def triu_indices(
    row: int, col: int, offset: int = 0, *, dtype: Any = None, device: Any = None
) -> Tensor:
    """The (2, n) coordinates of the upper triangle (on and above the ``offset`` diagonal)."""
    return _triangle_indices(row, col, offset, True, dtype)
