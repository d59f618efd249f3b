"""``lucid-inspect-trace``: summarise a trace dump, or diff two.

lucid-inspect-trace trace.json            feeds, op counts, outputs
lucid-inspect-trace old.json new.json     what changed between two traces
lucid-inspect-trace trace.json --mlir     the trace imported into the lucid dialect

A file may also hold ``CompiledModule.graph_dump()``'s list of signatures: the summary covers
each; ``--sig N`` picks the N-th for a diff or ``--mlir``.

Exit status: 0, or 1 when two traces differ (as diff does); 2 for an error, reported as one
line on stderr that names the file and the place in it.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections import Counter
from collections.abc import Sequence


class _UserError(Exception):
    """A problem with the user's input: reported as one line, exit status 2."""


def _load(path: str, sig: int | None = None):
    """The trace in ``path``; for a graph_dump() file, every ``(sig, trace)`` unless ``sig``
    picks one."""
    import json

    from lucid.ir.text import decode_source
    from lucid.trace._trace import traces_from_json

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _UserError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        obj = json.loads(decode_source(data, path))
    except json.JSONDecodeError as e:
        raise _UserError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    except RecursionError:
        raise _UserError(f"{path}: the JSON nests too deeply to be a trace") from None
    except ValueError as e:  # not UTF-8
        raise _UserError(str(e)) from None
    try:
        traces = traces_from_json(obj)
    except (ValueError, TypeError) as e:
        raise _UserError(f"{path}: {e}") from None
    if not isinstance(obj, list):
        return traces[0][1]
    if sig is None:
        return traces
    if not 0 <= sig < len(traces):
        raise _UserError(f"{path}: --sig {sig}: the dump holds {len(traces)} signature(s)")
    return traces[sig][1]


def _one(path: str, sig: int | None):
    loaded = _load(path, sig)
    if isinstance(loaded, list):
        if len(loaded) != 1:
            raise _UserError(
                f"{path} holds {len(loaded)} signatures (a graph_dump()): pick one with --sig N"
            )
        return loaded[0][1]
    return loaded


def _shape(v) -> str:
    dims = "x".join("?" if d is None else str(d) for d in v.shape)
    return f"{v.dtype.name}[{dims}]"


def summary(trace) -> str:
    """A readable summary: feeds, op histogram, outputs."""
    lines = [f"{len(trace.feeds)} feeds, {len(trace.ops)} ops, {len(trace.outputs)} outputs", ""]
    lines.append("feeds:")
    lines += [f"  %{f.value.id:<5} {f.role:<40} {_shape(f.value)}" for f in trace.feeds]
    lines.append("ops:")
    for name, n in sorted(Counter(op.name for op in trace.ops).items(), key=lambda t: -t[1]):
        lines.append(f"  {n:>6}  {name}")
    lines.append("outputs:")
    lines += [f"  %{v.id:<5} {role:<40} {_shape(v)}" for role, v in trace.outputs]
    return "\n".join(lines) + "\n"


def _op_lines(trace) -> list[str]:
    """One line per op, with value ids renumbered away so unrelated edits do not show."""
    from lucid.trace._trace import Const

    def operand(x) -> str:
        if isinstance(x, list):
            return "[" + ", ".join(operand(e) for e in x) + "]"
        return repr(x.value) if isinstance(x, Const) else _shape(x)

    out = [f"feed {f.role} {_shape(f.value)}" for f in trace.feeds]
    for op in trace.ops:
        args = [operand(x) for x in op.inputs] + [f"{k}={v!r}" for k, v in op.attrs.items()]
        outs = ", ".join(_shape(v) for v in op.outputs)
        out.append(f"{op.name}({', '.join(args)}) -> {outs}")
    out += [f"output {role} {_shape(v)}" for role, v in trace.outputs]
    return out


def diff(a, b, names: tuple[str, str] = ("a", "b")) -> str:
    """A unified diff of two traces' feeds, ops (name, attributes, result types) and outputs."""
    return "".join(
        line if line.endswith("\n") else line + "\n"
        for line in difflib.unified_diff(
            _op_lines(a), _op_lines(b), fromfile=names[0], tofile=names[1], lineterm=""
        )
    )


def _mlir(trace, path: str) -> str:
    import lucid  # noqa: F401  (registers every op)
    from lucid.ir import print_ir
    from lucid.ir.importer import import_checked_trace

    try:
        return print_ir(import_checked_trace(trace))
    except ValueError as e:
        raise _UserError(f"{path}: {e}") from None


def _run(args: argparse.Namespace) -> int:
    if not args.other and not args.mlir:
        loaded = _load(args.trace, args.sig)
        if isinstance(loaded, list):
            parts = [f"{len(loaded)} signature(s)\n"]
            for i, (sig, trace) in enumerate(loaded):
                parts.append(f"\n--sig {i}: {sig}\n{summary(trace)}")
            sys.stdout.write("".join(parts))
        else:
            sys.stdout.write(summary(loaded))
        return 0
    first = _one(args.trace, args.sig)
    second = _one(args.other, args.sig) if args.other else None
    if second is not None:
        text = diff(first, second, (args.trace, args.other))
        sys.stdout.write(text or "traces are identical\n")
        return 1 if text else 0
    sys.stdout.write(_mlir(first, args.trace) if args.mlir else summary(first))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lucid-inspect-trace", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="a trace JSON file (lucid.compile.trace/v1)")
    p.add_argument("other", nargs="?", help="a second trace to diff against")
    p.add_argument("--mlir", action="store_true", help="print the trace as lucid-dialect IR")
    p.add_argument(
        "--sig", type=int, default=None, help="in a graph_dump() file, the signature to use"
    )
    args = p.parse_args(argv)
    try:
        return _run(args)
    except _UserError as e:
        sys.stderr.write(f"lucid-inspect-trace: error: {' '.join(str(e).split())}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
