"""fuse-kernels' convolution rewrites.

- ``add(conv2d(x, w), b)`` with ``b`` a per-channel bias (shape ``[O, 1, 1]`` or
  ``[1, O, 1, 1]``; one of shape ``[O]`` would broadcast along the width), optionally followed
  by ``relu``, becomes ``conv2d_bias(x, w, b){relu}``: the kernel adds the bias and clamps while
  each image's output is still in cache, instead of a separate pass over the whole activation
  (3.2 MB for workload C's first layer);
- ``select(gt(x, 0), max_pool2d_grad(dy, x), 0)`` (ReLU's gradient applied to the gradient of a
  max pool over the ReLU's output) becomes ``max_pool2d_relu_grad(dy, x)``: the mask is applied
  where the pool gradient is written, one pass over the input-sized gradient instead of two.

Each applies only when the values it removes are read by nothing else (not a result either).
"""

from __future__ import annotations

from lucid.backends.cpu.program import Instr, Program
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
