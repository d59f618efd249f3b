"""Row kernels: the column sums a ``gelu_grad`` or a ``layer_norm_grad`` can write on the way.
(GELU, layer norm and their gradients are composite prim ops: lowering emits them whole, and
the CPU backend runs their kernels directly.)"""

from __future__ import annotations

from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites.match import Graph, column_sum, take_column_sum


def layer_norm_grad_column_sums(g: Graph) -> None:
    """A ``layer_norm_grad(dy, x, gamma) -> (dx, dgamma, dbeta)`` whose ``dx``'s column sums
    the program takes (the bias gradient of the layer before) writes them as a fourth output,
    in the same pass over the rows."""
    for k, ins in g.each("layer_norm_grad"):
        if len(ins.outputs) != 3:
            continue
        dx = ins.outputs[0]
        if column_sum(g, dx, k) is not None:
            outputs = (*ins.outputs, take_column_sum(g, dx, k))
            g.set(k, Instr("layer_norm_grad", ins.inputs, outputs, dict(ins.attrs)))


def gelu_grad_column_sums(g: Graph) -> None:
    """A ``gelu_grad`` (a composite prim op, emitted whole by lowering) whose result's column
    sums the program takes (the bias gradient of the layer that produced ``x``) writes them as
    its second output, in the same pass over the rows."""
    for k, ins in g.each("gelu_grad"):
        if len(ins.outputs) != 1:
            continue
        (dx,) = ins.outputs
        if column_sum(g, dx, k) is not None:
            g.set(k, Instr("gelu_grad", ins.inputs, (dx, take_column_sum(g, dx, k)), {}))
