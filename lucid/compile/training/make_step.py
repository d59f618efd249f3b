"""``make_step`` and ``compiled_step``: a compiled forward + backward whose loss carries a
``grad_fn`` handing the compiled gradients to ``p.grad``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid import _random
from lucid._autograd import Node
from lucid._state import state as _state
from lucid._tensor import Tensor
from lucid.amp import autocast_key
from lucid.compile import parity
from lucid.compile._binding import STRUCTURE_VERSION, Bound
from lucid.compile.cache import LRU, max_entries
from lucid.compile.entry import StepEntry
from lucid.compile.errors import CompileError, FeedMismatch
from lucid.compile.options import (
    check_settings,
    resolve_backend,
)
from lucid.compile.signature import step_input_sig
from lucid.compile.training.base import (
    _feed_values,
    _grad_roles,
    _one_call_at_a_time,
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
    _compile_step,
    _describe,
    _entry_of,
    _run_checked,
)
from lucid.ops._registry import OpDef

logger = logging.getLogger("lucid.compile")

__all__ = ["TrainStep", "compiled_step", "make_step"]


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
    _build_options: dict[str, Any] = {}  # more build_training_module keywords (subclasses)

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
        self.backend = resolve_backend(backend)
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
            autocast_key(),
        )

    def _build(self, key: tuple, inputs: tuple) -> StepEntry:
        check_settings(self.backend)
        self._cache.note_compile(key)
        opts = self._opts
        try:
            compiled = _compile_step(
                self._what,
                opts.switches,
                self.backend,
                lambda inst: build_training_module(
                    self.model,
                    self.loss_fn,
                    inputs,
                    pipeline=opts.pipeline,
                    instrumentation=inst,
                    **self._build_options,
                ),
                inplace=True,
                describe=_describe(inputs),
            )
        except _COMPILER_ERRORS as e:
            raise CompileError(
                f"{self._what}: cannot compile the training step for inputs {_describe(inputs)}: "
                f"{type(e).__name__}: {e}"
            ) from e
        entry = _entry_of(compiled, inplace=True)
        self._bound.settle()
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
            (FeedMismatch,),
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
    name = resolve_backend(backend)
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
