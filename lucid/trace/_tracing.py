"""Stage 1: record a Python call as a Trace, computing nothing.

``_tracing()`` installs a thread-local ``Tracer``; while it is installed the dispatch point hands
every op to ``Tracer.record`` instead of running it. Trace tensors carry shape, dtype and device
only. Concrete tensors reaching an op (parameters, buffers, anything captured) become feeds bound
by identity, never constants. Reading a value (``item()``, ``bool()``, ``numpy()``, ``tolist()``,
ops with data-dependent output shapes) raises ``GraphBreak`` naming the user's source line.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from lucid import _dtype
from lucid._state import state
from lucid._tensor import Tensor
from lucid.ops._registry import DATA_DEPENDENT, GRAD_SINK, OpDef
from lucid.trace._trace import Const, Feed, Trace, TraceOp, Value

__all__ = ["GraphBreak", "Tracer", "_tracing", "trace"]

_LUCID_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


class GraphBreak(RuntimeError):
    """A traced call read a tensor's value, so it cannot become one graph.

    ``what`` names the operation; ``filename``/``lineno`` point at the user's code that did it.
    """

    def __init__(self, what: str, filename: str | None = None, lineno: int | None = None):
        self.what = what
        self.filename = filename
        self.lineno = lineno
        where = ""
        if filename is not None:
            where = f" at {filename}:{lineno}"
            line = linecache.getline(filename, lineno or 0).strip()
            if line:
                where += f"\n    {line}"
        super().__init__(f"graph break: {what}{where}")


def user_location() -> tuple[str | None, int | None]:
    """The innermost frame of the call stack that is neither inside the ``lucid`` package nor
    in Python's standard library (``contextlib``'s wrapper of a ``no_grad`` block)."""
    frame = sys._getframe(1)
    while frame is not None:
        fn = frame.f_code.co_filename
        path = os.path.abspath(fn)
        if (
            not path.startswith(_LUCID_DIR)
            and not fn.startswith("<frozen")
            and not (path.startswith(_STDLIB_DIR) and "-packages" not in path)
        ):
            return fn, frame.f_lineno
        frame = frame.f_back
    return None, None


class Tracer:
    """Records the ops of one call. Get one from ``_tracing()``.

    ``model`` (optional, an ``nn.Module``) names captured parameters and buffers
    (``param:fc1.weight``, ``buffer:bn.running_mean``); other captured tensors are ``capture:N``.
    """

    def __init__(self, model: Any = None, *, locations: bool = False):
        self.trace = Trace()
        self.locations = locations  # record each op's user file:line (for IR debug info)
        self._values: dict[int, Value] = {}  # value id -> Value, for "is it one of mine"
        # id(tensor) -> (tensor, current Value): concrete tensors captured as feeds. The tensor is
        # kept alive so its id cannot be reused during the trace.
        self._captured: dict[int, tuple[Tensor, Value]] = {}
        self._feed_roles: dict[int, str] = {}  # feed value id -> role
        self._roles_taken: set[str] = set()
        self._updates: dict[int, str] = {}  # id(tensor) -> role of the update output
        self._names: dict[int, str] = _feed_names(model) if model is not None else {}
        self._feed_tensors: dict[str, Tensor] = {}  # role -> captured tensor
        self._tensor_roles: dict[int, str] = {}  # id(tensor) -> its feed role, kept across writes
        self._n_inputs = 0
        self._rng: Tensor | None = None  # the RNG-state feed, once a random op asked for it
        self._rng_step: Tensor | None = None
        self._rng_calls = 0
        self._n_captures = 0
        self.finished = False
        self.parent: Tracer | None = None  # the trace this one is nested in, if any
        # A trace begun with gradients on differentiates what it records; ops recorded inside a
        # ``no_grad`` block then get a ``detach`` (eager gives their inputs no gradient).
        self._grad_trace = state.grad_enabled
        # Tensors that alias another's memory in eager (``record_view``): id(view) -> (view, its
        # base, the ``index`` items when it is a slice, else the op that made it), id(base) ->
        # its views, and the values of views their base has since overwritten (reading one is
        # a graph break: eager would see the write, the trace would not).
        self._views: dict[int, tuple[Tensor, Tensor, Any]] = {}
        self._derived: dict[int, list[Tensor]] = {}
        self._stale: set[int] = set()
        self._writing_through: Tensor | None = None

    # --- feeds ----------------------------------------------------------------------------------
    def _new_value(self, shape: tuple, dt: _dtype.dtype) -> Value:
        shape = tuple(shape)
        if not all(type(d) is int or d is None for d in shape):
            # inference may hand back numpy integers; the trace (and its JSON) holds Python ints
            shape = tuple(None if d is None else int(d) for d in shape)
        v = Value(len(self._values), shape, dt)
        self._values[v.id] = v
        return v

    def _add_feed(self, shape: tuple, dt: _dtype.dtype, role: str) -> Value:
        if role in self._roles_taken:
            raise ValueError(f"the trace already has a feed with role {role!r}")
        self._roles_taken.add(role)
        v = self._new_value(shape, dt)
        self.trace.feeds.append(Feed(v, role))
        self._feed_roles[v.id] = role
        return v

    def input(
        self, shape: tuple, dtype: Any = _dtype.float32, *, role: str | None = None
    ) -> Tensor:
        """A new trace tensor fed by the caller (role ``input:N`` unless given). A None dim is
        symbolic."""
        if role is None:
            role = f"input:{self._n_inputs}"
            self._n_inputs += 1
        return Tensor._traced(self._add_feed(tuple(shape), _dtype.canonical(dtype), role))

    def input_like(self, example: Tensor, *, role: str | None = None) -> Tensor:
        t = self.input(tuple(example.shape), example.dtype, role=role)
        t._requires_grad = example.requires_grad
        return t

    def _capture(self, t: Tensor) -> Value:
        hit = self._captured.get(id(t))
        if hit is not None:
            return hit[1]
        role = self._names.get(id(t))
        if role is None:
            role = f"capture:{self._n_captures}"
            self._n_captures += 1
        v = self._add_feed(tuple(t.shape), t.dtype, role)
        self._captured[id(t)] = (t, v)
        self._tensor_roles[id(t)] = role
        self._feed_tensors[role] = t
        return v

    def _operand(self, x: Any) -> Value | Const:
        if isinstance(x, Tensor):
            tv = x._trace
            if tv is not None:
                if self._values.get(tv.id) is tv:
                    if self._stale and tv.id in self._stale:
                        self.graph_break(
                            "a read of a view (a slice, transpose or reshape) whose tensor was "
                            "since written in place"
                        )
                    return tv
                self._check_enclosing(tv)
            return self._capture(x)
        if isinstance(x, (bool, int, float)):
            return Const(x)
        if isinstance(x, (np.bool_, np.integer, np.floating)):
            return Const(x.item())
        raise TypeError(
            f"expected a Tensor or a number as operand, got {type(x).__name__} during tracing"
        )

    def _check_enclosing(self, tv: Value) -> None:
        """A trace tensor of another trace may only come from an enclosing, active trace (it is
        then a feed of this one); one from a finished trace has no value to feed."""
        outer = self.parent
        while outer is not None:
            if outer._values.get(tv.id) is tv and not outer.finished:
                return
            outer = outer.parent
        raise RuntimeError(
            f"a trace tensor (shape {tuple(tv.shape)}, {tv.dtype}) from another, finished trace "
            "reached this trace; it has no value. Keep trace tensors inside their own trace"
        )

    # --- the hooks the eager core calls ---------------------------------------------------------
    def record(self, opdef: OpDef, operands: tuple, attrs: dict) -> Any:
        """Record one op (called by ``lucid._dispatch.apply``) and return its trace tensors."""
        if self.finished:
            raise RuntimeError("this trace is finished; no more ops can be recorded into it")
        if DATA_DEPENDENT in opdef.props:
            self.graph_break(f"op {opdef.name!r} (its output shape depends on input values)")
        if len(operands) != len(opdef.operands):
            raise TypeError(
                f"{opdef.name}() takes {len(opdef.operands)} operands "
                f"({', '.join(opdef.operands)}), got {len(operands)}"
            )
        inputs: list = []
        infer_args: list = []
        needs_grad = False
        last = len(operands) - 1 if opdef.variadic else -1
        for i, x in enumerate(operands):
            if i == last:
                if not isinstance(x, (list, tuple)):
                    raise TypeError(
                        f"{opdef.name}(): operand {opdef.operands[-1][:-1]!r} must be a sequence"
                    )
                group = [self._operand(e) for e in x]
                inputs.append(group)
                infer_args.append([e.value if isinstance(e, Const) else e for e in group])
                needs_grad = needs_grad or any(
                    isinstance(e, Tensor) and e._requires_grad for e in x
                )
                continue
            o = self._operand(x)
            inputs.append(o)
            infer_args.append(o.value if isinstance(o, Const) else o)
            needs_grad = needs_grad or (isinstance(x, Tensor) and x._requires_grad)
        avals = opdef.infer(*infer_args, **attrs)
        single = opdef.n_outputs == 1
        if single:
            avals = (avals,)
        outputs = [self._new_value(tuple(av.shape), av.dtype) for av in avals]
        loc = None
        if self.locations:
            filename, lineno = user_location()
            loc = (filename, lineno) if filename is not None else None
        self.trace.ops.append(TraceOp(opdef.name, inputs, outputs, dict(attrs), loc))
        if needs_grad and self._grad_trace and not state.grad_enabled:
            outputs = [self._detached(v, loc) for v in outputs]
        needs_grad = needs_grad and state.grad_enabled and GRAD_SINK not in opdef.props
        outs = []
        for v in outputs:
            t = Tensor._traced(v)
            t._requires_grad = needs_grad and v.dtype.is_floating_point
            outs.append(t)
        return outs[0] if single else tuple(outs)

    def _detached(self, v: Value, loc: Any) -> Value:
        if not v.dtype.is_floating_point:
            return v
        d = self._new_value(v.shape, v.dtype)
        self.trace.ops.append(TraceOp("detach", [v], [d], {}, loc))
        return d

    def record_view(self, view: Tensor, base: Tensor) -> None:
        """``view`` aliases ``base``'s memory in eager (``lucid.ops._front.alias_version``): an
        in-place write through one must be seen through the other. A write to a slice is
        written back into its base (``index_put`` at the slice); a write to another view (a
        transpose, a reshape) is a graph break; a view whose base is written is stale."""
        tv = view._trace
        if tv is None:
            return
        last = self.trace.ops[-1] if self.trace.ops else None
        how: Any = "view"
        if last is not None and last.outputs and last.outputs[0] is tv:
            how = last.name
            if last.name == "index" and not last.inputs[1]:  # basic indexing: a slice
                how = ("index", last.attrs["index"])
        self._views[id(view)] = (view, base, how)
        self._derived.setdefault(id(base), []).append(view)

    def _after_write(self, tensor: Tensor) -> None:
        """``tensor`` was just written in place: its views are stale, and a view's write goes
        on to its base."""
        for view in self._derived.get(id(tensor), ()):
            if view is not self._writing_through:
                self._mark_stale(view)
        entry = self._views.get(id(tensor))
        if entry is None:
            return
        _, base, how = entry
        if not isinstance(how, tuple):
            self.graph_break(f"an in-place write to a view made by {how!r} (its base would change)")
        from lucid._dispatch import apply

        index = how[1]
        previous, self._writing_through = self._writing_through, tensor
        try:
            base._apply_inplace(
                lambda alias, v: apply("index_put", alias, v, [], index=index, accumulate=False),
                tensor,
            )
        finally:
            self._writing_through = previous

    def _mark_stale(self, view: Tensor) -> None:
        if view._trace is not None:
            self._stale.add(view._trace.id)
        for inner in self._derived.get(id(view), ()):
            self._mark_stale(inner)

    def record_inplace(self, tensor: Tensor, out: Tensor) -> None:
        """``tensor`` was overwritten with ``out``: later reads see ``out``; a written feed
        becomes an extra output (``update:<its role>``) so a backend can write it back."""
        if tuple(out.shape) != tuple(tensor.shape):
            raise RuntimeError(
                f"in-place result has shape {tuple(out.shape)}, which does not match the "
                f"tensor's shape {tuple(tensor.shape)}"
            )
        if out.dtype is not tensor.dtype:
            from lucid._dispatch import apply

            out = apply("cast", out, dtype=tensor.dtype)
        new = self._operand(out)
        key = id(tensor)
        tv = tensor._trace
        if tv is not None and self._values.get(tv.id) is tv:
            role = self._tensor_roles.get(key) or self._feed_roles.get(tv.id)
            tensor._trace = new
            if role is not None:
                # An in-place write to a traced input: it is written back like a buffer.
                self._tensor_roles[key] = role
                self._captured[key] = (tensor, new)
                self._updates[key] = "update:" + role
        else:
            self._capture(tensor)
            self._updates[key] = "update:" + self._tensor_roles[key]
            self._captured[key] = (tensor, new)
        if self._views:  # filled with _derived by record_view
            self._after_write(tensor)

    def next_rng(self) -> Tensor:
        """The RNG state for one random op (``lucid._random.next_rng`` asks here under a trace).

        The global state becomes one feed with role ``rng``; the k-th random op gets the feed with
        its counter advanced by k, as eager runs would, and the advanced state is written back
        through an ``update:rng`` output.
        """
        if self._rng is None:
            self._rng = Tensor._traced(self._add_feed((2,), _dtype.int64, "rng"))
        k = self._rng_calls
        self._rng_calls += 1
        return self._rng if k == 0 else self._advanced_rng(k)

    def _advanced_rng(self, k: int) -> Tensor:
        from lucid._dispatch import apply

        if self._rng_step is None:
            self._rng_step = apply("iota", self._rng, dim=0)  # (0, 1): moves the counter only
        return apply("add", self._rng, apply("mul", self._rng_step, k))

    def graph_break(self, what: str, tensor: Tensor | None = None) -> Any:
        """Raise ``GraphBreak`` for ``what``, pointing at the user's source line."""
        raise GraphBreak(what, *user_location())

    # --- result ---------------------------------------------------------------------------------
    def finish(self, outputs: Any) -> Trace:
        """Mark ``outputs`` (a tensor, or nested tuples/lists/dicts of them) as the trace's
        results, append the in-place updates of feeds, and return the Trace."""
        if self.finished:
            raise RuntimeError("finish() was already called on this trace")
        flat: list[Tensor] = []
        _flatten(outputs, flat)
        for i, t in enumerate(flat):
            self.trace.outputs.append((f"output:{i}", self._operand(t)))
        for key, role in self._updates.items():
            self.trace.outputs.append((role, self._captured[key][1]))
        if self._rng is not None:
            advanced = self._advanced_rng(self._rng_calls)
            self.trace.outputs.append(("update:rng", advanced._trace))
        self.finished = True
        return self.trace

    def feed_tensors(self) -> dict[str, Tensor]:
        """The concrete tensors bound to the trace's captured feeds, by role (for binding)."""
        return dict(self._feed_tensors)


def _flatten(x: Any, out: list) -> None:
    if isinstance(x, Tensor):
        out.append(x)
    elif isinstance(x, (tuple, list)):
        for e in x:
            _flatten(e, out)
    elif isinstance(x, dict):
        for e in x.values():
            _flatten(e, out)
    else:
        raise TypeError(
            f"a traced function must return tensors (or tuples/lists/dicts of them), "
            f"got {type(x).__name__}"
        )


def _feed_names(model: Any) -> dict[int, str]:
    names: dict[int, str] = {}
    for method, kind in (("named_parameters", "param"), ("named_buffers", "buffer")):
        fn = getattr(model, method, None)
        if fn is None:
            continue
        for name, t in fn():
            if t is not None:
                names.setdefault(id(t), f"{kind}:{name}")
    return names


@contextmanager
def _tracing(model: Any = None, *, locations: bool = False) -> Iterator[Tracer]:
    """Install a ``Tracer`` on this thread for the ``with`` block and yield it.

    Traces nest (the inner one is active inside its block) and do not see other threads' ops.
    ``locations=True`` records each op's user source line (shown with ``print_ir(...,
    debuginfo=True)``); it costs a stack walk per op, so it is off by default.
    """
    tracer = Tracer(model, locations=locations)
    prev = state.tracer
    tracer.parent = prev
    state.tracer = tracer
    try:
        yield tracer
    finally:
        state.tracer = prev


def trace(fn: Callable, *example_inputs: Any, model: Any = None, locations: bool = False) -> Trace:
    """Trace ``fn(*example_inputs)``: tensors become ``input:N`` feeds of their shape and dtype;
    other arguments are passed through as Python constants."""
    if model is None and hasattr(fn, "named_parameters"):
        model = fn
    with _tracing(model, locations=locations) as tracer:
        args = [tracer.input_like(x) if isinstance(x, Tensor) else x for x in example_inputs]
        return tracer.finish(fn(*args))
