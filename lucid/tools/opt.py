"""``lucid-opt``: the MLIR-style driver over Lucid's dialects and passes.

    lucid-opt model.mlir --pass-pipeline="canonicalize,cse,dce" --print-ir-after-all

Reads a module (a file, or stdin for ``-``), verifies it, runs the pipeline and prints the
result to stdout (or ``-o FILE``). IR dumps and timing go to stderr, as in ``mlir-opt``.
Also ``python -m lucid.tools.opt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lucid-opt",
        description="Run Lucid passes over a module in the lucid dialect.",
    )
    p.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' for stdin)")
    p.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    p.add_argument(
        "-p", "--pass-pipeline", default="", help='passes to run, e.g. "canonicalize,cse,dce"'
    )
    p.add_argument("--print-ir-before-all", action="store_true")
    p.add_argument("--print-ir-after-all", action="store_true")
    p.add_argument("--print-ir-after-change", action="store_true")
    p.add_argument("--print-ir-after-failure", action="store_true")
    p.add_argument("--print-ir-tree-dir", metavar="DIR", help="write the IR after each pass here")
    p.add_argument("--verify-each", action="store_true", help="verify the IR after each pass")
    p.add_argument("--no-verify", action="store_true", help="do not verify the input module")
    p.add_argument("--pass-timing", action="store_true", help="report per-pass wall time")
    p.add_argument("--print-op-generic", action="store_true", help="print the generic form")
    p.add_argument(
        "--mlir-print-debuginfo", action="store_true", help="print op locations (loc(...))"
    )
    p.add_argument("--list-passes", action="store_true", help="list the available passes")
    return p


def _list_passes(out) -> None:
    from lucid.passes import available_passes

    for name, load in sorted(available_passes().items()):
        try:
            cls = load()
        except Exception as e:  # a broken third-party entry point should not hide the rest
            out.write(f"  {name}  (cannot load: {e})\n")
            continue
        doc = (cls.__doc__ or "").strip().splitlines()
        out.write(f"  {name}  {doc[0] if doc else ''}\n")
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else f" = {f.default!r}"
            out.write(f"      {f.name.replace('_', '-')}: {f.type}{default}\n")


def _locate_failure(module, text: str, name: str) -> str | None:
    """``file:line`` of the first op that fails to verify. The parser keeps no locations, but it
    keeps result names, which find the defining line in the source."""
    import re

    failing = None
    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except Exception:
            failing = op
            break
    if failing is None:
        return None
    hints = [r.name_hint for r in failing.results if r.name_hint]
    patterns = [rf"%{re.escape(h)}\b[^=]*=\s*\"?{re.escape(failing.name)}" for h in hints]
    patterns.append(rf"\b\"?{re.escape(failing.name)}\b")
    lines = text.splitlines()
    for pattern in patterns:
        for i, line in enumerate(lines, 1):
            if re.search(pattern, line):
                return f"{name}:{i}"
    return None


class _UserError(Exception):
    """A problem with the user's input or flags: reported as one line, exit status 1."""


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def _read_source(path: str) -> tuple[str, str]:
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)  # a test may swap in a text stream
            data = stream.read() if stream is not None else sys.stdin.read().encode()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise _UserError(f"cannot read {name}: {e.strerror or e}") from None
    from lucid.ir.text import decode_source

    try:
        return name, decode_source(data, name)
    except ValueError as e:
        raise _UserError(str(e)) from None


def _prepare_tree_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise _UserError(f"--print-ir-tree-dir {path}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise _UserError(
            f"--print-ir-tree-dir {path}: cannot create it: {e.strerror or e}"
        ) from None


def _write_output(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise _UserError(f"cannot write {path}: {e.strerror or e}") from None


def _run(args: argparse.Namespace) -> None:
    import lucid  # noqa: F401  (registers every op, so the dialect is complete)
    from lucid.ir import _xdsl as x
    from lucid.ir.text import describe_parse_error, make_context, parse_ir, print_ir
    from lucid.passes import PassFailure, PassManager, PipelineError

    try:
        pm = PassManager(
            args.pass_pipeline,
            print_ir_before_all=args.print_ir_before_all,
            print_ir_after_all=args.print_ir_after_all,
            print_ir_after_change=args.print_ir_after_change,
            print_ir_after_failure=args.print_ir_after_failure,
            print_ir_tree_dir=args.print_ir_tree_dir,
            verify_each=args.verify_each,
            timing=args.pass_timing,
            generic=args.print_op_generic,
            debuginfo=args.mlir_print_debuginfo,
            stream=sys.stderr,
        )
    except PipelineError as e:
        raise _UserError(_describe_pipeline_error(e)) from None
    if args.print_ir_tree_dir:
        _prepare_tree_dir(args.print_ir_tree_dir)

    name, text = _read_source(args.input)
    ctx = make_context()
    if "prim." in text:  # a lowered module: the prim dialect is loaded only when needed
        from lucid.ir.prim.dialect import prim_dialect

        ctx.load_dialect(prim_dialect())
    try:
        module = parse_ir(text, ctx=ctx, name=name)
    except x.ParseError as e:
        raise _UserError(describe_parse_error(e)) from None
    if not args.no_verify:
        try:
            module.verify()
        except RecursionError:
            raise _UserError(f"{name}: the module nests too deeply to verify") from None
        except Exception as e:  # VerifyException, or a verifier tripping on odd input
            where = _locate_failure(module, text, name) or name
            raise _UserError(f"{where} does not verify: {e}") from None
    try:
        pm.run(module, ctx)
    except PassFailure as e:
        raise _UserError(str(e)) from None
    except OSError as e:  # writing the IR tree
        raise _UserError(f"cannot write {e.filename or 'the IR tree'}: {e.strerror or e}") from None
    try:
        result = print_ir(
            module, generic=args.print_op_generic, debuginfo=args.mlir_print_debuginfo
        )
    except RecursionError:
        raise _UserError(f"{name}: the module nests too deeply to print") from None
    _write_output(args.output, result)


def _describe_pipeline_error(e: Exception) -> str:
    # xDSL's spec errors draw a caret under the spec on extra lines; keep the words only.
    lines = [ln for ln in str(e).splitlines() if ln.strip() and set(ln.strip()) != {"^"}]
    return " ".join(ln.strip() for ln in lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_passes:
        sys.stdout.write("Available passes:\n")
        _list_passes(sys.stdout)
        return 0
    try:
        _run(args)
    except _UserError as e:
        sys.stderr.write(f"lucid-opt: error: {_one_line(str(e))}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
