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
- a type the running macOS lacks is refused with the version that introduced it
  (``MPSDataTypeBFloat16``: macOS 14.0); float16 and bfloat16 are otherwise native;
- int64 indices: MPSGraph's gathers, scatters and one-hot take Int32 indices. The narrowing is not
  an IR rewrite here on purpose: the emitter range-checks the int64 values first and casts after
  (``prim.cast`` to i32 would wrap 2**32 + 1 into range and read the wrong row silently);
- the pooling gradients are MPSGraph's own gradient methods already (``prim.max_pool2d_grad`` and
  ``prim.avg_pool2d_grad`` map one to one), so nothing is rewritten for them;
- half precision: ``lower-to-prim`` computes each op on half values in float32 between casts
  (``cast`` to f32, the op, ``cast`` back), as eager's kernels do. MPSGraph runs those ops on
  Float16/BFloat16 natively, so regions of such ops whose float32 values are all read back as
  the same half type are narrowed to it (``narrow_half``): the casts go, and each op rounds to
  the half type itself (per op, as Apple's half arithmetic does; within a unit of eager where a
  region held several ops). Ops that accumulate (reductions, softmax, norms, cumulative sums,
  scatter-adds), the exact float32 divmod and the composites stay float32.

``legalize_refusal(module)`` returns the reason a module is refused (or None) without changing it:
``diagnose``'s ``mpsgraph`` column uses it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from lucid.backends.mpsgraph.selectors import MPS_DTYPES, dtype_introduced, macos_key
from lucid.ir import _xdsl as x
from lucid.ir import prim as P
from lucid.ir import visits
from lucid.ir.prim.dialect import PrimIROp, create_prim, prim_attrs
from lucid.ir.prim.expand import expand_composites
from lucid.passes._blocks import blocks_of
from lucid.passes.registry import register_pass

__all__ = ["MPSGraphLegalize", "MPSGraphUnsupported", "legalize", "legalize_refusal"]

_INT32_MAX = 2**31 - 1
STAGE = "mpsgraph-legalize"  # the visit counters' name for this step


class MPSGraphUnsupported(ValueError):
    """The module uses something MPSGraph cannot run; ``reason`` says what and where."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"MPSGraph cannot run this graph: {reason}")


# Element types by the prim dtype name their MPSDataType is keyed by (selectors.MPS_DTYPES).
_HALF_ELEMENT_TYPES = ((x.Float16Type, "f16"), (x.BFloat16Type, "bf16"))


def _type_problem(t: x.Attribute, macos: tuple[int, ...] | None = None) -> str | None:
    if not isinstance(t, x.TensorType):
        return None
    if isinstance(t.element_type, x.Float64Type):
        return "float64 (MPSGraph has no 64-bit float; use float32 or backend='cpu')"
    for cls, prim_dtype in _HALF_ELEMENT_TYPES:
        since = dtype_introduced(prim_dtype)
        if isinstance(t.element_type, cls) and macos is not None and macos < macos_key(since):
            return (
                f"{t.element_type} ({MPS_DTYPES[prim_dtype][0]} needs macOS {since}; this is "
                f"macOS {'.'.join(map(str, macos))})"
            )
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
    if isinstance(t, x.TensorType) and not isinstance(
        t.element_type, (x.Float32Type, x.Float16Type, x.BFloat16Type)
    ):
        # PyTorch never sends integer matmul to MPSGraph (use_metal_mm: its own kernel), and
        # MPSGraph's Int32/Int64 matrixMultiplication is undocumented.
        return (
            f"{op.name} on {t.element_type} (MPSGraph's matrix multiplication is used for "
            "float32, float16 and bfloat16 only)"
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
            problem = _type_problem(a.type, macos)
            if problem:
                return f"argument {i} has {problem}"
        for op in block.ops:
            visits.count(STAGE)
            # Every operand is an earlier op's result or a block argument: checking those checks
            # each value once (the op named is the one that makes the value).
            for v in op.results:
                problem = _type_problem(v.type, macos)
                if problem:
                    return f"{op.name} has {problem}"
            problem = _matmul_problem(op, macos)
            if problem:
                return problem
    return None


def _split_matmul_accumulate(block: x.Block) -> None:
    ops = list(block.ops)
    visits.count(STAGE, len(ops))
    for op in ops:
        if not isinstance(op, PrimIROp) or op.name != "prim.matmul_accumulate":
            continue
        a, b, c, alpha = op.operands
        mm = create_prim("matmul", [a, b], prim_attrs(op))
        scaled = create_prim("mul", [mm.results[0], alpha], {})
        total = create_prim("add", [c, scaled.results[0]], {})
        block.insert_ops_before([mm, scaled, total], op)
        op.results[0].replace_all_uses_with(total.results[0])
        block.erase_op(op)


# The prim ops MPSGraph runs on half values with one rounding of their result (elementwise math,
# matrix products, convolution, pooling) or exactly (comparisons, selections, shape and index ops,
# max/min and arg reductions). Left out, so they stay float32: the ops that accumulate long sums
# (the emitter would widen them again), floor_divide/remainder (an exact float32 divmod), the
# composites expm1/log1p (several roundings in half), casts, and what has no float operand.
NARROWABLE = frozenset({
    "neg", "abs", "square", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan",
    "tanh", "sigmoid", "erf", "floor", "ceil", "round", "relu", "sign", "isnan", "isinf",
    "isfinite", "add", "sub", "mul", "div", "pow", "atan2", "maximum", "minimum", "eq", "ne",
    "lt", "le", "gt", "ge", "select", "matmul", "reduce_max", "reduce_min", "argmax", "argmin",
    "reshape", "transpose", "broadcast_to", "slice", "concat", "pad", "gather",
    "gather_along_axis", "fill", "conv2d", "conv2d_data_grad", "conv2d_weights_grad",
    "max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad",
})  # fmt: skip
_HALF_ELEMENT = {x.f16: "f16", x.bf16: "bf16"}


def _element(v: x.SSAValue) -> x.Attribute | None:
    return v.type.element_type if isinstance(v.type, x.TensorType) else None


def _prim_name(op: x.Operation) -> str | None:
    return op.PRIM.name if isinstance(op, PrimIROp) else None


def _half_widening(v: x.SSAValue) -> x.SSAValue | None:
    """The half value ``v`` is the exact float32 widening of (``prim.cast`` f16/bf16 -> f32)."""
    op = v.owner
    if (
        _prim_name(op) == "cast"
        and _element(v) == x.f32
        and _element(op.operands[0]) in _HALF_ELEMENT
    ):
        return op.operands[0]
    return None


def _exact_constant(v: x.SSAValue, half: str) -> list[float] | None:
    """The values of a float32 ``prim.constant`` when each is exactly a ``half`` value."""
    op = v.owner
    if _prim_name(op) != "constant" or _element(v) != x.f32:
        return None
    values = [float(c) for c in prim_attrs(op)["value"]]
    exact = P.to_half(np.array(values, np.float64), half).astype(np.float64)
    same = (exact == np.array(values)) | (np.isnan(exact) & np.isnan(np.array(values)))
    return values if bool(np.all(same)) else None


def _narrowing_half(op: x.Operation, narrowed: dict) -> str | None:
    """The half type ``op`` can run in: every float operand is a half widening, a narrowed op's
    result or an exact constant, all of one half type (None when not)."""
    halves = set()
    has_float = False
    for v in op.operands:
        elem = _element(v)
        if elem != x.f32:
            if elem in (x.f16, x.bf16, x.f64):  # already half, or float64: not this pattern
                return None
            continue
        has_float = True
        source = _half_widening(v)
        if source is not None:
            halves.add(_HALF_ELEMENT[_element(source)])
        elif v in narrowed:
            halves.add(narrowed[v])
        elif _prim_name(v.owner) != "constant":
            return None
    if not has_float or len(halves) > 1:
        return None
    half = halves.pop() if halves else None
    if half is None:
        return None
    for v in op.operands:
        if _element(v) == x.f32 and _half_widening(v) is None and v not in narrowed:
            if _exact_constant(v, half) is None:
                return None
    return half


def _stays_narrow(op: x.Operation, half: str, ops: dict, narrowed: dict) -> bool:
    """Whether candidate ``op`` still runs in ``half``: its operands still allow it and each of
    its float32 results is read only by candidates or by casts back to ``half``."""
    visits.count(STAGE)
    if _narrowing_half(op, narrowed) != half:
        return False
    back_type = x.f16 if half == "f16" else x.bf16
    for r in op.results:
        if _element(r) != x.f32:
            continue
        for use in r.uses:
            user = use.operation
            back = _prim_name(user) == "cast" and _element(user.results[0]) == back_type
            if not back and user not in ops:
                return False
    return True


def narrow_half(block: x.Block) -> int:
    """Run on half values the regions of ``NARROWABLE`` ops that lower-to-prim wrapped in casts
    to float32 and back, when every float32 value of the region is read only by ops of the
    region or by casts back to its half type; returns how many ops were narrowed."""
    # Candidates in order (an operand's producer comes first), then drop those whose float32
    # results escape the region. A drop can only change the verdict of its neighbours (the
    # candidates producing its operands, whose values now reach a non-member, and those reading
    # its results, whose operands are no longer narrowed): they are queued again, so each op is
    # rechecked once per dropped neighbour instead of once per round over every candidate.
    narrowed: dict[x.SSAValue, str] = {}
    ops: dict[x.Operation, str] = {}
    for op in block.ops:
        visits.count(STAGE)
        if _prim_name(op) in NARROWABLE:
            half = _narrowing_half(op, narrowed)
            if half is not None:
                ops[op] = half
                for r in op.results:
                    if _element(r) == x.f32:
                        narrowed[r] = half
    pending = deque(ops)
    queued = set(ops)
    while pending:
        op = pending.popleft()
        queued.discard(op)
        half = ops.get(op)
        if half is None or _stays_narrow(op, half, ops, narrowed):
            continue
        del ops[op]
        for r in op.results:
            narrowed.pop(r, None)
        neighbours = [v.owner for v in op.operands if isinstance(v.owner, x.Operation)]
        neighbours += [use.operation for r in op.results for use in r.uses]
        for n in neighbours:
            if n in ops and n not in queued:
                pending.append(n)
                queued.add(n)
    replacement: dict[x.SSAValue, x.SSAValue] = {}
    walked = list(block.ops)
    visits.count(STAGE, 2 * len(walked))  # the rewrite and the erasing sweeps
    for op in walked:
        half = ops.get(op)
        if half is None:
            continue
        operands = []
        for v in op.operands:
            if _element(v) != x.f32:
                operands.append(v)
            elif v in replacement:
                operands.append(replacement[v])
            elif (source := _half_widening(v)) is not None:
                operands.append(source)
            else:  # an exact constant
                c = prim_attrs(v.owner)
                const = create_prim("constant", [], {**c, "dtype": half})
                block.insert_op_before(const, op)
                operands.append(const.results[0])
        new = create_prim(op.PRIM.name, operands, prim_attrs(op))
        block.insert_op_before(new, op)
        for old, r in zip(op.results, new.results, strict=True):
            if _element(old) == x.f32:
                replacement[old] = r
                for use in list(old.uses):
                    user = use.operation
                    if _prim_name(user) == "cast" and user.results[0].type == r.type:
                        user.results[0].replace_all_uses_with(r)
            else:
                old.replace_all_uses_with(r)
    for op in reversed(list(block.ops)):  # the old ops, the casts they no longer need
        if (op in ops or _prim_name(op) in ("cast", "constant")) and all(
            not r.uses for r in op.results
        ):
            block.erase_op(op)
    return len(ops)


# Set on a module once ``legalize`` rewrote it: the backend's compile legalizes what it is given
# (tests and tools hand it prim modules), and a compile's module has been through the
# ``mpsgraph-legalize`` pass already: the rewrites are not repeated (a tenth of a large module's
# compile), only the refusals of the running macOS's releases are checked.
_LEGALIZED = "_lucid_mpsgraph_legalized"


def legalize(module: x.ModuleOp, macos: tuple[int, ...] | None = None) -> None:
    """Rewrite ``module`` in place for MPSGraph; raise MPSGraphUnsupported if it cannot run.
    A module legalized before is only checked again, when ``macos`` names a release."""
    done = getattr(module, _LEGALIZED, False)
    if done and macos is None:
        return
    if not done:
        expand_composites(module)  # MPSGraph has no kernel of a composite prim op
    reason = legalize_refusal(module, macos)
    if reason is not None:
        raise MPSGraphUnsupported(reason)
    if done:
        return
    for block in blocks_of(module):
        _split_matmul_accumulate(block)
        narrow_half(block)
    setattr(module, _LEGALIZED, True)


@register_pass
@dataclass(frozen=True)
class MPSGraphLegalize(x.ModulePass):
    """Rewrite a prim module for MPSGraph (matmul_accumulate split) and refuse float64,
    zero-sized and oversized dimensions with a reason."""

    name = "mpsgraph-legalize"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        legalize(op)
