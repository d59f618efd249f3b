"""The prim op table as markdown, for ``docs/prim.md`` (a test keeps the two equal).

``python -m lucid.tools.prim_table`` prints it. The table itself (``lucid.ir.prim``) knows no
backend; this generator combines it with what each backend states about the ops: the MPSGraph
emitter's table (``lucid.backends.mpsgraph.selectors.EMISSIONS``) gives the method each op's
emission is built around, the composite it forms when it takes several, and the newest macOS
version among all the methods it may call.
"""

from __future__ import annotations

import sys

from lucid.backends.mpsgraph.selectors import EMISSION_NOTES, EMISSIONS, emission_macos
from lucid.ir.prim import COMPOSITE_OPS, PRIM_OPS, REQUIRED, PrimOp

_FAMILY_ORDER = (
    "unary", "binary", "select", "cast", "normalization", "linalg", "reduction", "softmax",
    "shape", "gather", "convolution", "pooling", "factory", "random",
)  # fmt: skip


def _mpsgraph_method(op: PrimOp) -> str:
    main = f"`{EMISSIONS[op.name][0]}`"
    note = EMISSION_NOTES.get(op.name)
    return f"{main} ({note})" if note else main


def _attributes(op: PrimOp) -> str:
    parts = []
    for name, spec in op.attrs.items():
        default = "" if spec.default is REQUIRED else f"={spec.default}"
        parts.append(f"{name}: {spec.kind}{default}")
    return ", ".join(parts)


def markdown_table() -> str:
    """Every prim op, by family: operands, attributes, MPSGraph method, min macOS, CPU kernel;
    then the composite ops."""
    lines = [
        "| prim op | operands | attributes | MPSGraph method | min macOS | CPU kernel |",
        "|---|---|---|---|---|---|",
    ]
    ops = sorted(PRIM_OPS.values(), key=lambda o: (_FAMILY_ORDER.index(o.family), o.name))
    for op in ops:
        operands = ", ".join(op.operands) + ("..." if op.variadic else "")
        lines.append(
            f"| `{op.name}` | {operands} | {_attributes(op)} | {_mpsgraph_method(op)} "
            f"| {emission_macos(op.name)} | {op.cpu_kernel} |"
        )
    lines += [
        "",
        "Composite ops (`lucid/ir/prim/composite.py`): a backend with the kernel runs it, any",
        "other expands the op's decomposition into the ops above (MPSGraph expands them all).",
        "",
        "| composite op | operands | attributes | CPU kernel |",
        "|---|---|---|---|",
    ]
    for op in COMPOSITE_OPS.values():
        lines.append(
            f"| `{op.name}` | {', '.join(op.operands)} | {_attributes(op)} | {op.cpu_kernel} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
