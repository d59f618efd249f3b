"""Op coverage: what every registry op has, for ``docs/ops.md`` and the registry-walking test.

``python -m lucid.tools.coverage > docs/ops.md`` regenerates the table; it is never written by
hand. Beyond the registry's own columns it combines what the later stages state per op: whether
the op lowers to prim (``lucid.passes.lower_to_prim``) and whether the CPU backend runs it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from lucid.ir.prim import PRIM_OPS
from lucid.ops._registry import GRAD_SINK, REGISTRY, OpDef
from lucid.passes.lower_to_prim import lowering_status


def cpu_status(name: str) -> str | None:
    """The CPU backend runs an op when it lowers to prim and the native runtime implements every
    prim op (checked against the native module's opcode list)."""
    from lucid import _native  # only this column needs the built native module

    lowered = lowering_status(name)
    if lowered is None or not lowered.startswith("yes"):
        return lowered and "no (does not lower)"
    missing = sorted(set(PRIM_OPS) - set(_native.op_names()))
    return "yes" if not missing else f"prim ops missing natively: {', '.join(missing)}"


# The per-op columns of later stages: (column, function(op_name) -> str | None).
STAGE_COLUMNS: list[tuple[str, Callable[[str], str | None]]] = [
    ("lowers to prim", lowering_status),
    ("cpu", cpu_status),
]


def vjp_status(op: OpDef) -> str:
    if GRAD_SINK in op.props:
        return "grad sink"
    if op.vjp is not None:
        return "rule"
    reason = op.unsupported.get("vjp")
    return f"none: {reason}" if reason else "MISSING"


def family(op: OpDef) -> str:
    mod = getattr(op.kernel, "__module__", "") or ""
    return mod.rsplit(".", 1)[-1] if mod.startswith("lucid.ops.") else "-"


def rows() -> list[dict[str, str]]:
    import lucid  # noqa: F401  (registers every op family)

    stages = STAGE_COLUMNS
    out = []
    for name in sorted(REGISTRY):
        op = REGISTRY[name]
        row = {
            "op": name,
            "operands": ", ".join(op.operands),
            "attributes": ", ".join(op.attrs),
            "properties": ", ".join(sorted(op.props)),
            "vjp": vjp_status(op),
        }
        for column, lookup in stages:
            row[column] = lookup(name) or "-"
        out.append(row)
    return out


def markdown() -> str:
    table = rows()
    cols = list(table[0]) if table else ["op"]
    lines = [
        "# Op coverage",
        "",
        "Generated from the op registry by `python -m lucid.tools.coverage`; do not edit by hand.",
        "",
        f"{len(table)} ops. `vjp`: `rule` (a VJP rule), `grad sink` (the gradient deliberately "
        "stops), `none: reason` (no rule, with the reason).",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in table:
        lines.append("| " + " | ".join(r[c].replace("|", "\\|") for c in cols) + " |")
    return "\n".join(lines + list(surface_lines())) + "\n"


def compiled_status(kind: str, name: str, owner: object) -> str:
    """Whether a row compiles: its probe call (``torch_surface.probe``) traced, and every
    registry op it records lowers to prim; else the graph break or the ops that do not lower."""
    from lucid.ops import torch_surface
    from lucid.trace import GraphBreak, trace

    found = torch_surface.probe(kind, name, owner)
    if found is None:
        return "not probed"
    fn, args, model = found
    try:
        traced = trace(fn, *args, model=model)
    except GraphBreak as exc:  # the message ends with a source location: drop it
        return f"no: graph break ({str(exc).split(' at ')[0].removeprefix('graph break: ')})"
    except Exception as exc:  # noqa: BLE001
        return f"no: does not trace ({type(exc).__name__})"
    refused = sorted({op.name for op in traced.ops if lowering_status(op.name) != "yes"})
    return "yes" if not refused else "no: " + ", ".join(refused) + " not lowered"


@functools.cache  # the probes take seconds; one table per process
def surface_lines() -> list[str]:
    """The coverage of PyTorch's public names (``lucid.ops.torch_surface``): which exist in
    Lucid under the same name, and whether each compiles."""
    import lucid
    from lucid.ops import torch_surface as ts

    namespaces = [
        ("torch.nn modules", "modules", "lucid.nn", lucid.nn, ts.NN_MODULES),
        ("torch.nn.functional", "functional", "lucid.nn.functional", lucid.nn.functional,
         ts.NN_FUNCTIONAL),
        ("torch.optim optimizers", "optim", "lucid.optim", lucid.optim, ts.OPTIMIZERS),
        ("torch.linalg", "linalg", "lucid.linalg", lucid.linalg, ts.LINALG),
        ("torch tensor functions", "torch", "lucid", lucid, ts.TORCH_FUNCTIONS),
    ]  # fmt: skip
    lines = [
        "",
        "## Coverage of PyTorch's public API",
        "",
        "Which names of PyTorch 2.13 exist in Lucid under the same name (the lists are frozen in "
        "`lucid/ops/torch_surface.py`; excluded rows, with the reason, do not count). `compiled`: "
        "a small call of the row (its probe) traced, `yes` when every registry op it records "
        "lowers to prim, else the graph break or the ops that do not lower (`lucid.compile` runs "
        "those eagerly); `lucid.compile.diagnose(model, x)` tells for a given model.",
        "",
    ]
    for title, kind, where, module, names in namespaces:
        excluded = {n: ts.EXCLUDED[(kind, n)] for n in names if (kind, n) in ts.EXCLUDED}
        counted = [n for n in names if n not in excluded]
        present = [n for n in counted if hasattr(module, n)]
        share = 100 * len(present) // max(len(counted), 1)
        lines += [
            f"### {title}: {len(present)} of {len(counted)} ({share}%) in `{where}`",
            "",
            "| name | status | compiled |",
            "|---|---|---|",
        ]
        for n in names:
            if n in excluded:
                lines.append(f"| `{n}` | excluded: {excluded[n]} | - |")
            elif n in present:
                lines.append(f"| `{n}` | supported | {compiled_status(kind, n, module)} |")
            else:
                lines.append(f"| `{n}` | missing | - |")
        lines.append("")
    return lines[:-1]


if __name__ == "__main__":
    sys.stdout.write(markdown())
