"""Attention: per-head operands read in place from the projection (head views), sums of zero
pads as one ``concat``, ``attention(q, k, v)`` for the softmax of scaled scores times V written
out by hand, the weights the gradient reads taken from the forward kernel (a causal attention's
too: their recomputation masks the scores with ``composite.causal_keep``), and the results of
``attention_grad`` (a composite prim op) written into the fused QKV projection's gradient."""

from __future__ import annotations

import numpy as np

from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites.match import (
    FLOAT_DTYPES,
    PRODUCTS,
    STAGE,
    Graph,
    gemm_of,
    is_close,
    single_use,
    zero_constant,
)
from lucid.ir import visits


def _head_source(g: Graph, slot: int) -> tuple[int, list[int]] | None:
    """``(src, [H, D, col0])`` when ``slot`` is ``transpose{0,2,1,3}(reshape(x))`` of a
    ``[B, L, W]`` value's columns ``col0 .. col0 + H*D`` (x a unit-stride slice of its last axis,
    or the whole value): the heads of a projection, which a gemm reads in place."""
    t = g.made_by(slot, "transpose")
    if t is None or tuple(t[1].attrs["perm"]) != (0, 2, 1, 3):
        return None
    r = g.made_by(t[1].inputs[0], "reshape")
    if r is None:
        return None
    b, length, heads, dim = g.aval(r[1].outputs[0]).shape
    src = r[1].inputs[0]
    col0 = 0
    sl = g.made_by(src, "slice")
    if sl is not None:
        starts, ends, strides = (sl[1].attrs[k] for k in ("starts", "ends", "strides"))
        whole = g.aval(sl[1].inputs[0]).shape
        if (
            len(whole) != 3
            or tuple(strides) != (1, 1, 1)
            or tuple(starts[:2]) != (0, 0)
            or tuple(ends[:2]) != whole[:2]
        ):
            return None
        src, col0 = sl[1].inputs[0], starts[2]
    if g.aval(src).shape[:2] != (b, length) or len(g.aval(src).shape) != 3:
        return None
    return src, [heads, dim, col0]


def _merged_output(g: Graph, out: int) -> tuple[int, int, list[int]] | None:
    """(transpose index, new [B, L, H*D] slot, [H, D]) when the [B, H, L, D] value ``out`` is
    read by one ``transpose{0,2,1,3}`` (not a result) whose readers are all reshapes: the
    transposed value is dense, so it is byte for byte the [B, L, H*D] value a kernel writes in
    that order; the reshapes read the new slot instead."""
    if len(g.aval(out).shape) != 4:
        return None
    t = g.only_reader(out, "transpose")
    if t is None or tuple(t[1].attrs["perm"]) != (0, 2, 1, 3):
        return None
    readers = g.readers(t[1].outputs[0])
    if t[1].outputs[0] in g.results or not all(g.instrs[j].op == "reshape" for j in readers):
        return None
    b, heads, length, dim = g.aval(out).shape
    new = g.program.new_slot((b, length, heads * dim), g.aval(out).dtype)
    for j in readers:
        r = g.instrs[j]
        g.set(j, Instr("reshape", (new,), r.outputs, dict(r.attrs)))
    return t[0], new, [heads, dim]


def _with_head_views(
    g: Graph, k: int, ins: Instr, names: tuple[str | None, ...], out_name: str | None
) -> None:
    """Instruction ``ins`` at ``k`` with its rank-4 operands read as head views (attributes
    ``names``; None: that operand stays dense) and its one output written in [B, L, H*D] order
    (attribute ``out_name``; None: the outputs stay dense)."""
    inputs, attrs, outputs = list(ins.inputs), dict(ins.attrs), ins.outputs
    for i, name in enumerate(names):
        if name is None or name in attrs or len(g.aval(inputs[i]).shape) != 4:
            continue
        found = _head_source(g, inputs[i])
        if found is not None:
            inputs[i], attrs[name] = found[0], found[1]
    merged = None
    if out_name is not None and out_name not in attrs:
        merged = _merged_output(g, outputs[0])
    if merged is not None:
        # Where the transpose was: every reader of its value comes after it.
        g.set(k, None)
        k, new, attrs[out_name] = merged
        outputs = (new,)
    if attrs == ins.attrs and outputs == ins.outputs:
        return
    g.set(k, Instr(ins.op, tuple(inputs), outputs, attrs))
    # The slices, reshapes and transposes whose values nothing reads any more go.
    g.erase_unread(lambda _, ins: ins.op in ("slice", "reshape", "transpose"))


def fold_head_views(g: Graph) -> None:
    """The per-head operands of attention and its gradient (composite ops) and of products
    read straight from the projection, and per-head results written straight in [B, L, H*D]
    order: the slices and transposes around them (copies of the whole activation each) are
    gone."""
    for k, ins in g.each("attention", "attention_grad", *PRODUCTS):
        if g.aval(ins.outputs[0]).dtype not in FLOAT_DTYPES:
            continue
        if ins.op == "attention" and len(ins.outputs) == 1:
            _with_head_views(g, k, ins, ("q_view", "k_view", "v_view"), "out_view")
        elif ins.op == "attention_grad" and len(ins.outputs) == 3:
            views = ("d_out_view", "q_view", "k_view", "v_view", None)
            _with_head_views(g, k, ins, views, None)
        elif ins.op in PRODUCTS and len(ins.inputs) == 2:
            _with_head_views(g, k, gemm_of(ins), ("a_view", "b_view"), "c_view")


def _padded_sum(g: Graph, k: int, shape: tuple):
    """(zero pads, zero constants, tree instructions) of the tree of single-use same-shape adds
    rooted at instruction ``k`` when every leaf is a single-use zero pad or a zero constant;
    None at the first other leaf (so a long sum of other values, a gradient accumulated over
    time steps, costs its root a few visits, not a walk of the whole chain per add)."""
    pieces, zeros, tree, pending = [], [], [k], list(g.instrs[k].inputs)
    while pending:
        s = pending.pop()
        visits.count(STAGE)
        if g.aval(s).shape != shape:
            return None
        found = g.made_by(s, "add")
        if found is not None and g.used_only_by(s, 1):
            tree.append(found[0])
            pending.extend(found[1].inputs)
            continue
        pad = single_use(g, s, "pad")
        if pad is not None and pad[1].attrs["value"] == 0:
            pieces.append(pad)
        elif zero_constant(g, s):
            zeros.append(s)
        else:
            return None
    return pieces, zeros, tree


def fold_padded_sums(g: Graph) -> None:
    """A sum of zero-padded pieces that tile one axis, plus zeros, becomes their concatenation:
    the gradient of a fused QKV projection was three pads of [.., 3E] and an add of four arrays
    (one of them a zero constant), where one concat reads each piece once."""
    if g.count("pad") < 2:  # a sum of one pad tiles nothing
        return
    for k, ins in g.each("add", reverse=True):
        if any(g.op_of(s) not in ("add", "pad", "constant") for s in ins.inputs):
            continue  # a leaf that is neither a pad nor a zero: most adds
        shape = g.aval(ins.outputs[0]).shape
        found = _padded_sum(g, k, shape)
        if found is None:
            continue
        pieces, zeros, tree = found
        axis = _tiled_axis([p for _, p in pieces], shape)
        if axis is None:
            continue
        pieces.sort(key=lambda jp: jp[1].attrs["low"][axis])
        for j in tree + [j for j, _ in pieces]:
            g.set(j, None)
        sources = tuple(p.inputs[0] for _, p in pieces)
        g.set(k, Instr("concat", sources, ins.outputs, {"axis": axis}))
        for s in zeros:  # a zero constant read by nothing else now
            if g.uses[s] == 0 and s not in g.results and s in g.producer:
                g.set(g.producer[s], None)


def _tiled_axis(pads: list[Instr], shape: tuple) -> int | None:
    """The one axis along which ``pads`` (at least two) place their inputs side by side,
    covering it exactly; None otherwise."""
    if len(pads) < 2:
        return None
    axes = {a for p in pads for a in range(len(shape)) if p.attrs["low"][a] or p.attrs["high"][a]}
    if len(axes) != 1:
        return None
    (axis,) = axes
    spans = sorted((p.attrs["low"][axis], shape[axis] - p.attrs["high"][axis]) for p in pads)
    edge = 0
    for lo, hi in spans:
        if lo != edge or hi <= lo:
            return None
        edge = hi
    return axis if edge == shape[axis] else None


# -- attention -----------------------------------------------------------------------------------


def _attention_operand(g: Graph, gemm: Instr, i: int) -> tuple[int, list[int] | None, tuple]:
    """(slot, view or None, logical [B, H, L, D] shape) of a gemm's operand ``i``."""
    slot = gemm.inputs[i]
    view = gemm.attrs.get(("a_view", "b_view")[i])
    shape = g.aval(slot).shape
    if view is None:
        return slot, None, shape
    heads, dim, _ = view
    return slot, list(view), (shape[0], heads, shape[1], dim)


def _plain_gemm(g: Graph, slot: int, *, ta: bool, tb: bool) -> tuple[int, Instr] | None:
    """A single-use 2-operand float matmul/gemm producing ``slot`` with these transposes."""
    found = single_use(g, slot, "gemm") or single_use(g, slot, "matmul")
    if found is None or len(found[1].inputs) != 2 or g.aval(slot).dtype not in FLOAT_DTYPES:
        return None
    gemm = gemm_of(found[1])
    if (gemm.attrs["transpose_a"], gemm.attrs["transpose_b"]) != (ta, tb):
        return None
    return found[0], gemm


def _last_axis_softmax(g: Graph, slot: int) -> tuple[int, Instr] | None:
    found = g.made_by(slot, "softmax")
    if found is None or len(g.aval(slot).shape) != 4 or found[1].attrs["axis"] % 4 != 3:
        return None
    return found


def _scores(g: Graph, probs: int) -> tuple[int, int, Instr] | None:
    """(softmax index, scores gemm index, scores gemm) when ``probs`` is
    ``softmax(gemm{alpha}(q, k, transpose_b))`` over rank-4 operands of equal batch and heads."""
    sm = _last_axis_softmax(g, probs)
    if sm is None:
        return None
    qk = _plain_gemm(g, sm[1].inputs[0], ta=False, tb=True)
    if qk is None:
        return None
    q = _attention_operand(g, qk[1], 0)
    k = _attention_operand(g, qk[1], 1)
    if len(q[2]) != 4 or len(k[2]) != 4 or q[2][:2] != k[2][:2] or q[2][3] != k[2][3]:
        return None
    return sm[0], qk[0], qk[1]


def _attention_attrs(q, k, v, alpha: float) -> dict | None:
    """The attention attributes of (slot, view, shape) operands, None unless their logical
    shapes are [B, H, Lq, D], [B, H, Lk, D] and [B, H, Lk, Dv]."""
    (_, qv, qs), (_, kv, ks), (_, vv, vs) = q, k, v
    if len(vs) != 4 or vs[:2] != qs[:2] or vs[2] != ks[2]:
        return None
    attrs: dict = {"alpha": float(alpha)}
    for name, view in (("q_view", qv), ("k_view", kv), ("v_view", vv)):
        if view is not None:
            attrs[name] = view
    return attrs


def fold_attention(g: Graph) -> None:
    """``gemm(softmax(gemm{alpha}(q, k, transpose_b)), v)``, with the scores read nowhere else,
    becomes one ``attention(q, k, v)`` (masked scores stay unfused). Weights read elsewhere too
    (the training forward's, which the gradient reads; ``need_weights``) become its second
    output, when nothing reads them before the product."""
    for k, ins in g.each(*PRODUCTS):
        if len(ins.inputs) != 2:
            continue
        pv = gemm_of(ins)
        if pv.attrs["transpose_a"] or pv.attrs["transpose_b"] or pv.attrs["alpha"] != 1.0:
            continue
        if "a_view" in pv.attrs or g.aval(ins.outputs[0]).dtype not in FLOAT_DTYPES:
            continue
        probs = pv.inputs[0]
        # The pattern first: asking for readers builds the readers table (a walk over the
        # whole program), which a program without attention never needs.
        found = _scores(g, probs)
        if found is None:
            continue
        keep_probs = not g.used_only_by(probs, 1)
        if keep_probs and min(g.readers(probs), default=k) < k:
            continue
        j_sm, j_qk, qk = found
        q, kk = _attention_operand(g, qk, 0), _attention_operand(g, qk, 1)
        v = _attention_operand(g, pv, 1)
        attrs = _attention_attrs(q, kk, v, qk.attrs["alpha"])
        if attrs is None:
            continue
        out = g.aval(ins.outputs[0])
        b, heads, length, dv = q[2][0], q[2][1], q[2][2], v[2][3]
        if "c_view" in pv.attrs:
            attrs["out_view"] = [heads, dv]
            want = (b, length, heads * dv)
        else:
            want = (b, heads, length, dv)
        if out.shape != want:
            continue
        g.set(j_sm, None)
        g.set(j_qk, None)
        outputs = (*ins.outputs, probs) if keep_probs else ins.outputs
        g.set(k, Instr("attention", (q[0], kk[0], v[0]), outputs, attrs))


def _range_constant(g: Graph, slot: int, shape: tuple) -> bool:
    """Whether ``slot`` is the constant 0, 1, .. n - 1 of ``shape`` (one axis of size n)."""
    found = g.made_by(slot, "constant")
    if found is None or g.aval(slot).shape != shape:
        return False
    return tuple(found[1].attrs["value"]) == tuple(float(i) for i in range(max(shape)))


def _causal_scores(g: Graph, slot: int) -> tuple[list[int], int] | None:
    """(select index, scores) when ``slot`` is ``select(le(cols, rows), scores, -inf)`` with
    ``rows`` and ``cols`` the [Lq, 1] and [1, Lk] position ranges (``composite.causal_keep``):
    the scores a causal attention's weights are the softmax of."""
    sel = g.made_by(slot, "select")
    if sel is None or not g.used_only_by(slot, 1):
        return None
    cond, scores, fill = sel[1].inputs
    fill_const = g.made_by(fill, "constant")
    if fill_const is None or tuple(fill_const[1].attrs["value"]) != (-np.inf,):
        return None
    le = g.made_by(cond, "le")
    shape = g.aval(scores).shape
    if le is None or len(shape) != 4:
        return None
    cols, rows = le[1].inputs
    if not (_range_constant(g, cols, (1, shape[3])) and _range_constant(g, rows, (shape[2], 1))):
        return None
    return [sel[0]], scores


def fold_attention_weights(g: Graph) -> None:
    """The weights ``softmax(gemm{alpha}(q, k, transpose_b))`` that attention's gradient
    recomputes from the operands of an ``attention`` before it become that attention's second
    output (the kernel has them in cache): the training forward computes them once. A causal
    attention's weights are recomputed with their scores masked (``_causal_scores``)."""
    instrs = g.instrs
    forward: dict[tuple, int] = {}
    for k, ins in g.each("attention"):
        if len(ins.outputs) == 1:
            key = _scores_key(ins.inputs, ins.attrs.get("q_view"), ins.attrs.get("k_view"))
            forward[(*key, bool(ins.attrs.get("causal", False)))] = k
    if not forward:
        return
    masked = False
    # An instruction whose value is a softmax's is that softmax.
    for j, ins in g.each("softmax"):
        if _last_axis_softmax(g, ins.outputs[0]) is None:
            continue
        scores, masking = ins.inputs[0], []
        causal = _causal_scores(g, scores)
        if causal is not None:
            masking, scores = causal
        qk = _plain_gemm(g, scores, ta=False, tb=True)
        if qk is None:
            continue
        key = _scores_key(qk[1].inputs, qk[1].attrs.get("a_view"), qk[1].attrs.get("b_view"))
        k = forward.get((*key, causal is not None))
        probs = ins.outputs[0]
        if k is None or min(g.readers(probs), default=k + 1) < k:
            continue
        att = instrs[k]
        if not is_close(qk[1].attrs["alpha"], att.attrs["alpha"]):
            continue
        for i in (qk[0], *masking, j):
            g.set(i, None)
        g.set(k, Instr("attention", att.inputs, (*att.outputs, probs), att.attrs))
        del forward[(*key, causal is not None)]
        masked = masked or bool(masking)
    if masked:  # the causal masks' comparisons and ranges nothing reads any more go
        g.erase_unread(lambda _, ins: ins.op in ("le", "constant"))


def _scores_key(inputs: tuple[int, ...], q_view, k_view) -> tuple:
    """What the scores Q Kᵀ are computed from: the Q and K slots and their head views."""
    return (inputs[0], inputs[1], *(None if v is None else tuple(v) for v in (q_view, k_view)))


def _merged_result(g: Graph, slot: int) -> tuple[list[int], int] | None:
    """(instruction indices, [B, H, L, D] slot) when ``slot`` is ``reshape(transpose{0,2,1,3}
    (x))`` to [B, L, H*D], each value read once: ``x`` in the order a concatenation of heads
    has it."""
    r = single_use(g, slot, "reshape")
    if r is None:
        return None
    t = single_use(g, r[1].inputs[0], "transpose")
    if t is None or tuple(t[1].attrs["perm"]) != (0, 2, 1, 3):
        return None
    b, heads, length, dim = g.aval(t[1].inputs[0]).shape
    if g.aval(slot).shape != (b, length, heads * dim):
        return None
    return [r[0], t[0]], t[1].inputs[0]


def fold_attention_grad(g: Graph) -> None:
    """An ``attention_grad`` (a composite prim op: dQ, dK, dV) whose three results, merged
    into [B, L, H*D] order, are concatenated as the fused QKV projection's gradient writes
    them into that concatenation's columns (``grad_cols``): the transposes and the concat
    go."""
    for k, ins in g.each("concat"):
        if len(ins.inputs) != 3:
            continue
        out = g.aval(ins.outputs[0])
        if len(out.shape) != 3 or ins.attrs["axis"] % 3 != 2 or out.dtype not in FLOAT_DTYPES:
            continue
        pieces = [_merged_result(g, s) for s in ins.inputs]
        if any(p is None for p in pieces):
            continue
        grads = [p[1] for p in pieces]
        found = g.made_by(grads[0], "attention_grad")
        if found is None or sorted(found[1].outputs) != sorted(grads):
            continue
        j, grad = found
        if any(not g.used_only_by(s, 1) for s in grad.outputs):
            continue
        cols = list(np.cumsum([0] + [g.aval(s).shape[2] for s in ins.inputs])[:3])
        attrs = dict(grad.attrs)
        attrs["grad_cols"] = [int(cols[grads.index(s)]) for s in grad.outputs]
        attrs["grad_width"] = [out.shape[2]]
        for i in [j, *(i for p in pieces for i in p[0])]:
            g.set(i, None)
        g.set(k, Instr("attention_grad", grad.inputs, ins.outputs, attrs))
