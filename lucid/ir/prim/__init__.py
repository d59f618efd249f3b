"""The ``prim`` op table: the living definition of Lucid's backend-neutral primitives.

Each prim op has one direct MPSGraph counterpart and one CPU kernel. The table (this package's
top level and its ``_<family>`` modules) is pure Python (numpy only, no xDSL): for every op it
gives the operands, the attributes with their kinds and defaults, a shape/dtype rule over
:class:`Aval` and the numpy reference semantics. Beside it, ``dialect`` gives every entry an xDSL
face (the ``prim`` dialect) and ``interpreter`` runs prim modules on the table's semantics. The
``lower-to-prim`` pass, the native validator and the backends are checked against the table; it
imports no backend (each backend states which ops it runs).

Conventions shared by every op:

- dtypes are the strings ``f32 f64 f16 bf16 i32 i64 bool`` (half precision: see ``_half``);
  operands of an op have exactly the dtypes its rule asks for (promotion happened before prim,
  through explicit ``cast``);
- shapes are static tuples; binary/select/normalize operands broadcast with numpy rules;
- axes may be negative and count from the end;
- integer division or remainder by zero gives 0 (never a trap), as numpy does.
"""

# Importing a family module registers its ops in PRIM_OPS (composite: in COMPOSITE_OPS).
from lucid.ir.prim import (
    _conv,
    _elementwise,
    _linalg,
    _random,
    _reduction,
    _rnn,  # noqa: F401  (the LSTM composites)
    _shape,
    composite,
)
from lucid.ir.prim._conv import conv_output_shape, pool_output_shape
from lucid.ir.prim._core import (
    ANY,
    COMPOSITE_OPS,
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
    infer_checked,
    lookup,
    normalize_axes,
    normalize_axis,
)
from lucid.ir.prim._elementwise import BINARY, ELEMENTWISE_OPS, UNARY
from lucid.ir.prim._half import HALF, to_half, widen_half
from lucid.ir.prim._random import (
    _random_normal_ref,  # noqa: F401  (tests compare eager draws against these directly)
    _random_uniform_ref,  # noqa: F401
    philox4x32,
    random_words,
)
from lucid.ir.prim._reduction import REDUCTIONS

__all__ = [
    "_conv",
    "_elementwise",
    "_linalg",
    "_random",
    "_reduction",
    "_shape",
    "composite",
    "ANY",
    "BINARY",
    "COMPOSITE_OPS",
    "DTYPES",
    "ELEMENTWISE_OPS",
    "FLOAT",
    "HALF",
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
    "infer_checked",
    "lookup",
    "normalize_axes",
    "normalize_axis",
    "philox4x32",
    "pool_output_shape",
    "random_words",
    "to_half",
    "widen_half",
]
