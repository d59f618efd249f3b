"""The grad-mode path of ``cm(x)``: a compiled forward whose outputs carry a ``grad_fn`` that
runs a compiled backward.

``compile_grad_call`` traces the model once, adds one cotangent feed ``cot:<j>`` per floating
output and differentiates ``sum_j (out_j * cot_j).sum()`` with the ``vjp`` pass (so the
backward of every output is one graph). The differentiated function is then split in two:

- the **forward** executable: every op that does not depend on a cotangent. It returns the
  model's outputs, the buffer/RNG updates (written in place) and the **residuals**: the
  intermediate values the backward reads;
- the **backward** executable: the ops that do. It takes the residuals, the cotangents and the
  feeds it reads directly (parameters, inputs), and returns ``grad:<role>`` for every parameter
  and input that requires grad.

The outputs get one autograd ``Node`` (a custom ``OpDef``, as ``autograd.Function`` builds)
whose VJP runs the backward executable; saved parameters and inputs are version-checked like
eager autograd's saved tensors. Double backward through a compiled call is not supported.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lucid import _random
from lucid._autograd import Node
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.compile import _pipeline, _pytree
from lucid.compile._binding import name_feeds
from lucid.compile.diagnose import check_vjp_coverage
from lucid.ir import _xdsl as x
from lucid.ir.importer import feed_roles, forward_func, import_trace, result_roles
from lucid.ops._registry import OpDef
from lucid.passes import PassFailure, PassManager
from lucid.passes._graph import append_results, block_of, erase_args, keep_results, set_arg_roles
from lucid.passes.vjp import VJP
from lucid.trace._tracing import _tracing

__all__ = ["GradEntry", "compile_grad_call", "split_forward_backward"]


def split_forward_backward(module: x.ModuleOp) -> tuple[x.ModuleOp, x.ModuleOp]:
    """Split a differentiated module (cotangent feeds ``cot:*``, results ``output:*``,
    ``update:*`` and ``grad:*``) into a forward module (no cotangent; results ``output:*``,
    ``update:*``, ``residual:<i>``) and a backward module (feeds: what it reads of the original
    feeds, ``residual:<i>``, ``cot:*``; results ``grad:*``)."""
    fn = forward_func(module)
    block = block_of(fn)
    roles = feed_roles(fn)
    backward: set[x.SSAValue] = {
        a for a, r in zip(block.args, roles, strict=True) if r.startswith("cot:")
    }
    ops = list(block.ops)
    ret = ops[-1]
    body = ops[:-1]
    for op in body:
        if any(o in backward for o in op.operands):
            backward.update(op.results)
    arg_set = set(block.args)
    residual_pos: list[tuple[int, int]] = []  # (op index, result index) of each residual
    seen: set[x.SSAValue] = set()

    def need(v: x.SSAValue) -> None:
        if v in backward or v in arg_set or v in seen:
            return
        seen.add(v)
        owner = v.owner
        residual_pos.append((body.index(owner), v.index))

    for op in body:
        if any(o in backward for o in op.operands):
            for o in op.operands:
                need(o)
    r_roles = result_roles(fn)
    for v, role in zip(ret.operands, r_roles, strict=True):
        if role.startswith("grad:"):
            need(v)

    def value_at(mod: x.ModuleOp, pos: tuple[int, int]) -> x.SSAValue:
        ops_ = list(block_of(forward_func(mod)).ops)
        return ops_[pos[0]].results[pos[1]]

    # Forward: outputs (but the seeded sum), updates, residuals; the backward ops die.
    fwd = module.clone()
    ffn = forward_func(fwd)
    residuals = [value_at(fwd, p) for p in residual_pos]
    keep = [
        i
        for i, r in enumerate(r_roles)
        if r.startswith("update:") or (r.startswith("output:") and r != "output:0")
    ]
    keep_results(ffn, keep)
    append_results(ffn, residuals, [f"residual:{i}" for i in range(len(residuals))])
    PassManager("dce").run(fwd)
    _erase_unused_args(ffn)

    # Backward: residuals become feeds; only the gradients are returned.
    bwd = module.clone()
    bfn = forward_func(bwd)
    bblock = block_of(bfn)
    b_roles = feed_roles(bfn)
    for i, p in enumerate(residual_pos):
        v = value_at(bwd, p)
        arg = bblock.insert_arg(v.type, len(bblock.args))
        v.replace_all_uses_with(arg)
        b_roles.append(f"residual:{i}")
    set_arg_roles(bfn, b_roles)
    bfn.update_function_type()
    keep_results(bfn, [i for i, r in enumerate(r_roles) if r.startswith("grad:")])
    PassManager("dce").run(bwd)
    _erase_unused_args(bfn)
    return fwd, bwd


def _erase_unused_args(fn: x.func.FuncOp) -> None:
    erase_args(fn, [i for i, a in enumerate(block_of(fn).args) if not a.uses])


class GradEntry:
    """An entry of ``CompiledModule``'s cache for grad mode: ``entry(args, kwargs)`` runs the
    compiled forward and returns outputs whose ``grad_fn`` runs the compiled backward."""

    def __init__(self, **kw: Any):
        self.__dict__.update(kw)
        self.n_hits = 0
        self.last_run_ms = 0.0

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        t0 = time.perf_counter()
        tensor_args = [args[i] for i in self.tensor_pos]
        feeds = []
        rng = rng_before = None
        for kind, ref in self.fwd_plan:
            if kind == "input":
                feeds.append(tensor_args[ref]._data)
            elif kind == "rng":
                rng = _random.get_rng_state()._data
                feeds.append(rng)
                # The runtime advances ``rng`` in place; the backward (dropout's mask) needs the
                # state the forward drew from.
                rng_before = rng.copy()
            else:
                feeds.append(ref._data)
        try:
            res = self.fwd.run(feeds)
        except (TypeError, ValueError) as e:
            raise _pipeline.FeedMismatch(name_feeds(str(e), self.fwd.feed_roles)) from e
        outs: list[Any] = [None] * self.n_leaves
        residuals: list[np.ndarray] = []
        for i, (kind, ref) in enumerate(self.fwd_results):
            if kind == "output":
                outs[ref] = Tensor._wrap(res[i])
            elif kind == "rng":
                _random.set_rng_state(rng)
            elif kind == "update":
                ref._version[0] += 1
            else:
                residuals.append(res[i])
        wrt = [tensor_args[ref] if kind == "input" else ref for kind, ref in self.wrt]
        if _state.grad_enabled and any(t._requires_grad for t in wrt):
            self._attach(outs, wrt, tensor_args, residuals, rng_before)
        result = self.rebuild(outs)
        self.last_run_ms = (time.perf_counter() - t0) * 1e3
        return result

    def _attach(
        self, outs: list, wrt: list, tensor_args: list, residuals: list, rng_before: Any
    ) -> None:
        bwd, bwd_plan, cot_dtypes = self.bwd, self.bwd_plan, self.cot_dtypes
        saved = [
            tensor_args[ref] if kind == "input" else ref
            for kind, ref in bwd_plan
            if kind in ("input", "tensor")
        ]

        def vjp(ctx, *gouts):
            if _state.tracer is not None or _state.grad_enabled:
                raise RuntimeError(
                    "create_graph=True (higher-order gradients) or tracing the backward through "
                    "a compiled call is not supported: run the model eagerly for those"
                )
            feeds = []
            for kind, ref in bwd_plan:
                if kind == "residual":
                    feeds.append(residuals[ref])
                elif kind == "cot":
                    g = gouts[ref]
                    # np.ascontiguousarray would make a 0-d cotangent (a scalar loss) 1-d.
                    feeds.append(np.asarray(g._data, dtype=cot_dtypes[ref], order="C"))
                elif kind == "input":
                    feeds.append(tensor_args[ref]._data)
                elif kind == "rng":
                    feeds.append(rng_before)
                else:
                    feeds.append(ref._data)
            grads = bwd.run(feeds)
            return [Tensor._wrap(g) for g in grads]

        op = OpDef(
            name="CompiledCall",
            operands=tuple(f"x{i}" for i in range(len(wrt))),
            infer=lambda *a: None,
            kernel=lambda *a: None,
            vjp=vjp,
            n_outputs=len(outs),
            saves_inputs=False,
            saves_outputs=False,
        )
        Node.attach(op, tuple(wrt), {}, outs)
        node = next((t._node for t in outs if t._node is not None), None)
        if node is not None:
            node.versions = [(t, t._version[0]) for t in saved]


def compile_grad_call(model: Any, args: tuple, kwargs: dict, options: Any) -> GradEntry:
    """Trace, differentiate, split and compile ``model(*args, **kwargs)`` for grad mode.
    Raises ``_pipeline.Unsupported`` for what this path does not handle."""
    t0 = time.perf_counter()
    if any(isinstance(v, Tensor) for v in kwargs.values()):
        raise _pipeline.Unsupported("tensor keyword arguments in grad mode")
    from lucid.compile.api import _has_tensor

    if any(_has_tensor(a) and not isinstance(a, Tensor) for a in args):
        raise _pipeline.Unsupported("tensors inside a container argument in grad mode")
    with _tracing(model) as tracer:
        tensor_pos: list[int] = []
        targs = []
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                tensor_pos.append(i)
                targs.append(tracer.input_like(a))
            else:
                targs.append(a)
        out = model(*targs, **kwargs)
        leaves: list[Tensor] = []
        rebuild = _pytree.flatten(out, leaves)
        if any(any(t is targs[i] for i in tensor_pos) for t in leaves):
            raise _pipeline.Unsupported("an input returned unchanged in grad mode")
        seeded = None
        cot_index: dict[int, int] = {}
        for j, t in enumerate(leaves):
            if not t.dtype.is_floating_point:
                continue
            cot = tracer.input(tuple(t.shape), t.dtype, role=f"cot:{j}")
            cot_index[j] = j
            term = (t * cot).sum()
            seeded = term if seeded is None else seeded + term
        if seeded is None:
            raise _pipeline.Unsupported("no floating output to differentiate")
        trace = tracer.finish([seeded, *leaves])
        captured = tracer.feed_tensors()
    check_vjp_coverage(trace)
    module = import_trace(trace)
    roles = feed_roles(forward_func(module))
    wrt_roles = []
    for role in roles:
        if role.startswith("param:") and captured[role]._requires_grad:
            wrt_roles.append(role)
        elif role.startswith("input:") and args[tensor_pos[int(role[6:])]]._requires_grad:
            wrt_roles.append(role)
    if not wrt_roles:
        raise _pipeline.Unsupported("nothing the outputs depend on requires grad")
    try:
        PassManager([VJP(wrt=" ".join(wrt_roles))]).run(module)
    except PassFailure as e:
        raise _pipeline.Unsupported(f"vjp: {e.cause}") from e
    PassManager(options.pipeline or _pipeline.GRAPH_PIPELINE).run(module)
    fwd_mod, bwd_mod = split_forward_backward(module)
    fwd_fn, bwd_fn = forward_func(fwd_mod), forward_func(bwd_mod)
    backend = _pipeline.backend_of(options.backend)
    fwd_exe = _pipeline.compile_module(fwd_mod, backend, inplace=True)[0]
    bwd_exe = _pipeline.compile_module(bwd_mod, backend, inplace=False)[0]

    def plan_for(role: str) -> tuple[str, Any]:
        if role.startswith("input:"):
            return ("input", int(role[6:]))
        if role == "rng":
            return ("rng", None)
        if role.startswith("residual:"):
            return ("residual", int(role[9:]))
        if role.startswith("cot:"):
            return ("cot", int(role[4:]))
        return ("tensor", captured[role])

    fwd_plan = [plan_for(r) for r in feed_roles(fwd_fn)]
    if any(k in ("residual", "cot") for k, _ in fwd_plan):
        raise _pipeline.Unsupported("the forward reads a cotangent (split failed)")
    fwd_results: list[tuple[str, Any]] = []
    for role in result_roles(fwd_fn):
        if role.startswith("output:"):
            fwd_results.append(("output", int(role[7:]) - 1))
        elif role == "update:rng":
            fwd_results.append(("rng", None))
        elif role.startswith("update:"):
            fwd_results.append(("update", captured[role[7:]]))
        else:
            fwd_results.append(("residual", None))
    bwd_plan = [plan_for(r) for r in feed_roles(bwd_fn)]
    if any(k == "rng" for k, _ in bwd_plan) and not any(k == "rng" for k, _ in fwd_plan):
        raise _pipeline.Unsupported("the backward reads an RNG state the forward does not")
    grad_roles = [r[len("grad:") :] for r in result_roles(bwd_fn)]
    wrt = [plan_for(r) for r in grad_roles]
    cot_dtypes = {j: leaves[j].dtype.numpy for j in cot_index}
    return GradEntry(
        fwd=_pipeline.CompiledGraph(fwd_exe, feed_roles(fwd_fn), result_roles(fwd_fn), {}),
        bwd=bwd_exe,
        fwd_plan=fwd_plan,
        fwd_results=fwd_results,
        bwd_plan=bwd_plan,
        wrt=wrt,
        cot_dtypes=cot_dtypes,
        tensor_pos=tensor_pos,
        n_leaves=len(leaves),
        rebuild=rebuild,
        trace=trace,
        compile_ms=(time.perf_counter() - t0) * 1e3,
        passes_ms={},
        fwd_module=fwd_mod,
        bwd_module=bwd_mod,
        captured_tensors=list(captured.values()),
    )
