"""``fused_step``: forward + loss + backward + optimizer update as one native executable;
parameters, optimizer state, BatchNorm buffers and the RNG state are updated in place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.amp import autocast_key
from lucid.compile import parity
from lucid.compile._binding import STRUCTURE_VERSION, Bound
from lucid.compile.entry import StepEntry
from lucid.compile.errors import CompileError, FeedMismatch
from lucid.compile.options import (
    check_settings,
    resolve_backend,
)
from lucid.compile.signature import step_input_sig
from lucid.compile.training.base import (
    _feed_values,
    _one_call_at_a_time,
    _rebind_state,
    _refuse_eager_profile,
    _restore,
    _result_values,
    _save,
    _StepIntrospection,
    _StepOptions,
    _unique,
)
from lucid.compile.training.builder import (
    build_training_module,
)
from lucid.compile.training.entries import (
    _COMPILER_ERRORS,
    SkippedFirstRuns,
    _compile_step,
    _describe,
    _entry_of,
    _fuse_updates,
    _OptimizerView,
    _run_checked,
)
from lucid.compile.training.scaling import BoundScaler
from lucid.compile.training.update_terms import GradClip, LossScaling

logger = logging.getLogger("lucid.compile")

__all__ = ["FusedStep", "fused_step"]


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
        scaler: Any = None,
        master_weights: bool = False,
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
        self.backend = resolve_backend(backend)
        self._view = _OptimizerView(optimizer)
        self._skipped_first = SkippedFirstRuns(self._view)
        self._params = list(model.parameters())
        self._new_cache()
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        self._bound = Bound([model])
        self._opts = _StepOptions("fused_step", options, check, check_tolerance)
        # Checked before master weights change the optimizer (whose half parameters they
        # replace: the scaler then sees float32 masters only).
        held = [] if master_weights else [p for g in optimizer.param_groups for p in g["params"]]
        self._scaler = BoundScaler.of(scaler, "fused_step", held)
        # id(float32 master) -> the half-precision parameter it stands in for
        self._masters: dict[int, Tensor] = _master_weights(optimizer) if master_weights else {}

    def _check_structure(self) -> None:
        """A parameter, buffer or submodule was replaced: drop the entries (they bind the old
        objects). A replaced parameter the optimizer still holds would silently stop training
        (the optimizer updates the old object, as in PyTorch): refuse it, naming it."""
        bound = self._bound
        old, old_version = bound.tensors, bound.version
        if not bound.changed():
            return
        self._drop_entries()
        self._params = list(self.model.parameters())
        held = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        held |= {id(p) for p in self._masters.values()}
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
            autocast_key(),
            self._scaling_key(),
        )

    def _scaling_key(self) -> tuple | None:
        return None if self._scaler is None else self._scaler.key()

    def _loss_scaling(self) -> LossScaling | None:
        return None if self._scaler is None else self._scaler.loss_scaling()

    def _scaler_in(self) -> None:
        if self._scaler is not None:
            self._scaler.load()

    def _scaler_out(self) -> None:
        if self._scaler is not None:
            self._scaler.store()

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
                    loss_scaling=self._loss_scaling(),
                    masters=self._masters,
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
        self._bound.settle()
        entry.created_state = snap  # undone if the entry's first run fails
        self._view.find_reps()
        key = self._key(inputs, self._view.group_scalars())
        self._cache.put(key, entry)
        return key, entry

    def _drop_entries(self) -> None:
        """Forget every compiled entry (they bind objects the model or optimizer replaced)."""
        self._entries.clear()
        self._skipped_first.clear()

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
        self._scaler_in()
        view = self._view
        if view.changed():  # load_state_dict: the bound state tensors are gone
            view.reset()
            self._drop_entries()
        scalars = view.group_scalars()
        key = self._key(inputs, scalars)
        opts = self._opts
        cache = self._cache
        entry = cache.get(key)
        if entry is not None and (why := view.stale(entry)) is not None:
            logger.info("fused_step: compiling the step again: %s", why)
            cache.pop(key)
            entry = None
        if entry is None:
            # An eager-only key (a failed parity check) has no entry: no lookup on a hit.
            if key in cache.eager_only:
                return self._eager_step(inputs)
            resumed = self._skipped_first.resume(cache, key)
            if resumed is not None:
                key, entry = resumed
            else:
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
        view.prepare(entry, scalars)
        scale_before = None if self._scaler is None else self._scaler.scale_value()
        tensors = [a for a in inputs if isinstance(a, Tensor)]
        first = entry

        def run(k: tuple, e: StepEntry) -> list:
            try:
                return _run_checked(e, tensors, "fused_step")
            except FeedMismatch:
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

        key, entry, res = self._cache.rebuild_once(key, entry, run, rebuild, (FeedMismatch,))
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
        self._scaler_out()
        if scale_before is not None and self._scaler.skipped(scale_before):
            self._skipped_first.park(
                self._cache, key, entry, lambda: self._key(inputs, self._view.group_scalars())
            )
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
        scaler = self._grad_scaler()
        loss, _ = parity.eager_optimizer_step(
            self.model,
            self.loss_fn,
            self.optimizer,
            inputs,
            self._clip(),
            scaler=scaler,
            masters=self._masters,
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
                *self._scaler_tensors(),
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
                self.model,
                self.loss_fn,
                opt,
                inputs,
                self._clip(),
                scaler=self._grad_scaler(),
                masters=self._masters,
            )
        finally:
            _rebind_state(opt, bound_state)
            self._view.find_reps()
            self._scaler_in()  # the eager step's scaler state, as the step binds it
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

    def master_weights(self) -> dict[Tensor, Tensor]:
        """Each half-precision parameter's float32 master weight (empty without
        ``master_weights=True``)."""
        by_id = {id(m): m for g in self.optimizer.param_groups for m in g["params"]}
        return {p: by_id[mid] for mid, p in self._masters.items()}

    def _grad_scaler(self) -> Any:
        return None if self._scaler is None else self._scaler.scaler

    def _scaler_tensors(self) -> list[Tensor]:
        return [] if self._scaler is None else self._scaler.tensors()

    def _profile_entry(self, inputs: tuple) -> StepEntry:
        if self._bound.version != STRUCTURE_VERSION[0]:
            self._check_structure()
        self._scaler_in()
        view = self._view
        if view.changed():
            view.reset()
            self._drop_entries()
        scalars = view.group_scalars()
        key = self._key(inputs, scalars)
        _refuse_eager_profile(self._cache, key)
        entry = self._entries.get(key)
        if entry is None:
            key, entry = self._build(inputs)
        view.prepare(entry, scalars)
        return entry


def fused_step(
    model: Any,
    loss_fn: Callable[..., Tensor],
    optimizer: Any,
    *,
    process_group: Any = None,
    bucket_cap_mb: float | None = None,
    check_finite: bool = False,
    backend: str = "auto",
    options: dict[str, Any] | None = None,
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
    max_grad_norm: float | None = None,
    norm_type: float | str = 2.0,
    clip_grad_value: float | None = None,
    scaler: Any = None,
    master_weights: bool = False,
) -> Any:
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

    ``process_group`` (a ``lucid.distributed`` group; a ``DistributedDataParallel`` model
    brings its own, and its module is what is compiled): data-parallel training. The gradients
    are averaged over the ranks in buckets of at most ``bucket_cap_mb`` (default 25, or the DDP
    model's) by the ``grad-allreduce`` pass; the step runs as a forward + backward executable,
    one MPI all-reduce per bucket, then ``compile_optimizer``'s update executable, which clips
    the averaged gradients (``p.grad`` holds them afterwards). ``check_finite``, ``check``,
    ``scaler`` and ``master_weights`` are not taken there yet.

    ``max_grad_norm`` clips the gradients inside the step as ``clip_grad_norm_(params,
    max_grad_norm, norm_type)`` before ``opt.step()`` would (``step.grad_norm`` is then the total
    norm before clipping, a 0-d tensor; a non-finite one raises ``FloatingPointError`` under
    ``check_finite``); ``clip_grad_value`` clamps them first, as ``clip_grad_value_``.

    ``scaler`` (a ``lucid.amp.GradScaler``) does inside the step what ``scaler.scale(loss)
    .backward(); scaler.unscale_(opt); <clipping>; scaler.step(opt); scaler.update()`` does
    eagerly: a step whose gradients are not all finite leaves the parameters and the optimizer
    state untouched, and the scaler's scale and growth tracker are updated (``get_scale()`` and
    ``state_dict()`` see them). The returned loss is the unscaled one.

    ``master_weights=True`` (for float16/bfloat16 models) replaces each half-precision parameter
    in ``optimizer`` by a float32 master copy (``step.master_weights()`` maps them): the
    optimizer and its state work in float32 on the half gradients widened, and each parameter is
    set to its master rounded to its dtype. The optimizer must not have taken a step yet.
    """
    distributed = _distributed_step(
        model,
        loss_fn,
        optimizer,
        process_group,
        bucket_cap_mb,
        backend=backend,
        options=options,
        max_grad_norm=max_grad_norm,
        norm_type=norm_type,
        clip_grad_value=clip_grad_value,
        refused={
            "check_finite": check_finite,
            "check": check,
            "scaler": scaler,
            "master_weights": master_weights,
        },
    )
    if distributed is not None:
        return distributed
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
        scaler=scaler,
        master_weights=master_weights,
    )


def _master_weights(optimizer: Any) -> dict[int, Tensor]:
    """Put a float32 copy of each half-precision parameter in ``optimizer`` in its place;
    ``{id(master): parameter}``."""
    from lucid import _dtype

    if optimizer.state:
        raise ValueError(
            "fused_step: master_weights=True needs an optimizer that has not taken a step yet "
            "(its state would belong to the half-precision parameters)"
        )
    masters: dict[int, Tensor] = {}
    for group in optimizer.param_groups:
        params = group["params"]
        for i, p in enumerate(params):
            if p.dtype in (_dtype.float16, _dtype.bfloat16):
                master = Tensor._wrap(p._data.astype(np.float32))
                master._requires_grad = p._requires_grad
                params[i] = master
                masters[id(master)] = p
    return masters


def _distributed_step(
    model: Any,
    loss_fn: Callable[..., Tensor],
    optimizer: Any,
    process_group: Any,
    bucket_cap_mb: float | None,
    *,
    refused: dict[str, Any],
    **kw: Any,
) -> Any:
    """``fused_step``'s data-parallel step, or None when it trains on one process alone."""
    from lucid.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        kw["broadcast_buffers"] = model.broadcast_buffers
        if process_group is None:
            process_group = model.process_group
        if bucket_cap_mb is None:
            bucket_cap_mb = model.bucket_cap_mb
        model = model.module
    if process_group is None:
        if bucket_cap_mb is not None:
            raise ValueError("fused_step: bucket_cap_mb needs a process_group")
        return None
    for name, value in refused.items():
        if value:
            raise ValueError(
                process_group.error(f"fused_step: {name}= is not taken with a process_group")
            )
    from lucid.compile.training.distributed import DistributedFusedStep

    return DistributedFusedStep(
        model,
        loss_fn,
        optimizer,
        process_group,
        bucket_cap_mb=25.0 if bucket_cap_mb is None else bucket_cap_mb,
        **kw,
    )
