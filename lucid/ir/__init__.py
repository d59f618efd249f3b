"""Stage 2: the ``lucid`` dialect (generated from the op registry), Trace import, printing and
parsing, and the reference interpreter. xDSL is reached only through ``lucid.ir._xdsl``."""

from lucid.ir.dialect import ConstantOp, LucidOp, get_op_class, lucid_dialect
from lucid.ir.importer import feed_roles, forward_func, import_trace, result_roles
from lucid.ir.interpreter import interpret
from lucid.ir.text import make_context, parse_ir, print_ir

__all__ = [
    "ConstantOp",
    "LucidOp",
    "feed_roles",
    "forward_func",
    "get_op_class",
    "import_trace",
    "interpret",
    "lucid_dialect",
    "make_context",
    "parse_ir",
    "print_ir",
    "result_roles",
]
