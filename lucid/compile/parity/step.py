"""Parity checking of training steps (``make_step``/``compiled_step``/``fused_step`` with
``check="first"|"always"``): the compiled step is compared with an eager step taken from the
same state, by role: the loss (``output:0``), the gradients (``grad:param:<name>``) and every
in-place update (``update:param:…``, ``update:state:…``, ``update:buffer:…``).

On a mismatch the bisection works on the training module's own pipeline (``vjp``,
``optimizer-fusion``, ``ghost-grads``, then the graph passes), with the ``lucid`` interpreter:

1. the imported trace (forward and optimizer update, gradients fed as the ``ghost:`` feeds
   from the eager step) is checked first: a difference there is the trace's;
2. each pass in turn: the first whose module's results leave eager's is guilty;
3. lowering: ``lower-to-prim`` and the ``prim`` interpreter; when they differ, op by op, first
   over the trace (forward ops, with their source line), then over the differentiated module
   (backward and optimizer ops too), each op alone lowered against its eager kernel;
4. otherwise the backend is named.

The repro folder is ``parity.call``'s (trace JSON, feeds, IR before and after, a ``lucid-opt``
line).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import lucid
from lucid._dispatch import _run_eager
from lucid._tensor import Tensor
from lucid.compile.parity import call as _call
from lucid.compile.parity.compare import Culprit, backend_culprit, compare
from lucid.ir import ConstantOp, LucidOp, import_trace, interpret
from lucid.ir.dialect import constant_value
from lucid.ir.importer import feed_roles, forward_func, result_roles
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager, parse_pipeline_spec
from lucid.trace._trace import Const, Feed, Trace, TraceOp, Value

__all__ = ["bisect_step", "compare_roles", "eager_gradients", "eager_optimizer_step"]


def compare_roles(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: tuple[float, float]
) -> str | None:
    """None when every role of ``want`` that ``got`` has is close; else what differs, by role
    (``grad:param:fc.weight: 3 of 12 elements differ ...``)."""
    for role, w in want.items():
        if role not in got:
            continue
        bad = compare([got[role]], [w], tol, what=role)
        if bad is not None:
            return bad.replace(f"{role} 0:", f"{role}:", 1)
    return None


def eager_gradients(
    model: Any, loss_fn: Callable[..., Any], inputs: tuple, params: Sequence[Tensor]
) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """One eager forward and backward: the loss and the gradient of each of ``params`` (None
    where the loss does not depend on it). ``.grad`` of every parameter is left as it was."""
    with lucid.enable_grad():
        loss = loss_fn(model(inputs[0]), *inputs[1:])
        wanted = [p for p in params if p._requires_grad]
        grads = (
            lucid.autograd.grad(loss, wanted, allow_unused=True)
            if wanted and loss._requires_grad
            else [None] * len(wanted)
        )
    by_id = {id(p): g for p, g in zip(wanted, grads, strict=True)}
    out = []
    for p in params:
        g = by_id.get(id(p))
        out.append(None if g is None else np.array(g._data, copy=True))
    return np.array(loss._data, copy=True), out


def eager_optimizer_step(
    model: Any,
    loss_fn: Callable[..., Any],
    optimizer: Any,
    inputs: tuple,
    before_update: Callable[[list[Tensor]], None] | None = None,
    scaler: Any = None,
    masters: dict[int, Tensor] | None = None,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """One eager training step (forward, backward, ``optimizer``'s own ``step``, even when
    ``compile_optimizer`` replaced it): the loss and each parameter's gradient (by ``id``).
    ``.grad`` of every parameter is left as it was (a fused step never fills it);
    ``before_update(params)`` runs between backward and the update (gradient clipping).
    With ``scaler`` (a ``GradScaler``) the scaled loss is differentiated (the gradients returned
    are scaled), unscaled before ``before_update``, the update skipped on inf/NaN and the scale
    updated, as ``scaler.step(optimizer); scaler.update()``. ``masters`` (``{id(float32
    master the optimizer holds): half-precision model parameter}``): each master's gradient is
    its parameter's widened, and after the update the parameter is set to its master rounded."""
    masters = masters or {}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    params += list(masters.values())
    saved = [p._grad for p in params]
    for p in params:
        p._grad = None
    try:
        with lucid.enable_grad():
            loss = loss_fn(model(inputs[0]), *inputs[1:])
            differentiated = scaler.scale(loss) if scaler is not None else loss
            if differentiated._requires_grad:
                differentiated.backward()
        for p in params:
            model_param = masters.get(id(p))
            if model_param is not None and model_param._grad is not None:
                p._grad = Tensor._wrap(model_param._grad._data.astype(p._data.dtype))
        grads = {id(p): np.array(p._grad._data, copy=True) for p in params if p._grad is not None}
        if scaler is not None:
            scaler.unscale_(optimizer)
        if before_update is not None:
            before_update(params)
        if scaler is None:
            type(optimizer).step(optimizer)
        else:
            # scaler.step, but with the optimizer's own step (compile_optimizer may replace it)
            if not scaler._per_optimizer_states[id(optimizer)]["found_inf"]:
                type(optimizer).step(optimizer)
            scaler.update()
        for p in params:
            model_param = masters.get(id(p))
            if model_param is not None:
                model_param._data[...] = p._data.astype(model_param._data.dtype)
                model_param._version[0] += 1
    finally:
        for p, g in zip(params, saved, strict=True):
            p._grad = g
    return np.array(loss._data, copy=True), grads


# ---------------------------------------------------------------------------------------------
# Bisection
# ---------------------------------------------------------------------------------------------
def _stage_check(
    module: Any,
    feeds: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    tol: tuple[float, float],
    run: Callable[[Any, dict], list],
) -> str | None:
    fn = forward_func(module)
    values = run(module, {r: feeds[r] for r in feed_roles(fn)})
    got = dict(zip(result_roles(fn), values, strict=True))
    return compare_roles(got, reference, tol)


def _op_shapes(module: Any) -> list[tuple]:
    """Each op of the forward function as (name, operand sources, properties): a source is
    ``("arg", i)`` or ``(op index, result index)``."""
    block = forward_func(module).body.blocks.first
    where: dict[Any, tuple] = {a: ("arg", i) for i, a in enumerate(block.args)}
    out = []
    for k, op in enumerate(block.ops):
        for j, r in enumerate(op.results):
            where[r] = (k, j)
        props = tuple(sorted((n, str(v)) for n, v in op.properties.items()))
        out.append((op.name, tuple(where.get(v) for v in op.operands), props))
    return out


def _changed_ops(before: Any, after: Any) -> str:
    """The ops a pass changed: removed -> added names, or, when it rewrote ops in place (same
    ops, other operands or attributes), the names of those."""
    b, a = _op_shapes(before), _op_shapes(after)
    if len(b) == len(a) and [o[0] for o in b] == [o[0] for o in a]:
        changed = sorted({new[0] for old, new in zip(b, a, strict=True) if old != new})
        if changed:
            return "rewritten in place: " + ", ".join(changed)
    return _call._changed_ops(before, after)


def _repro_spec(spec: str) -> str:
    # _parity writes the spec inside double quotes (vjp's wrt option is quoted itself).
    return spec.replace('"', '\\"')


def bisect_step(
    trace: Any,
    pipeline: str,
    feeds: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    *,
    backend: Any,
    tol: tuple[float, float],
    folder: str | None = None,
) -> Culprit:
    """Find which stage of a training step makes it differ from eager and write a repro folder.

    ``trace``: the training module's trace; ``pipeline``: the passes run on its import (a
    spec); ``feeds``: every feed's value at the step (including ``ghost:param:<name>``, the
    eager gradients); ``reference``: eager's value of each result role."""
    module = import_trace(trace)
    bad = _stage_check(module, feeds, reference, tol, interpret)
    if bad:
        culprit = Culprit(
            "trace",
            None,
            None,
            f"the traced step already differs from eager (before any pass): {bad}",
        )
        _call._write_repro(culprit, trace, feeds, module, module.clone(), "", folder)
        return culprit
    for p in parse_pipeline_spec(pipeline):
        before = module.clone()
        PassManager([p]).run(module)
        bad = _stage_check(module, feeds, reference, tol, interpret)
        if bad:
            culprit = Culprit("pass", p.name, _changed_ops(before, module), bad)
            spec = _repro_spec(str(p.spec()))
            _call._write_repro(culprit, trace, feeds, before, module, spec, folder)
            return culprit
    prim = module.clone()
    PassManager("lower-to-prim").run(prim)
    bad = _stage_check(prim, feeds, reference, tol, interpret_prim)
    if bad:
        culprit = (
            _call._bisect_lowering(trace, feeds, tol)
            or _bisect_lowering_ir(module, feeds, tol)
            or Culprit("lowering", None, None, f"the whole step differs: {bad}")
        )
        culprit.pass_name = "lower-to-prim"
        _call._write_repro(culprit, trace, feeds, module, prim, "lower-to-prim", folder)
        return culprit
    culprit = backend_culprit(backend)
    _call._write_repro(culprit, trace, feeds, module, prim, "lower-to-prim", folder)
    return culprit


def _bisect_lowering_ir(
    module: Any, feeds: dict[str, np.ndarray], tol: tuple[float, float]
) -> Culprit | None:
    """Each op of a ``lucid``-dialect module (after ``vjp``: backward and optimizer ops too)
    alone, lowered and run by the prim interpreter, against its eager kernel on the values the
    ``lucid`` interpreter gives it."""
    fn = forward_func(module)
    block = fn.body.blocks.first
    env: dict[Any, Any] = {}
    for arg, role in zip(block.args, feed_roles(fn), strict=True):
        env[arg] = Tensor._wrap(np.asarray(feeds[role]))
    for index, op in enumerate(block.ops):
        if isinstance(op, ConstantOp):
            v = constant_value(op)
            env[op.results[0]] = Tensor._wrap(v) if isinstance(v, np.ndarray) else v
            continue
        if not isinstance(op, LucidOp):
            continue
        grouped = op.operand_groups([env[v] for v in op.operands])
        out = _run_eager(op.OPDEF, tuple(grouped), op.lucid_attrs())
        outs = (out,) if op.OPDEF.n_outputs == 1 else tuple(out)
        for r, o in zip(op.results, outs, strict=True):
            env[r] = o
        bad = _lowered_alone(op.OPDEF.name, grouped, outs, op.lucid_attrs(), tol)
        if bad:
            return Culprit(
                "lowering",
                None,
                f"lucid.{op.OPDEF.name}",
                f"op #{index} of the differentiated step {bad}",
            )
    return None


def _lowered_alone(
    name: str, grouped: list, outs: tuple, attrs: dict, tol: tuple[float, float]
) -> str | None:
    """None when op ``name`` alone, lowered and run by the prim interpreter on ``grouped``
    (its operands: tensors, scalars, lists of them), gives ``outs``; else what differs."""
    feeds: list[Feed] = []
    values: dict[str, np.ndarray] = {}

    def as_input(v: Any) -> Any:
        if isinstance(v, list):
            return [as_input(e) for e in v]
        if isinstance(v, Tensor):
            role = f"input:{len(feeds)}"
            value = Value(len(feeds), tuple(v.shape), v.dtype)
            feeds.append(Feed(value, role))
            values[role] = np.asarray(v._data)
            return value
        return Const(v)

    inputs = [as_input(v) for v in grouped]
    outputs = [Value(len(feeds) + i, tuple(o.shape), o.dtype) for i, o in enumerate(outs)]
    one = Trace(
        feeds=feeds,
        ops=[TraceOp(name, inputs, outputs, attrs)],
        outputs=[(f"output:{i}", v) for i, v in enumerate(outputs)],
    )
    try:
        module = import_trace(one)
        PassManager("lower-to-prim").run(module)
        got = interpret_prim(module, values)
    except Exception as e:  # noqa: BLE001 - a rule that crashes is the culprit too
        return f"fails: {e}"
    bad = compare(got, [o._data for o in outs], tol)
    return None if bad is None else f"differs: {bad}"
