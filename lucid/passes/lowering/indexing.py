"""Lowering rules of indexing: ``x[...]`` (``index``), ``index_put``, gather/scatter_add,
masked_fill, embedding and one_hot.

Basic items (ints, slices, new axes) become slices, reshapes and constant-index gathers. Integer
index tensors become one ``prim.gather`` on a flat position: the indexed dims are moved to the
front and merged, and each index tensor (negative entries wrapped) is scaled by its dim's stride.
Writes (``index_put`` with accumulate, ``scatter_add``, the embedding gradient) are
``prim.scatter_add`` on flat positions computed the same way.

Every value read as an index first goes through ``prim.check_index`` with eager's range and
message (index tensors: [-n, n); gather/scatter, embedding, one_hot: [0, n)), so a bad index
raises eager's ``IndexError`` naming the user's op, never a wrapped or a ``prim.gather`` error.
"""

from __future__ import annotations

import math

import numpy as np

from lucid import _dtype
from lucid.ops._registry import normalize_dim
from lucid.ops.embedding import out_of_range_message
from lucid.ops.indexing import (
    along_dim_out_of_range,
    index_out_of_range,
    index_tensor_checks,
    index_tensor_dims,
)
from lucid.passes.lowering._core import PV, Builder, LoweringUnsupported, rule, unsupported

_I64 = _dtype.int64


def _wrap(b: Builder, idx: PV, n: int, dim: int, check: tuple[str, bool]) -> PV:
    """An index tensor of dim ``dim`` (size ``n``) checked by eager's rule ``check`` (the op its
    error names; whether negatives wrap, i.e. [-n, n), or are rejected, [0, n))."""
    name, wraps = check
    low = -n if wraps else 0
    idx = b.check_index(b.cast(idx, _I64), low, n, index_out_of_range(name, dim, n))
    if not wraps:
        return idx
    return b.select(b.binary("lt", idx, 0, _I64), b.binary("add", idx, n, _I64), idx, _I64)


def _slice_dim(b: Builder, v: PV, axis: int, start, stop, step) -> PV:
    n = v.shape[axis]
    lo, hi, st = slice(start, stop, step).indices(n)
    if st > 0:
        return b.slice_axis(v, axis, lo, max(hi, lo), st)
    positions = np.arange(lo, hi, st, dtype=np.int64)
    if positions.size == 0:
        return b.slice_axis(v, axis, 0, 0)
    return b.op("gather", v, b.const(positions, _I64, positions.shape), axis=axis)


def _apply_index(b: Builder, v: PV, indices: list, index: tuple, out_shape: tuple) -> PV:
    """``v[index]`` by eager's rule: integers first (``x[ints][rest]``), then slices, new axes and
    index tensors with numpy's advanced-indexing layout."""
    it = iter(indices)
    ints: list[tuple[int, int]] = []  # (dim, position)
    rest: list[
        tuple[str, object]
    ] = []  # per remaining item: ("slice", ...), ("new",), ("tensor", pv)
    dim = 0
    for item in index:
        tag = item[0]
        if tag == "int":
            ints.append((dim, item[1]))
            dim += 1
        elif tag == "new":
            rest.append(("new", None))
        elif tag == "slice":
            rest.append(("slice", (dim, item[1:])))
            dim += 1
        else:
            rest.append(("tensor", (dim, next(it))))
            dim += 1
    # 1. integer items: one-wide slices, then drop those dims.
    for d, i in ints:
        i = i % v.shape[d]
        v = b.slice_axis(v, d, i, i + 1)
    keep = [d for d in range(v.ndim) if d not in {d for d, _ in ints}]
    v = b.reshape(v, [v.shape[d] for d in keep])
    remap = {old: new for new, old in enumerate(keep)}
    # 2. slices on their own dims.
    for tag, payload in rest:
        if tag == "slice":
            d, (start, stop, step) = payload
            v = _slice_dim(b, v, remap[d], start, stop, step)
    tensors = [(remap[d], t) for tag, (d, t) in ((r[0], r[1]) for r in rest if r[0] == "tensor")]
    x_dims = index_tensor_dims(index)  # each index tensor's dim in the original x
    checks = index_tensor_checks(b.op_name, index)
    if not tensors:
        return b.reshape(v, out_shape)  # new axes are size-1 dims in place
    # 3. index tensors: merge their dims at the front and gather one flat position.
    adv_dims = [d for d, _ in tensors]
    others = [d for d in range(v.ndim) if d not in adv_dims]
    moved = b.transpose(v, adv_dims + others)
    sizes = [v.shape[d] for d in adv_dims]
    merged = b.reshape(moved, (math.prod(sizes), *[v.shape[d] for d in others]))
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    flat = None
    for (_d, t), n, stride, x_dim, check in zip(
        tensors, sizes, strides, x_dims, checks, strict=True
    ):
        term = b.binary("mul", _wrap(b, t, n, x_dim, check), stride, _I64)
        flat = term if flat is None else b.op("add", flat, term)
    bshape = np.broadcast_shapes(*(t.shape for _, t in tensors))
    flat = b.broadcast_to(flat, bshape)
    g = b.op("gather", merged, flat, axis=0)  # dims: bshape + others
    # 4. numpy's layout: the index dims stand where the first index item is when the items are
    # adjacent in the remaining index, else first; new axes are size-1 dims.
    labels = [("adv", i) for i in range(len(bshape))] + [("dim", d) for d in others]
    positions = [i for i, r in enumerate(rest) if r[0] == "tensor"]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    target: list = []
    placed = False
    body: list = []
    new_count = 0
    for tag, payload in rest:
        if tag == "tensor":
            if not placed:
                body.append("ADV")
                placed = True
        elif tag == "new":
            body.append(("new", new_count))
            new_count += 1
        else:
            body.append(("dim", remap[payload[0]]))
    used_dims = {lbl[1] for lbl in body if isinstance(lbl, tuple) and lbl[0] == "dim"} | set(
        adv_dims
    )
    trailing = [("dim", d) for d in range(v.ndim) if d not in used_dims]
    adv_labels = [("adv", i) for i in range(len(bshape))]
    if adjacent:
        for lbl in body:
            target.extend(adv_labels if lbl == "ADV" else [lbl])
    else:
        target = adv_labels + [lbl for lbl in body if lbl != "ADV"]
    target += trailing
    # add the new axes as trailing size-1 dims, then permute into place.
    with_new = labels + [("new", i) for i in range(new_count)]
    g = b.reshape(g, (*g.shape, *([1] * new_count)))
    g = b.transpose(g, [with_new.index(lbl) for lbl in target])
    return b.reshape(g, out_shape)


@rule("index")
def _index(b: Builder, v, indices, index):
    return _apply_index(b, v, list(indices), tuple(index), b.outs[0].shape)


def _positions(b: Builder, x: PV, indices: list, index: tuple) -> tuple[PV, np.ndarray | None]:
    """The flat positions in ``x`` that ``x[index]`` reads, and, when the index holds no tensors,
    the same positions as a numpy array (compile-time constants, all distinct)."""
    from lucid.ops.indexing import _index_kernel, _index_shape

    if not indices:
        known = _index_kernel(np.arange(x.size, dtype=np.int64).reshape(x.shape), [], index)
        known = np.ascontiguousarray(known)
        return b.const(known, _I64, known.shape), known
    target = _index_shape(x.shape, [t.shape for t in indices], index)
    return _apply_index(b, b.flat_iota(x.shape), indices, index, target), None


# Assignment through possibly repeated positions, exactly as numpy's: the last write (in C order
# of the index) wins. An m x m comparison finds the writes a later one overwrites, so this is
# limited to MAX_ASSIGN writes.
MAX_ASSIGN = 4096


def _assign(b: Builder, flat_x: PV, flat_pos: PV, flat_vals: PV, distinct: bool) -> PV:
    """``flat_x`` with ``flat_vals`` written at ``flat_pos`` (1-d, equal lengths)."""
    m = flat_pos.size
    dt = flat_x.dtype
    if m == 0:
        return flat_x
    # -0.0 as the neutral value keeps a written -0.0 (0.0 + -0.0 would give +0.0).
    neutral = -0.0 if dt.is_floating_point else 0
    if not distinct:
        if m > MAX_ASSIGN:
            raise LoweringUnsupported(
                f"assignment through index tensors with {m} writes (more than {MAX_ASSIGN}; "
                "finding the last write to each position compares every pair)"
            )
        same = b.op(
            "eq", b.reshape(flat_pos, (m, 1)), b.reshape(flat_pos, (1, m))
        )  # same[k, j]: writes k and j hit one position
        later = b.const(np.triu(np.ones((m, m), dtype=bool), 1), _dtype.bool_, (m, m))
        overwritten = b.op("logical_and", same, later)
        hit_later = b.reduce("reduce_max", b.cast(overwritten, _dtype.int32), (1,))
        keep = b.binary("eq", hit_later, 0, _dtype.int32)
        flat_vals = b.select(keep, flat_vals, neutral, dt)
    written = b.op("scatter_add", b.full(neutral, (flat_x.size,), dt), flat_pos, flat_vals, axis=0)
    ones = b.full(1, (m,), _dtype.int32)
    hits = b.op("scatter_add", b.full(0, (flat_x.size,), _dtype.int32), flat_pos, ones, axis=0)
    return b.op("select", b.binary("ne", hits, 0, _dtype.int32), written, flat_x)


def _basic_box(shape: tuple, index: tuple) -> list[tuple[int, int]] | None:
    """Per axis of ``x``, the ``[start, stop)`` an index of ints, step-1 slices and new axes
    selects; None for any other index (steps, index tensors)."""
    box: list[tuple[int, int]] = []
    axis = 0
    for item in index:
        kind = item[0]
        if kind == "new":
            continue
        if axis >= len(shape):
            return None
        n = shape[axis]
        if kind == "int":
            i = item[1] + n if item[1] < 0 else item[1]
            box.append((i, i + 1))
        elif kind == "slice":
            start, stop, step = slice(*item[1:4]).indices(n)
            if step != 1:
                return None
            box.append((start, max(start, stop)))
        else:
            return None
        axis += 1
    box.extend((0, n) for n in shape[axis:])
    return box


def _index_put_box(b: Builder, v, values, box, index, accumulate):
    """``index_put`` through a box of ``x`` (the gradient of slicing): values padded with zeros to
    ``x``'s shape and added or selected in; no position constants, whatever ``x``'s size."""
    inner = tuple(e - s for s, e in box)
    low, high = [s for s, _ in box], [n - e for (_, e), n in zip(box, v.shape, strict=True)]
    work = v if v.dtype is not _dtype.bool_ else b.cast(v, _dtype.int32)
    from lucid.ops.indexing import _index_shape

    target = tuple(_index_shape(tuple(v.shape), [], index))
    vals = b.cast(values, work.dtype)
    vshape = tuple(vals.shape)
    while len(vshape) > len(target) and vshape[0] == 1:  # numpy drops extra leading 1s
        vshape = vshape[1:]
    vals = b.reshape(b.broadcast_to(b.reshape(vals, vshape), target), inner)
    padded = b.op("pad", vals, low=low, high=high, value=0.0)
    if accumulate:
        out = b.binary("add", work, padded, work.dtype)
    else:
        ones = b.broadcast_to(b.const(1, _dtype.int32, ()), inner)
        inside = b.op("pad", ones, low=low, high=high, value=0.0)
        out = b.select(b.binary("ne", inside, 0, _dtype.int32), padded, work, work.dtype)
    return b.cast(out, v.dtype)


@rule("index_put")
def _index_put(b: Builder, v, values, indices, index, accumulate):
    box = None if indices else _basic_box(tuple(v.shape), tuple(index))
    if box is not None:
        return _index_put_box(b, v, values, box, tuple(index), accumulate)
    pos, known = _positions(b, v, list(indices), tuple(index))
    vals = b.cast(values, v.dtype)
    vshape = vals.shape
    while len(vshape) > pos.ndim and vshape[0] == 1:
        vshape = vshape[1:]
    vals = b.broadcast_to(b.reshape(vals, vshape), pos.shape)
    flat_pos = b.reshape(pos, (pos.size,))
    work = v if v.dtype is not _dtype.bool_ else b.cast(v, _dtype.int32)
    flat_vals = b.cast(b.reshape(vals, (pos.size,)), work.dtype)
    flat_x = b.reshape(work, (v.size,))
    if accumulate:
        out = b.op("scatter_add", flat_x, flat_pos, flat_vals, axis=0)
    else:
        out = _assign(b, flat_x, flat_pos, flat_vals, distinct=known is not None)
    return b.cast(b.reshape(out, v.shape), v.dtype)


def _along_dim_positions(b: Builder, x: PV, idx: PV, dim: int) -> PV:
    """Flat positions in ``x`` of torch's gather/scatter index ``idx`` along ``dim``."""
    strides = [math.prod(x.shape[i + 1 :]) for i in range(x.ndim)]
    n = x.shape[dim]
    # No wrapping: gather/scatter reject negative indices, as PyTorch (and eager).
    idx = b.check_index(b.cast(idx, _I64), 0, n, along_dim_out_of_range(b.op_name, dim, n))
    out = b.binary("mul", idx, strides[dim], _I64)
    for i in range(x.ndim):
        if i != dim and idx.shape[i] > 1:
            coord = b.binary("mul", b.arange_along(idx.shape[i], i, idx.ndim), strides[i], _I64)
            out = b.op("add", out, coord)
    return b.broadcast_to(out, idx.shape)


@rule("gather")
def _gather(b: Builder, v, idx, dim):
    d = normalize_dim(dim, v.ndim)
    if v.ndim == 0:
        return b.reshape(v, b.outs[0].shape)
    pos = _along_dim_positions(b, v, idx, d)
    return b.op("gather", b.reshape(v, (v.size,)), pos, axis=0)


@rule("scatter_add")
def _scatter_add(b: Builder, v, idx, src, dim):
    d = normalize_dim(dim, v.ndim)
    if v.ndim == 0:
        raise LoweringUnsupported("scatter_add into a 0-d tensor")
    src = b.cast(src, v.dtype)
    if src.shape != idx.shape:  # torch reads only the leading index.shape block of src
        src = b.op(
            "slice", src, starts=[0] * src.ndim, ends=list(idx.shape), strides=[1] * src.ndim
        )
    pos = b.reshape(_along_dim_positions(b, v, idx, d), (math.prod(idx.shape),))
    flat = b.op("scatter_add", b.reshape(v, (v.size,)), pos, b.reshape(src, pos.shape), axis=0)
    return b.reshape(flat, v.shape)


@rule("scatter")
def _scatter(b: Builder, v, idx, src, dim):
    if v.ndim == 0:
        raise LoweringUnsupported("scatter into a 0-d tensor")
    d = normalize_dim(dim, v.ndim)
    m = math.prod(idx.shape)
    if isinstance(src, PV):
        src = b.cast(src, v.dtype)
        if src.shape != idx.shape:  # torch reads only the leading index.shape block of src
            src = b.op(
                "slice", src, starts=[0] * src.ndim, ends=list(idx.shape), strides=[1] * src.ndim
            )
        flat_src = b.reshape(src, (m,))
    else:
        flat_src = b.full(src, (m,), v.dtype)
    work = v if v.dtype is not _dtype.bool_ else b.cast(v, _dtype.int32)
    pos = b.reshape(_along_dim_positions(b, v, idx, d), (m,))
    out = _assign(b, b.reshape(work, (v.size,)), pos, b.cast(flat_src, work.dtype), distinct=False)
    return b.cast(b.reshape(out, v.shape), v.dtype)


unsupported("nonzero", "its output shape depends on the input's values (a graph break)")


@rule("masked_fill")
def _masked_fill(b: Builder, v, mask, value):
    return b.select(mask, value, v, v.dtype)


def _embedding_rows(b: Builder, indices: PV, n: int) -> PV:
    return b.check_index(b.cast(indices, _I64), 0, n, out_of_range_message("embedding", n))


@rule("embedding")
def _embedding(b: Builder, indices, weight, padding_idx, scale_grad_by_freq):
    return b.op("gather", weight, _embedding_rows(b, indices, weight.shape[0]), axis=0)


@rule("embedding_backward")
def _embedding_backward(b: Builder, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad.shape[-1]
    n = indices.size
    flat_idx = b.reshape(_embedding_rows(b, indices, num_weights), (n,))
    rows = b.reshape(grad, (n, dim))
    out = b.op("scatter_add", b.full(0, (num_weights, dim), grad.dtype), flat_idx, rows, axis=0)
    if scale_grad_by_freq:
        ones = b.full(1, (n,), grad.dtype)
        counts = b.op("scatter_add", b.full(0, (num_weights,), grad.dtype), flat_idx, ones, axis=0)
        counts = b.binary("maximum", counts, 1, grad.dtype)
        out = b.op("div", out, b.reshape(counts, (num_weights, 1)))
    if padding_idx is not None:
        keep = np.ones((num_weights, 1), dtype=bool)
        keep[padding_idx] = False
        out = b.select(b.const(keep, _dtype.bool_, (num_weights, 1)), out, 0, grad.dtype)
    return out


@rule("one_hot")
def _one_hot(b: Builder, v, num_classes):
    if num_classes is None or num_classes < 0:
        raise LoweringUnsupported("one_hot without num_classes (the depth depends on the values)")
    v = b.check_index(b.cast(v, _I64), 0, num_classes, out_of_range_message("one_hot", num_classes))
    return b.op("one_hot", v, depth=num_classes, axis=-1, dtype="i64")
