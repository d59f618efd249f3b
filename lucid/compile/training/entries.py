"""A training module compiled for one signature, as a cache entry of a training step:
``_compile_step`` builds and compiles it in one ``CompileSession``, ``_make_entry`` plans its
feeds (inputs, bound tensors, preallocated step scalars, the RNG) and results, ``_run_checked``
runs it (re-laying out arrays the runtime refuses), ``_OptimizerView`` reads an optimizer's
per-step scalars and notices ``load_state_dict``. Shared by every training step and by the
steps ``load_compiled`` returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid._tensor import Tensor
from lucid.compile import introspect
from lucid.compile._binding import ensure_c_layout, name_feeds
from lucid.compile.entry import StepEntry, _Slot
from lucid.compile.errors import CompileError, FeedMismatch, Unsupported
from lucid.compile.options import (
    backend_of,
)
from lucid.compile.session import CompileSession
from lucid.compile.training.builder import (
    TrainingModule,
)
from lucid.ir._gc import paused_gc
from lucid.passes import PassFailure
from lucid.trace._tracing import GraphBreak

logger = logging.getLogger("lucid.compile")


# Errors that mean "the compiler cannot do this" (as opposed to the user's model or loss
# rejecting its inputs, which surface unchanged, exactly as eager would raise them).
_COMPILER_ERRORS = (GraphBreak, Unsupported, PassFailure, NotImplementedError)


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


@paused_gc()  # the whole compile, tracing included (see lucid.ir._gc)
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
    session = CompileSession(switches)
    t0 = time.perf_counter()
    tm = build(session.instrumentation(f"{what}-graph"))
    traced_ms = (time.perf_counter() - t0) * 1e3 - sum(tm.passes_ms.values())
    session.record("trace", max(traced_ms, 0.0))  # tracing and import
    for name, ms in tm.passes_ms.items():
        session.record(name, ms)
    executable = session.compile_module(
        tm.module, backend_of(backend), inplace=inplace, pipeline=f"{what}-lowering"
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
            raise FeedMismatch(f"{what}: {name_feeds(str(e2), entry.feed_roles)}") from e


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
        """Each group's representative: its first parameter with state that is trained (a
        frozen one's step count stops), else its first with state."""
        st = self.opt.state
        reps: list[Tensor | None] = []
        for g in self.opt.param_groups:
            held = [p for p in g["params"] if st.get(p)]
            trained = [p for p in held if p._requires_grad]
            reps.append(trained[0] if trained else held[0] if held else None)
        self.reps = reps

    def changed(self) -> bool:
        """``load_state_dict`` replaced the state or the groups, or a group was added."""
        opt = self.opt
        return (
            opt.state is not self.state_obj
            or opt.param_groups is not self.groups_obj
            or len(opt.param_groups) != len(self.reps)
        )

    def group_scalars(self) -> list[dict | None]:
        opt = self.opt
        st = opt.state
        out = []
        for group, rep in zip(opt.param_groups, self.reps, strict=False):
            if rep is not None and rep in st:
                try:
                    out.append(opt._step_scalars(group, st[rep], False))
                    continue
                except KeyError:  # its state was emptied (``opt.state[p] = {}``)
                    pass
            try:  # stateless (plain SGD), or no step taken yet
                out.append(opt._step_scalars(group, {}, False))
            except KeyError:
                out.append(None)
        return out

    def stale(self, entry: StepEntry) -> str | None:
        """Why ``entry``'s compiled update no longer fits the optimizer's state (None: it
        fits): a state tensor it binds was replaced or removed, or the parameters of a group
        whose step scalars it feeds once no longer agree on them (``OptimizerBindings``). The
        caller compiles the step again, which then binds the new tensors or feeds per
        parameter."""
        bindings = entry.tm.bindings if entry.tm is not None else None
        if bindings is None:
            return None
        st = self.opt.state
        per_param, shared_steps = bindings.checks()
        for param, pairs in per_param:
            held = st.get(param)
            if held is None:
                return "the optimizer's state of a parameter was removed"
            for key, tensor in pairs:
                if held.get(key) is not tensor:
                    return f"the optimizer's state {key!r} of a parameter was replaced or removed"
        for gi, params, step_tensors in shared_steps:
            if step_tensors is None:
                steps = [st[p]["step"]._data.item() for p in params]
            else:  # the bound tensors, checked above to be the optimizer's
                steps = [t._data.item() for t in step_tensors]
            if steps.count(steps[0]) == len(steps):
                continue
            # Different step counts; the scalars may still agree (Adagrad without lr_decay).
            group = self.opt.param_groups[gi]
            shared = {key for _, g, param, key in entry.scalar_plan if g == gi and param is None}
            values = [self.opt._step_scalars(group, st[p], False) for p in params]
            if any(v[k] != values[0][k] for v in values[1:] for k in shared):
                return (
                    f"the parameters of optimizer group {gi} no longer share their step count "
                    "(some were not updated by every step)"
                )
        return None

    def statics(self, scalars: list[dict | None]) -> tuple:
        keys = self.static_keys
        groups = self.opt.param_groups
        return tuple(
            [
                (len(g["params"]), None if s is None else tuple([s[k] for k in keys]))
                for g, s in zip(groups, scalars, strict=True)
            ]
        )

    def prepare(self, entry: StepEntry, scalars: list[dict | None]) -> None:
        """Set ``entry``'s step scalars for its next run: the values its build saw on its first
        run (a first step may differ: SGD's momentum buffer), the optimizer's current ones
        after."""
        if entry.n_runs == 0 and entry.first_scalars is not None:
            entry.set_scalars(entry.first_scalars)
        else:
            self.refresh(entry, scalars)

    def refresh(self, entry: StepEntry, scalars: list[dict | None]) -> None:
        opt = self.opt
        last = entry.scalar_last
        if last is None:
            last = entry.scalar_last = [None] * len(entry.scalar_plan)
        own_reps = entry.tm.bindings.shared_steps if entry.tm and entry.tm.bindings else ()
        if own_reps:
            # A group's scalars from a parameter this entry updates (``reps`` may name one it
            # does not, whose step count lags).
            scalars = list(scalars)
            for gi, params in own_reps:
                if params[0] is not self.reps[gi]:
                    scalars[gi] = opt._step_scalars(
                        opt.param_groups[gi], opt.state[params[0]], False
                    )
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
        self.take_created(snap)

    def take_created(self, snap: dict) -> dict:
        """Take the state created since ``snap`` out of the optimizer; returns it for
        ``put_back`` (parameter -> the entries taken)."""
        st = self.opt.state
        taken: dict = {}
        for p in list(st.keys()):
            if p not in snap:
                taken[p] = st.pop(p)
            else:
                created = {k: st[p].pop(k) for k in set(st[p]) - snap[p]}
                if created:
                    taken[p] = created
        return taken

    def put_back(self, taken: dict) -> bool:
        """Put state ``take_created`` took back, unless the optimizer holds any of it anew
        (then nothing changes); whether it did."""
        st = self.opt.state
        if any(p in st and not st[p].keys().isdisjoint(entries) for p, entries in taken.items()):
            return False
        for p, entries in taken.items():
            if p in st:
                st[p].update(entries)
            else:
                st[p] = entries
        self.find_reps()
        return True


class SkippedFirstRuns:
    """Entries whose first run a ``GradScaler`` skipped, kept for the next call of their
    signature instead of compiled again (a run of skipped first steps, a scale far too large,
    then compiles once).

    Eager ``scaler.step`` skips ``optimizer.step()``, so the state the entry's build created must
    not exist after the skip (SGD's first momentum step differs from later ones): it is taken out
    of the optimizer, untouched by the skipped run, and put back when the entry is resumed, with
    the entry's first-step scalars. Keyed by the signature's key without that state; the owner
    clears them whenever it drops its entries (they bind the model's and optimizer's objects)."""

    def __init__(self, view: _OptimizerView):
        self.view = view
        self.parked: dict[tuple, tuple] = {}

    def park(self, cache: Any, key: tuple, entry: StepEntry, key_now: Callable[[], tuple]) -> None:
        """After ``entry``'s skipped run: drop it from ``cache`` and take its created state out
        of the optimizer (only on a first run: later skips keep both)."""
        if entry.n_runs > 1 or entry.first_scalars is None or entry.created_state is None:
            return
        cache.entries.pop(key, None)
        taken = self.view.take_created(entry.created_state)
        self.view.find_reps()
        self.parked[key_now()] = (key, entry, taken, entry.first_scalars, entry.created_state)

    def resume(self, cache: Any, key: tuple) -> tuple[tuple, StepEntry] | None:
        """The entry parked for ``key`` back in ``cache`` with its state, ready for a first run
        again: (its key, the entry); None when none is parked (or its state is back anew)."""
        parked = self.parked.pop(key, None)
        if parked is None:
            return None
        built_key, entry, taken, first_scalars, created_state = parked
        if not self.view.put_back(taken):
            return None
        entry.n_runs, entry.created_state = 0, created_state
        entry.first_scalars = self._first_scalars(entry, taken, first_scalars)
        cache.put(built_key, entry)
        return built_key, entry

    def _first_scalars(self, entry: StepEntry, taken: dict, built: dict) -> dict:
        """The step scalars of a first step now: ``built`` (the build's) with each optimizer
        scalar read again, as a scheduler may have changed the learning rate since."""
        opt, reps = self.view.opt, self.view.reps
        role_of = {id(slot._data): role for role, slot in entry.scalar_slots.items()}
        values = dict(built)
        for arr, gi, param, key in entry.scalar_plan:
            p = reps[gi] if param is None else param
            state = opt.state[p] if p is not None and p in opt.state else {}
            fresh = p is not None and p in taken  # its state is the build's: a first step
            values[role_of[id(arr)]] = opt._step_scalars(opt.param_groups[gi], state, fresh)[key]
        return values

    def clear(self) -> None:
        self.parked.clear()
