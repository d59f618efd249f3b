"""fuse-kernels: fold small passes over memory into the CPU runtime's larger kernels.

Runs on a native :class:`Program` before ``fuse-elementwise``. Each rewrite replaces a few prim
instructions by one CPU-only instruction that computes the same values in fewer passes:

- ``add(matmul(a, b), bias)`` with ``bias`` of shape ``[N]`` becomes ``gemm(a, b, bias)``: the
  runtime writes the bias rows into the output and lets BLAS accumulate onto them (``beta = 1``),
  which costs what BLAS's own zeroing of the output did, so the separate bias pass is gone (a
  transformer's QKV projection, whose bias add fuses with nothing);
- ``add(gemm(...), r)`` with ``r`` of the output's shape (a residual) becomes ``gemm(..., r)``:
  ``r`` (plus the bias) is written into the output before BLAS accumulates, one pass fewer;
- ``mul(matmul(a, b), c)`` with ``c`` a 0-d constant becomes ``gemm{alpha = c}(a, b)``: the
  attention's ``1/sqrt(d)`` scale and its gradient's, applied by BLAS's ``alpha``;
- ``normalize(x, mean(x), mean((x - mean(x))^2), gamma, beta)`` over the last axis (layer norm
  as lowered) becomes ``layer_norm(x, gamma, beta)``: one kernel per row, which stays in cache,
  instead of four instructions and five passes over the tensor;
- attention's per-head operands ``transpose{0,2,1,3}(reshape(slice(qkv)))`` become head views
  of the projection (``a_view``/``b_view`` = [H, D, col0]: BLAS reads each head's [L, D] block
  in place, rows W apart), and a per-head product transposed back and reshaped to [B, L, H*D]
  is written in that order (``c_view``): the slices and transposes, a copy of the activation
  each, are gone;
- a sum of zero pads that tile one axis (plus zero constants) becomes a ``concat`` of the
  padded values (the gradient of a fused QKV projection);
- ``gemm(softmax(gemm{alpha}(q, k, transpose_b)), v)`` over [B, H, L, D] operands (head views
  or dense) becomes ``attention(q, k, v)``: per (batch, head) and block of query rows the scores
  stay in cache between the two products and the softmax; weights P read after the product (by
  the gradient) are its second output;
- attention's gradient as lowered (dP = dO Vᵀ, dS = P (dP - rowsum(dP P)), dQ = alpha dS K,
  dK = alpha dSᵀ Q, dV = Pᵀ dO, concatenated into the fused QKV projection's gradient) becomes
  ``attention_grad(qkv, dO, P)`` (P: the forward's weights, kept), which writes dQ, dK and dV
  into that gradient's columns;
- ``relu`` or ``gelu`` of a gemm's (or float matmul's) product that nothing else reads becomes
  that gemm with ``activation``: Lucid's sgemm applies it to each output tile in registers after
  the bias and addend (OpenBLAS products get it as a pass after the call);
- GELU (erf form) and its gradient become ``gelu(x)`` and ``gelu_grad(dy, x)`` (with the
  column sums of the gradient, the bias gradient of the layer before, as a second output), and
  layer norm's backward (statistics recomputed, as autodiff writes it) becomes
  ``layer_norm_grad(dy, x, gamma)`` with gamma's, beta's and the previous bias's gradients as
  further outputs: one pass per row instead of about fourteen instructions.

A rewrite applies only when the values it removes are used nowhere else (not read by another
instruction, not a program result), so the program computes the same values (up to float
rounding: the layer norm multiplies by one reciprocal square root per row).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from math import prod

import numpy as np

from lucid.backends.cpu import conv_fusion
from lucid.backends.cpu.program import Instr, Program
from lucid.ir import visits
from lucid.ir.prim import Aval

FLOAT_DTYPES = ("f32", "f64")
STAGE = "fuse-kernels"  # the visit counters' name for this step


def fuse_kernels(program: Program) -> Program:
    """A new program with GEMM epilogues and layer norms folded; the input is left unchanged."""
    out = Program()
    out.slots = list(program.slots)
    out.feeds = list(program.feeds)
    out.results = list(program.results)
    out.inplace = dict(program.inplace)
    instrs: list[Instr | None] = list(program.instrs)
    graph = _Graph(out, instrs)
    rewrites = (
        _fold_gemm_scale,  # first: a scaled product is then one gemm for the head views
        _fold_head_views,
        _fold_layer_norm,
        _fold_layer_norm_grad,
        _fold_gelu_grad,
        _fold_gelu,  # after _fold_gelu_grad, which frees the cdf the backward shares
        _fold_gemm_bias,
        _fold_gemm_addend,
        _fold_padded_sums,
        _fold_attention_grad,  # after _fold_padded_sums, whose concat it absorbs
        _fold_attention,
        _fold_gemm_activation,  # last of the gemm folds: the attention folds match plain gemms
        _fold_conv_epilogues,
    )
    for rewrite in rewrites:
        rewrite(graph)
    # Constants the rewrites stopped reading (a folded scale, a zero addend) go.
    for k, ins in enumerate(instrs):
        if ins is not None and ins.op == "constant" and not graph.uses[ins.outputs[0]]:
            graph.set(k, None)
    out.instrs = [ins for ins in instrs if ins is not None]
    return out


class _Graph:
    """Producers, use counts and readers of the instruction list, built once and kept current
    by ``set``, through which every rewrite edits the list: a fold costs the instructions it
    looks at, not a rebuild of the whole program per rewrite (which made fusion quadratic)."""

    def __init__(self, program: Program, instrs: list[Instr | None]) -> None:
        self.program = program
        self.instrs = instrs
        self.producer: dict[int, int] = {}
        self.uses: Counter[int] = Counter(program.results)
        self._readers: dict[int, dict[int, None]] = {}
        # Slots whose last reader went away since the last ``erase_unread``.
        self.unread: set[int] = set()
        for k, ins in enumerate(instrs):
            if ins is not None:
                self._link(k, ins)
        visits.count(STAGE, len(instrs))

    def _link(self, k: int, ins: Instr) -> None:
        for s in ins.outputs:
            self.producer[s] = k
        for s in ins.inputs:
            self.uses[s] += 1
            self._readers.setdefault(s, {})[k] = None

    def _unlink(self, k: int, ins: Instr) -> None:
        for s in ins.outputs:
            if self.producer.get(s) == k:
                del self.producer[s]
        for s in ins.inputs:
            self.uses[s] -= 1
            self._readers[s].pop(k, None)
            if not self.uses[s]:
                self.unread.add(s)

    def set(self, k: int, ins: Instr | None) -> None:
        """Put ``ins`` (None: nothing) at position ``k``, updating producers, uses, readers."""
        visits.count(STAGE)
        old = self.instrs[k]
        if old is not None:
            self._unlink(k, old)
        self.instrs[k] = ins
        if ins is not None:
            self._link(k, ins)

    def readers(self, slot: int) -> list[int]:
        """Positions of the instructions reading ``slot``, in program order."""
        return sorted(self._readers.get(slot, ()))

    def erase_unread(self, erasable: Callable[[int, Instr], bool]) -> None:
        """Drop the instructions ``erasable`` accepts whose values nothing reads any more, among
        the producers of values left unread by the edits so far, and so on up their operands."""
        pending: list[int] = []
        while True:
            pending.extend(self.producer[s] for s in self.unread if s in self.producer)
            self.unread.clear()
            if not pending:
                return
            k = pending.pop()
            ins = self.instrs[k]
            if ins is None or not erasable(k, ins) or any(self.uses[s] for s in ins.outputs):
                continue
            self.set(k, None)

    def only_reader(self, slot: int, op: str) -> tuple[int, Instr] | None:
        """(index, instruction) of the one ``op`` instruction reading ``slot``, when nothing else
        reads it (and it is not a result)."""
        readers = self.readers(slot)
        if len(readers) != 1 or not self.used_only_by(slot, 1):
            return None
        ins = self.instrs[readers[0]]
        return (readers[0], ins) if ins is not None and ins.op == op else None

    def made_by(self, slot: int, op: str) -> tuple[int, Instr] | None:
        """(index, instruction) when ``slot`` is the output of an ``op`` instruction."""
        k = self.producer.get(slot)
        ins = self.instrs[k] if k is not None else None
        return (k, ins) if ins is not None and ins.op == op else None

    def used_only_by(self, slot: int, count: int) -> bool:
        return self.uses[slot] == count and slot not in self.program.results

    def aval(self, slot: int):
        return self.program.slots[slot]


def _float_matmul(g: _Graph, slot: int) -> tuple[int, Instr] | None:
    found = g.made_by(slot, "matmul")
    if found is None or g.aval(slot).dtype not in FLOAT_DTYPES or not g.used_only_by(slot, 1):
        return None
    return found


def _gemm_of(ins: Instr) -> Instr:
    """``ins`` (a matmul or gemm) as a gemm."""
    if ins.op == "gemm":
        return ins
    attrs = {"transpose_a": ins.attrs["transpose_a"], "transpose_b": ins.attrs["transpose_b"]}
    return Instr("gemm", ins.inputs, ins.outputs, {**attrs, "alpha": 1.0})


def _constant_scalar(g: _Graph, slot: int) -> float | None:
    found = g.made_by(slot, "constant")
    if found is None or g.aval(slot).shape != () or g.aval(slot).dtype not in FLOAT_DTYPES:
        return None
    value = np.asarray(found[1].attrs["value"], dtype=np.float64).reshape(-1)
    return float(value[0]) if value.size == 1 else None


def _fold_gemm_scale(g: _Graph) -> None:
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op != "mul":
            continue
        for i in (0, 1):
            product, scale = ins.inputs[i], ins.inputs[1 - i]
            mm = _float_matmul(g, product)
            alpha = _constant_scalar(g, scale)
            if mm is None or alpha is None or g.aval(product) != g.aval(ins.outputs[0]):
                continue
            j, matmul = mm
            gemm = _gemm_of(matmul)
            # Where the mul was: the constant may be defined after the matmul.
            g.set(j, None)
            g.set(
                k,
                Instr(
                    "gemm",
                    gemm.inputs,
                    ins.outputs,
                    {**gemm.attrs, "alpha": gemm.attrs["alpha"] * alpha},
                ),
            )
            break


def _fold_add_into_gemm(
    g: _Graph,
    takes: Callable[[_Graph, Instr, int, Aval], bool],
) -> None:
    """Each ``add`` of a float matmul's (or single-use gemm's) product and an operand that
    ``takes(g, gemm, operand, out_aval)`` accepts becomes that gemm with the operand as its
    accumulator, at the add's position (every operand is defined by then)."""
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op != "add":
            continue
        out = g.aval(ins.outputs[0])
        for i in (0, 1):
            product, operand = ins.inputs[i], ins.inputs[1 - i]
            found = _float_matmul(g, product) or _single_use(g, product, "gemm")
            if found is None or g.aval(product) != out:
                continue
            j, matmul = found
            gemm = _gemm_of(matmul)
            if not takes(g, gemm, operand, out):
                continue
            g.set(j, None)
            g.set(k, Instr("gemm", (*gemm.inputs, operand), ins.outputs, dict(gemm.attrs)))
            break


def _takes_bias(g: _Graph, gemm: Instr, bias: int, out: Aval) -> bool:
    b = g.aval(bias)
    return len(gemm.inputs) == 2 and b.shape == out.shape[-1:] and b.dtype == out.dtype


def _takes_addend(g: _Graph, gemm: Instr, addend: int, out: Aval) -> bool:
    # A gemm with a full-shape addend already has its accumulator.
    return g.aval(addend) == out and not any(len(g.aval(s).shape) > 1 for s in gemm.inputs[2:])


def _fold_gemm_bias(g: _Graph) -> None:
    _fold_add_into_gemm(g, _takes_bias)


def _fold_gemm_addend(g: _Graph) -> None:
    _fold_add_into_gemm(g, _takes_addend)


GEMM_ACTIVATIONS = ("relu", "gelu")


def _fold_gemm_activation(g: _Graph) -> None:
    """``relu`` or ``gelu`` (the row kernel ``_fold_gelu`` made) of a float matmul's or gemm's
    product that nothing else reads becomes that gemm with ``activation``: the kernel applies
    it to each output tile while the tile is in registers, after bias and addend, instead of a
    pass of its own over the output. At the activation's position, as the other gemm folds."""
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op not in GEMM_ACTIVATIONS or len(ins.inputs) != 1:
            continue
        product = ins.inputs[0]
        found = _float_matmul(g, product) or _single_use(g, product, "gemm")
        if found is None or g.aval(product) != g.aval(ins.outputs[0]):
            continue
        j, matmul = found
        gemm = _gemm_of(matmul)
        if "activation" in gemm.attrs:
            continue
        g.set(j, None)
        g.set(k, Instr("gemm", gemm.inputs, ins.outputs, {**gemm.attrs, "activation": ins.op}))


def _head_source(g: _Graph, slot: int) -> tuple[int, list[int]] | None:
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


def _fold_head_views(g: _Graph) -> None:
    """Attention's per-head operands read straight from the projection, and its per-head result
    written straight in [B, L, H*D] order: the slices and transposes around it (copies of the
    whole activation each) are gone."""
    program, instrs = g.program, g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op not in ("matmul", "gemm") or len(ins.inputs) != 2:
            continue
        if g.aval(ins.outputs[0]).dtype not in FLOAT_DTYPES:
            continue
        gemm = _gemm_of(ins)
        inputs, attrs, outputs = list(gemm.inputs), dict(gemm.attrs), gemm.outputs
        for i, name in ((0, "a_view"), (1, "b_view")):
            if name in attrs or len(g.aval(inputs[i]).shape) != 4:
                continue
            found = _head_source(g, inputs[i])
            if found is not None:
                inputs[i], attrs[name] = found[0], found[1]
        out = outputs[0]
        t = g.only_reader(out, "transpose") if len(g.aval(out).shape) == 4 else None
        if t is not None and tuple(t[1].attrs["perm"]) == (0, 2, 1, 3) and "c_view" not in attrs:
            # The transposed value [B, L, H, D] is dense, so it is byte for byte the [B, L, H*D]
            # value the gemm writes through c_view; readers that reshape it read that instead.
            b, heads, length, dim = g.aval(out).shape
            merged = (b, length, heads * dim)
            readers = g.readers(t[1].outputs[0])
            if t[1].outputs[0] not in program.results and all(
                instrs[j].op == "reshape" for j in readers
            ):
                new = program.new_slot(merged, g.aval(out).dtype)
                for j in readers:
                    r = instrs[j]
                    g.set(j, Instr("reshape", (new,), r.outputs, dict(r.attrs)))
                outputs, attrs["c_view"] = (new,), [heads, dim]
                # Where the transpose was: every reader of its value comes after it.
                g.set(k, None)
                k = t[0]
        if attrs == gemm.attrs and outputs == gemm.outputs:
            continue
        g.set(k, Instr("gemm", tuple(inputs), outputs, attrs))
        # The slices, reshapes and transposes whose values nothing reads any more go.
        g.erase_unread(lambda _, ins: ins.op in ("slice", "reshape", "transpose"))


def _single_use(g: _Graph, slot: int, op: str) -> tuple[int, Instr] | None:
    found = g.made_by(slot, op)
    return found if found is not None and g.used_only_by(slot, 1) else None


def _last_axis_mean(g: _Graph, slot: int, of: int) -> int | None:
    """The index of ``slot``'s producer when it is ``reduce_mean(of)`` over the last axis with
    kept dims."""
    found = g.made_by(slot, "reduce_mean")
    if found is None:
        return None
    k, ins = found
    rank = len(g.aval(of).shape)
    axes = [a % rank for a in ins.attrs["axes"]] if rank else []
    if ins.inputs != (of,) or axes != [rank - 1] or not ins.attrs["keepdims"]:
        return None
    return k


def _fold_layer_norm(g: _Graph) -> None:
    program, instrs = g.program, g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op != "normalize":
            continue
        x, mean, var, gamma, beta = ins.inputs
        xa = g.aval(x)
        if xa.dtype not in FLOAT_DTYPES or not xa.shape or xa.shape != g.aval(ins.outputs[0]).shape:
            continue
        if any(g.aval(p) != Aval(xa.shape[-1:], xa.dtype) for p in (gamma, beta)):
            continue
        k_mean = _last_axis_mean(g, mean, x)
        sq = instrs[g.producer[var]].inputs[0] if g.made_by(var, "reduce_mean") else None
        k_var = _last_axis_mean(g, var, sq) if sq is not None else None
        square = _single_use(g, sq, "mul") if sq is not None else None
        if k_mean is None or k_var is None or square is None:
            continue
        centered = square[1].inputs[0]
        sub = g.made_by(centered, "sub")
        if square[1].inputs != (centered, centered) or sub is None:
            continue
        if sub[1].inputs != (x, mean) or g.aval(centered) != xa:
            continue
        # mean: read by the sub and the normalize; the variance only by the normalize.
        if not (g.used_only_by(mean, 2) and g.used_only_by(var, 1) and g.uses[centered] == 2):
            continue
        if centered in program.results:
            continue
        eps = ins.attrs["epsilon"]
        for j in (k_mean, k_var, square[0], sub[0]):
            g.set(j, None)
        g.set(k, Instr("layer_norm", (x, gamma, beta), ins.outputs, {"epsilon": eps}))


def _zero_constant(g: _Graph, slot: int) -> bool:
    found = g.made_by(slot, "constant")
    return found is not None and not any(found[1].attrs["value"])


def _padded_sum(g: _Graph, k: int, shape: tuple):
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
        pad = _single_use(g, s, "pad")
        if pad is not None and pad[1].attrs["value"] == 0:
            pieces.append(pad)
        elif _zero_constant(g, s):
            zeros.append(s)
        else:
            return None
    return pieces, zeros, tree


def _fold_padded_sums(g: _Graph) -> None:
    """A sum of zero-padded pieces that tile one axis, plus zeros, becomes their concatenation:
    the gradient of a fused QKV projection was three pads of [.., 3E] and an add of four arrays
    (one of them a zero constant), where one concat reads each piece once."""
    program, instrs = g.program, g.instrs
    for k in reversed(range(len(instrs))):
        ins = instrs[k]
        if ins is None or ins.op != "add":
            continue
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
            if g.uses[s] == 0 and s not in program.results and s in g.producer:
                g.set(g.producer[s], None)


def _fold_conv_epilogues(g: _Graph) -> None:
    conv_fusion.fold_conv_bias_relu(g)
    conv_fusion.fold_max_pool_relu_grad(g)


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


def _attention_operand(g: _Graph, gemm: Instr, i: int) -> tuple[int, list[int] | None, tuple]:
    """(slot, view or None, logical [B, H, L, D] shape) of a gemm's operand ``i``."""
    slot = gemm.inputs[i]
    view = gemm.attrs.get(("a_view", "b_view")[i])
    shape = g.aval(slot).shape
    if view is None:
        return slot, None, shape
    heads, dim, _ = view
    return slot, list(view), (shape[0], heads, shape[1], dim)


def _plain_gemm(g: _Graph, slot: int, *, ta: bool, tb: bool) -> tuple[int, Instr] | None:
    """A single-use 2-operand float matmul/gemm producing ``slot`` with these transposes."""
    found = _single_use(g, slot, "gemm") or _single_use(g, slot, "matmul")
    if found is None or len(found[1].inputs) != 2 or g.aval(slot).dtype not in FLOAT_DTYPES:
        return None
    gemm = _gemm_of(found[1])
    if (gemm.attrs["transpose_a"], gemm.attrs["transpose_b"]) != (ta, tb):
        return None
    return found[0], gemm


def _last_axis_softmax(g: _Graph, slot: int) -> tuple[int, Instr] | None:
    found = g.made_by(slot, "softmax")
    if found is None or len(g.aval(slot).shape) != 4 or found[1].attrs["axis"] % 4 != 3:
        return None
    return found


def _scores(g: _Graph, probs: int) -> tuple[int, int, Instr] | None:
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


def _fold_attention(g: _Graph) -> None:
    """``gemm(softmax(gemm{alpha}(q, k, transpose_b)), v)``, with the scores read nowhere else,
    becomes one ``attention(q, k, v)`` (masked scores stay unfused). Weights read elsewhere too
    (the training forward's, which the gradient reads; ``need_weights``) become its second
    output, when nothing reads them before the product."""
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op not in ("matmul", "gemm") or len(ins.inputs) != 2:
            continue
        pv = _gemm_of(ins)
        if pv.attrs["transpose_a"] or pv.attrs["transpose_b"] or pv.attrs["alpha"] != 1.0:
            continue
        if "a_view" in pv.attrs or g.aval(ins.outputs[0]).dtype not in FLOAT_DTYPES:
            continue
        probs = pv.inputs[0]
        keep_probs = not g.used_only_by(probs, 1)
        if keep_probs and min(g.readers(probs), default=k) < k:
            continue
        found = _scores(g, probs)
        if found is None:
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


def _concat_piece(g: _Graph, slot: int) -> tuple[list[int], Instr] | None:
    """(instruction indices, gemm) when ``slot`` is a single-use gemm written through a
    ``c_view``, possibly behind a same-shape reshape."""
    chain = []
    r = _single_use(g, slot, "reshape")
    if r is not None and g.aval(r[1].inputs[0]) == g.aval(slot):
        chain.append(r[0])
        slot = r[1].inputs[0]
    found = _single_use(g, slot, "gemm")
    if found is None or "c_view" not in found[1].attrs or len(found[1].inputs) != 2:
        return None
    return [*chain, found[0]], found[1]


def _mul_of(g: _Graph, slot: int, factor: int) -> tuple[int, int] | None:
    """(index, other factor) when ``slot`` is ``mul(factor, other)`` (either order)."""
    found = g.made_by(slot, "mul")
    if found is None or factor not in found[1].inputs:
        return None
    a, b = found[1].inputs
    return found[0], (b if a == factor else a)


def _fold_attention_grad(g: _Graph) -> None:
    """Attention's gradient, concatenated as the fused QKV projection's gradient, becomes one
    ``attention_grad(qkv, dO, P)`` writing dQ, dK and dV into that concatenation's columns."""
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op != "concat" or len(ins.inputs) != 3:
            continue
        out = g.aval(ins.outputs[0])
        if len(out.shape) != 3 or ins.attrs["axis"] % 3 != 2 or out.dtype not in FLOAT_DTYPES:
            continue
        pieces = [_concat_piece(g, s) for s in ins.inputs]
        if any(p is None for p in pieces):
            continue
        found = _attention_grad_parts(g, [p[1] for p in pieces])
        if found is None:
            continue
        roles, removed, qkv, d_out, probs, attrs = found
        cols = list(np.cumsum([0] + [g.aval(s).shape[2] for s in ins.inputs])[:3])
        attrs["grad_cols"] = [int(cols[roles.index(r)]) for r in ("dq", "dk", "dv")]
        attrs["grad_width"] = [out.shape[2]]
        for j in removed + [j for p in pieces for j in p[0]]:
            g.set(j, None)
        g.set(k, Instr("attention_grad", (qkv, d_out, probs), ins.outputs, attrs))


def _attention_grad_parts(g: _Graph, gemms: list[Instr]):
    """Matches the three gemms of a concatenation against attention's gradient: (roles in
    concat order, indices of the other removed instructions, qkv slot, dO slot, weights slot,
    attrs)."""
    roles: list[str] = []
    probs = None
    by_role: dict[str, Instr] = {}
    for gemm in gemms:
        if gemm.attrs["transpose_b"] or "a_view" in gemm.attrs or "b_view" not in gemm.attrs:
            return None
        if gemm.attrs["transpose_a"] and g.made_by(gemm.inputs[0], "softmax"):
            role = "dv"
            probs = gemm.inputs[0]
        elif gemm.attrs["transpose_a"]:
            role = "dk"
        else:
            role = "dq"
        if role in by_role:
            return None
        by_role[role] = gemm
        roles.append(role)
    dq, dk, dv = by_role["dq"], by_role["dk"], by_role["dv"]
    ds = dq.inputs[0]
    if dk.inputs[0] != ds or dq.inputs[1] != dk.inputs[1] or dv.attrs["alpha"] != 1.0:
        return None
    if dq.attrs["alpha"] != dk.attrs["alpha"] or not g.used_only_by(ds, 2):
        return None
    qkv, d_out = dq.inputs[1], dv.inputs[1]
    # dS = mul(P, sub(dP, reduce_sum(mul(dP, P), last axis)))
    m = _mul_of(g, ds, probs)
    sub = _single_use(g, m[1], "sub") if m is not None else None
    if sub is None:
        return None
    dp, row = sub[1].inputs
    red = _single_use(g, row, "reduce_sum")
    if red is None or not red[1].attrs["keepdims"] or [a % 4 for a in red[1].attrs["axes"]] != [3]:
        return None
    m2 = _mul_of(g, red[1].inputs[0], probs)
    if m2 is None or m2[1] != dp or not g.used_only_by(red[1].inputs[0], 1):
        return None
    dp_found = g.made_by(dp, "gemm")
    if dp_found is None or not g.used_only_by(dp, 2):
        return None
    dpg = dp_found[1]
    if dpg.attrs["transpose_a"] or not dpg.attrs["transpose_b"] or len(dpg.inputs) != 2:
        return None
    if dpg.inputs != (d_out, qkv) or dpg.attrs["alpha"] != 1.0:
        return None
    if dpg.attrs.get("a_view") != dv.attrs["b_view"] or "a_view" not in dpg.attrs:
        return None
    # P: any last-axis softmax (masked scores too: the gradient's formula does not read them);
    # Q, K and V: heads of qkv as the dK, dQ and dP products read them.
    if _last_axis_softmax(g, probs) is None:
        return None
    q_view, k_view, v_view = dk.attrs["b_view"], dq.attrs["b_view"], dpg.attrs.get("b_view")
    if v_view is None:
        return None
    removed = [dp_found[0], m2[0], red[0], sub[0], m[0]]
    attrs = {
        "alpha": float(dq.attrs["alpha"]),
        "q_view": list(q_view),
        "k_view": list(k_view),
        "v_view": list(v_view),
        "d_out_view": list(dv.attrs["b_view"]),
    }
    return roles, removed, qkv, d_out, probs, attrs


# -- GELU and layer norm's backward as row kernels --------------------------------------------
#
# The autodiff graph of a layer norm and of an erf GELU is matched as expression trees over the
# unfused prim instructions (``_match``), so operand order of adds and multiplies, and a mean
# written as ``reduce_mean`` or as ``reduce_sum * (1/n)``, do not matter. The matched instructions
# whose values nothing else reads are removed; the rest (the forward's GELU cdf, read by the
# backward and by the activation) stay.

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _is_close(value: float, want: float) -> bool:
    return abs(value - want) <= 1e-6 * max(1.0, abs(want))


class _Match:
    """Matches an expression pattern against the instruction tree producing a slot.

    A pattern is a variable name (binds a slot; a bound name must see the same slot again), a
    ``("const", value)``, a ``("bind_const", name)`` (binds a 0-d float constant's value), a
    ``("mean_last", p)`` (``reduce_mean`` over the last axis with kept dims, or that axis's
    ``reduce_sum`` times ``1/n``), or ``(op, *operand_patterns)``, trying both operand orders of
    ``add`` and ``mul``. ``instrs`` collects the matched instructions (constants excluded)."""

    def __init__(self, g: _Graph) -> None:
        self.g = g
        self.env: dict[str, int | float] = {}
        self.instrs: set[int] = set()

    def match(self, slot: int, pat) -> bool:
        saved = (dict(self.env), set(self.instrs))
        if self._match(slot, pat):
            return True
        self.env, self.instrs = saved
        return False

    def _match(self, slot: int, pat) -> bool:
        g = self.g
        visits.count(STAGE)
        if isinstance(pat, str):
            if pat in self.env:
                return self.env[pat] == slot
            self.env[pat] = slot
            return True
        kind = pat[0]
        if kind == "const":
            value = _constant_scalar(g, slot)
            return value is not None and _is_close(value, pat[1])
        if kind == "bind_const":
            value = _constant_scalar(g, slot)
            if value is None:
                return False
            self.env[pat[1]] = value
            return True
        if kind == "mean_last":
            return self._mean_last(slot, pat[1])
        found = g.made_by(slot, kind)
        if found is None or len(found[1].inputs) != len(pat) - 1:
            return False
        k, ins = found
        orders = [ins.inputs]
        if kind in ("add", "mul"):
            orders.append(ins.inputs[::-1])
        for operands in orders:
            saved = (dict(self.env), set(self.instrs))
            if all(self.match(s, p) for s, p in zip(operands, pat[1:], strict=True)):
                self.instrs.add(k)
                return True
            self.env, self.instrs = saved
        return False

    def _mean_last(self, slot: int, pat) -> bool:
        g = self.g
        found = g.made_by(slot, "reduce_mean")
        if found is not None and _last_axis_mean(g, slot, found[1].inputs[0]) is not None:
            if self.match(found[1].inputs[0], pat):
                self.instrs.add(found[0])
                return True
            return False
        mul = g.made_by(slot, "mul")
        if mul is None:
            return False
        for total, scale in (mul[1].inputs, mul[1].inputs[::-1]):
            summed = g.made_by(total, "reduce_sum")
            value = _constant_scalar(g, scale)
            if summed is None or value is None:
                continue
            (x,) = summed[1].inputs
            shape = g.aval(x).shape
            axes = [a % len(shape) for a in summed[1].attrs["axes"]] if shape else []
            if axes != [len(shape) - 1] or not summed[1].attrs["keepdims"]:
                continue
            if not _is_close(value, 1.0 / shape[-1]) or not self.match(x, pat):
                continue
            self.instrs.update((mul[0], summed[0]))
            return True
        return False


def _erase_dead(g: _Graph, candidates: set[int]) -> None:
    """Drop the ``candidates`` whose values nothing reads any more (after a rewrite stopped
    reading them), and constants left unread; values other instructions still read stay."""
    g.erase_unread(lambda k, ins: k in candidates or ins.op == "constant")


def _column_sum(g: _Graph, slot: int, after: int) -> tuple[int, Instr] | None:
    """A ``reduce_sum`` after instruction ``after`` of ``slot`` (or of its reshape to
    ``[rows, n]``) over every axis but the last: the gradient of a bias added to ``slot``'s
    rows."""
    shape = g.aval(slot).shape
    sources = [slot]
    for j in g.readers(slot):
        r = g.instrs[j]
        if r is not None and r.op == "reshape" and len(g.aval(r.outputs[0]).shape) == 2:
            if g.aval(r.outputs[0]).shape[-1] == shape[-1]:
                sources.append(r.outputs[0])
    for src in sources:
        rank = len(g.aval(src).shape)
        for j in g.readers(src):
            r = g.instrs[j]
            if j <= after or r is None or r.op != "reduce_sum":
                continue
            axes = sorted(a % rank for a in r.attrs["axes"])
            out = g.aval(r.outputs[0]).shape
            if axes == list(range(rank - 1)) and out[-1:] == shape[-1:] and prod(out) == shape[-1]:
                return j, r
    return None


def _take_column_sum(g: _Graph, slot: int, after: int) -> int:
    """A new ``[n]`` slot for the column sums of ``slot``: an existing column sum after
    ``after`` becomes a reshape (a view) of it; otherwise nothing reads the new slot."""
    aval = g.aval(slot)
    new = g.program.new_slot(aval.shape[-1:], aval.dtype)
    found = _column_sum(g, slot, after)
    if found is not None:
        j, r = found
        shape = g.aval(r.outputs[0]).shape
        g.set(j, Instr("reshape", (new,), r.outputs, {"shape": tuple(shape)}))
    return new


_GELU_CDF = (
    "mul",
    ("add", ("erf", ("mul", "x", ("const", _SQRT_HALF))), ("const", 1.0)),
    ("const", 0.5),
)
_GELU_PDF = (
    "mul",
    ("exp", ("mul", ("mul", "x", "x"), ("const", -0.5))),
    ("const", _INV_SQRT_2PI),
)
_GELU_GRAD = ("mul", "dy", ("add", _GELU_CDF, ("mul", "x", _GELU_PDF)))
_GELU = ("mul", "x", _GELU_CDF)

_LN_CENTERED = ("sub", "x", ("mean_last", "x"))
_LN_RSTD = (
    "pow",
    ("add", ("mean_last", ("mul", _LN_CENTERED, _LN_CENTERED)), ("bind_const", "eps")),
    ("const", -0.5),
)
_LN_XHAT = ("mul", _LN_CENTERED, "rstd")
_LN_G = ("mul", "dy", "gamma")
_LN_GRAD = (
    "mul",
    "rstd",
    (
        "sub",
        ("sub", _LN_G, ("mean_last", _LN_G)),
        ("mul", _LN_XHAT, ("mean_last", ("mul", _LN_G, _LN_XHAT))),
    ),
)


def _row_kernel_candidates(g: _Graph, pattern, op: str):
    """Yields (index, match) for each float ``op`` instruction whose value matches ``pattern``;
    the caller rewrites through ``g`` before the next candidate."""
    instrs = g.instrs
    for k in range(len(instrs)):
        ins = instrs[k]
        if ins is None or ins.op != op or len(ins.outputs) != 1:
            continue
        if g.aval(ins.outputs[0]).dtype not in FLOAT_DTYPES or not g.aval(ins.outputs[0]).shape:
            continue
        m = _Match(g)
        if m.match(ins.outputs[0], pattern):
            yield k, m


def _product_with_column_sum(g: _Graph, xhat: int | None, dy: int, after: int) -> int | None:
    """The slot of ``dy * xhat`` when a column sum after ``after`` reads it."""
    for j in g.readers(xhat) if xhat is not None else []:
        r = g.instrs[j]
        if r is None or r.op != "mul" or sorted(r.inputs) != sorted((dy, xhat)):
            continue
        if _column_sum(g, r.outputs[0], after) is not None:
            return r.outputs[0]
    return None


def _fold_layer_norm_grad(g: _Graph) -> None:
    """Layer norm's backward (statistics recomputed, ``_normalize_grad`` of lucid/ops/norm.py
    as lowered: five row reductions and eight elementwise passes, plus the column sums of
    gamma's and beta's gradients and the bias gradient of the layer before) becomes one
    ``layer_norm_grad(dy, x, gamma) -> (dx, dgamma, dbeta, dx column sums)``."""
    program, instrs = g.program, g.instrs
    for k, m in _row_kernel_candidates(g, _LN_GRAD, "mul"):
        x, dy, gamma, rstd = (m.env[n] for n in ("x", "dy", "gamma", "rstd"))
        xa = g.aval(x)
        if g.aval(dy) != xa:  # dy * gamma is matched up to the order of its factors
            dy, gamma = gamma, dy
        rstd_ok = m.match(rstd, _LN_RSTD)
        if not rstd_ok or g.aval(dy) != xa or g.aval(gamma) != Aval(xa.shape[-1:], xa.dtype):
            continue
        if g.aval(instrs[k].outputs[0]) != xa:
            continue
        dx = instrs[k].outputs[0]
        xhat = next(
            (s for j in sorted(m.instrs) for s in instrs[j].outputs if m.match(s, _LN_XHAT)),
            None,
        )
        outputs, dead = [dx], set(m.instrs) - {k}
        # gamma's gradient: the column sums of dy * xhat (that product then goes). With dy and
        # gamma of one shape (a single row) either factor of dy * gamma may be dy.
        product = None
        for dy_, gamma_ in ((dy, gamma), (gamma, dy))[: 2 if g.aval(gamma) == xa else 1]:
            product = _product_with_column_sum(g, xhat, dy_, k)
            if product is not None:
                dy, gamma = dy_, gamma_
                break
        if product is not None:
            dead |= {g.producer[product], *g.readers(product)}
            outputs.append(_take_column_sum(g, product, k))
        else:
            outputs.append(program.new_slot(xa.shape[-1:], xa.dtype))
        outputs.append(_take_column_sum(g, dy, k))
        if _column_sum(g, dx, k) is not None:
            outputs.append(_take_column_sum(g, dx, k))
        g.set(
            k,
            Instr(
                "layer_norm_grad", (dy, x, gamma), tuple(outputs), {"epsilon": float(m.env["eps"])}
            ),
        )
        _erase_dead(g, dead)


def _fold_gelu_grad(g: _Graph) -> None:
    """GELU's gradient (erf form) ``dy * (cdf(x) + x * pdf(x))`` becomes ``gelu_grad(dy, x)``,
    with the column sums of the result (the bias gradient of the layer that produced ``x``) as
    a second output when the program takes them."""
    instrs = g.instrs
    for k, m in _row_kernel_candidates(g, _GELU_GRAD, "mul"):
        dy, x = m.env["dy"], m.env["x"]
        dx = instrs[k].outputs[0]
        if g.aval(dy) != g.aval(x) or g.aval(dx) != g.aval(x):
            continue
        outputs = [dx]
        if _column_sum(g, dx, k) is not None:
            outputs.append(_take_column_sum(g, dx, k))
        g.set(k, Instr("gelu_grad", (dy, x), tuple(outputs), {}))
        _erase_dead(g, set(m.instrs) - {k})


def _fold_gelu(g: _Graph) -> None:
    """GELU (erf form) ``x * (erf(x / sqrt 2) + 1) / 2`` becomes ``gelu(x)``: one vectorized pass
    instead of the elementwise evaluator's five nodes (runs after ``_fold_gelu_grad``, which
    frees the cdf the backward shared)."""
    instrs = g.instrs
    for k, m in _row_kernel_candidates(g, _GELU, "mul"):
        x, y = m.env["x"], instrs[k].outputs[0]
        if g.aval(x) != g.aval(y):
            continue
        g.set(k, Instr("gelu", (x,), (y,), {}))
        _erase_dead(g, set(m.instrs) - {k})


# -- numpy references of the CPU-only instructions (Program.interpret) ------------------------


def _gemm_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    a, b = args[0], args[1]
    for i, name in ((0, "a_view"), (1, "b_view")):
        if name in attrs:  # [B, L, W] -> [B, H, L, D]
            heads, dim, col0 = attrs[name]
            x = args[i][..., col0 : col0 + heads * dim]
            x = x.reshape(*x.shape[:2], heads, dim).transpose(0, 2, 1, 3)
            a, b = (x, b) if i == 0 else (a, x)
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    out = np.matmul(a, b) * a.dtype.type(attrs["alpha"])
    for extra in args[2:]:  # a bias row, an addend of the output's shape
        out = out + extra
    if attrs.get("activation") == "relu":
        out = np.maximum(out, out.dtype.type(0))
    elif attrs.get("activation") == "gelu":
        out = _gelu_reference([out], {})
    if "c_view" in attrs:  # [B, H, L, D] -> [B, L, H*D]
        out = out.transpose(0, 2, 1, 3)
        out = out.reshape(*out.shape[:2], -1)
    return out


def _layer_norm_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    x, gamma, beta = args
    mean64 = x.mean(axis=-1, keepdims=True, dtype=np.float64)
    # Squares in float64, as the kernel: (3.6e19)^2 overflows float32.
    var = ((x - mean64) ** 2).mean(axis=-1, keepdims=True).astype(x.dtype)
    mean = mean64.astype(x.dtype)
    return (x - mean) / np.sqrt(var + x.dtype.type(attrs["epsilon"])) * gamma + beta


def _heads(x: np.ndarray, view) -> np.ndarray:
    """[B, L, W] read through view [H, D, col0] as [B, H, L, D]; a dense operand as it is."""
    if view is None:
        return x
    heads, dim, col0 = view
    x = x[..., col0 : col0 + heads * dim]
    return x.reshape(*x.shape[:2], heads, dim).transpose(0, 2, 1, 3)


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(output, weights): the weights are the optional second output."""
    q, k, v = (
        _heads(x, attrs.get(n)) for x, n in zip(args, ("q_view", "k_view", "v_view"), strict=True)
    )
    alpha = q.dtype.type(attrs["alpha"])
    probs = _softmax_rows(np.matmul(q, np.swapaxes(k, -1, -2)) * alpha)
    out = probs @ v
    if "out_view" in attrs:  # [B, H, L, Dv] -> [B, L, H*Dv]
        out = out.transpose(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
    return out, probs


def _attention_grad_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    qkv, d_out, p = args
    q, k, v = (_heads(qkv, attrs[n]) for n in ("q_view", "k_view", "v_view"))
    d_o = _heads(d_out, attrs.get("d_out_view"))
    alpha = q.dtype.type(attrs["alpha"])
    dp = d_o @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    grads = (ds @ k * alpha, np.swapaxes(ds, -1, -2) @ q * alpha, np.swapaxes(p, -1, -2) @ d_o)
    out = np.empty((*qkv.shape[:2], attrs["grad_width"][0]), dtype=qkv.dtype)
    for col0, grad in zip(attrs["grad_cols"], grads, strict=True):
        merged = grad.transpose(0, 2, 1, 3).reshape(*out.shape[:2], -1)
        out[..., col0 : col0 + merged.shape[2]] = merged
    return out


def _gelu_reference(args: list[np.ndarray], attrs: dict) -> np.ndarray:
    (x,) = args
    return x * _gelu_cdf(x)


def _gelu_cdf(x: np.ndarray) -> np.ndarray:
    from lucid.ir import prim as prim_ops

    t = x.dtype.type
    (erf,) = prim_ops.evaluate("erf", [x * t(_SQRT_HALF)], {})
    return ((erf + t(1)) * t(0.5)).astype(x.dtype)


def _gelu_grad_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, ...]:
    dy, x = args
    t = x.dtype.type
    pdf = np.exp(x * x * t(-0.5)) * t(_INV_SQRT_2PI)
    dx = dy * (_gelu_cdf(x) + x * pdf)
    return dx, _sum_rows(dx)


def _sum_rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]).sum(axis=0, dtype=np.float64).astype(a.dtype)


def _layer_norm_grad_reference(args: list[np.ndarray], attrs: dict) -> tuple[np.ndarray, ...]:
    dy, x, gamma = (a.astype(np.float64) for a in args)
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + attrs["epsilon"])
    xhat = (x - mean) * rstd
    g = dy * gamma
    dx = rstd * (
        g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)
    )
    dt = args[1].dtype
    return tuple(v.astype(dt) for v in (dx, _sum_rows(dy * xhat), _sum_rows(dy), _sum_rows(dx)))


# A reference of a multi-output kernel returns a tuple: its first len(outputs) entries are used.
CPU_ONLY_REFERENCES: dict[str, Callable[[list[np.ndarray], dict], np.ndarray | tuple]] = {
    "gemm": _gemm_reference,
    "layer_norm": _layer_norm_reference,
    "attention": _attention_reference,
    "attention_grad": _attention_grad_reference,
    "gelu": _gelu_reference,
    "gelu_grad": _gelu_grad_reference,
    "layer_norm_grad": _layer_norm_grad_reference,
    **conv_fusion.CONV_REFERENCES,
}

__all__ = ["CPU_ONLY_REFERENCES", "fuse_kernels"]
