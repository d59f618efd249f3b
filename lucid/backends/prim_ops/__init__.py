"""The ``prim`` op table: the living definition of Lucid's backend-neutral primitives.

Each prim op has one direct MPSGraph counterpart and one CPU kernel. This module is pure Python
(numpy only, no xDSL): for every op it gives the operands, the attributes with their kinds and
defaults, a shape/dtype rule over :class:`Aval` and the numpy reference semantics. The xDSL ``prim``
dialect, the ``lower-to-prim`` pass, the native validator and the MPSGraph numpy builder are
checked against this table.

Conventions shared by every op:

- dtypes are the strings ``f32 f64 i32 i64 bool``; operands of an op have exactly the dtypes its
  rule asks for (promotion happened before prim, through explicit ``cast``);
- shapes are static tuples; binary/select/normalize operands broadcast with numpy rules;
- axes may be negative and count from the end;
- integer division or remainder by zero gives 0 (never a trap), as numpy does.
"""

# Importing a family module registers its ops in PRIM_OPS.
from lucid.backends.prim_ops import _conv, _elementwise, _linalg, _random, _reduction, _shape
from lucid.backends.prim_ops._conv import conv_output_shape, pool_output_shape
from lucid.backends.prim_ops._core import (
    ANY,
    DTYPES,
    FLOAT,
    INT,
    NUMERIC,
    NUMPY_DTYPES,
    PRIM_OPS,
    REQUIRED,
    Attr,
    Aval,
    PrimError,
    PrimOp,
    broadcast,
    check_attrs,
    dtype_of,
    evaluate,
    infer,
    lookup,
    markdown_table,
    normalize_axes,
    normalize_axis,
)
from lucid.backends.prim_ops._elementwise import BINARY, ELEMENTWISE_OPS, UNARY
from lucid.backends.prim_ops._random import (
    _random_normal_ref,  # noqa: F401  (tests compare eager draws against these directly)
    _random_uniform_ref,  # noqa: F401
    philox4x32,
    random_words,
)
from lucid.backends.prim_ops._reduction import REDUCTIONS

__all__ = [
    "_conv",
    "_elementwise",
    "_linalg",
    "_random",
    "_reduction",
    "_shape",
    "ANY",
    "BINARY",
    "DTYPES",
    "ELEMENTWISE_OPS",
    "FLOAT",
    "INT",
    "NUMERIC",
    "NUMPY_DTYPES",
    "PRIM_OPS",
    "REDUCTIONS",
    "REQUIRED",
    "UNARY",
    "Attr",
    "Aval",
    "PrimError",
    "PrimOp",
    "broadcast",
    "check_attrs",
    "conv_output_shape",
    "dtype_of",
    "evaluate",
    "infer",
    "lookup",
    "markdown_table",
    "normalize_axes",
    "normalize_axis",
    "philox4x32",
    "pool_output_shape",
    "random_words",
]
