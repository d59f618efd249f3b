"""GEMM epilogues: a constant scale, a bias row, a residual addend and a relu/gelu activation
folded into the CPU-only ``gemm`` instruction (BLAS's ``alpha``, its ``beta = 1`` accumulator,
and the tile epilogue of Lucid's sgemm)."""

from __future__ import annotations

from collections.abc import Callable

from lucid.backends.cpu.program import Instr
from lucid.backends.cpu.rewrites.match import (
    PRODUCTS,
    Graph,
    constant_scalar,
    float_matmul,
    gemm_of,
    single_use,
)
from lucid.ir.prim import Aval


def fold_gemm_scale(g: Graph) -> None:
    # Looked up per mul: asking each mul's operands for their producers would visit an
    # instruction per operand, and an optimizer's update is mostly muls.
    products = g.outputs_of("matmul")
    if not products:
        return
    for k, ins in g.each("mul"):
        if ins.inputs[0] not in products and ins.inputs[1] not in products:
            continue  # most muls: neither operand is a product
        for i in (0, 1):
            product, scale = ins.inputs[i], ins.inputs[1 - i]
            mm = float_matmul(g, product)
            alpha = constant_scalar(g, scale)
            if mm is None or alpha is None or g.aval(product) != g.aval(ins.outputs[0]):
                continue
            j, matmul = mm
            gemm = gemm_of(matmul)
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
    g: Graph,
    takes: Callable[[Graph, Instr, int, Aval], bool],
) -> None:
    """Each ``add`` of a float matmul's (or single-use gemm's) product and an operand that
    ``takes(g, gemm, operand, out_aval)`` accepts becomes that gemm with the operand as its
    accumulator, at the add's position (every operand is defined by then)."""
    products = g.outputs_of(*PRODUCTS)
    if not products:
        return
    for k, ins in g.each("add"):
        if ins.inputs[0] not in products and ins.inputs[1] not in products:
            continue  # most adds: neither operand is a product
        out = g.aval(ins.outputs[0])
        for i in (0, 1):
            product, operand = ins.inputs[i], ins.inputs[1 - i]
            found = float_matmul(g, product) or single_use(g, product, "gemm")
            if found is None or g.aval(product) != out:
                continue
            j, matmul = found
            gemm = gemm_of(matmul)
            if not takes(g, gemm, operand, out):
                continue
            g.set(j, None)
            g.set(k, Instr("gemm", (*gemm.inputs, operand), ins.outputs, dict(gemm.attrs)))
            products.add(ins.outputs[0])
            break


def _takes_bias(g: Graph, gemm: Instr, bias: int, out: Aval) -> bool:
    b = g.aval(bias)
    return len(gemm.inputs) == 2 and b.shape == out.shape[-1:] and b.dtype == out.dtype


def _takes_addend(g: Graph, gemm: Instr, addend: int, out: Aval) -> bool:
    # A gemm with a full-shape addend already has its accumulator.
    return g.aval(addend) == out and not any(len(g.aval(s).shape) > 1 for s in gemm.inputs[2:])


def fold_gemm_bias(g: Graph) -> None:
    _fold_add_into_gemm(g, _takes_bias)


def fold_gemm_addend(g: Graph) -> None:
    _fold_add_into_gemm(g, _takes_addend)


GEMM_ACTIVATIONS = ("relu", "gelu")


def fold_gemm_activation(g: Graph) -> None:
    """``relu`` or ``gelu`` (a composite prim op) of a float matmul's or gemm's
    product that nothing else reads becomes that gemm with ``activation``: the kernel applies
    it to each output tile while the tile is in registers, after bias and addend, instead of a
    pass of its own over the output. At the activation's position, as the other gemm folds."""
    for k, ins in g.each(*GEMM_ACTIVATIONS):
        if len(ins.inputs) != 1:
            continue
        product = ins.inputs[0]
        found = float_matmul(g, product) or single_use(g, product, "gemm")
        if found is None or g.aval(product) != g.aval(ins.outputs[0]):
            continue
        j, matmul = found
        gemm = gemm_of(matmul)
        if "activation" in gemm.attrs:
            continue
        g.set(j, None)
        g.set(k, Instr("gemm", gemm.inputs, ins.outputs, {**gemm.attrs, "activation": ins.op}))


def mark_shared_operands(g: Graph) -> None:
    """Float products that read one value as operand ``b`` with the same layout, two or more of
    them, become gemms with ``share_b``: within a run the native GEMM packs that operand once
    and the others read the packed copy (an LSTM's recurrent weight, read once per time step).
    Head views (``b_view``) and products of other dtypes are left alone."""
    groups: dict[tuple[int, bool], list[int]] = {}
    for k, ins in g.each(*PRODUCTS):
        if "b_view" in ins.attrs:
            continue
        if g.aval(ins.outputs[0]).dtype not in ("f32", "f16", "bf16"):
            continue
        groups.setdefault((ins.inputs[1], ins.attrs["transpose_b"]), []).append(k)
    for positions in groups.values():
        if len(positions) < 2:
            continue
        for k in positions:
            gemm = gemm_of(g.instrs[k])
            g.set(k, Instr("gemm", gemm.inputs, gemm.outputs, {**gemm.attrs, "share_b": True}))
