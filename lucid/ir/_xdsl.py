"""The one place Lucid imports xDSL (pinned to 0.75.0): everything else imports from here.

An xDSL upgrade should touch only this file. Names are re-exported as they are, so xDSL's own
documentation applies to them.
"""

import re as _re

from xdsl.context import Context
from xdsl.dialects import builtin, func
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
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    Signedness,
    StringAttr,
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
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    opt_prop_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.passes import ModulePass, PassPipeline
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.printer import Printer
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import ConstantLike, Pure
from xdsl.transforms.common_subexpression_elimination import cse
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.universe import Universe
from xdsl.utils.arg_spec import parse_pipeline
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    VerifyException,
)
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRLexer as _MLIRLexer

# xDSL 0.75's string-literal pattern nests a quantifier inside a quantifier, so a string left
# unterminated on its line backtracks exponentially (each character doubles the time: 22 take
# 2 s, 30 about ten minutes): one stray quote hung lucid-opt. The same language, in linear time.
_SLOW_STRING_LITERAL = r'"(?:[^"\\\n\v\f]+|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
if _MLIRLexer._unescaped_characters_regex.pattern == _SLOW_STRING_LITERAL:
    _MLIRLexer._unescaped_characters_regex = _re.compile(
        r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'
    )

ui8 = IntegerType(8, Signedness.UNSIGNED)


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


__all__ = [
    "DYNAMIC_INDEX",
    "UNKNOWN_LOC",
    "ArgSpecParseError",
    "ArrayAttr",
    "Attribute",
    "BFloat16Type",
    "Block",
    "BoolAttr",
    "BytesAttr",
    "ConstantLike",
    "Context",
    "DenseArrayBase",
    "DenseIntOrFPElementsAttr",
    "DiagnosticException",
    "DictionaryAttr",
    "FileLineColLoc",
    "Dialect",
    "Float16Type",
    "Float32Type",
    "Float64Type",
    "FloatAttr",
    "GreedyRewritePatternApplier",
    "IRDLOperation",
    "InsertPoint",
    "IntAttr",
    "IntegerAttr",
    "IntegerType",
    "ModuleOp",
    "ModulePass",
    "Operation",
    "Input",
    "ParseError",
    "ParsePropInAttrDict",
    "Parser",
    "PassPipeline",
    "PatternRewriteWalker",
    "PatternRewriter",
    "Printer",
    "Pure",
    "Region",
    "RewritePattern",
    "Rewriter",
    "SSAValue",
    "Signedness",
    "Span",
    "StringAttr",
    "TensorType",
    "UnitAttr",
    "Universe",
    "VerifyException",
    "bf16",
    "builtin",
    "cse",
    "erase_block_args",
    "f16",
    "f32",
    "f64",
    "func",
    "i1",
    "i8",
    "i16",
    "i32",
    "i64",
    "irdl_op_definition",
    "op_type_rewrite_pattern",
    "opt_prop_def",
    "parse_pipeline",
    "region_dce",
    "traits_def",
    "ui8",
    "var_operand_def",
    "var_result_def",
]
