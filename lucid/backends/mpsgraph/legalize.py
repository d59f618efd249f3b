"""``mpsgraph-legalize``: rewrite what MPSGraph lacks or does differently, refuse what it cannot do.

Runs on a ``prim`` module (after ``lower-to-prim``), before the emitter:

- ``prim.matmul_accumulate`` (BLAS's ``C += alpha·A·B``, which MPSGraph has no method for) becomes
  ``prim.matmul``, ``prim.mul`` by ``alpha`` and ``prim.add`` of ``C``;
- MPSGraph has no float64 (``MPSDataType`` has no 64-bit float): a module with an ``f64`` value
  is refused with a reason naming the op, for the user to see (``cache_info()``, ``diagnose``);
- MPSGraph cannot create a zero-sized dimension, and checks every dimension against INT32_MAX:
  such modules are refused;
- integer matmul is refused (PyTorch never gives it to MPSGraph), and so is a matmul with a
  dimension above 2**15 when the running macOS is older than 14.4 (wrong results there);
- int64 indices: MPSGraph's gathers, scatters and one-hot take Int32 indices. The narrowing is not
  an IR rewrite here on purpose: the emitter range-checks the int64 values first and casts after
  (``prim.cast`` to i32 would wrap 2**32 + 1 into range and read the wrong row silently);
- the pooling gradients are MPSGraph's own gradient methods already (``prim.max_pool2d_grad`` and
  ``prim.avg_pool2d_grad`` map one to one), so nothing is rewritten for them.

``legalize_refusal(module)`` returns the reason a module is refused (or None) without changing it:
``diagnose``'s ``mpsgraph`` column uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lucid.ir import _xdsl as x
from lucid.ir.prim.dialect import PrimIROp, create_prim, prim_attrs
from lucid.ir.prim.expand import expand_composites
from lucid.passes._blocks import blocks_of
from lucid.passes.registry import register_pass

__all__ = ["MPSGraphLegalize", "MPSGraphUnsupported", "legalize", "legalize_refusal"]

_INT32_MAX = 2**31 - 1


class MPSGraphUnsupported(ValueError):
    """The module uses something MPSGraph cannot run; ``reason`` says what and where."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"MPSGraph cannot run this graph: {reason}")


def _type_problem(t: x.Attribute) -> str | None:
    if not isinstance(t, x.TensorType):
        return None
    if isinstance(t.element_type, x.Float64Type):
        return "float64 (MPSGraph has no 64-bit float; use float32 or backend='cpu')"
    if t.element_type in (x.f16, x.bf16):
        name = "float16" if t.element_type == x.f16 else "bfloat16"
        return f"{name} (mpsgraph backend: {name} storage not supported yet)"
    shape = t.get_shape()
    if any(d == 0 for d in shape):
        return f"a zero-sized dimension in {t} (MPSGraph cannot create one)"
    if any(d > _INT32_MAX for d in shape):
        return f"a dimension above INT32_MAX in {t}"
    return None


# MPSGraph's matrixMultiplication "returns silently incorrect results if one of the matrix
# dimensions is greater than 2**15" before macOS 14.4 (PyTorch LinearAlgebra.mm, use_metal_mm;
# PyTorch #116769).
_MATMUL_DIM_LIMIT = 2**15
_MATMUL_FIXED_IN = (14, 4)


def _matmul_problem(op: x.Operation, macos: tuple[int, ...] | None) -> str | None:
    if not isinstance(op, PrimIROp) or op.name not in ("prim.matmul", "prim.matmul_accumulate"):
        return None
    t = op.results[0].type
    if isinstance(t, x.TensorType) and not isinstance(t.element_type, x.Float32Type):
        # PyTorch never sends integer matmul to MPSGraph (use_metal_mm: its own kernel), and
        # MPSGraph's Int32/Int64 matrixMultiplication is undocumented.
        return (
            f"{op.name} on {t.element_type} (MPSGraph's matrix multiplication is used for "
            "float32 only)"
        )
    if macos is not None and macos < _MATMUL_FIXED_IN:
        for v in op.operands[:2]:
            if isinstance(v.type, x.TensorType) and any(
                d > _MATMUL_DIM_LIMIT for d in v.type.get_shape()
            ):
                return (
                    f"{op.name} with a dimension above {_MATMUL_DIM_LIMIT} on macOS "
                    f"{'.'.join(map(str, macos))} (wrong results before 14.4)"
                )
    return None


def legalize_refusal(module: x.ModuleOp, macos: tuple[int, ...] | None = None) -> str | None:
    """Why MPSGraph cannot run ``module`` (the first problem found), or None. ``macos`` (the
    running version, when known) adds the refusals of older releases' bugs."""
    for block in blocks_of(module):
        for i, a in enumerate(block.args):
            problem = _type_problem(a.type)
            if problem:
                return f"argument {i} has {problem}"
        for op in block.ops:
            for v in (*op.operands, *op.results):
                problem = _type_problem(v.type)
                if problem:
                    return f"{op.name} has {problem}"
            problem = _matmul_problem(op, macos)
            if problem:
                return problem
    return None


def _split_matmul_accumulate(block: x.Block) -> None:
    for op in list(block.ops):
        if not isinstance(op, PrimIROp) or op.name != "prim.matmul_accumulate":
            continue
        a, b, c, alpha = op.operands
        mm = create_prim("matmul", [a, b], prim_attrs(op))
        scaled = create_prim("mul", [mm.results[0], alpha], {})
        total = create_prim("add", [c, scaled.results[0]], {})
        block.insert_ops_before([mm, scaled, total], op)
        op.results[0].replace_all_uses_with(total.results[0])
        block.erase_op(op)


def legalize(module: x.ModuleOp, macos: tuple[int, ...] | None = None) -> None:
    """Rewrite ``module`` in place for MPSGraph; raise MPSGraphUnsupported if it cannot run."""
    expand_composites(module)  # MPSGraph has no kernel of a composite prim op
    reason = legalize_refusal(module, macos)
    if reason is not None:
        raise MPSGraphUnsupported(reason)
    for block in blocks_of(module):
        _split_matmul_accumulate(block)


@register_pass
@dataclass(frozen=True)
class MPSGraphLegalize(x.ModulePass):
    """Rewrite a prim module for MPSGraph (matmul_accumulate split) and refuse float64,
    zero-sized and oversized dimensions with a reason."""

    name = "mpsgraph-legalize"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        legalize(op)
