"""``compile_optimizer``: ``optimizer.step()`` as one cached native executable writing
parameters and optimizer state in place (hyperparameters and per-step scalars are feeds).
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import lucid
from lucid._tensor import Tensor
from lucid.amp import autocast_key
from lucid.compile import parity
from lucid.compile._binding import ensure_c_layout, name_feeds
from lucid.compile.entry import StepEntry
from lucid.compile.errors import CompileError
from lucid.compile.options import (
    check_settings,
    resolve_backend,
)
from lucid.compile.training.base import (
    _feed_values,
    _one_call_at_a_time,
    _rebind_state,
    _restore,
    _result_values,
    _save,
    _StepIntrospection,
    _StepOptions,
    _unique,
)
from lucid.compile.training.builder import (
    TrainingModule,
    build_optimizer_module,
)
from lucid.compile.training.entries import (
    _COMPILER_ERRORS,
    SkippedFirstRuns,
    _compile_step,
    _entry_of,
    _fuse_updates,
    _GradRef,
    _OptimizerView,
)
from lucid.compile.training.scaling import BoundScaler
from lucid.compile.training.update_terms import GradClip, LossScaling

logger = logging.getLogger("lucid.compile")

__all__ = ["CompiledOptimizerStep", "compile_optimizer"]


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
        scaler: Any = None,
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
        self.backend = resolve_backend(backend)
        self._opts = _StepOptions("compile_optimizer", options, check, check_tolerance)
        self.eager = optimizer.step
        self._view = _OptimizerView(optimizer)
        self._skipped_first = SkippedFirstRuns(self._view)
        self._new_cache(recompiles=False)
        self._scaler = BoundScaler.of(
            scaler, "compile_optimizer", (p for g in optimizer.param_groups for p in g["params"])
        )
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        # The parameter objects the entries bind. As in PyTorch, the optimizer updates the
        # objects in its param_groups (a parameter replaced in the model afterwards is not its
        # business); one swapped inside param_groups is noticed here and rebinds.
        self._bound_params: list[Tensor] = []

    def _key(self, scalars: list, params: list) -> tuple:
        return (
            self._view.statics(scalars),
            tuple([p._grad is not None for p in params]),
            autocast_key(),
            None if self._scaler is None else self._scaler.key(),
        )

    def _build(self) -> tuple[tuple, StepEntry]:
        check_settings(self.backend)
        opt = self.optimizer
        snap = self._view.snapshot()
        refs: dict[str, Any] = {}

        scaling = None if self._scaler is None else self._scaler.loss_scaling()

        def build(inst: Any) -> TrainingModule:
            tm, grad_refs = _build_optimizer_module(opt, self.grad_clip, inst, scaling)
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
        if self._scaler is not None:
            self._scaler.load()
        bound = self._bound_params
        if view.changed() or (
            bound and (len(bound) != len(params) or not all(map(operator.is_, params, bound)))
        ):
            view.reset()
            self._entries.clear()
            self._skipped_first.clear()
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
        if entry is not None and (why := view.stale(entry)) is not None:
            logger.info("compile_optimizer: compiling the step again: %s", why)
            cache.pop(key)
            entry = None
        if entry is None:
            # An eager-only key (a failed parity check) has no entry: no lookup on a hit.
            if key in cache.eager_only:
                self._eager_step()
                return loss
            resumed = self._skipped_first.resume(cache, key)
            key, entry = resumed if resumed is not None else self._build()
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
        view.prepare(entry, scalars)
        scale_before = None if self._scaler is None else self._scaler.scale_value()
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
        if self._scaler is not None:
            self._scaler.store()
            if self._scaler.skipped(scale_before):
                params = [p for g in self.optimizer.param_groups for p in g["params"]]
                self._skipped_first.park(
                    self._cache, key, entry, lambda: self._key(view.group_scalars(), params)
                )
        entry.first_scalars = None
        if entry.tm.grad_norm_index is not None:
            self.grad_norm = Tensor._wrap(np.array(res[entry.tm.grad_norm_index]))
        entry.created_state = None
        return key, entry

    def _eager_step(self) -> None:
        """The optimizer's own eager ``step``, after clipping the gradients eagerly as the
        compiled step clips them (``grad_norm`` is then eager's); with a scaler, unscaled first,
        skipped on inf/NaN and the scale updated, as ``scaler.step(opt); scaler.update()``."""
        opt = self.optimizer
        scaler = None if self._scaler is None else self._scaler.scaler
        if scaler is not None:
            scaler.unscale_(opt)
        clip = self.grad_clip
        if clip is not None:
            from lucid.nn.utils import clip_grad_norm_, clip_grad_value_

            with_grad = [p for g in opt.param_groups for p in g["params"] if p._grad is not None]
            if clip.clip_value is not None:
                clip_grad_value_(with_grad, clip.clip_value)
            if clip.max_norm is not None:
                self.grad_norm = clip_grad_norm_(with_grad, clip.max_norm, clip.norm_type)
        if scaler is None:
            type(opt).step(opt)
            return
        if not scaler._per_optimizer_states[id(opt)]["found_inf"]:
            type(opt).step(opt)
        scaler.update()
        self._scaler.load()  # the eager step's scaler state, as the compiled step binds it

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
                *([] if self._scaler is None else self._scaler.tensors()),
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
        self._view.prepare(entry, scalars)
        return entry


def _build_optimizer_module(
    opt: Any,
    grad_clip: GradClip | None = None,
    instrumentation: Any = None,
    loss_scaling: LossScaling | None = None,
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
        loss_scaling=loss_scaling,
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
    scaler: Any = None,
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
    clipping leaves it; ``optimizer.step.grad_norm`` is the total norm before clipping).

    ``scaler`` (a ``lucid.amp.GradScaler`` whose ``scale(loss)`` was differentiated): the step
    then does what ``scaler.step(optimizer); scaler.update()`` does, inside the executable:
    unscale ``p.grad`` (before clipping), skip the update when a gradient is inf/NaN, and grow
    or back off the scale."""
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
        bound = compiled._scaler.scaler if compiled._scaler is not None else None
        if scaler is not bound and (scaler is not None or bound is not None):
            raise ValueError(
                "compile_optimizer: the optimizer is already compiled with another scaler "
                f"({bound!r}); asked for {scaler!r}"
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
        scaler=scaler,
    )
    return optimizer
