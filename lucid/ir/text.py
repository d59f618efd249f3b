"""Printing and parsing modules of Lucid's dialects (custom or generic form)."""

from __future__ import annotations

import io

from lucid.ir import _xdsl as x
from lucid.ir.dialect import lucid_dialect

__all__ = ["make_context", "print_ir", "parse_ir"]


def make_context() -> x.Context:
    """A context with ``builtin``, ``func`` and ``lucid`` (every op registered now) loaded."""
    ctx = x.Context()
    ctx.load_dialect(x.builtin.Builtin)
    ctx.load_dialect(x.func.Func)
    ctx.load_dialect(lucid_dialect())
    return ctx


def print_ir(op: x.Operation, *, generic: bool = False) -> str:
    """The text of ``op``: Lucid's readable custom form, or the generic form (valid MLIR that
    upstream ``mlir-opt --allow-unregistered-dialect`` parses)."""
    out = io.StringIO()
    x.Printer(stream=out, print_generic_format=generic).print_op(op)
    return out.getvalue() + "\n"


def parse_ir(text: str, *, ctx: x.Context | None = None, name: str = "<string>") -> x.ModuleOp:
    """Parse a module (custom or generic form). A syntax error raises ``ParseError`` with the
    line and column."""
    return x.Parser(ctx or make_context(), text, name).parse_module()
