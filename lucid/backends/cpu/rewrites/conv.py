"""fuse-kernels' convolution rewrites.

- ``add(conv2d(x, w), b)`` with ``b`` a per-channel bias (shape ``[O, 1, 1]`` or
  ``[1, O, 1, 1]``; one of shape ``[O]`` would broadcast along the width), optionally followed
  by ``relu``, becomes ``conv2d_bias(x, w, b){relu}``: the kernel adds the bias and clamps while
  each image's output is still in cache, instead of a separate pass over the whole activation
  (3.2 MB for workload C's first layer);
- a ``conv2d`` (or a ``conv2d_bias`` without relu) read only by a per-channel affine chain (an
  inference BatchNorm: ``(y - mean) * rstd * gamma + beta``), then optionally the add of a
  residual of the output's shape and a ``relu``, becomes ``conv2d_bias(x, w, bias, scale[,
  residual]){relu}`` (``fold_conv_affine``): one pass over the activation fewer per layer;
- ``select(gt(x, 0), max_pool2d_grad(dy, x), 0)`` (ReLU's gradient applied to the gradient of a
  max pool over the ReLU's output) becomes ``max_pool2d_relu_grad(dy, x)``: the mask is applied
  where the pool gradient is written, one pass over the input-sized gradient instead of two.

Each applies only when the values it removes are read by nothing else (not a result either).
"""

from __future__ import annotations

import numpy as np

from lucid.backends.cpu.program import FUSED, FusedNode, Instr, Program
from lucid.backends.cpu.rewrites.match import FLOAT_DTYPES, Graph


def _bias_of(program: Program, slot: int, out_shape: tuple) -> bool:
    """True when ``slot`` broadcasts one value per output channel (so its bytes are ``[O]``)."""
    channels = out_shape[1]
    return program.slots[slot].shape in ((channels, 1, 1), (1, channels, 1, 1))


def fold_conv_bias_relu(g: Graph) -> None:
    """``relu(add(conv2d(x, w), bias))`` (the relu optional) becomes one ``conv2d_bias``
    (edits go through ``g``)."""
    program = g.program
    for k, ins in g.each("conv2d"):
        (y,) = ins.outputs
        ya = g.aval(y)
        found = g.only_reader(y, "add")
        if ya.dtype not in FLOAT_DTYPES or found is None:
            continue
        k_add, add = found
        if add.inputs[0] == add.inputs[1] or g.aval(add.outputs[0]) != ya:
            continue
        bias = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        if g.aval(bias).dtype != ya.dtype or not _bias_of(program, bias, ya.shape):
            continue
        out, last, relu = add.outputs[0], k_add, False
        found = g.only_reader(out, "relu")
        if found is not None:
            last, out, relu = found[0], found[1].outputs[0], True
            g.set(k_add, None)
        # At the last removed instruction's place: the bias may be made after the conv.
        g.set(k, None)
        g.set(last, Instr("conv2d_bias", (*ins.inputs, bias), (out,), {**ins.attrs, "relu": relu}))


def _zero_scalar(g: Graph, slot: int) -> bool:
    found = g.made_by(slot, "constant")
    return found is not None and g.aval(slot).shape == () and not any(found[1].attrs["value"])


def fold_max_pool_relu_grad(g: Graph) -> None:
    """``select(gt(x, 0), max_pool2d_grad(dy, x), 0)`` becomes ``max_pool2d_relu_grad(dy, x)``."""
    for k, ins in g.each("select"):
        mask, grad, zero = ins.inputs
        gt = g.made_by(mask, "gt")
        pool = g.made_by(grad, "max_pool2d_grad")
        if gt is None or pool is None or not _zero_scalar(g, zero):
            continue
        x = pool[1].inputs[1]
        if gt[1].inputs[0] != x or not _zero_scalar(g, gt[1].inputs[1]):
            continue
        if not (g.used_only_by(mask, 1) and g.used_only_by(grad, 1)):
            continue
        if g.aval(ins.outputs[0]) != g.aval(grad):
            continue
        g.set(gt[0], None)
        g.set(pool[0], None)
        g.set(k, Instr("max_pool2d_relu_grad", pool[1].inputs, ins.outputs, dict(pool[1].attrs)))


# The elementwise ops a per-channel affine chain after a convolution may take, besides the
# residual add and the final relu.
_AFFINE_STEPS = frozenset({"add", "sub", "mul", "div", "neg"})


class _ChannelValues:
    """The nodes of one ``fused`` instruction over ``[C]`` vectors (the chain's per-channel
    operands and scalars): a value is an input slot (``("in", slot)``) or a node's
    (``("node", index)``), and None stands for the identity (a scale of 1, a bias of 0)."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.nodes: list[tuple[str, tuple[tuple[str, int], ...]]] = []

    def node(self, op: str, *args: tuple[str, int]) -> tuple[str, int]:
        self.nodes.append((op, args))
        return ("node", len(self.nodes) - 1)

    def instruction(self, outputs: list[tuple[str, int]], slots: tuple[int, ...]) -> Instr:
        inputs: dict[int, int] = {}
        for _, args in self.nodes:
            for kind, s in args:
                if kind == "in":
                    inputs.setdefault(s, len(inputs))
        n_in = len(inputs)

        def arg(ref: tuple[str, int]) -> int:
            return inputs[ref[1]] if ref[0] == "in" else n_in + ref[1]

        nodes = tuple(
            FusedNode(op, tuple(arg(a) for a in args), self.dtype) for op, args in self.nodes
        )
        out_nodes = tuple(ref[1] for ref in outputs)
        default = out_nodes == (len(nodes) - 1,)
        return Instr(FUSED, tuple(inputs), slots, {}, nodes, None if default else out_nodes)


def _channel_vector(g: Graph, slot: int, ya) -> int | None:
    """``slot`` (a chain operand broadcasting one value per output channel, or one value) as a
    ``[C]`` vector or a 0-d value: the source of its reshape to ``[1, C, 1, 1]``/``[C, 1, 1]``,
    or itself when 0-d. None when it is neither (it then stays with its elementwise pass)."""
    aval = g.aval(slot)
    if aval.dtype != ya.dtype:
        return None
    if aval.shape == ():
        return slot
    channels = ya.shape[1]
    padded = (1,) * (4 - len(aval.shape)) + tuple(aval.shape)
    if len(aval.shape) > 4 or padded[0] != 1 or padded[2:] != (1, 1):
        return None
    found = g.made_by(slot, "reshape")
    if found is None:
        return None
    source = found[1].inputs[0]
    want = ((channels,),) if padded[1] == channels else ((), (1,))
    return source if g.aval(source).shape in want else None


def _affine_chain(g: Graph, start: int, ya, values: _ChannelValues, bias):
    """The elementwise chain reading ``start + bias`` (``start`` a convolution's output, each
    value read only by the next) as ``relu?(start * scale + bias + residual?)`` with ``scale`` and
    ``bias`` per-channel values built in ``values``: (positions, scale, bias, residual, relu,
    output), or None when the chain's first instruction is not such a step."""
    positions: list[int] = []
    scale, residual, relu, cur = None, None, False, start
    while g.used_only_by(cur, 1):
        (k,) = g.readers(cur)
        ins = g.instrs[k]
        if ins is None or g.aval(ins.outputs[0]) != ya:
            break
        if ins.op == "relu":
            positions.append(k)
            relu, cur = True, ins.outputs[0]
            break
        if residual is not None or ins.op not in _AFFINE_STEPS:
            break
        others = [s for s in ins.inputs if s != cur]
        if len(others) + 1 != len(ins.inputs):
            break  # cur read twice (x * x)
        if ins.op == "neg":
            if scale is None:
                break
            scale = values.node("neg", scale)
            bias = None if bias is None else values.node("neg", bias)
        elif (p := _channel_vector(g, others[0], ya)) is None:
            if ins.op != "add" or g.aval(others[0]) != ya:
                break
            residual = others[0]  # read where the conv writes each value
        else:
            pv, first = ("in", p), ins.inputs[0] == cur
            if ins.op == "add":
                bias = pv if bias is None else values.node("add", bias, pv)
            elif ins.op == "sub" and first:  # v - p
                bias = values.node("neg", pv) if bias is None else values.node("sub", bias, pv)
            elif ins.op == "sub":  # p - v
                if scale is None:
                    break
                scale = values.node("neg", scale)
                bias = pv if bias is None else values.node("sub", pv, bias)
            elif ins.op == "mul":
                scale = pv if scale is None else values.node("mul", scale, pv)
                bias = None if bias is None else values.node("mul", bias, pv)
            elif first:  # v / p
                scale = (
                    values.node("reciprocal", pv)
                    if scale is None
                    else values.node("div", scale, pv)
                )
                bias = None if bias is None else values.node("div", bias, pv)
            else:
                break
        positions.append(k)
        cur = ins.outputs[0]
    if not positions:
        return None
    return positions, scale, bias, residual, relu, cur


def _value_shape(g: Graph, values: _ChannelValues, ref) -> tuple:
    if ref[0] == "in":
        return tuple(g.aval(ref[1]).shape)
    shapes = [_value_shape(g, values, a) for a in values.nodes[ref[1]][1]]
    return tuple(np.broadcast_shapes(*shapes))


def fold_conv_affine(g: Graph) -> None:
    """A convolution followed by a per-channel affine chain (an inference BatchNorm: ``(y -
    mean) * rstd * gamma + beta``), then optionally the add of a residual of the output's shape
    and a ReLU, becomes ``conv2d_bias(x, w, bias, scale[, residual]){relu}``, the ``[C]`` scale
    and bias computed before it by one small ``fused`` instruction (edits go through ``g``)."""
    for k, ins in g.each("conv2d", "conv2d_bias"):
        (y,) = ins.outputs
        ya = g.aval(y)
        if ya.dtype not in FLOAT_DTYPES or len(ya.shape) != 4:
            continue
        values = _ChannelValues(ya.dtype)
        bias = None
        if ins.op == "conv2d_bias":
            if len(ins.inputs) != 3 or ins.attrs["relu"]:
                continue
            source = _channel_vector(g, ins.inputs[2], ya)
            if source is None:
                continue
            bias = ("in", source)
        chain = _affine_chain(g, y, ya, values, bias)
        if chain is None:
            continue
        positions, scale, bias, residual, relu, out = chain
        if scale is None or bias is None:
            continue  # nothing to scale (a bias alone is fold_conv_bias_relu's) or to add
        shapes = {_value_shape(g, values, v) for v in (scale, bias)}
        if shapes != {(ya.shape[1],)}:
            continue  # the chain's per-channel operands were all scalars
        made = [v for v in (scale, bias) if v[0] == "node"]
        place = None
        if made:
            # The fused instruction goes at the first freed position after its operands.
            inputs = {s for _, args in values.nodes for kind, s in args if kind == "in"}
            ready = max((g.producer.get(s, -1) for s in inputs), default=-1)
            place = next((j for j in [k, *positions[:-1]] if j > ready), None)
            if place is None:
                continue
        conv_attrs = {a: v for a, v in ins.attrs.items() if a != "relu"}
        for j in [k, *positions]:
            g.set(j, None)
        slots = {v: v[1] for v in (scale, bias) if v[0] == "in"}
        if made:
            outs = tuple(g.program.new_slot((ya.shape[1],), ya.dtype) for _ in made)
            slots.update(zip(made, outs, strict=True))
            g.set(place, values.instruction(made, outs))
        operands = (*ins.inputs[:2], slots[bias], slots[scale])
        if residual is not None:
            operands += (residual,)
        g.set(
            positions[-1],
            Instr("conv2d_bias", operands, (out,), {**conv_attrs, "relu": relu}),
        )
    g.erase_unread(lambda _, ins: ins.op == "reshape")
