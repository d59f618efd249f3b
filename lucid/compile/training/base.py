"""What the training steps share: ``options=``/``check=`` state (``_StepOptions``), the eager
reference helpers of parity checking, one-call-at-a-time locking, and introspection
(``cache_info``, ``timing``, ``ir``, ``module``, ``profile``) over the step's ``SignatureCache``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.compile import _recompile, introspect, parity
from lucid.compile.cache import LRU, RecompileLog, SignatureCache
from lucid.compile.entry import StepEntry
from lucid.compile.options import (
    GRAPH_PIPELINE,
    parse_options,
)
from lucid.compile.session import STAGES
from lucid.compile.training.entries import (
    profile_entry,
)

logger = logging.getLogger("lucid.compile")


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
        pipeline, self.switches = parse_options(options, what)
        self.pipeline = GRAPH_PIPELINE if pipeline is None else pipeline
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
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
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


def _refuse_eager_profile(cache: SignatureCache, key: tuple) -> None:
    """``profile`` of a signature that runs eagerly: there is no executable to time."""
    reason = cache.eager_reason(key)
    if reason is not None:
        raise RuntimeError(f"profile: these inputs run eagerly ({reason}): no executable")
