"""One signature of ``CompiledModule`` without gradients: tracing and compiling it
(``compile_forward``), and the closures a hit runs: the binder (arguments, parameters and
buffers to feed arrays) and the finisher (result arrays to the model's return structure, buffer
and RNG updates written back). Also the helpers that walk tensor arguments inside containers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.compile import _pytree
from lucid.compile._pytree import _at, _replace_tensors, _tensor_paths
from lucid.compile.cache import LRU, TICK, max_entries
from lucid.compile.entry import ForwardEntry
from lucid.compile.errors import AliasedInputs, Unsupported
from lucid.compile.inference.tracing import trace_call
from lucid.compile.options import Options, backend_of
from lucid.compile.session import CompileSession, compile_symbolic_trace, compile_trace
from lucid.compile.signature import (
    _SYMBOLIC_SAFE_OPS,
    CacheKey,
    _is_symbolic,
    _NotSymbolic,
)
from lucid.trace._tracing import _tracing

__all__ = ["compile_forward"]


def compile_forward(
    model: Any,
    key: CacheKey,
    args: tuple,
    kwargs: dict,
    options: Options,
    session: CompileSession,
) -> ForwardEntry:
    """Trace ``model(*args, **kwargs)`` for the signature ``key`` (grad mode off) and compile
    it in ``session``: the entry a hit runs. A symbolic ``key`` gets one graph for every batch
    size (``_NotSymbolic`` when the model cannot take it); what the compiler cannot handle
    raises ``Unsupported`` or ``GraphBreak``."""
    symbolic = _is_symbolic(key)
    with _tracing(model) as tracer:
        call = trace_call(tracer, model, args, kwargs, symbolic)
        tensor_pos, out, leaves, rebuild = call.tensor_pos, call.out, call.leaves, call.rebuild
        # An input returned unchanged comes back as itself, not as a copy.
        passthrough = {
            j: ("arg", tensor_pos[ref]) if kind == "input" else (kind, ref)
            for j, (kind, ref) in call.passthrough.items()
        }
        computed = call.computed
        trace = tracer.finish(computed)
        captured = tracer.feed_tensors()
    if symbolic:
        unsafe = sorted({op.name for op in trace.ops if op.name not in _SYMBOLIC_SAFE_OPS()})
        if unsafe:
            raise _NotSymbolic(f"ops not safe under a symbolic batch: {', '.join(unsafe)}")
        batch = next(a.shape[0] for a in args if isinstance(a, Tensor))
        graph = _SymbolicGraph(trace, options, batch, session)
    else:
        graph = compile_trace(
            trace,
            backend=options.backend,
            pipeline=options.pipeline,
            session=session,
        )
    bind = _make_binder(graph.feed_roles, tensor_pos, captured)
    written = [
        r[len("update:input:") :] for r in graph.result_roles if r.startswith("update:input:")
    ]
    if written:
        bind = _alias_checked(bind, written, tensor_pos, list(captured.values()))
    finish = _make_finisher(
        graph.result_roles,
        leaves,
        passthrough,
        rebuild,
        captured,
        len(computed),
        tensor_pos,
        returns_tensor=isinstance(out, Tensor),
    )
    compile_ms = session.finish(repr(key), trace=trace, backend=options.backend)
    if "gc" in session.passes_ms:  # the collection that ends the compile (see finish)
        graph.passes_ms["gc"] = session.passes_ms["gc"]
    entry = ForwardEntry(
        graph,
        bind,
        finish,
        trace,
        compile_ms,
        graph.passes_ms,
        feed_roles=list(graph.feed_roles),
        captured_tensors=list(captured.values()),
        aot_output=(out, leaves, passthrough),
        aot_captured=captured,
    )
    if not symbolic and not passthrough and len(computed) == len(graph.result_roles):
        # Every result is an output (no buffer update, no input returned as itself): the
        # backend may serve hits in one direct call.
        plan = _simple_bind_plan(graph.feed_roles, tensor_pos, captured)
        if plan is not None:
            single = isinstance(out, Tensor) and len(leaves) == 1
            direct = _direct_call(options.backend, graph, *plan, single=single)
            if direct is not None:
                entry.serve_hits_with(direct, None if single else rebuild)
    return entry


def _alias_checked(bind, written: list[str], tensor_pos: list[tuple], captured: list[Tensor]):
    """``bind`` for an entry that writes inputs in place, refusing (``AliasedInputs``) a call
    whose written input shares memory with another argument or a bound tensor."""

    def bind_checked(args: tuple, kwargs: dict) -> list:
        tensors = _input_tensors(args, kwargs)
        for name in written:
            w = _at(args, tensor_pos[int(name)]) if name.isdigit() else kwargs[name]
            others = [t for t in tensors if t is not w] + captured
            if sum(t is w for t in tensors) > 1 or any(
                np.may_share_memory(w._data, t._data) for t in others
            ):
                raise AliasedInputs(
                    f"input {name}, written in place by the model, shares memory with another "
                    "argument or a parameter"
                )
        return bind(args, kwargs)

    return bind_checked


def _trace_of(entry: Any) -> Any:
    """The trace of a cache entry, through the auto/checked wrappers (None if it has none)."""
    return getattr(getattr(entry, "inner", entry), "trace", None)


def _leaf_arrays(out: Any) -> list[np.ndarray]:
    leaves: list = []
    _pytree.flatten(out, leaves)
    return [np.array(t._data, copy=True) for t in leaves if isinstance(t, Tensor)]


def _input_tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    """Every tensor among the arguments, including inside tuples, lists and dicts."""
    paths: list[tuple] = []
    _tensor_paths(args, (), paths)
    _tensor_paths(kwargs, (), paths)
    return [_at(args, p) if isinstance(p[0], int) else _at(kwargs, p) for p in paths]


def _contiguous(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every tensor whose array the runtime does not take (not C-contiguous
    or not aligned) replaced by a contiguous copy."""

    def c(a: Tensor) -> Tensor:
        d = a._data
        if d is not None and not (d.flags.c_contiguous and d.flags.aligned):
            return Tensor._wrap(np.array(d, order="C", copy=True))
        return a

    return _replace_tensors(args, c), _replace_tensors(kwargs, c)


class _SymbolicGraph:
    """One compiled graph for every batch size: the trace is taken once with a symbolic batch
    and proven safe. A backend that ``supports_symbolic_batch`` compiles one executable for all
    sizes; on the others the program is specialised per batch size on first sight (no retrace)
    and kept, so later calls of any seen batch size only bind and run."""

    def __init__(self, trace: Any, options: Options, batch: int, session: Any):
        self.trace = trace
        self.options = options
        self.by_batch: LRU = LRU(max_entries())
        self.shared = None
        if backend_of(options.backend).supports_symbolic_batch:
            try:
                first = self.shared = compile_symbolic_trace(
                    trace,
                    batch,
                    backend=options.backend,
                    pipeline=options.pipeline,
                    session=session,
                )
            except Unsupported as e:
                raise _NotSymbolic(f"the backend cannot share one executable: {e}") from e
        else:
            first = self._specialize(batch, session)
        self.feed_roles, self.result_roles = first.feed_roles, first.result_roles
        self.passes_ms = first.passes_ms

    def _specialize(self, batch: int, session: Any = None) -> Any:
        graph = compile_trace(
            self.trace,
            backend=self.options.backend,
            pipeline=self.options.pipeline,
            switches=self.options.switches,
            batch=batch,
            session=session,
        )
        self.by_batch.put(batch, graph)
        return graph

    def run(self, feeds: list) -> list:
        if self.shared is not None:
            return self.shared.run(feeds)
        graph = self.by_batch.get(feeds[0].shape[0]) if feeds[0].ndim else None
        if graph is None:
            graph = self._specialize(feeds[0].shape[0])
        else:
            graph.last_used = next(TICK)
        return graph.run(feeds)


def _simple_bind_plan(
    feed_roles: list[str], tensor_pos: list[tuple], captured: dict[str, Tensor]
) -> tuple[list[int], list[Tensor]] | None:
    """``(positions, tensors)`` when the feeds are the positional arguments at ``positions``
    (each a tensor argument itself) followed by the bound ``tensors`` (parameters, buffers); None
    for anything else (keyword or nested inputs, the RNG state)."""
    n = len(tensor_pos)
    inputs, rest = feed_roles[:n], feed_roles[n:]
    if inputs != [f"input:{i}" for i in range(n)] or any(len(p) != 1 for p in tensor_pos):
        return None
    if any(r == "rng" or r.startswith("input:") or r not in captured for r in rest):
        return None
    return [p[0] for p in tensor_pos], [captured[r] for r in rest]


def _direct_call(
    backend: str, graph: Any, positions: list[int], tensors: list[Tensor], *, single: bool
) -> Any:
    """The backend's direct call for a cache hit of ``graph`` (its ``bound_call``: binding,
    running and wrapping in one call), or None when the backend has none for it."""
    executable = getattr(graph, "executable", None)
    if executable is None:
        return None
    return backend_of(backend).bound_call(executable, positions, tensors, single=single)


def _make_binder(feed_roles: list[str], tensor_pos: list[tuple], captured: dict[str, Tensor]):
    """A function (args, kwargs) -> the feed arrays, in the executable's feed order
    (``tensor_pos``: the access path of each ``input:N``)."""
    simple = _simple_bind_plan(feed_roles, tensor_pos, captured)
    if simple is not None:
        # The common case (positional inputs, then parameters and buffers) gets a tight loop.
        positions, tensors = simple

        def bind_fast(args: tuple, kwargs: dict) -> list:
            return [args[i]._data for i in positions] + [t._data for t in tensors]

        return bind_fast
    plan: list[tuple[str, Any]] = []
    for role in feed_roles:
        kind, _, name = role.partition(":")
        if kind == "input":
            if name.isdigit():
                plan.append(("arg", tensor_pos[int(name)]))
            else:
                plan.append(("kw", name))
        elif role == "rng":
            plan.append(("rng", None))
        else:
            plan.append(("tensor", captured[role]))

    def bind(args: tuple, kwargs: dict) -> list:
        feeds = []
        for kind, ref in plan:
            if kind == "arg":
                feeds.append(_at(args, ref)._data)
            elif kind == "kw":
                feeds.append(kwargs[ref]._data)
            elif kind == "rng":
                feeds.append(_random.get_rng_state()._data)
            else:
                feeds.append(ref._data)
        return feeds

    return bind


def _make_finisher(
    result_roles: list[str],
    leaves: list,
    passthrough: dict,
    rebuild,
    captured: dict[str, Tensor],
    n_outputs: int,
    tensor_pos: list[tuple],
    returns_tensor: bool = False,
):
    """A function (args, kwargs, result arrays) -> the model's return structure; it also writes
    buffer updates (BatchNorm running statistics) and the advanced RNG state back."""
    out_index: list[int] = []
    writebacks: list[tuple[int, Any]] = []
    for i, role in enumerate(result_roles):
        if role.startswith("output:"):
            out_index.append(i)
        elif role == "update:rng":
            writebacks.append((i, "rng"))
        elif role.startswith("update:"):
            target = role[len("update:") :]
            writebacks.append((i, captured.get(target, target)))
        else:
            raise ValueError(f"unknown result role {role!r}")
    if len(out_index) != n_outputs:
        raise Unsupported(f"the executable returns {len(out_index)} outputs, the trace {n_outputs}")
    n_leaves = len(leaves)
    slots = [None] * n_leaves
    computed_slots = [j for j in range(n_leaves) if j not in passthrough]
    wrap = Tensor._wrap

    if not passthrough and not writebacks:
        if n_leaves == 1 and len(out_index) == 1:
            i0 = out_index[0]
            if returns_tensor:  # the model returned one tensor: no structure to rebuild
                return lambda args, kwargs, res: wrap(res[i0])
            return lambda args, kwargs, res: rebuild([wrap(res[i0])])

        def finish_plain(args, kwargs, res):
            return rebuild([wrap(res[i]) for i in out_index])

        return finish_plain

    def finish(args: tuple, kwargs: dict, res: list) -> Any:
        for i, target in writebacks:
            if target == "rng":
                _random.set_rng_state(res[i])
            elif isinstance(target, Tensor):
                if res[i] is not target._data:  # else the runtime already wrote it in place
                    np.copyto(target._data, res[i])
                target._version[0] += 1
            elif target.startswith("input:"):
                name = target[len("input:") :]
                t = kwargs[name] if not name.isdigit() else _at(args, tensor_pos[int(name)])
                np.copyto(t._data, res[i])
                t._version[0] += 1
        vals = list(slots)
        for j, i in zip(computed_slots, out_index, strict=True):
            vals[j] = wrap(res[i])
        for j, (kind, ref) in passthrough.items():
            vals[j] = _at(args, ref) if kind == "arg" else kwargs[ref]
        return rebuild(vals)

    return finish
