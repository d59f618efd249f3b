"""Parity checking (``check=``) and timed serving (``mode="auto"``) of ``CompiledModule``.

``check_call`` runs a compiled entry and the model eagerly from the same state and compares
every output, buffer update and (in grad mode) gradient; a mismatch returns the eager result,
makes the signature eager-only and bisects to the culprit. ``CheckedEntry`` and ``AutoEntry``
wrap a cache entry so that only checked or timed signatures pay for it.
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.compile import _pytree, parity
from lucid.compile.entry import GradEntry
from lucid.compile.errors import FeedMismatch
from lucid.compile.inference.forward import _contiguous, _leaf_arrays
from lucid.compile.options import GRAPH_PIPELINE
from lucid.compile.signature import CacheKey, _is_symbolic

__all__ = ["AUTO_TRIALS", "AutoEntry", "CheckedEntry", "check_call"]

logger = logging.getLogger("lucid.compile")


def check_call(cm: Any, key: CacheKey, entry: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``entry`` and the model eagerly from the same state and compare every output
    (and buffer update). A mismatch returns the eager result, makes ``key`` eager-only
    with the reason and bisects to the culprit pass or lowering rule."""
    if isinstance(entry, GradEntry):
        return check_grad_call(cm, key, entry, args, kwargs)
    buffers = [t for _, t in cm._bound.tensors if not t._requires_grad]
    saved = [np.array(t._data, copy=True) for t in buffers]
    rng = np.array(_random.get_rng_state()._data, copy=True)
    roles = getattr(entry, "feed_roles", None)
    feeds = None
    if roles is not None:
        args, kwargs = _contiguous(args, kwargs)
        feeds = [np.array(f, copy=True) for f in entry.bind(args, kwargs)]
    try:
        out = entry(args, kwargs)
    except (TypeError, ValueError, FeedMismatch):
        out = cm._run_fixed(entry, args, kwargs)
    got = _leaf_arrays(out)
    got_buffers = [np.array(t._data, copy=True) for t in buffers]
    for t, data in zip(buffers, saved, strict=True):
        np.copyto(t._data, data)
    _random.set_rng_state(Tensor._wrap(rng))
    eager = cm._model(*args, **kwargs)
    tol = cm._check_tol
    bad = parity.compare(got, _leaf_arrays(eager), tol)
    if bad is None:
        bad = parity.compare(got_buffers, [t._data for t in buffers], tol, "buffer")
    if bad is None:
        return out
    culprit = None
    if feeds is not None:
        try:
            culprit = parity.bisect(
                entry.trace,
                dict(zip(roles, feeds, strict=True)),
                pipeline=cm._options.pipeline or GRAPH_PIPELINE,
                backend=cm._options.backend,
                tol=tol,
                batch=feeds[0].shape[0] if _is_symbolic(key) and feeds[0].ndim else None,
            )
        except Exception as e:  # noqa: BLE001 - the user still gets the eager result
            logger.warning("lucid.compile: parity bisection failed: %s: %s", type(e), e)
    return parity_failed(cm, key, bad, culprit, eager)


def check_grad_call(cm: Any, key: CacheKey, entry: Any, args: tuple, kwargs: dict) -> Any:
    """``_checked`` for a grad-mode entry: the outputs, the buffer updates and, through a
    probe backward with seeded random cotangents (``autograd.grad``, ``.grad`` untouched),
    the gradients of every input and parameter that requires grad are compared with eager.
    A mismatch returns eager's outputs (so the user's backward gives eager's gradients)
    and bisects over the grad pipeline (vjp, graph passes, the lowering of forward and
    backward ops)."""
    from lucid._autograd import grad as autograd_grad

    buffers = [t for _, t in cm._bound.tensors if not t._requires_grad]
    saved = {id(t): np.array(t._data, copy=True) for t in buffers}
    rng = np.array(_random.get_rng_state()._data, copy=True)
    args, kwargs = _contiguous(args, kwargs)
    prog = entry._program_for(args) if entry.symbolic else entry.program
    tensor_args = entry.tensor_args(args)

    def tensor_of(role: str) -> Tensor:
        name = role[len("input:") :] if role.startswith("input:") else None
        if name is None:
            return entry.captured[role]
        return tensor_args[int(name)] if name.isdigit() else kwargs[name]

    wrt = [tensor_of(r) for r in prog.grad_roles]
    try:
        out = entry(args, kwargs)
    except (TypeError, ValueError, FeedMismatch):
        out = cm._run_fixed(entry, args, kwargs)
    got_buffers = [np.array(t._data, copy=True) for t in buffers]
    for t in buffers:
        np.copyto(t._data, saved[id(t)])
    _random.set_rng_state(Tensor._wrap(rng))
    eager = cm._model(*args, **kwargs)
    tol = cm._check_tol
    leaves_c: list = []
    leaves_e: list = []
    _pytree.flatten(out, leaves_c)
    _pytree.flatten(eager, leaves_e)
    got = [t for t in leaves_c if isinstance(t, Tensor)]
    want = [t for t in leaves_e if isinstance(t, Tensor)]
    bad = parity.compare([t._data for t in got], [t._data for t in want], tol)
    if bad is None:
        bad = parity.compare(got_buffers, [t._data for t in buffers], tol, "buffer")
    # Seeded cotangents (never the global RNG): one per floating output, as the trace's.
    gen = np.random.default_rng(0)
    cots = {
        j: gen.standard_normal(t.shape).astype(t._data.dtype)
        for j, t in enumerate(want)
        if t.dtype.is_floating_point
    }

    def probe(leaves: list) -> list:
        outs = [(t, cots[j]) for j, t in enumerate(leaves) if j in cots and t._requires_grad]
        if not outs or not wrt:
            return [None] * len(wrt)
        grads = autograd_grad(
            [t for t, _ in outs],
            wrt,
            grad_outputs=[Tensor._wrap(c) for _, c in outs],
            retain_graph=True,
            allow_unused=True,
        )
        return [None if g is None else np.array(g._data, copy=True) for g in grads]

    want_grads = probe(want)
    if bad is None:
        got_grads = probe(got)
        for role, g, w in zip(prog.grad_roles, got_grads, want_grads, strict=True):
            if w is None and g is None:
                continue
            g = np.zeros_like(w) if g is None else g  # an unused input: zero gradient
            w = np.zeros_like(g) if w is None else w
            bad = parity.compare([g], [w], tol, f"gradient of {role}")
            if bad is not None:
                bad = bad.replace(f"gradient of {role} 0:", f"gradient of {role}:", 1)
                break
    if bad is None:
        return out
    culprit = None
    try:
        feeds: dict[str, np.ndarray] = {}
        for f in entry.trace.feeds:
            role = f.role
            if role == "rng":
                feeds[role] = rng
            elif role.startswith("cot:"):
                feeds[role] = cots[int(role[4:])]
            else:
                t = tensor_of(role)
                feeds[role] = saved.get(id(t), np.array(t._data, copy=True))
        reference = {f"output:{j + 1}": np.asarray(t._data) for j, t in enumerate(want)}
        for role, w in zip(prog.grad_roles, want_grads, strict=True):
            if w is not None:
                reference[f"grad:{role}"] = w
        culprit = parity.bisect_step(
            entry.trace,
            prog.pipeline,
            feeds,
            reference,
            backend=cm._options.backend,
            tol=tol,
        )
    except Exception as e:  # noqa: BLE001 - the user still gets the eager result
        logger.warning("lucid.compile: parity bisection failed: %s: %s", type(e), e)
    return parity_failed(cm, key, bad, culprit, eager)


def parity_failed(cm: Any, key: CacheKey, bad: str, culprit: Any, eager: Any) -> Any:
    """Make ``key`` eager-only with the mismatch and the culprit; the eager result."""
    reason = f"parity check failed: {bad}" + (f"; culprit: {culprit}" if culprit else "")
    with cm._lock:
        cm._cache.mark_eager(key, reason)
    cm._parity.append({"key": key, "mismatch": bad, "culprit": culprit})
    logger.warning("lucid.compile: running %r eagerly: %s", key, reason)
    return eager


class CheckedEntry:
    """A cache entry under ``check="always"``: every call is compared with eager."""

    def __init__(self, owner: Any, key: CacheKey, inner: Any):
        self.owner, self.key, self.inner = owner, key, inner
        self.n_hits = 0
        self.last_used = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        return self.owner._checked(self.key, self.inner, args, kwargs)

    # Defined here: __getattr__ would hand out the inner entry's unchecked hit.
    hit = __call__


AUTO_TRIALS = 3  # timed calls of each path before mode="auto" decides


class AutoEntry:
    """A cache entry under ``mode="auto"``: the next ``2 * AUTO_TRIALS`` calls alternate
    compiled and eager (interleaved, so both see the same machine load) and time them; the
    faster path (by median) serves the signature from then on. A compiled decision puts the
    plain entry back in the cache (no cost on hits); an eager one keeps this wrapper."""

    def __init__(self, owner: Any, key: CacheKey, inner: Any):
        self.owner, self.key, self.inner = owner, key, inner
        self.n_hits = 0
        self.last_used = 0
        self.times: dict[str, list[float]] = {"compiled": [], "eager": []}
        self.decision: str | None = None
        owner._auto[key] = {"decision": None, "compiled_ms": None, "eager_ms": None}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.decision == "eager":
            return self.owner._model(*args, **kwargs)
        times = self.times
        path = "eager" if len(times["eager"]) < len(times["compiled"]) else "compiled"
        t0 = perf_counter()
        out = self.inner(args, kwargs) if path == "compiled" else self.owner._model(*args, **kwargs)
        times[path].append((perf_counter() - t0) * 1e3)
        if len(times["eager"]) >= AUTO_TRIALS:
            self._decide()
        return out

    # Defined here: __getattr__ would hand out the inner entry's untimed hit.
    hit = __call__

    def _decide(self) -> None:
        compiled = float(np.median(self.times["compiled"]))
        eager = float(np.median(self.times["eager"]))
        self.decision = "compiled" if compiled <= eager else "eager"
        self.owner._auto[self.key] = {
            "decision": self.decision,
            "compiled_ms": compiled,
            "eager_ms": eager,
        }
        logger.info(
            "lucid.compile: mode='auto' serves %r %s (compiled %.3f ms, eager %.3f ms)",
            self.key,
            self.decision,
            compiled,
            eager,
        )
        if self.decision == "compiled":
            entries = self.owner._entries
            if entries.get(self.key) is self:
                self.inner.n_hits = self.n_hits
                entries.put(self.key, self.inner)
