"""Half-precision GEMMs: the casts a half model's products are lowered with (half operands
widened to float32, the float32 result rounded back) folded into the ``gemm`` instruction, whose
kernel widens half operands while it packs them and rounds its output tiles once (``dtype``).
An activation between two of those roundings (a half model computes a layer and its activation
as two rounded ops) becomes the gemm's epilogue with ``round_product``: the product is rounded
to half before the activation, as the unfused program does, so the values are the same.

These folds run after the float32 epilogue folds (``gemm``): the bias of a half ``Linear`` is
added in float32 before the one rounding, so it is already folded when they run."""

from __future__ import annotations

from lucid.backends.cpu.program import HALF_STORAGE, Instr
from lucid.backends.cpu.rewrites.gemm import GEMM_ACTIVATIONS
from lucid.backends.cpu.rewrites.match import PRODUCTS, Graph, gemm_of, single_use


def _half_cast(g: Graph, slot: int, to: str) -> tuple[int, Instr] | None:
    """(index, cast) when ``slot`` is a cast to ``to`` of another dtype nothing else reads."""
    found = single_use(g, slot, "cast")
    if found is None or found[1].attrs["dtype"] != to:
        return None
    return found


def _f32_product(g: Graph, slot: int) -> tuple[int, Instr] | None:
    """(index, gemm) of a float32 matmul or gemm writing ``slot`` that nothing else reads, not
    yet rounded to half and with no activation."""
    found = single_use(g, slot, "matmul") or single_use(g, slot, "gemm")
    if found is None or g.aval(slot).dtype != "f32":
        return None
    gemm = gemm_of(found[1])
    if "dtype" in gemm.attrs or "activation" in gemm.attrs:
        return None
    return found[0], gemm


def fold_half_activation(g: Graph) -> None:
    """``cast_h(act(cast_f32(cast_h(product))))`` (``h`` f16 or bf16, ``act`` relu or gelu, each
    value read once) becomes ``gemm{activation, round_product = h, dtype = h}``. ReLU commutes
    with the rounding (it keeps a value or makes it +0), so it needs no ``round_product``."""
    for k, ins in g.each("cast"):
        if ins.attrs["dtype"] not in HALF_STORAGE:
            continue
        half = ins.attrs["dtype"]
        act = single_use(g, ins.inputs[0], "relu") or single_use(g, ins.inputs[0], "gelu")
        if act is None or act[1].op not in GEMM_ACTIVATIONS or len(act[1].inputs) != 1:
            continue
        widened = _half_cast(g, act[1].inputs[0], "f32")
        rounded = widened and _half_cast(g, widened[1].inputs[0], half)
        found = rounded and _f32_product(g, rounded[1].inputs[0])
        if not found:
            continue
        j, gemm = found
        attrs = {**gemm.attrs, "activation": act[1].op, "dtype": half}
        if act[1].op != "relu":
            attrs["round_product"] = half
        for gone in (j, rounded[0], widened[0], act[0]):
            g.set(gone, None)
        g.set(k, Instr("gemm", gemm.inputs, ins.outputs, attrs))


def fold_half_output(g: Graph) -> None:
    """``cast_h(product)`` of a float32 product nothing else reads becomes ``gemm{dtype = h}``:
    the kernel rounds each output tile while it is in cache, and no float32 output is stored."""
    for k, ins in g.each("cast"):
        if ins.attrs["dtype"] not in HALF_STORAGE:
            continue
        found = _f32_product(g, ins.inputs[0])
        if found is None:
            continue
        j, gemm = found
        g.set(j, None)
        g.set(
            k, Instr("gemm", gemm.inputs, ins.outputs, {**gemm.attrs, "dtype": ins.attrs["dtype"]})
        )


def fold_half_operands(g: Graph) -> None:
    """A float32 product's operands (and bias row) that are half values widened by a cast are
    read as the half values: the kernel widens them while packing, so no float32 copy of a half
    weight or activation is written. A cast other instructions still read stays."""
    casts: set[int] = set()
    for k, ins in g.each(*PRODUCTS):
        if not ins.inputs:
            continue
        if ins.op == "matmul" and g.aval(ins.outputs[0]).dtype != "f32":
            continue
        # a, b and a bias row; an addend (rank >= 2 after them) stays float32.
        positions = [0, 1]
        if ins.op == "gemm" and len(ins.inputs) > 2 and len(g.aval(ins.inputs[2]).shape) == 1:
            positions.append(2)
        inputs = list(ins.inputs)
        for i in positions:
            found = g.made_by(inputs[i], "cast")
            if found is None or found[1].attrs["dtype"] != "f32":
                continue
            source = found[1].inputs[0]
            if g.aval(source).dtype in HALF_STORAGE:
                inputs[i] = source
                casts.add(found[0])
        if tuple(inputs) != ins.inputs:
            gemm = gemm_of(ins)
            g.set(k, Instr("gemm", tuple(inputs), gemm.outputs, dict(gemm.attrs)))
    g.erase_unread(lambda k, _: k in casts)


__all__ = ["fold_half_activation", "fold_half_operands", "fold_half_output"]
