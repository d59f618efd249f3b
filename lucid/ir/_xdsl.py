"""The one place Lucid imports xDSL (pinned to 0.75.0): everything else imports from here.

An xDSL upgrade should touch only this file. Names are re-exported as they are, so xDSL's own
documentation applies to them. One exception: ``func`` is Lucid's own ``func`` dialect
(``lucid.ir.func``: MLIR's ops and text), because importing xDSL's costs the first compile ~30 ms.

The compile path (trace, import, passes, lowering, backend) builds, verifies and rewrites IR but
never prints, parses or pattern-rewrites it: the parser, the printer, the pattern rewriter and
xDSL's passes are imported on the first use of their names (``_LAZY``), so a process's first
``lucid.compile`` does not pay for them.
"""

from __future__ import annotations

import importlib as _importlib
import re as _re
from typing import TYPE_CHECKING

from xdsl.context import Context
from xdsl.dialects import builtin
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    UNKNOWN_LOC,
    ArrayAttr,
    BFloat16Type,
    BoolAttr,
    BytesAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    DictionaryAttr,
    FileLineColLoc,
    FlatSymbolRefAttrConstr,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    FunctionType,
    IntAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    Signedness,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i8,
    i16,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue
from xdsl.ir.core import SSAValues as _SSAValues
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import (
    CallableOpInterface,
    ConstantLike,
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    Pure,
    ReturnLike,
    SymbolOpInterface,
    SymbolTable,
    SymbolUserOpInterface,
)
from xdsl.utils.arg_spec import parse_pipeline
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    VerifyException,
)
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRLexer as _MLIRLexer

from lucid._lazy import lazy_attributes

# xDSL 0.75's string-literal pattern nests a quantifier inside a quantifier, so a string left
# unterminated on its line backtracks exponentially (each character doubles the time: 22 take
# 2 s, 30 about ten minutes): one stray quote hung lucid-opt. The same language, in linear time.
_SLOW_STRING_LITERAL = r'"(?:[^"\\\n\v\f]+|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
if _MLIRLexer._unescaped_characters_regex.pattern == _SLOW_STRING_LITERAL:
    _MLIRLexer._unescaped_characters_regex = _re.compile(
        r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
    )

if TYPE_CHECKING:
    from xdsl.parser import Parser
    from xdsl.printer import Printer

ui8 = IntegerType(8, Signedness.UNSIGNED)

# Names the compile path does not use, imported on first use: their modules add to the import
# that a process's first ``lucid.compile`` call pays (parser, printer, pattern rewriter: ~10 ms).
_LAZY = {
    "Parser": "xdsl.parser",
    "Printer": "xdsl.printer",
    "GreedyRewritePatternApplier": "xdsl.pattern_rewriter",
    "PatternRewriter": "xdsl.pattern_rewriter",
    "PatternRewriteWalker": "xdsl.pattern_rewriter",
    "RewritePattern": "xdsl.pattern_rewriter",
    "op_type_rewrite_pattern": "xdsl.pattern_rewriter",
    "parse_func_op_like": "xdsl.dialects.utils",
    "print_func_op_like": "xdsl.dialects.utils",
    "PassPipeline": "xdsl.passes",
    "Universe": "xdsl.universe",
    "cse": "xdsl.transforms.common_subexpression_elimination",
    "region_dce": "xdsl.transforms.dead_code_elimination",
}
_lazy_getattr = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str):
    if name == "func":  # Lucid's func dialect, which imports this module
        module = _importlib.import_module("lucid.ir.func")
        globals()["func"] = module
        return module
    return _lazy_getattr(name)


# Reference cycles of the IR. An operation and its results point at each other (``op.results``,
# ``result.op``); so do an operation and the ``Use`` records of its operands, the doubly linked
# lists of operations, blocks and uses, and every parent pointer. Whatever a compile drops
# (erased operations, a finished module) can then only be freed by the cyclic collector: tens of
# thousands of objects per compile, and the collection that ends the compile (``lucid.ir._gc``)
# spent most of its time on them. Breaking the links lets reference counting free them at once.


def release(op: Operation) -> None:
    """Break every reference cycle within ``op`` and the IR nested in it, once nothing needs
    it (a finished module, an erased operation): reference counting then frees it all as soon
    as the last outside reference goes. One visit per operation, block and use. ``op`` is left
    empty (no results, operands, regions or links): release only what no one will read."""
    stack = [op]
    while stack:
        op = stack.pop()
        for use in op._operand_uses:  # unlink from the value's use list (all released too)
            use._prev_use = use._next_use = None
        for use in op._successor_uses:
            use._prev_use = use._next_use = None
        op._operand_uses = op._successor_uses = op._successors = ()
        op._operands = _SSAValues()
        for result in op.results:
            result.first_use = None
        op.results = _SSAValues()
        op.parent = op._next_op = op._prev_op = None
        for region in op.regions:
            block = region._first_block
            region._first_block = region._last_block = region.parent = None
            while block is not None:
                for arg in block._args:
                    arg.first_use = None
                block._args = ()
                block.first_use = None
                nested = block._first_op
                while nested is not None:
                    stack.append(nested)
                    nested = nested._next_op
                following = block._next_block
                block._first_op = block._last_op = block.parent = None
                block._prev_block = block._next_block = None
                block = following
        op.regions = ()


_xdsl_operation_erase = Operation.erase


def _erase_releasing(self: Operation, safe_erase: bool = True, drop_references: bool = True):
    """``Operation.erase``, then ``release`` when it dropped the references: an erased operation
    is freed when its last outside reference goes, not by the next cyclic collection. Every
    erasure (``Block.erase_op``, the rewriters) goes through ``Operation.erase``."""
    _xdsl_operation_erase(self, safe_erase=safe_erase, drop_references=drop_references)
    if drop_references:
        # Its results are erased: unused, or their uses now read an ErasedSSAValue, which keeps
        # the result (and through ``result.op`` the operation) for diagnostics.
        release(self)


Operation.erase = _erase_releasing


def erase_block_args(block: Block, args) -> None:
    """Erase ``args`` (unused arguments of ``block``) in one pass. ``Block.erase_arg`` rebuilds
    the argument tuple and renumbers the arguments after it on every call, so erasing one
    argument per parameter of a deep model (ghost-grads, the forward/backward split) was
    quadratic; this renumbers once."""
    drop = set(args)
    for arg in drop:
        if arg.block is not block:
            raise ValueError("erase_block_args: an argument of another block")
        if arg.first_use is not None:
            raise ValueError(f"erase_block_args: argument {arg.index} is still used")
    kept = tuple(a for a in block.args if a not in drop)
    for index, arg in enumerate(kept):
        arg.index = index
    block._args = kept  # the one attribute Block.erase_arg writes, set once
    for arg in drop:
        arg.erase()


def print_operands_attrs_type(op: Operation, printer: Printer) -> None:
    """Print ``op``'s custom form: ``%a, %b {attrs} : (types) -> (types)``, the text of the
    assembly format ``$args attr-dict `:` functional-type($args, $res)`` with the properties in
    the attribute dictionary. Written by hand because every generated op class would otherwise
    parse its own copy of that format when it is defined (about a millisecond per op kind on a
    process's first compile)."""
    if op.operands:
        printer.print_string(" ")
        printer.print_list(op.operands, printer.print_operand)
    attrs = {**op.properties, **op.attributes}
    if attrs:
        printer.print_string(" ")
        printer.print_attr_dict(attrs)
    printer.print_string(" : ")
    printer.print_function_type(op.operand_types, op.result_types)


def parse_operands_attrs_type(cls: type[Operation], parser: Parser, properties) -> Operation:
    """Parse the form ``print_operands_attrs_type`` prints into a ``cls``; the names in
    ``properties`` become properties, other attributes stay attributes."""
    pos = parser.pos
    unresolved = (
        parser.parse_optional_undelimited_comma_separated_list(
            parser.parse_optional_unresolved_operand, parser.parse_unresolved_operand
        )
        or []
    )
    attrs = parser.parse_optional_attr_dict()
    parser.parse_punctuation(":")
    ftype = parser.parse_function_type()
    operands = parser.resolve_operands(unresolved, ftype.inputs.data, pos)
    return cls.create(
        operands=operands,
        result_types=list(ftype.outputs.data),
        properties={k: v for k, v in attrs.items() if k in properties},
        attributes={k: v for k, v in attrs.items() if k not in properties},
    )


__all__ = [
    "ArgSpecParseError",
    "ArrayAttr",
    "Attribute",
    "BFloat16Type",
    "Block",
    "BoolAttr",
    "BytesAttr",
    "CallableOpInterface",
    "ConstantLike",
    "Context",
    "DYNAMIC_INDEX",
    "DenseArrayBase",
    "DenseIntOrFPElementsAttr",
    "DiagnosticException",
    "Dialect",
    "DictionaryAttr",
    "FileLineColLoc",
    "FlatSymbolRefAttrConstr",
    "Float16Type",
    "Float32Type",
    "Float64Type",
    "FloatAttr",
    "FunctionType",
    "HasParent",
    "IRDLOperation",
    "Input",
    "InsertPoint",
    "IntAttr",
    "IntegerAttr",
    "IntegerType",
    "IsTerminator",
    "IsolatedFromAbove",
    "ModuleOp",
    "ModulePass",
    "Operation",
    "ParseError",
    "ParsePropInAttrDict",
    "Pure",
    "Region",
    "ReturnLike",
    "Rewriter",
    "SSAValue",
    "Signedness",
    "Span",
    "StringAttr",
    "SymbolNameConstraint",
    "SymbolOpInterface",
    "SymbolRefAttr",
    "SymbolTable",
    "SymbolUserOpInterface",
    "TensorType",
    "UNKNOWN_LOC",
    "UnitAttr",
    "VerifyException",
    "bf16",
    "builtin",
    "erase_block_args",
    "f16",
    "f32",
    "f64",
    "i1",
    "i16",
    "i32",
    "i64",
    "i8",
    "irdl_op_definition",
    "opt_prop_def",
    "parse_operands_attrs_type",
    "parse_pipeline",
    "print_operands_attrs_type",
    "prop_def",
    "region_def",
    "release",
    "traits_def",
    "ui8",
    "var_operand_def",
    "var_result_def",
]
__all__ += sorted([*_LAZY, "func"])  # reached through __getattr__
