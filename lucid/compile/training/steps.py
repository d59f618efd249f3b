"""Compiled training: ``make_step``, ``compiled_step``, ``compile_optimizer`` and ``fused_step``.

All four build on ``build_training_module`` (``lucid.compile.training.builder``): one traced
module in the ``lucid`` dialect with roles on its feeds and results, lowered and compiled by the
backend chosen with ``backend=`` (through the registry) into one executable. Results with role
``update:<feed role>`` are written by the run straight into that feed's array (parameters,
optimizer state, BatchNorm running statistics, the RNG state), at the end of a successful run, so
a run that raises leaves them untouched.

>>> step = lucid.compile.fused_step(model, F.cross_entropy, opt)
>>> loss = step(x, target)            # forward + loss + backward + optimizer update, one call

The per-step path does no dict work: feeds are bound by a plan computed once per cache entry (a
list of tensor references read in feed order), and step scalars (learning rate, bias
corrections...) are preallocated 0-d arrays (in the dtype the update uses them in) overwritten
each step, so a learning-rate scheduler takes effect without recompiling.

Thread safety: every call of a step object (``make_step``'s, ``fused_step``'s, the step
``compile_optimizer`` installs, and ``compiled_step``'s cached one) holds that object's lock, so
calls from several threads run one after the other, each a whole read-modify-write of the
parameters and optimizer state; different step objects run concurrently.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import lucid
from lucid import _random
from lucid._autograd import Node
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.compile import _pipeline, _recompile, introspect, parity
from lucid.compile._binding import (
    LRU,
    STRUCTURE_VERSION,
    Bound,
    check_settings,
    ensure_c_layout,
    max_entries,
    name_feeds,
)
from lucid.compile._pipeline import CompileError
from lucid.compile.cache import RecompileLog, SignatureCache
from lucid.compile.entry import StepEntry, _Slot
from lucid.compile.signature import step_input_sig
from lucid.compile.training.builder import (
    GradClip,
    TrainingModule,
    build_optimizer_module,
    build_training_module,
)
from lucid.ops._registry import OpDef
from lucid.passes import PassFailure
from lucid.trace._tracing import GraphBreak

logger = logging.getLogger("lucid.compile")

__all__ = [
    "CompiledOptimizerStep",
    "FusedStep",
    "TrainStep",
    "compile_optimizer",
    "compiled_step",
    "fused_step",
    "make_step",
]

# Errors that mean "the compiler cannot do this" (as opposed to the user's model or loss
# rejecting its inputs, which surface unchanged, exactly as eager would raise them).
_COMPILER_ERRORS = (GraphBreak, _pipeline.Unsupported, PassFailure, NotImplementedError)


class _GradRef:
    """Reads a parameter's current gradient array (compile_optimizer's gradient feeds)."""

    __slots__ = ("param", "name")

    def __init__(self, param: Tensor, name: str):
        self.param = param
        self.name = name

    @property
    def _data(self) -> np.ndarray:
        g = self.param._grad
        if g is None:
            raise RuntimeError(f"compiled optimizer step: parameter {self.name} lost its gradient")
        return g._data

    @property
    def _version(self) -> list[int]:  # bumped when the step writes the (clipped) gradient
        return self.param._grad._version


@dataclass
class _Compiled:
    """A training module compiled for one signature, with what the compile took."""

    tm: TrainingModule
    executable: Any
    compile_ms: float
    passes_ms: dict[str, float]


def _compile_step(
    what: str,
    switches: dict[str, Any],
    backend: str,
    build: Callable[[Any], TrainingModule],
    *,
    inplace: bool,
    describe: str,
) -> _Compiled:
    """Build a training module (``build(instrumentation)``) and compile it on ``backend`` (a
    registry name) in one ``CompileSession``: the debugging switches (``LUCID_COMPILE_*`` and
    ``options=``) apply to both pipelines, ``<what>-graph`` (``vjp``, ``optimizer-fusion``,
    ``ghost-grads``, the graph passes) and ``<what>-lowering``, each in its own folder of
    ``LUCID_COMPILE_PRINT_IR_TREE_DIR``; ``LUCID_COMPILE_VERBOSE`` logs one line and
    ``LUCID_COMPILE_DEBUG`` writes the trace. With ``inplace`` the ``update:`` results are
    written into their feeds' arrays by the run (after it succeeded)."""
    session = _pipeline.CompileSession(switches)
    t0 = time.perf_counter()
    tm = build(session.instrumentation(f"{what}-graph"))
    traced_ms = (time.perf_counter() - t0) * 1e3 - sum(tm.passes_ms.values())
    session.record("trace", max(traced_ms, 0.0))  # tracing and import
    for name, ms in tm.passes_ms.items():
        session.record(name, ms)
    executable = session.compile_module(
        tm.module, _pipeline.backend_of(backend), inplace=inplace, pipeline=f"{what}-lowering"
    )
    compile_ms = session.finish(f"{what} {describe}", trace=tm.trace, backend=backend)
    return _Compiled(tm, executable, compile_ms, dict(session.passes_ms))


def _entry_of(
    compiled: _Compiled, *, inplace: bool, extra_refs: dict[str, Any] | None = None
) -> StepEntry:
    return _make_entry(
        compiled.tm,
        compiled.executable,
        inplace=inplace,
        compile_ms=compiled.compile_ms,
        extra_refs=extra_refs,
        passes_ms=compiled.passes_ms,
    )


# optimizer-fusion concatenates the parameters (and gradients, and state) into one flat chain:
# fewer, longer instructions, which pays off for many small tensors (workload E: ~1.3x faster
# Adam steps) but costs a concat and a slice copy per tensor per step, which dominates once the
# tensors are large (workload A, 200k parameters: unfused SGD steps are ~2x faster). Measured on
# the native runtime; the limit sits between the two.
_FUSE_LIMIT_ELEMENTS = 1 << 16


def _fuse_updates(params: Any) -> bool:
    return sum(int(np.prod(p.shape)) for p in params) <= _FUSE_LIMIT_ELEMENTS


def _describe(inputs: tuple) -> str:
    parts = []
    for a in inputs:
        if isinstance(a, Tensor):
            parts.append(f"tensor{tuple(a.shape)}:{a.dtype}")
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"


def profile_entry(entry: Any, inputs: tuple, repeats: int, backend: str) -> list[dict[str, Any]]:
    """Per-instruction times of ``entry``'s executable run ``repeats`` times on copies of the
    feeds ``inputs`` give (live and loaded steps alike), slowest first."""
    tensors = [a for a in _contiguous_inputs(inputs) if isinstance(a, Tensor)]
    ensure_c_layout(entry.refs)
    return introspect.profile_rows(entry.executable, entry.feed_copies(tensors), repeats, backend)


def _contiguous_inputs(inputs: tuple) -> tuple:
    """Inputs whose arrays the runtime accepts (C-contiguous, aligned): copies only if needed."""
    out = []
    for a in inputs:
        if isinstance(a, Tensor) and not (a._data.flags.c_contiguous and a._data.flags.aligned):
            a = Tensor._wrap(np.array(a._data, order="C", copy=True))
        out.append(a)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# One compiled entry: executable + binding plan
# ---------------------------------------------------------------------------------------------


def _make_entry(
    tm: TrainingModule,
    executable: Any,
    *,
    inplace: bool,
    compile_ms: float,
    extra_refs: dict[str, Any] | None = None,
    passes_ms: dict[str, float] | None = None,
) -> StepEntry:
    refs: list[Any] = []
    input_pos: list[tuple[int, int]] = []
    scalar_slots: dict[str, _Slot] = {}
    rng_slot = None
    rng_index = -1
    extra_refs = extra_refs or {}
    for fi, role in enumerate(tm.feed_roles):
        if role.startswith("input:"):
            input_pos.append((fi, int(role[len("input:") :])))
            refs.append(None)
        elif role.startswith("scalar:"):
            slot = _Slot(tm.scalar_array(role))
            scalar_slots[role] = slot
            refs.append(slot)
        elif role == "rng":
            rng_slot = _Slot(np.zeros(2, np.int64))
            rng_index = fi
            refs.append(None)
        elif role in extra_refs:
            refs.append(extra_refs[role])
        elif role in tm.feeds:
            refs.append(tm.feeds[role])
        else:
            raise CompileError(f"the training step has a feed {role!r} nothing is bound to")
    # Scalar refresh plan: a role shared by a group is computed once from the group's
    # representative parameter; a per-parameter role from its own parameter's state.
    scalar_plan: list[tuple[np.ndarray, int, Tensor | None, str]] = []
    seen: set[str] = set()
    group_index = {}
    if tm.optimizer is not None:
        group_index = {id(g): gi for gi, g in enumerate(tm.optimizer.param_groups)}
    for src in tm._scalar_sources:
        if src.role in seen:
            continue
        seen.add(src.role)
        gi = group_index[id(src.group)]
        shared = src.role.startswith(f"scalar:{gi}:")
        scalar_plan.append(
            (scalar_slots[src.role]._data, gi, None if shared else src.param, src.key)
        )
    loss_index = None
    grad_index: list[tuple[int, Tensor]] = []
    updated: list[Tensor] = []
    commits: list[tuple[int, Any]] = []
    for ri, role in enumerate(tm.result_roles):
        if role == "output:0":
            loss_index = ri
        elif role.startswith("grad:"):
            grad_index.append((ri, tm.params[role[len("grad:") :]]))
        elif role == "update:rng":
            if not inplace:
                commits.append((ri, "rng"))
        elif role.startswith("update:"):
            target_role = role[len("update:") :]
            target = tm.feeds.get(target_role)
            if target is None:  # a clipped gradient written back to p.grad (compile_optimizer)
                target = extra_refs.get(target_role)
            if target is None:
                raise CompileError(f"the training step updates {target_role!r}, which is not fed")
            updated.append(target)
            if not inplace:
                commits.append((ri, target))
    entry = StepEntry(
        executable=executable,
        feed_roles=list(tm.feed_roles),
        result_roles=list(tm.result_roles),
        refs=refs,
        input_pos=input_pos,
        scalar_slots=scalar_slots,
        scalar_plan=scalar_plan,
        rng_slot=rng_slot,
        loss_index=loss_index,
        grad_index=grad_index,
        updated=updated,
        commits=commits,
        inplace=inplace,
        compile_ms=compile_ms,
        first_scalars=dict(tm.scalars),
        tm=tm,
        passes_ms=passes_ms,
        rng_index=rng_index,
    )
    return entry


def _run_checked(entry: StepEntry, tensor_inputs: Sequence[Tensor], what: str) -> list:
    try:
        return entry.run(tensor_inputs)
    except (TypeError, ValueError) as e:
        # Arrays the runtime does not take (non-contiguous, e.g. after ``w.data = w.t()``):
        # bound tensors are re-laid out in place (same objects), inputs copied.
        ensure_c_layout(entry.refs)
        ensure_c_layout(r.param._grad for r in entry.refs if isinstance(r, _GradRef))
        contiguous = _contiguous_inputs(tuple(tensor_inputs))
        try:
            return entry.run(contiguous)
        except (TypeError, ValueError) as e2:
            raise _pipeline.FeedMismatch(f"{what}: {name_feeds(str(e2), entry.feed_roles)}") from e


# ---------------------------------------------------------------------------------------------
# Optimizer bookkeeping shared by fused_step and compile_optimizer
# ---------------------------------------------------------------------------------------------
class _OptimizerView:
    """Per-step reads of an optimizer: the step scalars of each group (from a representative
    parameter's state), the static options the compiled update branches on, and detection of
    ``load_state_dict`` (which replaces ``state`` and ``param_groups``)."""

    def __init__(self, optimizer: Any):
        self.opt = optimizer
        self.static_keys = tuple(sorted(type(optimizer)._static_keys))
        self.reset()

    def reset(self) -> None:
        self.state_obj = self.opt.state
        self.groups_obj = self.opt.param_groups
        self.reps: list[Tensor | None] = [None] * len(self.opt.param_groups)
        self.find_reps()

    def find_reps(self) -> None:
        st = self.opt.state
        self.reps = [next((p for p in g["params"] if p in st), None) for g in self.opt.param_groups]

    def changed(self) -> bool:
        return self.opt.state is not self.state_obj or self.opt.param_groups is not self.groups_obj

    def group_scalars(self) -> list[dict | None]:
        opt = self.opt
        st = opt.state
        out = []
        for group, rep in zip(opt.param_groups, self.reps, strict=False):
            if rep is not None and rep in st:
                out.append(opt._step_scalars(group, st[rep], False))
                continue
            try:  # stateless (plain SGD), or no step taken yet
                out.append(opt._step_scalars(group, {}, False))
            except KeyError:
                out.append(None)
        return out

    def statics(self, scalars: list[dict | None]) -> tuple:
        keys = self.static_keys
        groups = self.opt.param_groups
        return tuple(
            [
                (len(g["params"]), None if s is None else tuple([s[k] for k in keys]))
                for g, s in zip(groups, scalars, strict=True)
            ]
        )

    def refresh(self, entry: StepEntry, scalars: list[dict | None]) -> None:
        opt = self.opt
        last = entry.scalar_last
        if last is None:
            last = entry.scalar_last = [None] * len(entry.scalar_plan)
        for i, (arr, gi, param, key) in enumerate(entry.scalar_plan):
            if param is None:
                s = scalars[gi]
                if s is None:
                    raise RuntimeError(
                        "the optimizer's state for a compiled parameter group was removed"
                    )
                v = s[key]
            else:
                v = opt._step_scalars(opt.param_groups[gi], opt.state[param], False)[key]
            if v != last[i]:
                arr[()] = v
                last[i] = v

    def snapshot(self) -> dict:
        return {p: set(s) for p, s in self.opt.state.items()}

    def restore(self, snap: dict) -> None:
        """Undo state a failed build created (so a later eager step still sees a first step)."""
        st = self.opt.state
        for p in list(st.keys()):
            if p not in snap:
                del st[p]
            else:
                for k in set(st[p]) - snap[p]:
                    del st[p][k]


# ---------------------------------------------------------------------------------------------
# Options, parity checking and introspection shared by the training steps
# ---------------------------------------------------------------------------------------------
class _StepOptions:
    """A training step's ``options=`` (graph pipeline, pass-manager switches) and ``check=``
    state: the mode, the tolerance and the mismatches found (the signatures a failed check
    made eager-only are in the step's ``SignatureCache``)."""

    def __init__(
        self,
        what: str,
        options: dict[str, Any] | None,
        check: str | None,
        check_tolerance: tuple[float, float] | None,
    ):
        self.what = what
        pipeline, self.switches = _pipeline.parse_options(options, what)
        self.pipeline = _pipeline.GRAPH_PIPELINE if pipeline is None else pipeline
        self.mode = parity.check_mode(check)
        self.tol = parity.tolerance(check_tolerance)
        self.parity: list[dict[str, Any]] = []

    def wants(self, entry: StepEntry) -> bool:
        """Whether this run of ``entry`` is compared with eager."""
        mode = self.mode
        return mode == "always" or (mode == "first" and entry.n_runs == 0)

    def mismatch(
        self,
        owner: Any,
        key: tuple,
        entry: StepEntry,
        bad: str,
        feeds: dict[str, np.ndarray],
        reference: dict[str, np.ndarray],
    ) -> None:
        """Take ``key`` off the compiler (eager-only, with the reason) after a failed check,
        bisect to the culprit and write the repro folder."""
        culprit = None
        try:
            culprit = parity.bisect_step(
                entry.tm.trace,
                entry.tm.pipeline,
                feeds,
                reference,
                backend=owner.backend,
                tol=self.tol,
            )
        except Exception as e:  # noqa: BLE001 - the user still gets the eager result
            logger.warning(
                "lucid.compile: %s: parity bisection failed: %s: %s", self.what, type(e).__name__, e
            )
        reason = f"parity check failed: {bad}" + (f"; culprit: {culprit}" if culprit else "")
        owner._cache.mark_eager(key, reason)
        self.parity.append({"key": key, "mismatch": bad, "culprit": culprit})
        logger.warning("lucid.compile: %s: running %r eagerly: %s", self.what, key, reason)

    def info(self) -> dict[str, Any]:
        return {"parity": [dict(r) for r in self.parity]}


def _unique(tensors: Any) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())


def _save(tensors: list[Tensor]) -> list[np.ndarray]:
    return [np.array(t._data, copy=True) for t in tensors]


def _restore(tensors: list[Tensor], saved: list[np.ndarray]) -> None:
    for t, data in zip(tensors, saved, strict=True):
        np.copyto(t._data, data)


def _result_values(entry: StepEntry, loss: np.ndarray) -> dict[str, np.ndarray]:
    """The loss and the current value of every tensor the step updates, by result role."""
    out = {"output:0": np.array(loss, copy=True)}
    for role in entry.result_roles:
        if role.startswith("update:") and role != "update:rng":
            target = role[len("update:") :]
            t = entry.tm.feeds.get(target)
            if t is None:  # a clipped gradient written back to p.grad (compile_optimizer)
                t = entry.refs[entry.feed_roles.index(target)]
            out[role] = np.array(t._data, copy=True)
    return out


def _grad_roles(entry: StepEntry, grads: list[tuple[Tensor, np.ndarray]]) -> list[tuple[str, Any]]:
    """``(grad:param:<name>, gradient)`` of ``grads`` (in ``entry.grad_index`` order)."""
    return [
        (entry.result_roles[ri], g) for (ri, _), (_, g) in zip(entry.grad_index, grads, strict=True)
    ]


def _feed_values(entry: StepEntry, inputs: tuple) -> dict[str, np.ndarray]:
    """A copy of every feed of ``entry`` as the next run would read it, by role."""
    tensors = [a for a in inputs if isinstance(a, Tensor)]
    out: dict[str, np.ndarray] = {}
    for role, ref in zip(entry.feed_roles, entry.refs, strict=True):
        if ref is not None:
            out[role] = np.array(ref._data, copy=True)
    for fi, ii in entry.input_pos:
        out[entry.feed_roles[fi]] = np.array(tensors[ii]._data, copy=True)
    if entry.rng_slot is not None:
        out["rng"] = np.array(_random.get_rng_state()._data, copy=True)
    return out


def _rebind_state(opt: Any, bound: dict[Tensor, dict[str, Any]]) -> None:
    """Put the state tensors compiled entries bind back into ``opt.state`` after an eager step
    that created new ones (its values copied into them)."""
    for p, st in bound.items():
        if p not in opt.state:
            continue
        now = opt.state[p]
        for k, old in st.items():
            new = now.get(k)
            if isinstance(old, Tensor) and isinstance(new, Tensor) and new is not old:
                np.copyto(old._data, new._data)
                old._version[0] += 1
                now[k] = old


def _one_call_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Hold the step object's lock for the call: a step reads and writes parameters and
    optimizer state in place, so two at once would lose updates without any error."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class _StepIntrospection:
    """``timing()``, ``ir()``, ``module()`` and ``profile()`` of a training step (its entries in
    ``self._entries``, named ``self._what`` in messages)."""

    _what = "training step"
    _cache: SignatureCache
    _entries: LRU  # _cache.entries
    _lock: threading.RLock
    _opts: _StepOptions
    backend: str

    def _new_cache(self, recompiles: bool = True) -> None:
        """The step's ``SignatureCache`` (``_entries`` is its entry table)."""
        log = RecompileLog(f"{self._what}: ", _recompile.diff_step) if recompiles else None
        self._cache = SignatureCache(recompiles=log)
        self._entries = self._cache.entries

    def cache_info(self) -> dict[str, Any]:
        """``entries``, ``max_entries``, ``evictions``, ``keys``, ``compile_ms`` per entry,
        ``recompiles`` (why each new signature compiled; not for ``compile_optimizer``),
        ``eager_only`` and ``reasons`` (the signatures a parity check took off the compiler,
        and why) and ``parity`` (each mismatch: key, what differed, the bisected culprit)."""
        return introspect.cache_info(
            self._cache,
            compile_ms=[e.compile_ms for e in self._entries.values()],
            **self._opts.info(),
        )

    def timing(self) -> list[dict[str, Any]]:
        """One row per compiled signature: ``key``, ``compile_ms``, ``last_run_ms`` (the
        executable's last run), ``n_runs`` and ``passes_ms`` (time per compiler stage: ``trace``,
        ``vjp``, ``optimizer-fusion``, ``ghost-grads``, the graph passes, ``lower-to-prim``, the
        backend's passes, ``backend-compile``)."""
        return [introspect.timing_row(k, e, n_runs=e.n_runs) for k, e in self._entries.items()]

    def _entry(self, key: Any) -> StepEntry:
        entries = self._entries
        if not entries:
            raise KeyError(
                f"{self._what}: nothing is compiled yet: a training step compiles on its first "
                "call (or profile(...)); call it once, then ask again"
            )
        if key is None:
            key = -1
        if isinstance(key, int):
            values = list(entries.values())
            if not -len(values) <= key < len(values):
                raise KeyError(f"{self._what}: no entry {key}: {len(values)} compiled")
            return values[key]
        entry = entries.get(key)
        if entry is None:
            raise KeyError(
                f"{self._what}: no compiled signature {key!r}; compiled: {list(entries)!r}"
            )
        return entry

    def module(self, key: Any = -1) -> Any:
        """The training module of a compiled entry (by cache key, or by index in
        ``cache_info()["keys"]``; default the latest): the function in the ``prim`` dialect as
        compiled (forward, backward and update); print it with ``lucid.ir.print_ir``.
        ``ir(stage=...)`` shows the other stages. Raises ``KeyError`` before the first call."""
        return self._entry(key).tm.module

    def ir(self, key: Any = None, stage: str = "final") -> str:
        """The MLIR text of a compiled entry at ``stage``: ``imported`` (the trace: forward and
        optimizer update), ``optimized`` (after ``vjp``, ``optimizer-fusion``, ``ghost-grads``
        and the graph passes), ``prim`` or ``final`` (the backend's program). ``key`` as for
        ``module``."""
        if stage not in _pipeline.STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {_pipeline.STAGES}")
        tm = self._entry(key).tm
        return introspect.trace_ir(tm.trace, stage, backend=self.backend, pipeline=tm.pipeline)

    def _profile_entry(self, inputs: tuple) -> StepEntry:
        raise NotImplementedError  # each step finds (or compiles) the entry its inputs use

    @_one_call_at_a_time
    def profile(self, *inputs: Any, repeats: int = 100) -> list[dict[str, Any]]:
        """Where a step's time goes: the native executable serving ``inputs`` run ``repeats``
        times on copies of its feeds (parameters, optimizer state, buffers and the RNG are left
        as they were; compiling the entry first if needed, without taking a step): one row per
        instruction, slowest first: ``index``, ``op``, ``ms`` (mean) and ``instr``."""
        introspect.check_repeats(repeats)
        return profile_entry(self._profile_entry(inputs), inputs, repeats, self.backend)


# ---------------------------------------------------------------------------------------------
# make_step / compiled_step
# ---------------------------------------------------------------------------------------------
class TrainStep(_StepIntrospection):
    """``step(x, *extra) -> loss``: compiled forward + backward of ``loss_fn(model(x), *extra)``.

    The returned loss carries a ``grad_fn``: ``loss.backward()`` accumulates the compiled
    gradients into ``p.grad`` (scaled by the upstream gradient), so an eager ``opt.step()``
    works after it. BatchNorm running statistics and the RNG state advance as in eager training.
    One executable per input signature (shapes, dtypes), training flag and set of trained
    parameters. ``cache_info()``, ``timing()``, ``ir(stage=...)``, ``module()`` and
    ``profile(x, *extra)`` look inside.
    """

    _what = "make_step"

    def __init__(
        self,
        model: Any,
        loss_fn: Callable[..., Tensor],
        *,
        dynamic: bool = False,
        backend: str = "auto",
        options: dict[str, Any] | None = None,
        check: str | None = None,
        check_tolerance: tuple[float, float] | None = None,
    ):
        if not callable(model) or not hasattr(model, "named_parameters"):
            raise TypeError(f"make_step needs an nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"make_step needs a callable loss_fn, got {type(loss_fn).__name__}")
        self.model = model
        self.loss_fn = loss_fn
        self.dynamic = dynamic
        self.backend = _pipeline.resolve_backend(backend)
        self._new_cache()
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        self._params = list(model.parameters())
        self._bound = Bound([model])
        self._opts = _StepOptions("make_step", options, check, check_tolerance)

    def _check_structure(self) -> None:
        """A parameter, buffer or submodule was replaced: every entry binds stale objects."""
        if self._bound.changed():
            self._entries.clear()
            self._params = list(self.model.parameters())

    def _key(self, inputs: tuple) -> tuple:
        return (
            step_input_sig(inputs),
            self._bound.modes(),  # every submodule's mode (model.bn.eval() while training)
            tuple([(p._requires_grad, p._data.dtype) for p in self._params]),
        )

    def _build(self, key: tuple, inputs: tuple) -> StepEntry:
        check_settings(self.backend)
        self._cache.note_compile(key)
        opts = self._opts
        try:
            compiled = _compile_step(
                "make_step",
                opts.switches,
                self.backend,
                lambda inst: build_training_module(
                    self.model, self.loss_fn, inputs, pipeline=opts.pipeline, instrumentation=inst
                ),
                inplace=True,
                describe=_describe(inputs),
            )
        except _COMPILER_ERRORS as e:
            raise CompileError(
                f"make_step: cannot compile the training step for inputs {_describe(inputs)}: "
                f"{type(e).__name__}: {e}"
            ) from e
        entry = _entry_of(compiled, inplace=True)
        self._cache.put(key, entry)
        return entry

    def _profile_entry(self, inputs: tuple) -> StepEntry:
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        key = self._key(inputs)
        _refuse_eager_profile(self._cache, key)
        entry = self._entries.get(key)
        return entry if entry is not None else self._build(key, inputs)

    @_one_call_at_a_time
    def run(self, inputs: tuple) -> tuple[np.ndarray, list[tuple[Tensor, np.ndarray]]]:
        """Run one step: the loss array and ``(param, gradient array)`` pairs."""
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        key = self._key(inputs)
        opts = self._opts
        entry = self._cache.get(key)
        if entry is None:
            # An eager-only key (a failed parity check) has no entry: no lookup on a hit.
            if key in self._cache.eager_only:
                return self._eager_run(inputs)
            entry = self._build(key, inputs)
        if opts.mode is not None and opts.wants(entry):
            return self._checked_run(key, entry, inputs)
        return self._compiled_run(key, entry, inputs)[1:]

    def _compiled_run(
        self, key: tuple, entry: StepEntry, inputs: tuple
    ) -> tuple[StepEntry, np.ndarray, list[tuple[Tensor, np.ndarray]]]:
        tensors = [a for a in inputs if isinstance(a, Tensor)]

        def rebuild() -> tuple[tuple, StepEntry]:
            # A parameter changed dtype or storage behind our back: its key may differ too.
            self._params = list(self.model.parameters())
            new_key = self._key(inputs)
            return new_key, self._build(new_key, inputs)

        key, entry, res = self._cache.rebuild_once(
            key,
            entry,
            lambda _, e: _run_checked(e, tensors, "make_step"),
            rebuild,
            (_pipeline.FeedMismatch,),
        )
        entry.after_success(res)
        return entry, res[entry.loss_index], [(p, res[i]) for i, p in entry.grad_index]

    def _eager_run(self, inputs: tuple) -> tuple[np.ndarray, list[tuple[Tensor, np.ndarray]]]:
        """An eager-only signature (its parity check failed): eager forward and backward."""
        trained = [p for p in self._params if p._requires_grad]
        loss, grads = parity.eager_gradients(self.model, self.loss_fn, inputs, trained)
        return loss, [(p, g) for p, g in zip(trained, grads, strict=True) if g is not None]

    def _checked_run(
        self, key: tuple, entry: StepEntry, inputs: tuple
    ) -> tuple[np.ndarray, list[tuple[Tensor, np.ndarray]]]:
        """The compiled step, then an eager one from the same state (buffers, RNG), compared
        by role: loss, gradients, buffer updates. A mismatch returns eager's, leaves the
        buffers as eager left them and makes ``key`` eager-only (with the bisected culprit)."""
        buffers = _unique(self.model.buffers())
        saved = _save(buffers)
        rng = np.array(_random.get_rng_state()._data, copy=True)
        entry, loss, grads = self._compiled_run(key, entry, inputs)
        got = _result_values(entry, loss)
        got.update((role, np.array(g, copy=True)) for role, g in _grad_roles(entry, grads))
        _restore(buffers, saved)
        _random.set_rng_state(Tensor._wrap(rng))
        feeds = _feed_values(entry, inputs)
        trained = [p for _, p in entry.grad_index]
        loss_e, grads_e = parity.eager_gradients(self.model, self.loss_fn, inputs, trained)
        want = _result_values(entry, loss_e)
        eager_grads = [
            (p, g if g is not None else np.zeros_like(p._data))
            for p, g in zip(trained, grads_e, strict=True)
        ]
        want.update(_grad_roles(entry, eager_grads))
        bad = parity.compare_roles(got, want, self._opts.tol)
        if bad is None:
            return loss, grads
        self._opts.mismatch(self, key, entry, bad, feeds, want)
        return loss_e, eager_grads

    def __call__(self, x: Any, *extra: Any) -> Tensor:
        inputs = (x, *extra)
        loss_arr, grads = self.run(inputs)
        loss = Tensor._wrap(loss_arr)
        if _state.grad_enabled and grads:
            _attach_grads(loss, grads)
        return loss


def _attach_grads(loss: Tensor, grads: list[tuple[Tensor, np.ndarray]]) -> None:
    """Give ``loss`` a grad_fn whose backward hands each parameter ``upstream * gradient``."""
    params = tuple(p for p, _ in grads)
    grad_tensors = [Tensor._wrap(g) for _, g in grads]

    def vjp(ctx, g):
        if _state.tracer is not None or _state.grad_enabled:
            raise RuntimeError(
                "create_graph=True (higher-order gradients) through a make_step loss is not "
                "supported: its gradients are computed values, not a differentiable graph"
            )
        return [g * gt for gt in grad_tensors]

    op = OpDef(
        name="CompiledTrainStep",
        operands=tuple(f"p{i}" for i in range(len(params))),
        infer=lambda *a: None,
        kernel=lambda *a: None,
        vjp=vjp,
        n_outputs=1,
        saves_inputs=False,
        saves_outputs=False,
    )
    Node.attach(op, params, {}, [loss])


def make_step(
    model: Any,
    loss_fn: Callable[..., Tensor],
    *,
    dynamic: bool = False,
    backend: str = "auto",
    options: dict[str, Any] | None = None,
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
) -> TrainStep:
    """A compiled forward + backward: ``step(x, *extra)`` returns ``loss_fn(model(x), *extra)``
    with a working ``grad_fn`` (``loss.backward()`` fills ``p.grad``). ``backend``,
    ``options``, ``check`` and ``check_tolerance`` as for ``lucid.compile`` (``check`` compares
    the loss, the gradients and the buffer updates with an eager step)."""
    return TrainStep(
        model,
        loss_fn,
        dynamic=dynamic,
        backend=backend,
        options=options,
        check=check,
        check_tolerance=check_tolerance,
    )


_COMPILED_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_step(
    model: Any,
    x: Any,
    loss_fn: Callable[..., Tensor],
    *extra: Any,
    backend: str = "auto",
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
) -> Tensor:
    """One compiled forward + backward: accumulates the gradient of
    ``loss_fn(model(x), *extra)`` into every trained parameter's ``.grad`` and returns the loss
    (detached). The compiled step is cached per model and loss function; compilation errors
    raise ``CompileError`` (no eager fallback). ``check``: as for ``make_step``."""
    per_model = _COMPILED_STEPS.get(model)
    if per_model is None:
        per_model = _COMPILED_STEPS[model] = LRU(max_entries())
    name = _pipeline.resolve_backend(backend)
    mode, tol = parity.check_mode(check), parity.tolerance(check_tolerance)
    step = per_model.get((loss_fn, name, mode, tol))
    if step is None:
        step = TrainStep(model, loss_fn, backend=name, check=mode, check_tolerance=tol)
        per_model.put((loss_fn, name, mode, tol), step)
    with step._lock:  # the accumulation into .grad is part of the call
        loss_arr, grads = step.run((x, *extra))
        for p, g in grads:
            if p._grad is None:
                p._grad = Tensor._wrap(g)
            else:
                p._grad._data += g
                p._grad._version[0] += 1
    return Tensor._wrap(loss_arr)


# ---------------------------------------------------------------------------------------------
# fused_step
# ---------------------------------------------------------------------------------------------
class FusedStep(_StepIntrospection):
    """``step(x, *extra) -> loss``: forward + loss + backward + optimizer update as one native
    executable; parameters, optimizer state, BatchNorm buffers and the RNG state are updated in
    place. See ``fused_step``."""

    _what = "fused_step"

    def __init__(
        self,
        model: Any,
        loss_fn: Callable[..., Tensor],
        optimizer: Any,
        *,
        check_finite: bool = False,
        backend: str = "auto",
        options: dict[str, Any] | None = None,
        check: str | None = None,
        check_tolerance: tuple[float, float] | None = None,
        max_grad_norm: float | None = None,
        norm_type: float | str = 2.0,
        clip_grad_value: float | None = None,
    ):
        if not hasattr(model, "named_parameters"):
            raise TypeError(f"fused_step needs an nn.Module, got {type(model).__name__}")
        self.grad_clip = GradClip.of(max_grad_norm, norm_type, clip_grad_value, what="fused_step")
        # The total gradient norm before clipping of the last step (with max_grad_norm).
        self.grad_norm: Tensor | None = None
        if not hasattr(optimizer, "_update") or not hasattr(optimizer, "_static_keys"):
            raise TypeError(
                f"fused_step needs a lucid.optim optimizer, got {type(optimizer).__name__}"
            )
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.check_finite = bool(check_finite)
        self.backend = _pipeline.resolve_backend(backend)
        self._view = _OptimizerView(optimizer)
        self._params = list(model.parameters())
        self._new_cache()
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        self._bound = Bound([model])
        self._opts = _StepOptions("fused_step", options, check, check_tolerance)

    def _check_structure(self) -> None:
        """A parameter, buffer or submodule was replaced: drop the entries (they bind the old
        objects). A replaced parameter the optimizer still holds would silently stop training
        (the optimizer updates the old object, as in PyTorch): refuse it, naming it."""
        bound = self._bound
        old, old_version = bound.tensors, bound.version
        if not bound.changed():
            return
        self._entries.clear()
        self._params = list(self.model.parameters())
        held = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        stale = [n for n, t in bound.replaced(old) if id(t) in held]
        if stale:
            # Checked again on every call until the optimizer no longer holds them.
            bound.tensors, bound.version = old, old_version
            raise RuntimeError(
                f"fused_step: the model's parameter(s) {', '.join(map(repr, stale))} were "
                "replaced after the optimizer was created; the optimizer still holds the old "
                "object(s), so the new ones would never be trained. Create the optimizer (and "
                "the fused step) again over model.parameters(), or change values in place "
                "(p.data = ..., load_state_dict without assign=True)"
            )

    def _key(self, inputs: tuple, scalars: list) -> tuple:
        return (
            step_input_sig(inputs),
            self._bound.modes(),  # every submodule's mode (model.bn.eval() while training)
            self._view.statics(scalars),
            tuple([p._requires_grad for p in self._params]),  # dtype changes: FeedMismatch
        )

    def _build(self, inputs: tuple) -> tuple[tuple, StepEntry]:
        check_settings(self.backend)
        snap = self._view.snapshot()
        try:
            compiled = _compile_step(
                "fused_step",
                self._opts.switches,
                self.backend,
                lambda inst: build_training_module(
                    self.model,
                    self.loss_fn,
                    inputs,
                    optimizer=self.optimizer,
                    fuse_optimizer=_fuse_updates(p for p in self._params if p._requires_grad),
                    pipeline=self._opts.pipeline,
                    grad_clip=self.grad_clip,
                    instrumentation=inst,
                ),
                inplace=not self.check_finite,
                describe=_describe(inputs),
            )
        except _COMPILER_ERRORS as e:
            self._view.restore(snap)
            raise CompileError(
                f"fused_step: cannot compile the training step for inputs {_describe(inputs)}: "
                f"{type(e).__name__}: {e}"
            ) from e
        except BaseException:
            self._view.restore(snap)
            raise
        entry = _entry_of(compiled, inplace=not self.check_finite)
        entry.created_state = snap  # undone if the entry's first run fails
        self._view.find_reps()
        key = self._key(inputs, self._view.group_scalars())
        self._cache.put(key, entry)
        return key, entry

    def _first_run_failed(self, key: tuple, entry: StepEntry) -> None:
        """A new entry whose first step failed: forget it and the optimizer state its build
        created, so the optimizer looks exactly as before the call (eager or compiled)."""
        if (
            entry.n_runs <= 1
            and entry.first_scalars is not None
            and entry.created_state is not None
        ):
            self._entries.pop(key, None)
            self._view.restore(entry.created_state)
            self._view.find_reps()

    @_one_call_at_a_time
    def __call__(self, x: Any, *extra: Any) -> Tensor:
        inputs = (x, *extra)
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        view = self._view
        if view.changed():  # load_state_dict: the bound state tensors are gone
            view.reset()
            self._entries.clear()
        scalars = view.group_scalars()
        key = self._key(inputs, scalars)
        opts = self._opts
        cache = self._cache
        entry = cache.get(key)
        if entry is None:
            # An eager-only key (a failed parity check) has no entry: no lookup on a hit.
            if key in cache.eager_only:
                return self._eager_step(inputs)
            cache.note_compile(key)
            key, entry = self._build(inputs)
            if key in cache.eager_only:  # known once the optimizer state exists
                cache.pop(key)
                return self._eager_step(inputs)
        if opts.mode is not None and opts.wants(entry):
            return self._checked_step(key, entry, inputs, scalars)
        return self._run_step(key, entry, inputs, scalars)[2]

    def _run_step(
        self, key: tuple, entry: StepEntry, inputs: tuple, scalars: list
    ) -> tuple[tuple, StepEntry, Tensor]:
        """Run ``entry`` (rebuilt once if a feed changed dtype or layout): (key, entry, loss)."""
        view = self._view
        if entry.n_runs == 0 and entry.first_scalars is not None:
            entry.set_scalars(entry.first_scalars)  # a first step may differ (SGD's buffer)
        else:
            view.refresh(entry, scalars)
        tensors = [a for a in inputs if isinstance(a, Tensor)]
        first = entry

        def run(k: tuple, e: StepEntry) -> list:
            try:
                return _run_checked(e, tensors, "fused_step")
            except _pipeline.FeedMismatch:
                if e is not first:  # the rebuilt entry failed too
                    self._first_run_failed(k, e)
                raise
            except BaseException:
                self._first_run_failed(k, e)
                raise

        def rebuild() -> tuple[tuple, StepEntry]:
            # A parameter changed dtype or storage behind our back.
            self._params = list(self.model.parameters())
            k, e = self._build(inputs)
            e.set_scalars(e.first_scalars)
            return k, e

        key, entry, res = self._cache.rebuild_once(
            key, entry, run, rebuild, (_pipeline.FeedMismatch,)
        )
        loss_arr = res[entry.loss_index]
        norm_index = entry.tm.grad_norm_index
        if self.check_finite and not np.isfinite(loss_arr).all():
            self._first_run_failed(key, entry)
            raise FloatingPointError(
                f"fused_step: the loss is {float(loss_arr)}; parameters and optimizer state "
                "were left unchanged"
            )
        if self.check_finite and norm_index is not None and not np.isfinite(res[norm_index]):
            self._first_run_failed(key, entry)
            raise FloatingPointError(
                f"fused_step: the total gradient norm is {float(res[norm_index])}; parameters "
                "and optimizer state were left unchanged"
            )
        entry.after_success(res)
        if norm_index is not None:
            self.grad_norm = Tensor._wrap(np.array(res[norm_index]))
        entry.first_scalars = None
        entry.created_state = None
        return key, entry, Tensor._wrap(loss_arr)

    def _clip(self) -> Callable[[list[Tensor]], None] | None:
        """What the eager reference does between backward and the update (gradient clipping
        when the step clips: ``clip_grad_value_``, then ``clip_grad_norm_``, whose total norm
        becomes ``grad_norm``)."""
        clip = self.grad_clip
        if clip is None:
            return None
        from lucid.nn.utils import clip_grad_norm_, clip_grad_value_

        def clip_eagerly(params: list[Tensor]) -> None:
            with_grad = [p for p in params if p._grad is not None]
            if clip.clip_value is not None:
                clip_grad_value_(with_grad, clip.clip_value)
            if clip.max_norm is not None:
                self.grad_norm = clip_grad_norm_(with_grad, clip.max_norm, clip.norm_type)

        return clip_eagerly

    def _eager_step(self, inputs: tuple) -> Tensor:
        """An eager-only signature (its parity check failed): an eager training step."""
        loss, _ = parity.eager_optimizer_step(
            self.model, self.loss_fn, self.optimizer, inputs, self._clip()
        )
        self._view.find_reps()
        return Tensor._wrap(loss)

    def _checked_step(self, key: tuple, entry: StepEntry, inputs: tuple, scalars: list) -> Tensor:
        """The compiled step, then an eager one (forward, backward, the optimizer's own
        ``step``) from the same parameters, optimizer state, buffers and RNG, compared by role.
        The eager step's values stay (the compiled ones agree within the tolerance, or are
        wrong: then ``key`` becomes eager-only, with the bisected culprit)."""
        opt = self.optimizer
        # The state as the entry binds it (objects), and the keys that existed before a new
        # entry's build created the rest (an eager first step must create them itself: SGD's
        # first momentum step differs from later ones).
        bound_state = {p: dict(st) for p, st in opt.state.items()}
        pre_build = entry.created_state if entry.n_runs == 0 else None
        tracked = _unique(
            [
                *self.model.parameters(),
                *self.model.buffers(),
                *(v for st in bound_state.values() for v in st.values() if isinstance(v, Tensor)),
            ]
        )
        saved = _save(tracked)
        plain = {
            p: {k: v for k, v in st.items() if not isinstance(v, Tensor)}
            for p, st in bound_state.items()
        }
        rng = np.array(_random.get_rng_state()._data, copy=True)
        key, entry, loss = self._run_step(key, entry, inputs, scalars)
        got = _result_values(entry, loss._data)
        _restore(tracked, saved)
        for p, values in plain.items():
            opt.state[p].update(values)
        _random.set_rng_state(Tensor._wrap(rng))
        feeds = _feed_values(entry, inputs)
        if pre_build is not None:
            self._view.restore(pre_build)
        try:
            loss_e, grads_e = parity.eager_optimizer_step(
                self.model, self.loss_fn, opt, inputs, self._clip()
            )
        finally:
            _rebind_state(opt, bound_state)
            self._view.find_reps()
        want = _result_values(entry, loss_e)
        bad = parity.compare_roles(got, want, self._opts.tol)
        if bad is None:
            return loss
        reference = dict(want)
        for role, p in entry.tm.params.items():
            g = grads_e.get(id(p))
            if g is not None:
                reference[f"grad:{role}"] = g
                feeds[f"ghost:{role}"] = g
        self._opts.mismatch(self, key, entry, bad, feeds, reference)
        return Tensor._wrap(loss_e)

    def _profile_entry(self, inputs: tuple) -> StepEntry:
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        view = self._view
        if view.changed():
            view.reset()
            self._entries.clear()
        scalars = view.group_scalars()
        key = self._key(inputs, scalars)
        _refuse_eager_profile(self._cache, key)
        entry = self._entries.get(key)
        if entry is None:
            key, entry = self._build(inputs)
        if entry.n_runs == 0 and entry.first_scalars is not None:
            entry.set_scalars(entry.first_scalars)
        else:
            view.refresh(entry, scalars)
        return entry


def fused_step(
    model: Any,
    loss_fn: Callable[..., Tensor],
    optimizer: Any,
    *,
    check_finite: bool = False,
    backend: str = "auto",
    options: dict[str, Any] | None = None,
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
    max_grad_norm: float | None = None,
    norm_type: float | str = 2.0,
    clip_grad_value: float | None = None,
) -> FusedStep:
    """Forward + loss + backward + ``optimizer`` update as one cached executable.

    ``step(x, *extra)`` computes ``loss_fn(model(x), *extra)``, updates the parameters and the
    optimizer's state in place (and BatchNorm running statistics, and the RNG for dropout) and
    returns the loss. A new input shape compiles a new entry. What cannot be compiled raises
    ``CompileError`` (no eager fallback). With ``check_finite=True`` a non-finite loss raises
    ``FloatingPointError`` before anything is written. ``p.grad`` is not filled.
    ``backend``, ``options`` and ``check``/``check_tolerance`` as for ``lucid.compile``:
    ``check="first"`` compares the first step of each signature with an eager step (loss,
    updated parameters, optimizer state and buffers); on a mismatch the eager step's values
    stay and the signature runs eagerly from then on.

    ``max_grad_norm`` clips the gradients inside the step as ``clip_grad_norm_(params,
    max_grad_norm, norm_type)`` before ``opt.step()`` would (``step.grad_norm`` is then the total
    norm before clipping, a 0-d tensor; a non-finite one raises ``FloatingPointError`` under
    ``check_finite``); ``clip_grad_value`` clamps them first, as ``clip_grad_value_``.
    """
    return FusedStep(
        model,
        loss_fn,
        optimizer,
        check_finite=check_finite,
        backend=backend,
        options=options,
        check=check,
        check_tolerance=check_tolerance,
        max_grad_norm=max_grad_norm,
        norm_type=norm_type,
        clip_grad_value=clip_grad_value,
    )


# ---------------------------------------------------------------------------------------------
# compile_optimizer
# ---------------------------------------------------------------------------------------------
class CompiledOptimizerStep(_StepIntrospection):
    """Replaces ``optimizer.step``: the update of every parameter with a gradient as one cached
    native executable writing parameters and state in place. ``optimizer.step.eager`` is the
    original method."""

    _what = "compile_optimizer"

    def __init__(
        self,
        optimizer: Any,
        *,
        backend: str = "auto",
        options: dict[str, Any] | None = None,
        check: str | None = None,
        check_tolerance: tuple[float, float] | None = None,
        max_grad_norm: float | None = None,
        norm_type: float | str = 2.0,
        clip_grad_value: float | None = None,
    ):
        if options and "pipeline" in options:
            raise ValueError(
                "compile_optimizer: option 'pipeline' is not taken (the update's pipeline is "
                "fixed); the debugging switches are"
            )
        self.grad_clip = GradClip.of(
            max_grad_norm, norm_type, clip_grad_value, what="compile_optimizer"
        )
        # The total gradient norm before clipping of the last step (with max_grad_norm).
        self.grad_norm: Tensor | None = None
        self.optimizer = optimizer
        self.backend = _pipeline.resolve_backend(backend)
        self._opts = _StepOptions("compile_optimizer", options, check, check_tolerance)
        self.eager = optimizer.step
        self._view = _OptimizerView(optimizer)
        self._new_cache(recompiles=False)
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        # The parameter objects the entries bind. As in PyTorch, the optimizer updates the
        # objects in its param_groups (a parameter replaced in the model afterwards is not its
        # business); one swapped inside param_groups is noticed here and rebinds.
        self._bound_params: list[Tensor] = []

    def _key(self, scalars: list, params: list) -> tuple:
        return (self._view.statics(scalars), tuple([p._grad is not None for p in params]))

    def _build(self) -> tuple[tuple, StepEntry]:
        check_settings(self.backend)
        opt = self.optimizer
        snap = self._view.snapshot()
        refs: dict[str, Any] = {}

        def build(inst: Any) -> TrainingModule:
            tm, grad_refs = _build_optimizer_module(opt, self.grad_clip, inst)
            refs.update(grad_refs)
            return tm

        try:
            compiled = _compile_step(
                "compile_optimizer",
                self._opts.switches,
                self.backend,
                build,
                inplace=True,
                describe=f"{type(opt).__name__}.step",
            )
        except _COMPILER_ERRORS as e:
            self._view.restore(snap)
            raise CompileError(
                f"compile_optimizer: cannot compile {type(opt).__name__}.step: "
                f"{type(e).__name__}: {e}"
            ) from e
        except BaseException:
            self._view.restore(snap)
            raise
        entry = _entry_of(compiled, inplace=True, extra_refs=refs)
        entry.created_state = snap  # an eager first step (check=) must create the state itself
        self._view.find_reps()
        params = [p for g in opt.param_groups for p in g["params"]]
        key = self._key(self._view.group_scalars(), params)
        self._cache.put(key, entry)
        self._bound_params = params
        return key, entry

    @_one_call_at_a_time
    def __call__(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with lucid.enable_grad():
                loss = closure()
        view = self._view
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        bound = self._bound_params
        if view.changed() or (
            bound and (len(bound) != len(params) or not all(map(operator.is_, params, bound)))
        ):
            view.reset()
            self._entries.clear()
            self._bound_params = []
        scalars = view.group_scalars()
        key = self._key(scalars, params)
        if not any(key[1]):
            if self.grad_clip is not None and self.grad_clip.max_norm is not None:
                self.grad_norm = lucid.tensor(0.0)  # clip_grad_norm_ of no gradients
            return loss
        opts = self._opts
        cache = self._cache
        entry = cache.get(key)
        if entry is None:
            # An eager-only key (a failed parity check) has no entry: no lookup on a hit.
            if key in cache.eager_only:
                self._eager_step()
                return loss
            key, entry = self._build()
            if key in cache.eager_only:  # known once the optimizer state exists
                cache.pop(key)
                self._eager_step()
                return loss
        if opts.mode is not None and opts.wants(entry):
            self._checked_step(key, entry, scalars)
        else:
            self._run_step(key, entry, scalars)
        return loss

    def _run_step(self, key: tuple, entry: StepEntry, scalars: list) -> tuple[tuple, StepEntry]:
        view = self._view
        if entry.n_runs == 0 and entry.first_scalars is not None:
            entry.set_scalars(entry.first_scalars)
        else:
            view.refresh(entry, scalars)
        last = [entry]  # the entry whose feeds a second failure names

        def run(_: tuple, e: StepEntry) -> list:
            last[0] = e
            return e.run(())

        def relayout(_: BaseException) -> None:
            # A parameter, state or gradient array in another layout (re-laid out in place,
            # same objects) or dtype (rebuilt) than at compile time.
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    if p._grad is not None and not p._grad._data.flags.c_contiguous:
                        p._grad = Tensor._wrap(np.asarray(p._grad._data, order="C"))
            ensure_c_layout(entry.refs)

        def rebuild() -> tuple[tuple, StepEntry]:
            k, e = self._build()
            e.set_scalars(e.first_scalars)
            return k, e

        try:
            key, entry, res = self._cache.rebuild_once(
                key, entry, run, rebuild, (TypeError, ValueError), before_rebuild=relayout
            )
        except (TypeError, ValueError) as e:
            raise RuntimeError(
                "compiled optimizer step: cannot bind the feeds: "
                + name_feeds(str(e), last[0].feed_roles)
            ) from e
        entry.after_success(res)
        entry.first_scalars = None
        if entry.tm.grad_norm_index is not None:
            self.grad_norm = Tensor._wrap(np.array(res[entry.tm.grad_norm_index]))
        entry.created_state = None
        return key, entry

    def _eager_step(self) -> None:
        """The optimizer's own eager ``step``, after clipping the gradients eagerly as the
        compiled step clips them (``grad_norm`` is then eager's)."""
        opt = self.optimizer
        clip = self.grad_clip
        if clip is not None:
            from lucid.nn.utils import clip_grad_norm_, clip_grad_value_

            with_grad = [p for g in opt.param_groups for p in g["params"] if p._grad is not None]
            if clip.clip_value is not None:
                clip_grad_value_(with_grad, clip.clip_value)
            if clip.max_norm is not None:
                self.grad_norm = clip_grad_norm_(with_grad, clip.max_norm, clip.norm_type)
        type(opt).step(opt)

    def _checked_step(self, key: tuple, entry: StepEntry, scalars: list) -> None:
        """The compiled update, then the optimizer's own eager ``step`` from the same
        parameters, state and gradients, compared by role (``update:param:<g>.<i>``,
        ``update:state:...``); the eager values stay; a mismatch makes ``key`` eager-only."""
        opt = self.optimizer
        bound_state = {p: dict(st) for p, st in opt.state.items()}
        pre_build = entry.created_state if entry.n_runs == 0 else None
        params = [p for g in opt.param_groups for p in g["params"]]
        tracked = _unique(
            [
                *params,
                *(p._grad for p in params if p._grad is not None),  # clipping writes them
                *(v for st in bound_state.values() for v in st.values() if isinstance(v, Tensor)),
            ]
        )
        saved = _save(tracked)
        plain = {
            p: {k: v for k, v in st.items() if not isinstance(v, Tensor)}
            for p, st in bound_state.items()
        }
        key, entry = self._run_step(key, entry, scalars)
        got = self._update_values(entry)
        _restore(tracked, saved)
        for p, values in plain.items():
            opt.state[p].update(values)
        feeds = _feed_values(entry, ())
        if pre_build is not None:
            self._view.restore(pre_build)
        try:
            self._eager_step()
        finally:
            _rebind_state(opt, bound_state)
            self._view.find_reps()
        want = self._update_values(entry)
        bad = parity.compare_roles(got, want, self._opts.tol)
        if bad is not None:
            self._opts.mismatch(self, key, entry, bad, feeds, want)

    def _update_values(self, entry: StepEntry) -> dict[str, np.ndarray]:
        """The updates by role, and the total gradient norm (``output:0``) when clipping."""
        values = _result_values(entry, np.zeros(()))
        del values["output:0"]
        if entry.tm.grad_norm_index is not None and self.grad_norm is not None:
            values["output:0"] = np.array(self.grad_norm._data, copy=True)
        return values

    def _profile_entry(self, inputs: tuple) -> StepEntry:
        if inputs:
            raise TypeError("profile: a compiled optimizer step takes no inputs")
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        scalars = self._view.group_scalars()
        key = self._key(scalars, params)
        if not any(key[1]):
            raise RuntimeError("profile: no parameter has a gradient: there is no step to run")
        entry = self._entries.get(key)
        if entry is None:
            key, entry = self._build()
        if entry.n_runs == 0 and entry.first_scalars is not None:
            entry.set_scalars(entry.first_scalars)
        else:
            self._view.refresh(entry, scalars)
        return entry


def _refuse_eager_profile(cache: SignatureCache, key: tuple) -> None:
    """``profile`` of a signature that runs eagerly: there is no executable to time."""
    reason = cache.eager_reason(key)
    if reason is not None:
        raise RuntimeError(f"profile: these inputs run eagerly ({reason}): no executable")


def _build_optimizer_module(
    opt: Any, grad_clip: GradClip | None = None, instrumentation: Any = None
) -> tuple[TrainingModule, dict[str, Any]]:
    """The optimizer step alone (``build_optimizer_module``) and its gradient feeds' readers."""
    for gi, g in enumerate(opt.param_groups):
        for k, p in enumerate(g["params"]):
            if p._grad is not None and tuple(p._grad.shape) != tuple(p.shape):
                raise ValueError(
                    f"parameter {gi}.{k} has shape {tuple(p.shape)} but its gradient "
                    f"{tuple(p._grad.shape)}"
                )
    with_grad = (p for g in opt.param_groups for p in g["params"] if p._grad is not None)
    tm = build_optimizer_module(
        opt,
        fuse_optimizer=_fuse_updates(with_grad),
        grad_clip=grad_clip,
        instrumentation=instrumentation,
    )
    refs = {role: _GradRef(p, role[len("grad:param:") :]) for role, p in tm.grad_feeds.items()}
    return tm, refs


def compile_optimizer(
    optimizer: Any,
    *,
    backend: str = "auto",
    options: dict[str, Any] | None = None,
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
    max_grad_norm: float | None = None,
    norm_type: float | str = 2.0,
    clip_grad_value: float | None = None,
) -> Any:
    """Make ``optimizer.step()`` one cached native executable (in-place parameter and state
    writes) and return the optimizer. Hyperparameters and per-step scalars are fed each step,
    so schedulers take effect without recompiling; ``state``/``state_dict()`` hold the real
    buffers. Raises ``CompileError`` for what cannot be compiled. ``options``: the debugging
    switches of ``lucid.compile``'s ``options=`` (not ``pipeline``); ``optimizer.step`` has
    ``cache_info()``, ``timing()``, ``ir()``, ``module()`` and ``profile()``. ``check``/
    ``check_tolerance``: as for ``fused_step`` (the update compared with the eager ``step``).

    ``max_grad_norm``/``norm_type``/``clip_grad_value`` clip the gradients of the optimizer's
    parameters inside the step as ``fused_step``'s do (``p.grad`` is left clipped, as eager
    clipping leaves it; ``optimizer.step.grad_norm`` is the total norm before clipping)."""
    if not hasattr(optimizer, "_update") or not hasattr(optimizer, "_static_keys"):
        raise TypeError(
            f"compile_optimizer needs a lucid.optim optimizer, got {type(optimizer).__name__}"
        )
    compiled = optimizer.__dict__.get("step")
    if isinstance(compiled, CompiledOptimizerStep):
        clip = GradClip.of(max_grad_norm, norm_type, clip_grad_value, what="compile_optimizer")
        if clip != compiled.grad_clip:
            raise ValueError(
                f"compile_optimizer: the optimizer is already compiled with gradient clipping "
                f"{compiled.grad_clip}; asked for {clip}"
            )
        return optimizer
    optimizer.step = CompiledOptimizerStep(
        optimizer,
        backend=backend,
        options=options,
        check=check,
        check_tolerance=check_tolerance,
        max_grad_norm=max_grad_norm,
        norm_type=norm_type,
        clip_grad_value=clip_grad_value,
    )
    return optimizer
