"""The grad-mode path of ``cm(x)``: a compiled forward whose outputs carry a ``grad_fn`` that
runs a compiled backward.

``compile_grad_call`` traces the model once, adds one cotangent feed ``cot:<j>`` per floating
output and differentiates ``sum_j (out_j * cot_j).sum()`` with the ``vjp`` pass (so the
backward of every output is one graph). The ``partition`` pass (``lucid.passes.partition``)
then splits the differentiated function in two:

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

from lucid._tensor import Tensor
from lucid.compile._pytree import _at
from lucid.compile.cache import LRU, max_entries
from lucid.compile.diagnose import check_vjp_coverage
from lucid.compile.entry import GradEntry, GradProgram
from lucid.compile.errors import Unsupported, check_value_sizes
from lucid.compile.inference.tracing import trace_call
from lucid.compile.options import GRAPH_PIPELINE, backend_of
from lucid.compile.session import CompiledGraph, CompileSession
from lucid.compile.signature import _SYMBOLIC_SAFE_OPS, _has_tensor, _NotSymbolic
from lucid.ir._gc import release_ir
from lucid.ir.importer import feed_roles, forward_func, import_trace, result_roles
from lucid.passes import PassFailure, parse_pipeline_spec
from lucid.passes.partition import split_module
from lucid.passes.vjp import VJP
from lucid.trace._tracing import _tracing

__all__ = ["GradEntry", "compile_grad_call"]


def compile_grad_call(
    model: Any,
    args: tuple,
    kwargs: dict,
    options: Any,
    *,
    symbolic: bool = False,
    session: CompileSession | None = None,
) -> GradEntry:
    """Trace, differentiate, split and compile ``model(*args, **kwargs)`` for grad mode.
    Tensor keyword arguments are fed (role ``input:<name>``) and get gradients like positional
    ones. With ``symbolic`` the positional tensors' shared leading dim is traced as a symbolic
    batch (``_NotSymbolic`` when the graph cannot take it). Raises ``Unsupported``
    for what this path does not handle. ``session`` carries the debugging switches and collects
    the time of each stage (graph passes with ``vjp``; ``forward:``/``backward:`` lowering)."""
    first_session = session or CompileSession(getattr(options, "switches", None))
    if symbolic and any(_has_tensor(a) and not isinstance(a, Tensor) for a in args):
        # Their leading dim need not be the batch (an LSTM's (h, c) has it second).
        raise _NotSymbolic("tensors inside a container argument")
    with _tracing(model) as tracer:
        call = trace_call(tracer, model, args, kwargs, symbolic)
        tensor_pos, rebuild, passthrough = call.tensor_pos, call.rebuild, call.passthrough
        # An input returned unchanged is handed back as itself (its gradient is the caller's
        # own autograd business); the graph computes and differentiates the other outputs.
        computed = call.computed
        n_model_ops = len(tracer.trace.ops)  # the seeding below reduces over the batch
        seeded = None
        cot_index: dict[int, int] = {}
        for j, t in enumerate(computed):
            if not t.dtype.is_floating_point:
                continue
            cot = tracer.input(tuple(t.shape), t.dtype, role=f"cot:{j}")
            cot_index[j] = j
            term = (t * cot).sum()
            seeded = term if seeded is None else seeded + term
        if seeded is None:
            raise Unsupported("no floating output to differentiate")
        trace = tracer.finish([seeded, *computed])
        captured = tracer.feed_tensors()
    if symbolic:
        # Each batch size gets its own program (shape-specialize then vjp): the model's ops
        # must specialise soundly; the seeded sum over the batch is then concrete.
        model_ops = trace.ops[:n_model_ops]
        unsafe = sorted({op.name for op in model_ops if op.name not in _SYMBOLIC_SAFE_OPS()})
        if unsafe:
            raise _NotSymbolic(f"ops not safe under a symbolic batch: {', '.join(unsafe)}")
    check_vjp_coverage(trace)

    def requires_grad(role: str) -> bool:
        if role.startswith("param:"):
            return captured[role]._requires_grad
        if role.startswith("input:"):
            name = role[6:]
            t = _at(args, tensor_pos[int(name)]) if name.isdigit() else kwargs[name]
            return t._requires_grad
        return False

    def build(batch: int | None, session: CompileSession | None = None) -> GradProgram:
        # A later batch size of a symbolic entry is a compile of its own (switches apply again).
        check_value_sizes(trace, batch)
        session = session or CompileSession(getattr(options, "switches", None))
        with session.timed("import"):
            module = import_trace(trace)
        # An input (or parameter) no output depends on keeps grad None, as in eager.
        reaching = trace.feeds_reaching(
            [v for role, v in trace.outputs if role.startswith("output:")]
        )
        wrt_roles = [
            r for r in feed_roles(forward_func(module)) if requires_grad(r) and r in reaching
        ]
        if not wrt_roles:
            raise Unsupported("nothing the outputs depend on requires grad")
        # One graph pipeline: [shape-specialize,] vjp, then the graph passes.
        passes: list = []
        if batch is not None:
            passes += parse_pipeline_spec(f"shape-specialize{{batch={batch}}}")
        passes.append(VJP(wrt=" ".join(wrt_roles)))
        passes += parse_pipeline_spec(options.pipeline or GRAPH_PIPELINE)
        try:
            session.run_passes(passes, module, pipeline="graph")
        except PassFailure as e:
            if e.pass_name == "vjp":
                raise Unsupported(f"vjp: {e.cause}") from e
            raise
        program = _compile_split(module, captured, options, session)
        # For parity bisection: the graph pipeline as a spec over the imported trace.
        program.pipeline = ",".join(str(p.spec()) for p in passes)
        return program

    batch = _at(args, tensor_pos[0]).shape[0] if symbolic else None
    program = build(batch, first_session)
    entry = GradEntry(
        program=program,
        symbolic=symbolic,
        build=build,
        by_batch=LRU(max_entries()),
        cot_dtypes={j: computed[j].dtype.numpy for j in cot_index},
        tensor_pos=tensor_pos,
        n_leaves=len(computed),
        passthrough=passthrough,
        rebuild=rebuild,
        trace=trace,
        compile_ms=(time.perf_counter() - first_session.t0) * 1e3,
        passes_ms=first_session.passes_ms,
        fwd_module=program.fwd_module,
        bwd_module=program.bwd_module,
        captured_tensors=list(captured.values()),
        captured=captured,
    )
    if symbolic:
        entry.by_batch.put(batch, program)
    return entry


def _compile_split(
    module: Any, captured: dict, options: Any, session: CompileSession
) -> GradProgram:
    """Split a differentiated module and compile both halves on the backend (each its own
    pipeline of ``session``: ``forward-lowering`` and ``backward-lowering``)."""
    # The ``partition`` pass, in a pipeline of its own (visible with print-ir-after-all).
    session.run_passes("partition", module, pipeline="partition")
    fwd_mod, bwd_mod = split_module(module)
    release_ir(module)  # split into copies: freed now, not by the compile's end collection
    fwd_fn, bwd_fn = forward_func(fwd_mod), forward_func(bwd_mod)
    backend = backend_of(options.backend)
    fwd_exe = session.compile_module(
        fwd_mod, backend, inplace=True, pipeline="forward-lowering", prefix="forward:"
    )
    bwd_exe = session.compile_module(
        bwd_mod, backend, inplace=False, pipeline="backward-lowering", prefix="backward:"
    )

    def plan_for(role: str) -> tuple[str, Any]:
        if role.startswith("input:"):
            name = role[6:]
            return ("input", int(name)) if name.isdigit() else ("kw", name)
        if role == "rng":
            return ("rng", None)
        if role.startswith("residual:"):
            return ("residual", int(role[9:]))
        if role.startswith("cot:"):
            return ("cot", int(role[4:]))
        return ("tensor", captured[role])

    fwd_plan = [plan_for(r) for r in feed_roles(fwd_fn)]
    if any(k in ("residual", "cot") for k, _ in fwd_plan):
        raise Unsupported("the forward reads a cotangent (split failed)")
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
        raise Unsupported("the backward reads an RNG state the forward does not")
    grad_roles = [r[len("grad:") :] for r in result_roles(bwd_fn)]
    return GradProgram(
        fwd=CompiledGraph(fwd_exe, feed_roles(fwd_fn), result_roles(fwd_fn), {}),
        bwd=bwd_exe,
        fwd_plan=fwd_plan,
        fwd_results=fwd_results,
        bwd_plan=bwd_plan,
        wrt=[plan_for(r) for r in grad_roles],
        grad_roles=grad_roles,
        fwd_module=fwd_mod,
        bwd_module=bwd_mod,
    )
