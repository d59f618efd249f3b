"""Indexing ops: ``x[...]`` and ``x[...] = v``, gather/scatter, index_select, masked_fill, nonzero.

``x[idx]`` is the ``index`` op and ``x[idx] = v`` the out-of-place ``index_put`` op written back in
place. The static parts of an index are the ``index`` attribute, one item per position (ellipsis
already expanded), each a tuple a trace can print:

- ``("int", i)``: select position ``i`` (the dim disappears);
- ``("slice", start, stop, step)``: a Python slice (entries may be None);
- ``("new",)``: insert a size-1 dim (``None`` in Python);
- ``("tensor",)``: an integer index tensor, the next operand of ``indices`` (values in [-n, n),
  negatives wrap); ``("tensor", op)``: the same from ``op`` (index_select, index_add,
  index_copy), whose values must lie in [0, n), as in PyTorch; ``("tensor", op, True)``: from
  ``op``, wrapping (index_fill). ``op`` is the name errors give.

PyTorch's rule, which differs from numpy's in one corner: integers select first (as
``Tensor.select``), then index tensors follow numpy's advanced indexing on what remains (their
shapes broadcast; their result dims stand where they are when adjacent, or go first when a slice
or a new axis separates them). So ``x[0, :, idx]`` has shape ``(x.shape[1], len(idx))``, where
numpy gives the transpose. ``True``/``False`` add a dim of size 1/0. A bool mask becomes integer
index tensors through the ``nonzero`` op, the one op here whose output shape depends on data,
except in ``x[mask] = value`` with a one-element value, which is ``masked_fill`` (a select).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ops._front import alias_version as _alias_version
from lucid.ops._front import inplace_method, tensor_method
from lucid.ops._registry import (
    DATA_DEPENDENT,
    GRAD_SINK,
    SYMBOLIC_BATCH_SAFE,
    AVal,
    OpDef,
    broadcast_shapes,
    normalize_dim,
    register,
)

__all__ = [
    "gather",
    "scatter",
    "scatter_add",
    "index_select",
    "index_add",
    "index_copy",
    "index_fill",
    "masked_fill",
    "masked_select",
    "nonzero",
    "take_along_dim",
]

_FULL = ("slice", None, None, None)


def _STRICT(op: str) -> tuple:  # noqa: N802  (an index item, like _FULL)
    """An index tensor item of ``op``, which takes positions in [0, n) (no negative wrap)."""
    return ("tensor", op)


def _size_of_slice(n: Any, start: Any, stop: Any, step: Any) -> Any:
    if n is None:
        return None
    return len(range(*slice(start, stop, step).indices(n)))


def _index_shape(shape: tuple, index_shapes: list, index: tuple, op: str = "index") -> tuple:
    """The result shape of ``x[index]`` by PyTorch's rules, from shapes alone.

    Integers select first (their dims disappear, as ``select``); the rest follows numpy's
    advanced indexing on what remains: index tensors broadcast together, and their result dims
    replace them in place when they are adjacent, or go first when a slice or a new axis
    separates them.
    """
    consumed = sum(item[0] != "new" for item in index)
    if consumed > len(shape):
        raise IndexError(
            f"{op}: too many indices for a tensor of {len(shape)} dims (shape {tuple(shape)})"
        )
    parts: list = []  # per non-int item: a tuple of result dims, or "adv" for an index tensor
    dim = 0
    for item in index:
        tag = item[0]
        if tag == "new":
            parts.append((1,))
            continue
        n = shape[dim]
        dim += 1
        if tag == "int":
            i = item[1]
            if n is not None and not -n <= i < n:
                raise IndexError(
                    f"{op}: index {i} is out of bounds for dim {dim - 1} with size {n}"
                )
        elif tag == "slice":
            if item[3] == 0:
                raise ValueError(f"{op}: slice step cannot be zero")
            parts.append((_size_of_slice(n, *item[1:]),))
        elif tag == "tensor":
            parts.append("adv")
        else:
            raise ValueError(f"{op}: unknown index item {item!r}")
    rest = tuple(shape[dim:])
    adv_at = [i for i, p in enumerate(parts) if p == "adv"]
    if not adv_at:
        return tuple(d for p in parts for d in p) + rest
    try:
        bshape = broadcast_shapes(*index_shapes, op=f"{op}: indexing tensors")
    except ValueError as e:
        raise IndexError(str(e)) from None
    basic = [p for p in parts if p != "adv"]
    if adv_at == list(range(adv_at[0], adv_at[0] + len(adv_at))):
        before = tuple(d for p in parts[: adv_at[0]] for d in p)
        after = tuple(d for p in parts[adv_at[-1] + 1 :] for d in p)
        return before + bshape + after + rest
    return bshape + tuple(d for p in basic for d in p) + rest


def _split_index(index: tuple, indices: Sequence) -> tuple[tuple, list]:
    """numpy keys for PyTorch's rule: ``x[select][rest]``. ``select`` holds the integers (and
    full slices elsewhere, ending in an ellipsis so it always gives a view); ``rest`` is a list
    of the other items, ``None`` for a new axis."""
    it = iter(indices)
    select: list = []
    rest: list = []
    for item in index:
        tag = item[0]
        if tag == "int":
            select.append(item[1])
        elif tag == "new":
            rest.append(None)
        else:
            select.append(slice(None))
            rest.append(slice(*item[1:]) if tag == "slice" else next(it))
    return (*select, Ellipsis), rest


def _check_index_tensors(indices: Sequence, op: str) -> None:
    for t in indices:
        if t.dtype.category != 1:
            raise IndexError(
                f"{op}: tensors used as indices must be integer (or bool) tensors, got {t.dtype}"
            )


def _index_infer(x, indices, index):
    _check_index_tensors(indices, "index")
    n_tensors = sum(item[0] == "tensor" for item in index)
    if n_tensors != len(indices):
        raise ValueError(f"index: {n_tensors} tensor items but {len(indices)} index tensors")
    shape = _index_shape(tuple(x.shape), [tuple(t.shape) for t in indices], index)
    return AVal(shape, x.dtype)


def index_tensor_dims(index: tuple) -> list[int]:
    """The dim of ``x`` each index tensor of ``index`` indexes, in operand order."""
    dims: list[int] = []
    dim = 0
    for item in index:
        if item[0] == "tensor":
            dims.append(dim)
        if item[0] != "new":
            dim += 1
    return dims


def index_out_of_range(op: str, dim: int, size: int) -> str:
    """The message of an index tensor value outside [-size, size) (``{}`` stands for it)."""
    return f"{op}: index {{}} is out of bounds for dim {dim} with size {size}"


def index_tensor_checks(op: str, index: tuple) -> list[tuple[str, bool]]:
    """Per index tensor of ``index``: the op its errors name and whether it wraps negatives.
    ``x[idx]`` and ``index_put`` wrap (numpy's and PyTorch's rule: values in [-n, n)); a
    ``("tensor", name)`` item comes from ``name`` (index_select, index_add, index_copy), which
    takes [0, n) only, as PyTorch; ``("tensor", name, True)`` wraps (index_fill)."""
    items = [item for item in index if item[0] == "tensor"]
    return [(item[1], len(item) > 2 and bool(item[2])) if len(item) > 1 else (op, True)
            for item in items]  # fmt: skip


def _check_index_values(op: str, shape: tuple, indices: list, index: tuple) -> None:
    dims = index_tensor_dims(index)
    for t, d, (name, wraps) in zip(indices, dims, index_tensor_checks(op, index), strict=True):
        t = np.asarray(t)
        n = shape[d]
        if t.dtype != np.bool_ and t.size:
            bad = (t < (-n if wraps else 0)) | (t >= n)
            if bad.any():
                raise IndexError(index_out_of_range(name, d, n).format(int(t[bad].flat[0])))


def _index_kernel(x: np.ndarray, indices: list, index: tuple) -> np.ndarray:
    _check_index_values("index", x.shape, indices, index)
    select, rest = _split_index(index, indices)
    return x[select][tuple(rest)]


def _index_vjp(c, g):
    x, indices = c.inputs
    gx = apply(
        "index_put",
        apply("zeros_like", x),
        g,
        list(indices),
        index=c.attrs["index"],
        accumulate=True,
    )
    return gx, [None] * len(indices)


register(
    OpDef(
        "index",
        ("x", "indices*"),
        _index_infer,
        _index_kernel,
        _index_vjp,
        attrs={"index": ()},
        # The rule reads the index tensors and x's shape only, as torch's; x may change in place.
        saves_inputs=False,
        saves_outputs=False,
        doc="x[index]: basic and integer-array (advanced) indexing with numpy's rules.",
    )
)


def _index_put_infer(x, values, indices, index, accumulate):
    target = _index_infer(x, indices, index).shape
    vshape = tuple(getattr(values, "shape", ()))
    # Like numpy and torch, values may carry extra leading size-1 dims.
    while len(vshape) > len(target) and vshape[0] == 1:
        vshape = vshape[1:]
    if broadcast_shapes(vshape, target, op="index_put") != tuple(target):
        raise ValueError(
            f"index_put: values of shape {tuple(getattr(values, 'shape', ()))} cannot be "
            f"broadcast to the indexed shape {tuple(target)}"
        )
    return AVal(tuple(x.shape), x.dtype)


def _index_put_kernel(
    x: np.ndarray, values: np.ndarray, indices: list, index: tuple, accumulate: bool
) -> np.ndarray:
    _check_index_values("index_put", x.shape, indices, index)
    out = x.copy()
    select, rest = _split_index(index, indices)
    # np.add.at takes no newaxis: index a view whose new axes are real size-1 dims instead.
    new_axes = [i for i, r in enumerate(rest) if r is None]
    view = np.expand_dims(out[select], new_axes) if new_axes else out[select]
    key = tuple(slice(None) if r is None else r for r in rest)
    values = np.asarray(values, dtype=out.dtype)
    if accumulate:
        target_ndim = len(_index_shape(x.shape, [t.shape for t in indices], index))
        while values.ndim > target_ndim and values.shape[0] == 1:
            values = values[0]
        if indices:
            np.add.at(view, key, values)  # unbuffered: repeated indices add up
        else:
            view[key] += values
    else:
        view[key] = values
    return out


def _index_put_vjp(c, g):
    x, values, indices = c.inputs
    index, accumulate = c.attrs["index"], c.attrs["accumulate"]
    gx = None
    if c.needs_input_grad[0]:
        gx = g if accumulate else apply("index_put", g, 0.0, list(indices), index=index)
    gv = None
    if isinstance(values, Tensor) and c.needs_input_grad[1]:
        gv = apply("index", g, list(indices), index=index)
        if values.ndim > gv.ndim:
            gv = gv.reshape(values.shape)
    return gx, gv, [None] * len(indices)


register(
    OpDef(
        "index_put",
        ("x", "values", "indices*"),
        _index_put_infer,
        _index_put_kernel,
        _index_put_vjp,
        attrs={"index": (), "accumulate": False},
        saves_inputs=False,
        saves_outputs=False,
        doc="A copy of x with x[index] set to (or, accumulate=True, increased by) values.",
    )
)


def _nonzero_infer(x):
    # The count is known from values only: eager inference reads them, a tracer sees None.
    data = getattr(x, "_data", None)
    n = int(np.count_nonzero(data)) if isinstance(data, np.ndarray) else None
    return AVal((n, x.ndim), _dtype.int64)


def _nonzero_kernel(x: np.ndarray) -> np.ndarray:
    return np.argwhere(x)


register(
    OpDef(
        "nonzero",
        ("x",),
        _nonzero_infer,
        _nonzero_kernel,
        None,
        props=frozenset({DATA_DEPENDENT, GRAD_SINK}),
        doc="The (n, ndim) int64 coordinates of the non-zero elements of x, in C order.",
    )
)


@tensor_method()
def nonzero(x: Tensor, *, as_tuple: bool = False) -> Tensor | tuple:
    """Coordinates of the non-zero elements: an (n, ndim) tensor, or one (n,) tensor per dim."""
    coords = apply("nonzero", x)
    if not as_tuple:
        return coords
    return tuple(apply("index", coords, [], index=(_FULL, ("int", j))) for j in range(x.ndim))


# --- parsing a Python index ---------------------------------------------------------------------


def _to_int(v: Any, what: str) -> Any:
    if v is None:
        return None
    if isinstance(v, Tensor):
        if v.ndim != 0 or v.dtype.category != 1:
            raise TypeError(f"slice {what} must be an int or a 0-d integer tensor, got {v!r}")
        return int(v.item())
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"slice {what} must be an int or None, got {type(v).__name__}")
    return int(v)


def _as_index_tensor(obj: Any) -> Tensor:
    arr = np.asarray(obj._data if isinstance(obj, Tensor) else obj)
    if arr.dtype.kind == "b":
        return Tensor._wrap(arr)
    if arr.dtype.kind in "iu" or arr.size == 0:
        return Tensor._wrap(arr.astype(np.int64))
    raise IndexError(
        f"only integers, slices, None, Ellipsis, and integer or bool tensors/lists are valid "
        f"indices; got a sequence of {arr.dtype}"
    )


def _parse_index(x: Tensor, idx: Any) -> tuple[tuple, list, tuple]:
    """A Python index as (items, index tensors, result dims that ``False`` makes empty). Bool
    masks become index tensors through the ``nonzero`` op."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    raw: list = []
    for it in idx:
        if it is None:
            raw.append(("new",))
        elif it is Ellipsis:
            raw.append(("...",))
        elif isinstance(it, (bool, np.bool_)):
            raw.append(("bool", bool(it)))
        elif isinstance(it, (int, np.integer)):
            raw.append(("int", int(it)))
        elif isinstance(it, slice):
            step = _to_int(it.step, "step")
            if step == 0:
                raise ValueError("slice step cannot be zero")
            raw.append(("slice", _to_int(it.start, "start"), _to_int(it.stop, "stop"), step))
        elif isinstance(it, Tensor):
            if it.dtype is _dtype.bool_:
                # A 0-d mask is a Python bool read from data (a graph break under a trace).
                raw.append(("bool", bool(it)) if it.ndim == 0 else ("mask", it))
            elif it.dtype.category == 1:
                raw.append(("tensor", it))
            else:
                raise IndexError(
                    f"tensors used as indices must be integer or bool tensors, got {it.dtype}"
                )
        elif isinstance(it, (list, tuple, range, np.ndarray)):
            t = _as_index_tensor(it)
            raw.append(("mask", t) if t.dtype is _dtype.bool_ else ("tensor", t))
        else:
            raise IndexError(
                f"only integers, slices, None, Ellipsis, and integer or bool tensors are valid "
                f"indices; got {type(it).__name__}"
            )
    if sum(r[0] == "..." for r in raw) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(r[1].ndim if r[0] == "mask" else r[0] in ("int", "slice", "tensor") for r in raw)
    if consumed > x.ndim:
        raise IndexError(
            f"too many indices for a tensor of {x.ndim} dims (shape {tuple(x.shape)}): "
            f"the index uses {consumed}"
        )
    items: list = []
    tensors: list = []
    empty: list[int] = []
    dim = 0
    for r in raw:
        tag = r[0]
        if tag == "...":
            fill = x.ndim - consumed
            items.extend([_FULL] * fill)
            dim += fill
        elif tag == "mask":
            mask = r[1]
            covered = tuple(x.shape[dim : dim + mask.ndim])
            for j, (a, b) in enumerate(zip(mask.shape, covered, strict=True)):
                if a is not None and b is not None and a != b:
                    raise IndexError(
                        f"the shape {tuple(mask.shape)} of the mask does not match the shape "
                        f"{covered} of the indexed tensor at dim {dim + j}"
                    )
            coords = apply("nonzero", mask)
            for j in range(mask.ndim):
                items.append(("tensor",))
                tensors.append(apply("index", coords, [], index=(_FULL, ("int", j))))
            dim += mask.ndim
        elif tag == "tensor":
            items.append(("tensor",))
            tensors.append(r[1])
            dim += 1
        elif tag == "bool":
            # torch: True adds a size-1 dim, False a size-0 dim (sliced off afterwards).
            if not r[1]:
                empty.append(sum(item[0] in ("slice", "new") for item in items))
            items.append(("new",))
        else:
            items.append(r)
            dim += tag != "new"
    if empty and tensors:
        raise IndexError("indexing with False together with index tensors is not supported")
    return tuple(items), tensors, tuple(empty)


def _getitem(x: Tensor, idx: Any) -> Tensor:
    items, tensors, empty = _parse_index(x, idx)
    out = _alias_version(apply("index", x, tensors, index=items), x)
    if empty:
        cut = tuple(("slice", 0, 0, None) if d in empty else _FULL for d in range(max(empty) + 1))
        out = apply("index", out, [], index=cut)
    return out


def _is_full_slice(it: Any) -> bool:
    return isinstance(it, slice) and it.start is None and it.stop is None and it.step is None


def _mask_as_fill(x: Tensor, idx: Any, value: Any) -> Tensor | None:
    """The mask of ``x[idx] = value`` as a ``masked_fill`` mask (shaped to broadcast against
    ``x``), when that assignment is one: a single bool mask among full slices and an ellipsis,
    matching ``x``'s dims exactly, and a value of one element. Otherwise None.

    Such an assignment writes the value wherever the mask is true, which is what
    ``masked_fill`` computes without ``nonzero`` (whose output shape depends on data: a graph
    break). torch.compile traces it the same way (index_put with a bool mask becomes a where).
    """
    items = idx if isinstance(idx, tuple) else (idx,)
    masks = [i for i, it in enumerate(items) if isinstance(it, Tensor) and it.dtype is _dtype.bool_]
    if len(masks) != 1:
        return None
    (at,) = masks
    rest = items[:at] + items[at + 1 :]
    if sum(it is Ellipsis for it in rest) > 1 or not all(
        it is Ellipsis or _is_full_slice(it) for it in rest
    ):
        return None
    size = getattr(value, "shape", None)
    if isinstance(value, Tensor):
        if any(d is None for d in value.shape) or math.prod(value.shape) != 1:
            return None
    elif not isinstance(value, (bool, int, float, np.number, np.bool_)) or size not in (None, ()):
        return None
    mask = items[at]
    n_slices = len(rest) - sum(it is Ellipsis for it in rest)
    if mask.ndim + n_slices > x.ndim:
        return None  # too many indices: the general path raises the error
    before = items[:at]
    if any(it is Ellipsis for it in before):
        after = sum(_is_full_slice(it) for it in items[at + 1 :])
        dim = x.ndim - mask.ndim - after
    else:
        dim = len(before)
    if tuple(x.shape[dim : dim + mask.ndim]) != tuple(mask.shape):
        return None  # a shape mismatch: the general path raises the error
    trailing = x.ndim - dim - mask.ndim
    return mask.reshape(*mask.shape, *([1] * trailing)) if trailing else mask


def _setitem(x: Tensor, idx: Any, value: Any) -> None:
    mask = _mask_as_fill(x, idx, value)
    if mask is not None:
        if isinstance(value, Tensor) and value.ndim:
            value = value.reshape(())
        x._apply_inplace(lambda alias, v: apply("masked_fill", alias, mask, v), value)
        return
    items, tensors, empty = _parse_index(x, idx)
    if empty:
        return  # x[False] = v selects nothing
    if not isinstance(value, (Tensor, bool, int, float, np.number, np.bool_)):
        value = Tensor(value, dtype=x.dtype)

    def put(alias: Tensor, v: Any) -> Tensor:
        return apply("index_put", alias, v, tensors, index=items, accumulate=False)

    x._apply_inplace(put, value)


Tensor.__getitem__ = _getitem
Tensor.__setitem__ = _setitem


def _index_put(x: Tensor, indices: Sequence, values: Any, accumulate: bool = False) -> Tensor:
    """``torch.index_put``: ``x`` with ``x[indices]`` set to (or increased by) ``values``."""
    items, tensors, empty = _parse_index(x, tuple(indices))
    if empty:
        raise IndexError("index_put: a False index selects nothing; use a bool mask tensor")
    return apply("index_put", x, values, tensors, index=items, accumulate=accumulate)


Tensor.index_put = _index_put
inplace_method("index_put_", _index_put)


@tensor_method()
def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of ``x`` at positions ``index`` (a 1-d integer tensor) along ``dim``."""
    if not isinstance(index, Tensor):
        index = _as_index_tensor(index)
    if index.ndim > 1:
        raise ValueError(f"index_select: index must be 1-d, got shape {tuple(index.shape)}")
    _check_index_tensors([index], "index_select")
    if index.ndim == 0:
        index = index.reshape(1)
    if x.ndim == 0:
        normalize_dim(dim, 0, "index_select")
        if index.shape[0] != 1:
            raise IndexError(
                f"index_select: a 0-d tensor takes an index of one value, got {index.shape[0]}"
            )
        return apply("index", x.reshape(1), [index], index=(_STRICT("index_select"),)).reshape(())
    d = normalize_dim(dim, x.ndim, "index_select")
    return apply("index", x, [index], index=(*((_FULL,) * d), _STRICT("index_select")))


def _index_along(x: Tensor, dim: int, index: Any, values: Any, accumulate: bool, op: str):
    """``x`` with the positions ``index`` of ``dim`` written (or increased) by ``values``."""
    if not isinstance(index, Tensor):
        index = _as_index_tensor(index)
    _check_index_tensors([index], op)
    if index.ndim > 1:
        raise ValueError(f"{op}: index must be 1-d, got shape {tuple(index.shape)}")
    d = normalize_dim(dim, x.ndim, op)
    # index_add and index_copy reject negative positions (PyTorch); index_fill wraps them.
    item = ("tensor", op, True) if op == "index_fill" else _STRICT(op)
    items = (*((_FULL,) * d), item)
    return apply("index_put", x, values, [index.reshape(-1)], index=items, accumulate=accumulate)


@tensor_method()
def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: float = 1) -> Tensor:
    """A copy of ``x`` with ``alpha * source`` added at the positions ``index`` of ``dim``
    (repeated positions add up)."""
    # The expected shape from shapes alone: an index_select here would be a second op whose
    # errors (and, compiled, whose absence) would differ from index_add's own.
    if not isinstance(index, Tensor):
        index = _as_index_tensor(index)
    d = normalize_dim(dim, x.ndim, "index_add") if x.ndim else 0
    expected = (
        tuple(index.reshape(-1).shape)
        if x.ndim == 0
        else (*x.shape[:d], index.numel(), *x.shape[d + 1 :])
    )
    if tuple(source.shape) != expected:
        raise ValueError(
            f"index_add: source has shape {tuple(source.shape)}, expected the shape "
            f"{expected} of x.index_select(dim, index)"
        )
    return _index_along(x, dim, index, source if alpha == 1 else source * alpha, True, "index_add")


@tensor_method()
def index_copy(x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """A copy of ``x`` with the positions ``index`` of ``dim`` replaced by ``source``."""
    return _index_along(x, dim, index, source, False, "index_copy")


@tensor_method()
def index_fill(x: Tensor, dim: int, index: Tensor, value: float | Tensor) -> Tensor:
    """A copy of ``x`` with the positions ``index`` of ``dim`` set to ``value``."""
    return _index_along(x, dim, index, value, False, "index_fill")


inplace_method("index_add_", index_add)
inplace_method("index_copy_", index_copy)
inplace_method("index_fill_", index_fill)


# --- gather / scatter ---------------------------------------------------------------------------


def _check_gather_shapes(op, x, index, dim, src=None):
    if index.dtype.category != 1:
        raise TypeError(f"{op}: index must be an integer tensor, got {index.dtype}")
    if index.ndim != x.ndim and not (x.ndim <= 1 and index.ndim <= 1):
        raise ValueError(
            f"{op}: index has {index.ndim} dims (shape {tuple(index.shape)}) but the tensor has "
            f"{x.ndim} (shape {tuple(x.shape)}); they must have the same number of dims"
        )
    d = normalize_dim(dim, x.ndim, op)
    for j in range(index.ndim):
        a, b = index.shape[j], x.shape[j] if x.ndim else 1
        if j != d and a is not None and b is not None and a > b:
            raise ValueError(
                f"{op}: index {tuple(index.shape)} is larger than the tensor {tuple(x.shape)} "
                f"in dim {j}"
            )
    if isinstance(src, Tensor) or hasattr(src, "shape"):
        if src.ndim != index.ndim or any(
            a is not None and b is not None and a > b
            for a, b in zip(index.shape, src.shape, strict=True)
        ):
            raise ValueError(
                f"{op}: index {tuple(index.shape)} must not be larger than src "
                f"{tuple(src.shape)} in any dim"
            )
    return d


def _gather_infer(x, index, dim):
    _check_gather_shapes("gather", x, index, dim)
    return AVal(tuple(index.shape), x.dtype)


def _as_1d(*arrays):
    return [a.reshape(1) if a.ndim == 0 else a for a in arrays]


def along_dim_out_of_range(op: str, dim: int, size: int) -> str:
    """gather/scatter's message for an index outside [0, size) (``{}`` stands for it)."""
    return f"{op}: index {{}} is out of bounds for dim {dim} with size {size}"


def _check_along_dim(op: str, index: np.ndarray, dim: int, size: int) -> None:
    # No wrapping: PyTorch's gather/scatter reject negative indices too.
    bad = (index < 0) | (index >= size)
    if bad.any():
        raise IndexError(along_dim_out_of_range(op, dim, size).format(int(index[bad].flat[0])))


def _gather_kernel(x: np.ndarray, index: np.ndarray, dim: int) -> np.ndarray:
    shape = index.shape
    x, index = _as_1d(x, index)
    d = dim % x.ndim
    _check_along_dim("gather", index, d, x.shape[d])
    crop = tuple(slice(None) if j == d else slice(0, n) for j, n in enumerate(index.shape))
    return np.take_along_axis(x[crop], index, axis=d).reshape(shape)


def _grad_to_src(g, index, src):
    """The gradient of scatter's ``src``: gather's result, zero-padded where src is larger."""
    if tuple(src.shape) == tuple(index.shape):
        return g
    amounts = []
    for n_src, n_idx in zip(reversed(src.shape), reversed(index.shape), strict=True):
        amounts += [0, n_src - n_idx]
    return apply("pad", g, pad=tuple(amounts), value=0)


register(
    OpDef(
        "gather",
        ("x", "index"),
        _gather_infer,
        _gather_kernel,
        lambda c, g: (
            apply("scatter_add", apply("zeros_like", c.inputs[0]), c.inputs[1], g, **c.attrs),
            None,
        ),
        attrs={"dim": 0},
        saves_inputs=False,
        saves_outputs=False,
    )
)


def _scatter_infer(x, index, src, dim):
    _check_gather_shapes("scatter", x, index, dim, src)
    return AVal(tuple(x.shape), x.dtype)


def _scatter_coords(index: np.ndarray, dim: int) -> tuple:
    coords = list(np.indices(index.shape, sparse=True))
    coords[dim] = index
    return tuple(coords)


def _scatter_kernel(x: np.ndarray, index: np.ndarray, src: np.ndarray, dim: int, add: bool):
    shape = x.shape
    out, index = _as_1d(x.copy(), index)
    d = dim % out.ndim
    _check_along_dim("scatter_add" if add else "scatter", index, d, out.shape[d])
    src = np.asarray(src, dtype=out.dtype)
    if src.ndim:
        src = _as_1d(src)[0][tuple(slice(0, n) for n in index.shape)]
    coords = _scatter_coords(index, dim % out.ndim)
    if add:
        np.add.at(out, coords, src)
    else:
        out[coords] = src
    return out.reshape(shape)


def _scatter_vjp(c, g):
    x, index, src = c.inputs
    dim = c.attrs["dim"]
    gx = g if not c.needs_input_grad[0] else apply("scatter", g, index, 0.0, dim=dim)
    gsrc = None
    if isinstance(src, Tensor) and c.needs_input_grad[2]:
        gsrc = _grad_to_src(apply("gather", g, index, dim=dim), index, src)
    return gx, None, gsrc


def _scatter_add_vjp(c, g):
    x, index, src = c.inputs
    gsrc = None
    if isinstance(src, Tensor) and c.needs_input_grad[2]:
        gsrc = _grad_to_src(apply("gather", g, index, dim=c.attrs["dim"]), index, src)
    return g, None, gsrc


def _scatter_op_kernel(x, index, src, dim):
    return _scatter_kernel(x, index, src, dim, add=False)


def _scatter_add_op_kernel(x, index, src, dim):
    return _scatter_kernel(x, index, src, dim, add=True)


for _name, _kernel, _vjp in (
    ("scatter", _scatter_op_kernel, _scatter_vjp),
    ("scatter_add", _scatter_add_op_kernel, _scatter_add_vjp),
):
    register(
        OpDef(
            _name,
            ("x", "index", "src"),
            _scatter_infer,
            _kernel,
            _vjp,
            attrs={"dim": 0},
            saves_inputs=False,
            saves_outputs=False,
        )
    )


@tensor_method()
def gather(x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j][k] = x[index[i][j][k]][j][k]`` (for dim 0): values picked along ``dim``.
    ``sparse_grad`` is accepted for PyTorch compatibility; gradients are always dense."""
    return apply("gather", x, index, dim=dim)


@tensor_method()
def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """``torch.take_along_dim``: gather along ``dim`` with broadcasting of the other dims; with
    ``dim=None`` both tensors are flattened first."""
    if dim is None:
        return gather(x.reshape(-1), 0, indices.reshape(-1))
    if x.ndim != indices.ndim:
        raise ValueError(
            f"take_along_dim: x {tuple(x.shape)} and indices {tuple(indices.shape)} must have "
            "the same number of dims"
        )
    d = normalize_dim(dim, x.ndim, "take_along_dim")
    shape = broadcast_shapes(
        *(tuple(1 if j == d else n for j, n in enumerate(t.shape)) for t in (x, indices)),
        op="take_along_dim",
    )
    xs = x.expand(*(-1 if j == d else n for j, n in enumerate(shape)))
    ix = indices.expand(*(indices.shape[j] if j == d else n for j, n in enumerate(shape)))
    return gather(xs, d, ix)


@tensor_method()
def scatter(
    x: Tensor,
    dim: int,
    index: Tensor,
    src: Tensor | float | None = None,
    *,
    value: float | None = None,
    reduce: str | None = None,
) -> Tensor:
    """A copy of ``x`` with ``out[index[i][j]][j] = src[i][j]`` (for dim 0); ``src`` may be a
    number (or pass ``value=``). ``reduce='add'`` adds instead of overwriting."""
    if (src is None) == (value is None):
        raise TypeError("scatter: pass exactly one of src and value")
    source = src if src is not None else value
    if reduce not in (None, "add"):
        raise ValueError(f"scatter: reduce must be None or 'add' (use scatter_add), got {reduce!r}")
    return apply("scatter_add" if reduce == "add" else "scatter", x, index, source, dim=dim)


@tensor_method()
def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``x`` with ``out[index[i][j]][j] += src[i][j]`` (for dim 0); repeats add up."""
    return apply("scatter_add", x, index, src, dim=dim)


inplace_method("scatter_", scatter)
inplace_method("scatter_add_", scatter_add)


# --- masked_fill --------------------------------------------------------------------------------


def _masked_fill_infer(x, mask, value):
    if mask.dtype is not _dtype.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got {mask.dtype}")
    if getattr(value, "ndim", 0) != 0:
        raise ValueError(
            f"masked_fill: value must be a number or a 0-d tensor, got shape {tuple(value.shape)}"
        )
    shape = broadcast_shapes(tuple(x.shape), tuple(mask.shape), op="masked_fill")
    return AVal(shape, x.dtype)


def _masked_fill_kernel(x: np.ndarray, mask: np.ndarray, value: np.ndarray) -> np.ndarray:
    return np.where(mask, np.asarray(value, dtype=x.dtype), x)


def _masked_fill_vjp(c, g):
    x, mask, value = c.inputs
    gx = apply("masked_fill", g, mask, 0.0)
    # The value's gradient is the sum of g over the filled places; autograd sums it to 0-d.
    gv = g - gx if isinstance(value, Tensor) and c.needs_input_grad[2] else None
    return gx, None, gv


register(
    OpDef(
        "masked_fill",
        ("x", "mask", "value"),
        _masked_fill_infer,
        _masked_fill_kernel,
        _masked_fill_vjp,
        props=frozenset({SYMBOLIC_BATCH_SAFE}),
        saves_inputs=False,
        saves_outputs=False,
    )
)


@tensor_method()
def masked_fill(x: Tensor, mask: Tensor, value: float | Tensor) -> Tensor:
    """``x`` with ``value`` where ``mask`` (broadcast against ``x``) is true."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"masked_fill: mask must be a bool Tensor, got {type(mask).__name__}")
    return apply("masked_fill", x, mask, value)


inplace_method("masked_fill_", masked_fill)


@tensor_method()
def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    """The 1-d tensor of the elements of ``x`` where ``mask`` (broadcast with ``x``) is true."""
    if not isinstance(mask, Tensor) or mask.dtype is not _dtype.bool_:
        raise TypeError("masked_select: mask must be a bool Tensor")
    shape = broadcast_shapes(tuple(x.shape), tuple(mask.shape), op="masked_select")
    return _getitem(x.expand(*shape), mask.expand(*shape))
