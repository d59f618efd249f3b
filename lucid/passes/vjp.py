"""``vjp``: synthesize the backward graph of a function in the ``lucid`` dialect.

The pass walks the forward ops in reverse and runs each op's registry VJP rule (the same rule
eager autograd runs) on trace tensors bound to the op's SSA values; the ops the rule records are
appended before ``func.return`` (see ``lucid.passes._graph.Emitter``). It mirrors the eager
engine: gradients of a value used several times are summed, a gradient of a broadcast operand is
reduced with ``sum_to_size`` (and cast to the operand's dtype), and unused outputs of a
multi-output op get zeros. Only ops on a path from a ``wrt`` feed to the loss are
differentiated, so no unneeded gradient is built; ``dce`` removes what the forward no longer
needs. An op on such a path with no VJP rule makes the pass fail with ``VJPError`` naming every
such op; nothing is guessed.

Options:

- ``wrt``: which feeds get gradients: ``params`` (default, roles ``param:*``), ``inputs``
  (``input:*``), ``all`` (every floating feed but ``rng`` and ``ghost:*``), or a quoted,
  space-separated list of roles (``vjp{wrt="param:fc.weight input:0"}``).
- ``loss``: the role of the result to differentiate (default ``output:0``); it must have one
  element unless ``seed`` is set.
- ``seed``: take the output gradient as an extra feed (role ``grad_seed``, the loss's type)
  instead of 1, for non-scalar outputs.

Each gradient becomes a new result with role ``grad:<feed role>`` (``grad:param:fc1.weight``,
``grad:input:0``); a requested feed the loss does not depend on gets zeros.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ir import _xdsl as x
from lucid.ir import visits
from lucid.ir.dialect import LucidOp
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.ir.types import dtype_of_type, shape_of_type, tensor_type
from lucid.ops._registry import GRAD_SINK, VJPContext
from lucid.passes._graph import Emitter, append_results, block_of, return_op, set_arg_roles

__all__ = ["VJP", "VJPError", "differentiate", "select_wrt"]

SEED_ROLE = "grad_seed"
REQUIRE_ENV = "LUCID_MANUAL_VJP_REQUIRE"  # set: any op without a rule fails the pass


class VJPError(ValueError):
    """The backward graph cannot be built: ``missing`` maps each op with no VJP rule on the path
    from the requested feeds to the loss to how many times it occurs there."""

    def __init__(self, message: str, missing: dict[str, int] | None = None):
        self.missing = dict(missing or {})
        super().__init__(message)


def _is_float(v: x.SSAValue) -> bool:
    return dtype_of_type(v.type).is_floating_point


def select_wrt(roles: Sequence[str], wrt: str) -> list[int]:
    """Indices of the feeds ``wrt`` selects (see the module docstring)."""
    spec = wrt.strip()
    if spec == "params":
        return [i for i, r in enumerate(roles) if r.startswith("param:")]
    if spec == "inputs":
        return [i for i, r in enumerate(roles) if r.startswith("input:")]
    if spec == "all":
        return [
            i for i, r in enumerate(roles) if r != "rng" and not r.startswith(("ghost:", "grad_"))
        ]
    wanted = spec.replace(",", " ").split()
    unknown = [r for r in wanted if r not in roles]
    if unknown:
        raise VJPError(f"vjp: wrt names unknown feeds {unknown}; the feeds are {list(roles)}")
    return [roles.index(r) for r in wanted]


def _reduce_to(g: Tensor, like: Tensor) -> Tensor:
    """The eager engine's reduction of a gradient to its operand's shape and dtype."""
    shape = tuple(like.shape)
    if tuple(g.shape) != shape:
        g = apply("sum_to_size", g, shape=shape)
    if g.dtype is not like.dtype:
        g = g.type(like.dtype)
    return g


def differentiate(
    fn: x.func.FuncOp, wrt: str = "params", loss: str = "output:0", seed: bool = False
) -> list[str]:
    """Append the gradients of result ``loss`` with respect to the feeds ``wrt`` selects to
    ``fn`` as ``grad:<role>`` results; returns those roles."""
    block = block_of(fn)
    roles = feed_roles(fn)
    res_roles = result_roles(fn)
    if loss not in res_roles:
        raise VJPError(f"vjp: no result has role {loss!r}; the results are {res_roles}")
    loss_value = return_op(fn).operands[res_roles.index(loss)]
    if not _is_float(loss_value):
        raise VJPError(f"vjp: the loss {loss!r} has type {loss_value.type}, not a floating type")
    loss_shape = shape_of_type(loss_value.type)
    if not seed and (None in loss_shape or _numel(loss_shape) != 1):
        raise VJPError(
            f"vjp: the loss {loss!r} has shape {loss_shape}; a gradient is implied only for a "
            "one-element loss: pass seed=true to feed the output gradient"
        )
    wrt_idx = select_wrt(roles, wrt)
    again = [f"grad:{roles[i]}" for i in wrt_idx if f"grad:{roles[i]}" in res_roles]
    if again:
        raise VJPError(f"vjp: the function already returns {again}; differentiate once")
    args = block.args
    bad = [roles[i] for i in wrt_idx if not _is_float(args[i])]
    if bad:
        raise VJPError(f"vjp: feeds {bad} are not floating point and have no gradient")

    # Forward: values that depend on a wrt feed through differentiable ops.
    active: set[x.SSAValue] = {args[i] for i in wrt_idx}
    ops = [op for op in block.ops if isinstance(op, LucidOp)]
    visits.count(VJP.name, 2 * len(ops))  # the forward and backward sweeps
    for op in ops:
        if GRAD_SINK in op.OPDEF.props:
            continue
        if any(v in active for v in op.operands):
            active.update(r for r in op.results if _is_float(r))
    # Backward: of those, the ones the loss depends on.
    needed: set[x.SSAValue] = {loss_value} if loss_value in active else set()
    on_path: list[LucidOp] = []
    for op in reversed(ops):
        if any(r in needed for r in op.results) and any(v in active for v in op.operands):
            on_path.append(op)
            needed.update(v for v in op.operands if v in active)
    missing = Counter(op.OPDEF.name for op in on_path if op.OPDEF.vjp is None)
    where = "between the requested feeds and the loss"
    if _require_vjp():  # any op without a rule is an error, on the loss path or not
        missing = Counter(
            op.OPDEF.name for op in ops if op.OPDEF.vjp is None and GRAD_SINK not in op.OPDEF.props
        )
        where = f"in the function ({REQUIRE_ENV} is set)"
    if missing:
        listed = ", ".join(f"{n} (x{c})" for n, c in sorted(missing.items()))
        raise VJPError(f"vjp: no VJP rule for ops {where}: {listed}", dict(missing))

    emitter = Emitter(fn)
    if seed:
        seed_arg = block.insert_arg(
            tensor_type(loss_shape, dtype_of_type(loss_value.type)), len(args)
        )
        set_arg_roles(fn, [*roles, SEED_ROLE])
        fn.update_function_type()
    grads: dict[x.SSAValue, Tensor] = {}
    with emitter.recording():
        loss_t = emitter.tensor(loss_value)
        grads[loss_value] = emitter.tensor(seed_arg) if seed else apply("ones_like", loss_t)
        visits.count(VJP.name, len(on_path))
        for op in on_path:  # already in reverse order
            _backward_one(op, emitter, grads, active)
        results = []
        for i in wrt_idx:
            g = grads.get(args[i])
            results.append(apply("zeros_like", emitter.tensor(args[i])) if g is None else g)
    values = emitter.flush(results)
    new_roles = [f"grad:{roles[i]}" for i in wrt_idx]
    append_results(fn, values, new_roles)
    return new_roles


def _require_vjp() -> bool:
    value = os.environ.get(REQUIRE_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _backward_one(
    op: LucidOp, emitter: Emitter, grads: dict[x.SSAValue, Tensor], active: set[x.SSAValue]
) -> None:
    gouts = [grads.pop(r, None) for r in op.results]
    if all(g is None for g in gouts):
        return
    opdef = op.OPDEF
    outs = [emitter.tensor(r) for r in op.results]
    gouts = [apply("zeros_like", o) if g is None else g for g, o in zip(gouts, outs, strict=True)]
    flat_in = list(op.operands)
    needs = tuple(v in active for v in flat_in)
    inputs = op.operand_groups([emitter.tensor(v) for v in flat_in])
    ctx = VJPContext(tuple(inputs), outs, op.lucid_attrs(), needs)
    try:
        gins = opdef.vjp(ctx, *gouts)
    except Exception as e:
        raise VJPError(
            f"vjp: the VJP rule of {opdef.name!r} failed: {type(e).__name__}: {e}"
        ) from e
    gins = list(gins)
    if opdef.variadic:
        gins = [*gins[:-1], *gins[-1]]
    if len(gins) != len(flat_in):
        raise VJPError(
            f"vjp: the VJP rule of {opdef.name!r} returned {len(gins)} gradients for "
            f"{len(flat_in)} operands"
        )
    for v, g, need in zip(flat_in, gins, needs, strict=True):
        if g is None or not need:
            continue
        like = emitter.tensor(v)
        if not isinstance(g, Tensor):  # a rule returned a Python number
            g = apply("zeros_like", like) + g
        g = _reduce_to(g, like)
        prev = grads.get(v)
        grads[v] = g if prev is None else prev + g


@dataclass(frozen=True)
class VJP(x.ModulePass):
    """Append ``grad:<role>`` results: the gradients of the loss w.r.t. the ``wrt`` feeds."""

    name = "vjp"

    wrt: str = "params"
    loss: str = "output:0"
    seed: bool = False
    func: str = "forward"

    def apply(self, ctx: x.Context, op: x.ModuleOp) -> None:
        differentiate(forward_func(op, self.func), self.wrt, self.loss, self.seed)
