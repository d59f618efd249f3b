"""Printing and parsing modules of Lucid's dialects (custom or generic form)."""

from __future__ import annotations

import io

from lucid.ir import _xdsl as x
from lucid.ir.dialect import ConstantOp, get_op_class
from lucid.ops._registry import REGISTRY

__all__ = ["decode_source", "describe_parse_error", "make_context", "print_ir", "parse_ir"]


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
    """Parse a module (custom or generic form). Any malformed input raises ``ParseError`` with
    the position (``describe_parse_error`` gives it as one ``file:line:col: message`` line):
    syntax errors, nesting too deep for the recursive parser, and attribute values the parser's
    constructors refuse."""
    parser = x.Parser(ctx or make_context(), text, name)
    try:
        return parser.parse_module()
    except x.ParseError as e:
        raise _filled(e) from None
    except RecursionError:
        raise _error_at(parser, text, name, "the input nests too deeply to parse") from None
    except Exception as e:  # a constructor refusing a parsed value: still the input's fault
        raise _error_at(parser, text, name, f"{type(e).__name__}: {e}") from None


def _error_at(parser: x.Parser, text: str, name: str, msg: str) -> x.ParseError:
    pos = min(parser.pos, len(text))
    return x.ParseError(x.Span(pos, pos, x.Input(text, name)), msg)


def _filled(e: x.ParseError) -> x.ParseError:
    # xDSL 0.75 leaves "{first_char}" unformatted in its "Expected suffix identifier" message.
    if "{first_char}" in e.msg:
        content = e.span.input.content
        first = content[e.span.start : e.span.start + 1]
        first = first.decode("utf-8", "replace") if isinstance(first, bytes) else first
        e.msg = e.msg.replace("{first_char}", repr(first))
    return e


def describe_parse_error(e: x.ParseError) -> str:
    """``file:line:col: message`` on one line (``str(e)`` shows the source line and a caret)."""
    loc = e.span.get_location()
    msg = " ".join(_filled(e).msg.split())
    return f"{loc.file}:{loc.line}:{loc.col}: {msg}"


def decode_source(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text; otherwise a ValueError saying where the first bad byte is."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(
            f"{name}:{line}:{col}: not UTF-8 text (byte 0x{data[e.start]:02x})"
        ) from None
