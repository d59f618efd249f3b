"""Row kernels: layer norm's backward, matched over the autodiff graph and replaced by the
CPU-only ``layer_norm_grad`` kernel; and the column sums a ``gelu_grad`` can write on the way.
(Layer norm's forward and GELU are composite prim ops: lowering emits them whole.)"""

from __future__ import annotations

from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites.match import (
    Graph,
    column_sum,
    erase_dead,
    row_kernel_candidates,
    take_column_sum,
)
from lucid.ir.prim import Aval

# -- layer norm's backward as a row kernel -----------------------------------------------------
#
# The autodiff graph of a layer norm is matched as an expression tree over the unfused prim
# instructions (``match.Match``), so operand order of adds and multiplies, and a mean written as
# ``reduce_mean`` or as ``reduce_sum * (1/n)``, do not matter. The matched instructions whose
# values nothing else reads are removed.

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


def _product_with_column_sum(g: Graph, xhat: int | None, dy: int, after: int) -> int | None:
    """The slot of ``dy * xhat`` when a column sum after ``after`` reads it."""
    for j in g.readers(xhat) if xhat is not None else []:
        r = g.instrs[j]
        if r is None or r.op != "mul" or sorted(r.inputs) != sorted((dy, xhat)):
            continue
        if column_sum(g, r.outputs[0], after) is not None:
            return r.outputs[0]
    return None


def fold_layer_norm_grad(g: Graph) -> None:
    """Layer norm's backward (statistics recomputed, ``_normalize_grad`` of lucid/ops/norm.py
    as lowered: five row reductions and eight elementwise passes, plus the column sums of
    gamma's and beta's gradients and the bias gradient of the layer before) becomes one
    ``layer_norm_grad(dy, x, gamma) -> (dx, dgamma, dbeta, dx column sums)``."""
    program, instrs = g.program, g.instrs
    for k, m in row_kernel_candidates(g, _LN_GRAD, "mul"):
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
            outputs.append(take_column_sum(g, product, k))
        else:
            outputs.append(program.new_slot(xa.shape[-1:], xa.dtype))
        outputs.append(take_column_sum(g, dy, k))
        if column_sum(g, dx, k) is not None:
            outputs.append(take_column_sum(g, dx, k))
        g.set(
            k,
            Instr(
                "layer_norm_grad", (dy, x, gamma), tuple(outputs), {"epsilon": float(m.env["eps"])}
            ),
        )
        erase_dead(g, dead)


def gelu_grad_column_sums(g: Graph) -> None:
    """A ``gelu_grad`` (a composite prim op, emitted whole by lowering) whose result's column
    sums the program takes (the bias gradient of the layer that produced ``x``) writes them as
    its second output, in the same pass over the rows."""
    instrs = g.instrs
    for k, ins in enumerate(instrs):
        if ins is None or ins.op != "gelu_grad" or len(ins.outputs) != 1:
            continue
        (dx,) = ins.outputs
        if column_sum(g, dx, k) is not None:
            g.set(k, Instr("gelu_grad", ins.inputs, (dx, take_column_sum(g, dx, k)), {}))


# -- numpy references of the CPU-only instructions (Program.interpret) ------------------------
