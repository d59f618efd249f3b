"""One call that builds a whole training step as a module in the ``lucid`` dialect.

``build_training_module(model, loss_fn, example_inputs, optimizer=None)`` traces
``loss_fn(model(x), *extra)`` (and, with an optimizer, the optimizer's update against ghost
gradient feeds) into one function, then runs ``vjp`` (and ``ghost-grads``,
``optimizer-fusion``) and ``canonicalize,cse,dce``. The entry points (``make_step``,
``fused_step``, ``compile_optimizer``) build on it; the result is returned as a
``TrainingModule`` that knows how to feed the function and write its updates back:

>>> tm = build_training_module(model, F.cross_entropy, (x, target), optimizer=opt)
>>> results = interpret(tm.module, tm.feed_values(x, target))   # or a backend executable
>>> loss = tm.write_back(results)        # parameters, optimizer state and buffers updated
>>> tm.refresh_scalars()                 # the next step's learning rate, bias corrections...

Feeds: ``input:N`` (the example inputs, in order), ``param:<name>``, ``buffer:<name>``,
``state:<param name>.<key>`` (optimizer state), ``scalar:<group>:<key>`` (0-d step scalars:
learning rate, bias corrections; fed, never baked in, so a scheduler never forces a rebuild;
``scalar:<group>.<k>:<key>`` when parameters of a group disagree; in the dtype eager arithmetic
gives the Python float, i.e. the parameters', with ``:<dtype>`` appended unless float32),
``rng`` when the model draws random numbers. Results: ``output:0`` (the loss), then either
``grad:param:<name>`` (no optimizer) or the in-place updates ``update:param:<name>``,
``update:state:<name>.<key>`` (with an optimizer), plus ``update:buffer:<name>`` and
``update:rng`` when the forward writes them.

``build_optimizer_module(optimizer)`` builds the optimizer step alone (gradients as
``grad:param:<g>.<i>`` feeds read from each parameter's ``.grad``), for ``compile_optimizer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import lucid
from lucid import _dtype as lucid_dtype
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.compile.diagnose import check_vjp_coverage
from lucid.compile.training.update_terms import GradClip, LossScaling
from lucid.ir import _xdsl as x
from lucid.ir.importer import feed_roles, forward_func, import_trace, result_roles
from lucid.passes import Instrumentation, PassFailure, PassManager, parse_pipeline_spec
from lucid.passes.ghost_grads import GhostGrads
from lucid.passes.grad_allreduce import GradAllReduce, cut_at_allreduce
from lucid.passes.optimizer_fusion import OptimizerFusion
from lucid.passes.vjp import VJP
from lucid.trace._tracing import _tracing

__all__ = [
    "TrainingModule",
    "build_optimizer_module",
    "build_training_module",
]


@dataclass
class _ScalarSource:
    role: str
    group: dict
    param: Tensor
    key: str


@dataclass
class OptimizerBindings:
    """What a traced update assumes of the optimizer's state when it runs again: the state
    tensors it reads and writes, and, per parameter group whose step scalars are one feed
    shared by the group and read from the state (Adam's bias corrections), the parameters it
    updates, whose state must still agree on those scalars. A user who replaces a state tensor
    (``opt.state[p]["exp_avg"] = ...``), or parameters of one group whose step counts drift apart
    (one frozen, then trained again), invalidate the compiled update (``_OptimizerView.stale``).
    """

    state: list[tuple[Tensor, str, Tensor]] = field(default_factory=list)  # (param, key, tensor)
    shared_steps: list[tuple[int, list[Tensor]]] = field(default_factory=list)
    _checks: tuple | None = None

    def checks(self) -> tuple[list, list]:
        """The per-call checks, grouped once: (param, ((key, tensor), ...)) per parameter, and
        (group, its parameters, their bound ``step`` tensors, or None when one has none) per
        shared group."""
        if self._checks is None:
            per: dict[int, tuple[Tensor, list]] = {}
            for p, k, t in self.state:
                per.setdefault(id(p), (p, []))[1].append((k, t))
            steps = {id(p): t for p, k, t in self.state if k == "step"}
            shared = []
            for gi, params in self.shared_steps:
                bound = [steps.get(id(p)) for p in params]
                # ``is``: ``None in bound`` would compare tensors with ==.
                shared.append((gi, params, None if any(t is None for t in bound) else bound))
            self._checks = ([(p, tuple(pairs)) for p, pairs in per.values()], shared)
        return self._checks


@dataclass
class TrainingModule:
    """A traced training step and what is needed to run it.

    ``feeds`` holds the concrete tensors bound to the captured feeds (parameters, buffers,
    optimizer state, other captured tensors) by role; ``scalars`` the current value of every
    ``scalar:`` feed. ``n_inputs`` feeds ``input:0..n-1`` come from the caller.
    """

    module: x.ModuleOp
    feed_roles: list[str]
    result_roles: list[str]
    feeds: dict[str, Tensor]
    scalars: dict[str, float]
    n_inputs: int
    optimizer: Any = None
    params: dict[str, Tensor] = field(default_factory=dict)
    _scalar_sources: list[_ScalarSource] = field(default_factory=list)
    # grad:param:<name> feeds of an optimizer-only module: role -> the parameter (its .grad)
    grad_feeds: dict[str, Tensor] = field(default_factory=dict)
    # What made ``module``: the trace, the pipeline run on its import (a spec ``lucid-opt``
    # takes) and the ms of each pass (for parity bisection and the steps' introspection).
    trace: Any = None
    pipeline: str = ""
    passes_ms: dict[str, float] = field(default_factory=dict)
    # With ``grad_allreduce_mb``: the gradient roles of each ``bucket:<i>`` result, in the
    # order they are concatenated in it.
    buckets: list[list[str]] = field(default_factory=list)
    # numpy dtype of every scalar: feed (float32 unless the role names another)
    scalar_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    # index in result_roles of the total gradient norm (``grad_clip`` with a max_norm)
    grad_norm_index: int | None = None
    # the optimizer state the traced update binds (None: no optimizer, or a loaded step)
    bindings: OptimizerBindings | None = None

    def scalar_array(self, role: str) -> np.ndarray:
        """A fresh 0-d array holding scalar feed ``role``'s current value, in its dtype."""
        return np.array(self.scalars[role], dtype=self.scalar_dtypes.get(role, np.float32))

    def feed_values(self, *inputs: Any) -> dict[str, np.ndarray]:
        """Every feed's current value, by role (the inputs given, then captured tensors,
        step scalars and the RNG state)."""
        if len(inputs) != self.n_inputs:
            raise TypeError(f"the training step takes {self.n_inputs} inputs, got {len(inputs)}")
        values: dict[str, np.ndarray] = {}
        for i, t in enumerate(inputs):
            values[f"input:{i}"] = t._data if isinstance(t, Tensor) else np.asarray(t)
        for role, t in self.feeds.items():
            values[role] = t._data
        for role, p in self.grad_feeds.items():
            if p.grad is None:
                raise RuntimeError(f"{role}: the parameter has no gradient to feed")
            values[role] = p.grad._data
        for role in self.scalars:
            values[role] = self.scalar_array(role)
        if "rng" in self.feed_roles:
            from lucid import _random

            values["rng"] = _random.get_rng_state()._data
        return {r: values[r] for r in self.feed_roles}

    def write_back(self, results: Sequence[Any]) -> np.ndarray:
        """Write every ``update:<role>`` result into the tensor bound to ``<role>`` (in place);
        return the loss (``output:0``)."""
        loss = None
        for role, value in zip(self.result_roles, results, strict=True):
            if role == "output:0":
                loss = np.asarray(value)
            elif role.startswith("update:"):
                target = role[len("update:") :]
                if target == "rng":
                    from lucid import _random

                    _random.set_rng_state(np.asarray(value))
                    continue
                t = self.feeds[target]
                t._data[...] = np.asarray(value, dtype=t._data.dtype)
                t._version[0] += 1
        return loss

    def refresh_scalars(self) -> dict[str, float]:
        """Recompute the step scalars from the optimizer (after a step was written back, or the
        learning rate changed) and return them."""
        if self.optimizer is None:
            return self.scalars
        cache: dict[int, dict] = {}
        fresh: dict[str, float] = {}
        for src in self._scalar_sources:
            key = id(src.param)
            if key not in cache:
                st = self.optimizer.state.get(src.param, {})
                cache[key] = self.optimizer._step_scalars(src.group, st, False)
            value = float(cache[key][src.key])
            if fresh.setdefault(src.role, value) != value:
                raise RuntimeError(
                    f"step scalar {src.role!r} is shared by the group's parameters but now "
                    f"differs between them ({fresh[src.role]} vs {value}): rebuild the training "
                    "module"
                )
        self.scalars.update(fresh)
        return self.scalars


def _outside_trace(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` eagerly although a tracer is installed (optimizer state creation)."""
    prev = _state.tracer
    _state.tracer = None
    try:
        with lucid.no_grad():
            return fn()
    finally:
        _state.tracer = prev


def build_training_module(
    model: Any,
    loss_fn: Callable[..., Tensor],
    example_inputs: Sequence[Any],
    optimizer: Any = None,
    *,
    fuse_optimizer: bool = True,
    keep_grads: bool = False,
    pipeline: str = "canonicalize,cse,dce",
    instrumentation: Instrumentation | None = None,
    grad_clip: GradClip | None = None,
    loss_scaling: LossScaling | None = None,
    masters: dict[int, Tensor] | None = None,
    grad_allreduce_mb: float | None = None,
) -> TrainingModule:
    """Trace and differentiate one training step of ``model``.

    The loss is ``loss_fn(model(example_inputs[0]), *example_inputs[1:])``. Without an optimizer
    the module returns the loss and the gradient of every parameter that requires grad; with
    one, it also applies the optimizer's update (gradients reach it through ghost feeds bound by
    ``ghost-grads``) and returns the parameters' and state's new values as ``update:`` results
    (``keep_grads=True`` keeps the gradients too). ``grad_clip`` clips the gradients the update
    sees; with a ``max_norm`` the total norm before clipping is result ``output:1``.
    ``loss_scaling`` (with an optimizer) differentiates the scaled loss (the last ``output:``)
    and makes the update conditional on finite gradients (see ``LossScaling``). ``masters``
    maps ``id(master)`` to the model's parameter for each float32 master weight the optimizer
    holds in place of a half-precision parameter: the gradient is widened to float32, the
    master updated (``master:<name>``) and the parameter set to it rounded to its dtype.
    ``pipeline`` runs last. ``instrumentation`` (the pass manager's printing and timing
    switches) covers every pass, as one pipeline.

    ``grad_allreduce_mb`` (no optimizer): run ``grad-allreduce`` with that bucket cap after
    ``vjp``, then cut the function just before the collectives: the ``grad:`` results become
    ``bucket:<i>`` results (flat buffers the host reduces; ``buckets`` lists their gradients).
    """
    if grad_allreduce_mb is not None and optimizer is not None:
        raise ValueError("build_training_module: grad_allreduce_mb takes no optimizer")
    if grad_clip is not None and optimizer is None:
        raise ValueError("build_training_module: grad_clip needs an optimizer (it clips its input)")
    if loss_scaling is not None and optimizer is None:
        raise ValueError("build_training_module: loss_scaling needs an optimizer")
    example_inputs = tuple(example_inputs)
    if not example_inputs:
        raise TypeError("build_training_module needs at least one example input (the model's)")
    names = {id(p): n for n, p in model.named_parameters()}
    with _tracing(model) as tracer:
        args = [tracer.input_like(t) if isinstance(t, Tensor) else t for t in example_inputs]
        loss = loss_fn(model(args[0]), *args[1:])
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError("build_training_module: loss_fn must return a one-element tensor")
        used = tracer.trace.feeds_reaching([loss._trace])
        trained = [
            p for n, p in model.named_parameters() if p.requires_grad and f"param:{n}" in used
        ]
        scalars: dict[str, float] = {}
        scalar_dtypes: dict[str, np.dtype] = {}
        sources: list[_ScalarSource] = []
        bindings = None
        grad_norm = None
        outputs = [loss]
        scaled_loss = None
        if loss_scaling is not None:  # with the scale before the update changes it
            loss_scaling.name_feeds(tracer)
            scaled_loss = loss * loss_scaling.scale  # what backward differentiates
        if optimizer is not None:
            sources, grad_norm, bindings = _trace_update(
                tracer,
                optimizer,
                trained,
                names,
                scalars,
                scalar_dtypes,
                grad_clip=grad_clip,
                loss_scaling=loss_scaling,
                masters=masters,
            )
        if grad_norm is not None:
            outputs.append(grad_norm)
        if scaled_loss is not None:
            outputs.append(scaled_loss)
        trace = tracer.finish(outputs)
    check_vjp_coverage(trace)
    module = import_trace(trace)
    fn = forward_func(module)
    wrt = " ".join(f"param:{names[id(p)]}" for p in trained)
    differentiated = f"output:{len(outputs) - 1}" if loss_scaling is not None else "output:0"
    passes: list[x.ModulePass] = [VJP(wrt=wrt, loss=differentiated)] if trained else []
    allreduce = None
    if grad_allreduce_mb is not None and trained:
        allreduce = GradAllReduce(bucket_cap_mb=grad_allreduce_mb)
        passes.append(allreduce)
    if optimizer is not None and trained:
        if fuse_optimizer:
            # Before ghost-grads, the gradients are still feeds: each update chain starts at
            # them and never absorbs part of the backward graph, so all chains look alike.
            passes.append(OptimizerFusion())
        passes.append(GhostGrads(keep_grads=keep_grads))
    autodiff = {p.name for p in passes}
    passes.extend(parse_pipeline_spec(pipeline))
    try:
        report = PassManager(passes, instrumentation).run(module)
    except PassFailure as e:  # the pass's own error (e.g. an op with no VJP rule) is the message
        if e.pass_name in autodiff:
            raise e.cause from None
        raise
    fn = forward_func(module)
    buckets: list[list[str]] = []
    if allreduce is not None:
        buckets = allreduce.buckets
        cut_at_allreduce(fn, buckets)
    roles = feed_roles(fn)
    feeds = _kept_feeds(tracer, roles)
    results = result_roles(fn)
    return TrainingModule(
        module=module,
        feed_roles=roles,
        result_roles=results,
        grad_norm_index=results.index("output:1") if grad_norm is not None else None,
        feeds=feeds,
        scalars=scalars,
        scalar_dtypes=scalar_dtypes,
        n_inputs=sum(isinstance(t, Tensor) for t in example_inputs),
        optimizer=optimizer,
        params={f"param:{names[id(p)]}": p for p in trained},
        _scalar_sources=sources,
        bindings=bindings,
        trace=trace,
        pipeline=",".join(str(p.spec()) for p in passes),
        passes_ms=report.passes_ms(),
        buckets=buckets,
    )


class _FedScalar:
    """An optimizer step scalar while its update is traced, standing in for the Python float
    eager passes: weakly typed like that float. Where it meets a tensor it becomes a 0-d feed in
    the dtype the float would take there (a floating tensor's own dtype), created on first use:
    float64 parameters see the learning rate at float64, float32 ones at float32, and 0-d float32
    state (NAdam's ``mu_product``) at float32, exactly as in eager."""

    __slots__ = ("_feed_in", "_key")

    def __init__(self, key: str, feed_in: Callable[[Any], Tensor]):
        self._key = key
        self._feed_in = feed_in

    def _as_feed(self, other: Any, op: str) -> Tensor:
        if not isinstance(other, Tensor):
            raise TypeError(
                f"the optimizer's update uses its step scalar {self._key!r} with "
                f"{type(other).__name__} in {op!r}: a traced update may only do arithmetic "
                "between a step scalar and a tensor (compute derived numbers in _step_scalars)"
            )
        return self._feed_in(lucid_dtype.result_type(other, 1.0))

    def __repr__(self) -> str:
        return f"<step scalar {self._key!r}>"


def _fed_scalar_operator(name: str, reflected: bool) -> Callable[[_FedScalar, Any], Tensor]:
    def method(self: _FedScalar, other: Any) -> Tensor:
        fed = self._as_feed(other, name)
        return (
            getattr(other, f"__{name}__")(fed) if reflected else getattr(fed, f"__{name}__")(other)
        )

    return method


for _name in ("add", "sub", "mul", "truediv", "pow"):
    setattr(_FedScalar, f"__{_name}__", _fed_scalar_operator(_name, False))
    # ``tensor * scalar``: Tensor.__mul__ declines an unknown operand, so Python asks us.
    setattr(_FedScalar, f"__r{_name}__", _fed_scalar_operator(_name, True))


def _trace_update(
    tracer,
    optimizer,
    trained,
    names,
    scalars,
    scalar_dtypes,
    grad_role: str = "ghost:param:",
    grad_clip: GradClip | None = None,
    write_back_clipped: bool = False,
    loss_scaling: LossScaling | None = None,
    masters: dict[int, Tensor] | None = None,
) -> tuple[list[_ScalarSource], Tensor | None, OptimizerBindings]:
    """Record the optimizer's update of ``trained`` against ghost gradient feeds (clipped by
    ``grad_clip`` first, and with ``write_back_clipped`` the clipped gradients written back to
    their feeds, as eager clipping does to ``p.grad``); return the scalar sources and the total
    gradient norm (or None), and what the update binds of the optimizer's state.

    A step scalar with the same value for every parameter of a group (the usual case: they
    share their options and step count) is one feed ``scalar:<group>:<key>``; otherwise each
    parameter gets its own, ``scalar:<group>.<k>:<key>``. The feed has the dtype eager
    arithmetic gives the Python float (``_FedScalar``); a dtype other than float32 is appended
    to the role (``scalar:0:lr:float64``), so a group mixing dtypes gets one feed per dtype.
    ``loss_scaling`` unscales the gradients before clipping and keeps each update only when
    they are all finite, then updates the scale. ``masters``: as for ``build_training_module``."""
    masters = masters or {}
    trained_ids = {id(p) for p in trained}
    trained_ids |= {mid for mid, p in masters.items() if id(p) in trained_ids}
    saved = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) in masters:  # named before the placeholders below capture it
                tracer._names[id(p)] = f"master:{names[id(masters[id(p)])]}"
            saved[id(p)] = (p, p._grad)
            # Placeholders so _param_updates yields exactly the parameters that get a gradient.
            p._grad = lucid.zeros_like(p) if id(p) in trained_ids else None
    try:
        items = _outside_trace(lambda: list(optimizer._param_updates()))
    finally:
        for p, g in saved.values():
            p._grad = g
    group_index = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
    static = type(optimizer)._static_keys
    values_by_key: dict[tuple[int, str], set] = {}
    for param, _, _, step_scalars in items:
        for key, value in step_scalars.items():
            if key not in static:
                values_by_key.setdefault((group_index[id(param)], key), set()).add(float(value))
    fed_tensors: dict[str, Tensor] = {}
    sources: list[_ScalarSource] = []
    sourced: set[tuple[int, str]] = set()
    bindings = OptimizerBindings(shared_steps=_shared_steps(optimizer, items, group_index, static))

    def feeder(base: str, gi: int, param: Tensor, key: str, value: float):
        def feed_in(dt: Any) -> Tensor:
            role = base if dt is lucid.float32 else f"{base}:{dt.name}"
            if role not in fed_tensors:
                scalars[role] = value
                scalar_dtypes[role] = dt.numpy
                fed_tensors[role] = tracer.input((), dt, role=role)
            if (id(param), role) not in sourced:
                sourced.add((id(param), role))
                sources.append(_ScalarSource(role, optimizer.param_groups[gi], param, key))
            return fed_tensors[role]

        return feed_in

    with lucid.no_grad():
        grads = []
        for param, _placeholder, st, _ in items:
            model_param = masters.get(id(param), param)
            if id(model_param) not in names:
                raise ValueError("the optimizer holds a parameter that is not the model's")
            pname = names[id(model_param)]
            for key, t in st.items():
                if isinstance(t, Tensor):
                    tracer._names[id(t)] = f"state:{pname}.{key}"
                    bindings.state.append((param, key, t))
            grad = tracer.input(
                tuple(model_param.shape), model_param.dtype, role=f"{grad_role}{pname}"
            )
            if model_param is not param:
                grad = grad.to(param.dtype)
            grads.append(grad)
        grad_norm = None
        finite = None
        fed_grads = grads
        if loss_scaling is not None:
            grads, finite = loss_scaling.unscale(grads)
        if grad_clip is not None:
            grads, grad_norm = grad_clip.apply(grads)
        if write_back_clipped and grads is not fed_grads:
            for fed_grad, changed in zip(fed_grads, grads, strict=True):
                fed_grad.copy_(changed)
        for k, ((param, _placeholder, st, step_scalars), grad) in enumerate(
            zip(items, grads, strict=True)
        ):
            gi = group_index[id(param)]
            fed: dict[str, Any] = {}
            for key, value in step_scalars.items():
                if key in static:
                    fed[key] = value
                    continue
                shared = len(values_by_key[(gi, key)]) == 1
                base = f"scalar:{gi}:{key}" if shared else f"scalar:{gi}.{k}:{key}"
                fed[key] = _FedScalar(key, feeder(base, gi, param, key, float(value)))
            # A skipped step leaves the parameter and its state as they were.
            written = [param, *(t for t in st.values() if isinstance(t, Tensor))]
            before = [lucid.clone(t) for t in written] if finite is not None else []
            try:
                optimizer._update(param, grad, st, **fed)
            except TypeError as e:
                if "_FedScalar" not in str(e):
                    raise
                raise TypeError(
                    f"{type(optimizer).__name__}._update passes a step scalar to a function or "
                    "method; a traced update may only combine step scalars with tensors through "
                    f"+, -, *, / and ** ({e})"
                ) from None
            if finite is not None:
                for t, old in zip(written, before, strict=True):
                    t.copy_(lucid.where(finite, t, old))
            model_param = masters.get(id(param))
            if model_param is not None:
                model_param.copy_(param)  # rounded to the parameter's dtype
        if loss_scaling is not None:
            loss_scaling.update_scale(finite)
    return sources, grad_norm, bindings


def _shared_steps(
    optimizer: Any, items: list, group_index: dict[int, int], static: frozenset
) -> list[tuple[int, list[Tensor]]]:
    """(group, its updated parameters) of each group whose step scalars are read from the
    state (``_step_scalars`` of an empty state raises) and agree over those parameters now, so
    the trace feeds them once for the group."""
    members: dict[int, list] = {}
    for param, _, _, step_scalars in items:
        members.setdefault(group_index[id(param)], []).append((param, step_scalars))
    out = []
    for gi, pairs in members.items():
        if len(pairs) < 2:
            continue
        try:
            optimizer._step_scalars(optimizer.param_groups[gi], {}, False)
            continue  # the scalars do not read the state: they cannot drift apart
        except KeyError:
            pass
        first = pairs[0][1]
        if any(
            float(s[k]) != float(first[k]) for _, s in pairs[1:] for k in first if k not in static
        ):
            continue  # fed per parameter already
        out.append((gi, [p for p, _ in pairs]))
    return out


def build_optimizer_module(
    optimizer: Any,
    *,
    fuse_optimizer: bool = True,
    instrumentation: Instrumentation | None = None,
    grad_clip: GradClip | None = None,
    loss_scaling: LossScaling | None = None,
) -> TrainingModule:
    """The optimizer's step alone as a module (what ``compile_optimizer`` runs): it takes
    ``param:<g>.<i>`` (parameter ``i`` of group ``g``), ``grad:param:<g>.<i>`` (its ``.grad``),
    ``state:<g>.<i>.<key>`` and ``scalar:`` feeds and returns the ``update:`` results, for the
    parameters that have a gradient now (as ``step()`` skips the others). Identical update
    chains are fused unless ``fuse_optimizer=False``. ``grad_clip`` clips the gradients first
    (written back as ``update:grad:param:*``, as eager clipping changes ``p.grad``); with a
    ``max_norm`` the total norm before clipping is result ``output:0``. ``loss_scaling``
    unscales the gradients first (written back too, as ``GradScaler.unscale_``), keeps the
    update only when they are all finite and updates the scale."""
    names = {
        id(p): f"{gi}.{i}"
        for gi, g in enumerate(optimizer.param_groups)
        for i, p in enumerate(g["params"])
    }
    trained = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not trained:
        raise ValueError("build_optimizer_module: no parameter has a gradient")
    scalars: dict[str, float] = {}
    scalar_dtypes: dict[str, np.dtype] = {}
    with _tracing() as tracer:
        for p in trained:
            tracer._names[id(p)] = f"param:{names[id(p)]}"
        if loss_scaling is not None:
            loss_scaling.name_feeds(tracer)
        sources, grad_norm, bindings = _trace_update(
            tracer,
            optimizer,
            trained,
            names,
            scalars,
            scalar_dtypes,
            grad_role="grad:param:",
            grad_clip=grad_clip,
            write_back_clipped=True,
            loss_scaling=loss_scaling,
        )
        trace = tracer.finish([] if grad_norm is None else [grad_norm])
    module = import_trace(trace)
    passes = "optimizer-fusion,canonicalize,cse,dce" if fuse_optimizer else "canonicalize,cse,dce"
    report = PassManager(passes, instrumentation).run(module)
    fn = forward_func(module)
    roles = feed_roles(fn)
    feeds = _kept_feeds(tracer, roles)
    results = result_roles(fn)
    return TrainingModule(
        module=module,
        feed_roles=roles,
        result_roles=results,
        grad_norm_index=results.index("output:0") if grad_norm is not None else None,
        feeds=feeds,
        scalars=scalars,
        scalar_dtypes=scalar_dtypes,
        n_inputs=0,
        optimizer=optimizer,
        params={f"param:{names[id(p)]}": p for p in trained},
        _scalar_sources=sources,
        bindings=bindings,
        grad_feeds={
            f"grad:param:{names[id(p)]}": p
            for p in trained
            if f"grad:param:{names[id(p)]}" in roles
        },
        trace=trace,
        pipeline=passes,
        passes_ms=report.passes_ms(),
    )


def _kept_feeds(tracer: Any, roles: list[str]) -> dict[str, Any]:
    """The traced feed tensors the optimized function still reads."""
    kept = set(roles)  # once: a lookup per feed, not a walk of the roles (quadratic)
    return {r: t for r, t in tracer.feed_tensors().items() if r in kept}
