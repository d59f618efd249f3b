"""Parity checking of compiled calls (``lucid.compile(model, check="first"|"always")``): a
compiled call also runs
eagerly and the outputs are compared; on a mismatch the signature becomes eager-only and the
culprit is bisected.

Bisection, on the trace and the call's feeds:

1. graph passes: the pipeline is re-run one pass at a time on the imported module, the ``lucid``
   interpreter (eager kernels) after each; the first pass whose result leaves the imported
   module's is guilty (its changed ops are named);
2. lowering: ``lower-to-prim`` then the ``prim`` interpreter against the ``lucid`` interpreter;
   if they differ, op by op: each traced op alone, lowered, against its eager kernel;
3. otherwise the backend (its passes or codegen) is named.

A repro folder holds the trace JSON, the feeds as ``.npy``, the IR before and after the guilty
pass and a ``lucid-opt`` command line (``README.txt``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from typing import Any

import numpy as np

from lucid._dispatch import _run_eager
from lucid._tensor import Tensor
from lucid.compile.parity.compare import Culprit, backend_culprit, compare
from lucid.ir import forward_func, import_trace, interpret, print_ir, result_roles
from lucid.ir.importer import feed_roles
from lucid.ir.prim.interpreter import interpret_prim
from lucid.ops import REGISTRY
from lucid.passes import PassManager, parse_pipeline_spec
from lucid.trace._trace import Const, Feed, Trace, TraceOp, Value

__all__ = ["bisect"]


def _outputs(results: list, roles: list[str]) -> list:
    return [r for r, role in zip(results, roles, strict=True) if role.startswith("output:")]


def _result_roles(module: Any) -> list[str]:
    return result_roles(forward_func(module))


def _run_lucid(module: Any, feeds: dict[str, np.ndarray]) -> list:
    return _outputs(interpret(module, feeds), _result_roles(module))


def _changed_ops(before: Any, after: Any) -> str:
    def names(m: Any) -> Counter:
        return Counter(op.name for op in forward_func(m).body.blocks.first.ops)

    b, a = names(before), names(after)
    gone = sorted((b - a).elements())
    new = sorted((a - b).elements())
    if gone or new:
        return f"{', '.join(gone) or '-'} -> {', '.join(new) or '-'}"
    return "ops rewritten in place: " + ", ".join(sorted(set(b)))


def bisect(
    trace: Any,
    feeds: dict[str, np.ndarray],
    *,
    pipeline: str,
    backend: Any,
    tol: tuple[float, float],
    batch: int | None = None,
    folder: str | None = None,
) -> Culprit:
    """Find which pass or lowering rule makes the compiled result of ``trace`` differ from
    eager, and write a repro folder."""
    module = import_trace(trace)
    if batch is not None:
        PassManager(f"shape-specialize{{batch={batch}}}").run(module)
    reference = _run_lucid(module, feeds)
    passes = list(parse_pipeline_spec(pipeline))
    for p in passes:
        before = module.clone()
        PassManager([p]).run(module)
        bad = compare(_run_lucid(module, feeds), reference, tol)
        if bad:
            name = p.name
            culprit = Culprit("pass", name, _changed_ops(before, module), bad)
            _write_repro(culprit, trace, feeds, before, module, name, folder)
            return culprit
    optimized = module.clone()
    prim = module.clone()
    PassManager("lower-to-prim").run(prim)
    bad = compare(_outputs(interpret_prim(prim, feeds), _result_roles(prim)), reference, tol)
    if bad:
        culprit = _bisect_lowering(trace, feeds, tol) or Culprit(
            "lowering", "lower-to-prim", None, f"the whole graph differs: {bad}"
        )
        culprit.pass_name = "lower-to-prim"
        _write_repro(culprit, trace, feeds, optimized, prim, "lower-to-prim", folder)
        return culprit
    culprit = backend_culprit(backend)
    _write_repro(culprit, trace, feeds, optimized, prim, "lower-to-prim", folder)
    return culprit


def _bisect_lowering(trace: Any, feeds: dict[str, np.ndarray], tol: tuple) -> Culprit | None:
    """Each op of the trace alone, lowered and run by the prim interpreter, against its eager
    kernel on the values the eager run gives it."""
    env: dict[int, Tensor] = {}
    for f in trace.feeds:
        env[f.value.id] = Tensor._wrap(np.asarray(feeds[f.role]))

    def operand(v: Any) -> Any:
        if isinstance(v, Value):
            return env[v.id]
        if isinstance(v, Const):
            return v.value
        if isinstance(v, list):
            return [operand(e) for e in v]
        return v

    for index, op in enumerate(trace.ops):
        opdef = REGISTRY[op.name]
        args = tuple(operand(v) for v in op.inputs)
        out = _run_eager(opdef, args, dict(op.attrs))
        outs = (out,) if opdef.n_outputs == 1 else tuple(out)
        for v, o in zip(op.outputs, outs, strict=True):
            env[v.id] = o
        feeds_one: list[Feed] = []
        values: dict[str, np.ndarray] = {}
        inputs = [_feed_of(v, env, feeds_one, values) for v in op.inputs]
        one = Trace(
            feeds=feeds_one,
            ops=[TraceOp(op.name, inputs, list(op.outputs), dict(op.attrs))],
            outputs=[(f"output:{i}", v) for i, v in enumerate(op.outputs)],
        )
        try:
            mod = import_trace(one)
            PassManager("lower-to-prim").run(mod)
            got = interpret_prim(mod, values)
        except Exception as e:  # noqa: BLE001 - a rule that crashes is the culprit too
            return Culprit("lowering", None, f"lucid.{op.name}", f"op #{index} fails: {e}")
        bad = compare(got, list(outs), tol)
        if bad:
            loc = f" at {op.loc[0]}:{op.loc[1]}" if op.loc else ""
            return Culprit("lowering", None, f"lucid.{op.name}", f"op #{index}{loc}: {bad}")
    return None


def _feed_of(v: Any, env: dict, feeds: list, values: dict) -> Any:
    """Make each Value operand of a one-op trace a feed holding its eager value."""
    if isinstance(v, Value):
        role = f"input:{len(feeds)}"
        feeds.append(Feed(v, role))
        values[role] = np.asarray(env[v.id]._data)
        return v
    if isinstance(v, list):
        return [_feed_of(e, env, feeds, values) for e in v]
    return v


def _safe(role: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", role)


def _write_repro(
    culprit: Culprit,
    trace: Any,
    feeds: dict[str, np.ndarray],
    before: Any,
    after: Any,
    pass_spec: str,
    folder: str | None,
) -> None:
    base = folder or os.environ.get("LUCID_COMPILE_DEBUG_DIR") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    out = tempfile.mkdtemp(prefix="lucid-parity-", dir=base)
    files = {"trace": os.path.join(out, "trace.json")}
    with open(files["trace"], "w") as f:
        json.dump(trace.to_dict(), f, indent=1)
    os.makedirs(os.path.join(out, "inputs"))
    for role, value in feeds.items():
        np.save(os.path.join(out, "inputs", _safe(role) + ".npy"), np.asarray(value))
    files["before"] = os.path.join(out, "before.mlir")
    files["after"] = os.path.join(out, "after.mlir")
    with open(files["before"], "w") as f:
        f.write(print_ir(before))
    with open(files["after"], "w") as f:
        f.write(print_ir(after))
    command = f'lucid-opt {files["before"]} --pass-pipeline="{pass_spec}"'
    files["command"] = command
    with open(os.path.join(out, "README.txt"), "w") as f:
        f.write(
            f"lucid.compile parity mismatch: {culprit}\n\n"
            f"Reproduce the guilty stage:\n  {command}\n"
            f"and compare with after.mlir. inputs/<role>.npy are the feeds by role "
            f"({', '.join(feed_roles(forward_func(before)))}).\n"
        )
    culprit.folder, culprit.files = out, files
