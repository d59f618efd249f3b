"""Row kernels: layer norm (forward, as lowered), layer norm's backward and GELU (erf form)
with its gradient, matched as expression trees over the autodiff graph and replaced by the
CPU-only ``layer_norm``, ``layer_norm_grad``, ``gelu`` and ``gelu_grad`` kernels."""

from __future__ import annotations

from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.reference import INV_SQRT_2PI, SQRT_HALF
from lucid.backends.cpu.rewrites.match import (
    FLOAT_DTYPES,
    Graph,
    column_sum,
    erase_dead,
    last_axis_mean,
    row_kernel_candidates,
    single_use,
    take_column_sum,
)
from lucid.ir.prim import Aval


def fold_layer_norm(g: Graph) -> None:
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
        k_mean = last_axis_mean(g, mean, x)
        sq = instrs[g.producer[var]].inputs[0] if g.made_by(var, "reduce_mean") else None
        k_var = last_axis_mean(g, var, sq) if sq is not None else None
        square = single_use(g, sq, "mul") if sq is not None else None
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


# -- GELU and layer norm's backward as row kernels --------------------------------------------
#
# The autodiff graph of a layer norm and of an erf GELU is matched as expression trees over the
# unfused prim instructions (``match.Match``), so operand order of adds and multiplies, and a mean
# written as ``reduce_mean`` or as ``reduce_sum * (1/n)``, do not matter. The matched instructions
# whose values nothing else reads are removed; the rest (the forward's GELU cdf, read by the
# backward and by the activation) stay.


_GELU_CDF = (
    "mul",
    ("add", ("erf", ("mul", "x", ("const", SQRT_HALF))), ("const", 1.0)),
    ("const", 0.5),
)
_GELU_PDF = (
    "mul",
    ("exp", ("mul", ("mul", "x", "x"), ("const", -0.5))),
    ("const", INV_SQRT_2PI),
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


def fold_gelu_grad(g: Graph) -> None:
    """GELU's gradient (erf form) ``dy * (cdf(x) + x * pdf(x))`` becomes ``gelu_grad(dy, x)``,
    with the column sums of the result (the bias gradient of the layer that produced ``x``) as
    a second output when the program takes them."""
    instrs = g.instrs
    for k, m in row_kernel_candidates(g, _GELU_GRAD, "mul"):
        dy, x = m.env["dy"], m.env["x"]
        dx = instrs[k].outputs[0]
        if g.aval(dy) != g.aval(x) or g.aval(dx) != g.aval(x):
            continue
        outputs = [dx]
        if column_sum(g, dx, k) is not None:
            outputs.append(take_column_sum(g, dx, k))
        g.set(k, Instr("gelu_grad", (dy, x), tuple(outputs), {}))
        erase_dead(g, set(m.instrs) - {k})


def fold_gelu(g: Graph) -> None:
    """GELU (erf form) ``x * (erf(x / sqrt 2) + 1) / 2`` becomes ``gelu(x)``: one vectorized pass
    instead of the elementwise evaluator's five nodes (runs after ``fold_gelu_grad``, which
    frees the cdf the backward shared)."""
    instrs = g.instrs
    for k, m in row_kernel_candidates(g, _GELU, "mul"):
        x, y = m.env["x"], instrs[k].outputs[0]
        if g.aval(x) != g.aval(y):
            continue
        g.set(k, Instr("gelu", (x,), (y,), {}))
        erase_dead(g, set(m.instrs) - {k})


# -- numpy references of the CPU-only instructions (Program.interpret) ------------------------
