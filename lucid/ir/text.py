"""Printing and parsing modules of Lucid's dialects (custom or generic form)."""

from __future__ import annotations

import io

from lucid.ir import _xdsl as x
from lucid.ir.dialect import ConstantOp, get_op_class
from lucid.ops._registry import REGISTRY

__all__ = ["make_context", "print_ir", "parse_ir"]


class LucidContext(x.Context):
    """A context that generates ``lucid.<op>`` classes on first use, so a parse or a pass run
    pays only for the ops it meets (generating all of them costs a noticeable fraction of a
    second), and sees ops registered after it was made."""

    def get_optional_op(self, name: str, *, dialect_stack=()):
        op = super().get_optional_op(name, dialect_stack=dialect_stack)
        if op is None and name.startswith("lucid.") and name[6:] in REGISTRY:
            op = get_op_class(name[6:])
            self.load_op(op)
        return op


def make_context() -> x.Context:
    """A context with ``builtin``, ``func`` and ``lucid`` (ops generated as they are met)."""
    ctx = LucidContext()
    ctx.load_dialect(x.builtin.Builtin)
    ctx.load_dialect(x.func.Func)
    ctx.load_op(ConstantOp)
    return ctx


def print_ir(op: x.Operation, *, generic: bool = False, debuginfo: bool = False) -> str:
    """The text of ``op``: Lucid's readable custom form, or the generic form (valid MLIR that
    upstream ``mlir-opt --allow-unregistered-dialect`` parses). ``debuginfo`` adds each op's
    ``loc(...)`` (the user's source line, when the trace recorded locations)."""
    out = io.StringIO()
    x.Printer(stream=out, print_generic_format=generic, print_debuginfo=debuginfo).print_op(op)
    return out.getvalue() + "\n"


def parse_ir(text: str, *, ctx: x.Context | None = None, name: str = "<string>") -> x.ModuleOp:
    """Parse a module (custom or generic form). A syntax error raises ``ParseError`` with the
    line and column."""
    return x.Parser(ctx or make_context(), text, name).parse_module()
