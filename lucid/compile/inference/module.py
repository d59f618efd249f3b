"""``lucid.compile``: the user-facing wrapper and its per-signature executable cache.

A call computes a cache key from its arguments (see ``CompiledModule``); a hit binds the inputs,
parameters and buffers to the cached executable's feeds and runs it; a miss traces, compiles,
stores and runs. Anything the compiler cannot handle makes that signature eager-only, with the
reason kept in ``cache_info()["reasons"]`` and one warning on the ``lucid.compile`` logger.
The cache itself (LRU, eager-only keys, recompile log) is a ``SignatureCache``.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lucid._tensor import Tensor
from lucid.compile import introspect, parity
from lucid.compile._binding import (
    MODE_VERSION,
    STRUCTURE_VERSION,
    Bound,
    ensure_c_layout,
    name_feeds,
    owner_modules,
)
from lucid.compile.cache import LRU, TICK, SignatureCache
from lucid.compile.entry import ForwardEntry, GradEntry
from lucid.compile.errors import (
    AliasedInputs,
    CompileError,
    FeedMismatch,
    Unsupported,
    out_of_memory,
)
from lucid.compile.inference import checked
from lucid.compile.inference.checked import AutoEntry, CheckedEntry
from lucid.compile.inference.facade import ModuleFacade
from lucid.compile.inference.forward import (
    _contiguous,
    _input_tensors,
    _trace_of,
    compile_forward,
)
from lucid.compile.options import Options, check_settings, env_flag, parse_options, resolve_backend
from lucid.compile.session import CompileSession, discard_from_disk
from lucid.compile.signature import (
    CacheKey,
    _is_symbolic,
    _NotSymbolic,
    _symbolic_sig,
    _Unhashable,
    cache_key,
)
from lucid.ir._gc import paused_gc
from lucid.nn.modules.module import Module
from lucid.trace._tracing import GraphBreak

logger = logging.getLogger("lucid.compile")

__all__ = ["CacheKey", "CompileError", "CompiledModule", "compile"]


class CompiledModule(ModuleFacade):
    """A model (or callable) whose calls run as cached native executables.

    >>> cm = lucid.compile(model)
    >>> y = cm(x)                  # traces, compiles and runs
    >>> y = cm(x)                  # a cache hit: binds and runs the executable
    >>> cm.cache_info()["entries"]
    1

    It is an ``nn.Module`` that takes the wrapped model's place in a module tree
    (``nn.Sequential(cm, head)``): it shares the model's children, parameters and buffers, so
    their dotted names, ``state_dict`` and ``load_state_dict`` are the model's own and
    checkpoints of the compiled and the eager model are interchangeable. Unlike PyTorch's
    ``OptimizedModule`` there is no ``_orig_mod.`` level in the names (``cm._orig_mod`` is the
    model; ``load_state_dict`` accepts PyTorch's prefixed keys too).
    """

    def __init__(
        self,
        target: Any,
        *,
        dynamic: bool = False,
        backend: str = "auto",
        strict: bool = False,
        options: dict[str, Any] | None = None,
        check: str | None = None,
        check_tolerance: tuple[float, float] | None = None,
        mode: str = "default",
    ):
        if not callable(target):
            raise TypeError(
                f"lucid.compile needs an nn.Module or a callable, got {type(target).__name__}"
            )
        pipeline, switches = parse_options(options)
        # The module tables first (the training setter forwards nothing before _model is set).
        Module.__init__(self)
        # What __deepcopy__ compiles a copy with.
        self.__dict__["_init_kwargs"] = dict(
            dynamic=dynamic,
            backend=backend,
            strict=strict,
            options=options,
            check=check,
            check_tolerance=check_tolerance,
            mode=mode,
        )
        if isinstance(target, Module):
            # The wrapper takes the model's place in a module tree: it shares the model's
            # tables, so children, parameters, buffers and their dotted names are the model's.
            for table in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
                self.__dict__[table] = target.__dict__[table]
        self.__dict__["_model"] = target
        self.__dict__["_dynamic"] = bool(dynamic)
        # The shared symbolic-batch executable is opt-in (see the user guide, "dynamic").
        self.__dict__["_symbolic"] = bool(dynamic) and env_flag("LUCID_COMPILE_DYNAMIC")
        self.__dict__["_options"] = Options(
            backend=resolve_backend(backend),
            strict=strict or env_flag("LUCID_COMPILE_STRICT"),
            pipeline=pipeline,
            switches=switches,
        )
        self.__dict__["_raw_options"] = options  # passed on to step()'s make_step
        # Parity checking (see the parity package): None, "first" or "always"; (rtol, atol).
        self.__dict__["_check"] = parity.check_mode(check)
        self.__dict__["_check_tol"] = parity.tolerance(check_tolerance)
        self.__dict__["_parity"] = []
        if mode not in ("default", "auto"):
            raise ValueError(f"lucid.compile: mode must be 'default' or 'auto', got {mode!r}")
        # mode="auto": per signature, compiled vs eager timed on the first calls (AutoEntry).
        self.__dict__["_mode"] = mode
        self.__dict__["_auto"] = {}
        self.__dict__["_lock"] = threading.RLock()
        self.__dict__["_owners"] = owner_modules(target)
        # Entries, eager-only signatures, call counts and the recompile log (which is kept
        # across clear_cache).
        self.__dict__["_cache"] = SignatureCache()
        self._reset()
        # Like functools.wraps, but without routing through __setattr__ (which forwards to the
        # model: a model must never gain itself as an attribute).
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(target, attr):
                self.__dict__[attr] = getattr(target, attr)
        self.__dict__["__wrapped__"] = target

    def __deepcopy__(self, memo: dict) -> CompiledModule:
        """A compiled wrapper of a deep copy of the model, with the same options (an EMA twin, a
        copy of a module tree holding a compiled block): it compiles its own entries, as the
        executables and locks bind the original's objects."""
        model = copy.deepcopy(self.__dict__["_model"], memo)
        twin = type(self)(model, **self.__dict__["_init_kwargs"])
        memo[id(self)] = twin
        return twin

    def _reset(self) -> None:
        d = self.__dict__
        cache = d["_cache"]
        cache.clear()
        cap = cache.cap
        # The hit path reads the entry table directly (one dict lookup, no method call).
        d["_entries"] = cache.entries
        d["_eager_only"] = cache.eager_only
        d["_params"] = None
        d["_fingerprint"] = ()
        d["_not_symbolic"] = LRU(cap)
        d["_steps"] = LRU(cap)
        d["_bound"] = Bound(d["_owners"])

    def _check_structure(self) -> None:
        """The structure version moved: if a bound parameter, buffer or submodule was replaced,
        every entry binds stale objects: drop them (the next calls recompile)."""
        with self._lock:
            if self._bound.changed():
                logger.info("lucid.compile: the model's parameters or buffers were replaced")
                self._reset()

    def _use_hooks(self) -> None:
        # A class switch rather than a hook check in __call__: wrappers without hooks keep the
        # cache-hit path as it is.
        if type(self) is CompiledModule:
            object.__setattr__(self, "__class__", _HookedCompiledModule)

    # --- the cache ------------------------------------------------------------------------------
    def _param_list(self) -> list[Tensor]:
        params = self.__dict__["_params"]
        if params is None:
            fn = getattr(self._model, "parameters", None)
            params = list(fn()) if fn is not None else []
            self.__dict__["_params"] = params
            # Parameters' dtypes are part of the key; a later change of dtype or shape is caught
            # by the executable's feed check (FeedMismatch), which refreshes this.
            self.__dict__["_fingerprint"] = tuple(p._data.dtype for p in params)
        return params

    def _key(self, args: tuple, kwargs: dict, symbolic: bool = False) -> tuple:
        """The cache key as a plain tuple (hashes and compares like the ``CacheKey`` stored),
        after re-reading the parameter list and training modes when they may have changed.

        With ``symbolic``, the tensor arguments' shared leading dim is None."""
        d = self.__dict__
        params = d["_params"]
        if params is None:
            params = self._param_list()
        # Every module's mode, not just the model's (model.bn.eval() while training): re-read
        # only when some training flag was set since.
        bound = d["_bound"]
        training = bound.mode if bound.mode_version == MODE_VERSION[0] else bound.modes()
        return cache_key(args, kwargs, params, training, d["_fingerprint"], symbolic)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        d = self.__dict__
        bound = d["_bound"]
        try:
            if (
                bound.version == STRUCTURE_VERSION[0]
                and bound.mode_version == MODE_VERSION[0]
                and d["_params"] is not None
                and not d["_symbolic"]
            ):
                # The common call (nothing moved since the last): ``_key`` without its checks.
                key = cache_key(args, kwargs, d["_params"], bound.mode, d["_fingerprint"])
            else:
                if bound.version != STRUCTURE_VERSION[0]:
                    self._check_structure()
                key = self._key(args, kwargs)
                if d["_symbolic"]:
                    key = self._symbolic_key(key, args, kwargs)
        except _Unhashable:
            key = None
        if key is None:
            # Outside the except block: an error of the model's own is not chained to ours.
            return d["_model"](*args, **kwargs)
        # A hit is counted by its entry's n_hits (cache_info adds them to n_calls): no second
        # dict update hashing the key on the hot path.
        entry = d["_entries"].get(key)
        if entry is not None:
            entry.n_hits += 1
            entry.last_used = next(TICK)
            try:
                return entry.hit(args, kwargs)
            except AliasedInputs as e:
                return self._aliased(e, args, kwargs)
            except MemoryError as e:
                raise out_of_memory(_trace_of(entry), e) from e
            except (TypeError, ValueError, FeedMismatch) as e:
                try:
                    return self._run_fixed(entry, args, kwargs)
                except (TypeError, ValueError, FeedMismatch):
                    pass
                key = self._rekey(key, entry, args, kwargs, e)
        d["_cache"].count(key)
        if key in d["_eager_only"]:
            return self._model(*args, **kwargs)
        return self._miss(key, args, kwargs)

    def _aliased(self, err: AliasedInputs, args: tuple, kwargs: dict) -> Any:
        """This call's arguments alias what its entry writes in place: run it eagerly."""
        logger.info("lucid.compile: running a call eagerly: %s", err)
        return self._model(*args, **kwargs)

    def _rekey(self, key: tuple, entry: Any, args: tuple, kwargs: dict, err: Exception) -> tuple:
        """A parameter or buffer changed shape or dtype behind our back (the native run checks
        every feed): drop ``entry``, refresh the fingerprint; the key to compile once more."""
        logger.info("lucid.compile: recompiling %r: %s", key, err)
        cache = self._cache
        with self._lock:
            if cache.entries.get(key) is entry:
                entry.n_hits -= 1  # this call is counted again under the new key
                cache.pop(key)  # its earlier calls stay counted
            self.__dict__["_params"] = None
            self._param_list()
            stale, key = key, self._key(args, kwargs)
            if self._symbolic:
                key = self._symbolic_key(key, args, kwargs)
            cache.move_calls(stale, key)  # cache_info stays whole
        return key

    def _run_fixed(self, entry: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``entry`` after a failed run, with every array in a layout the runtime takes:
        bound parameters and buffers re-laid out (same objects, same values); non-contiguous
        inputs fed as contiguous copies whose in-place updates are written back to them."""
        ensure_c_layout(t for _, t in self._bound.tensors)
        ensure_c_layout(entry.captured_tensors)
        swapped = []
        for a in _input_tensors(args, kwargs):
            data = a._data
            if not (data.flags.c_contiguous and data.flags.aligned):
                swapped.append((a, data, a._version[0]))
                a._data = np.array(data, order="C", copy=True)
        try:
            return entry(args, kwargs)
        except (TypeError, ValueError, FeedMismatch) as e:
            roles = getattr(entry, "feed_roles", None)
            raise FeedMismatch(name_feeds(str(e), roles or [])) from e
        finally:
            for t, data, version in swapped:
                if t._version[0] != version:  # the call wrote the input in place
                    np.copyto(data, t._data)
                t._data = data

    def _symbolic_key(self, key: tuple, args: tuple, kwargs: dict) -> tuple:
        sym = (_symbolic_sig(key[0]), *key[1:])
        if sym == key or sym in self._not_symbolic:
            return key
        return sym

    def _miss(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        key = CacheKey(key)
        # A bad LUCID_* setting raises here instead of falling back.
        check_settings(self._options.backend)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None and key not in self._eager_only:
                self._cache.note_compile(
                    key, self.__dict__.get("__qualname__", type(self._model).__name__)
                )
                try:
                    entry = self._compile(key, args, kwargs)
                except _NotSymbolic as e:
                    # This graph cannot share one executable across batch sizes: per-shape.
                    self._not_symbolic.put(key, str(e))
                    static = self._key(args, kwargs)
                    self._cache.move_calls(key, static)
                    return (
                        self._miss(static, args, kwargs)
                        if static not in self._entries
                        else (self._entries[static](args, kwargs))
                    )
                except (GraphBreak, Unsupported) as e:
                    return self._fall_back(key, args, kwargs, e)
                except CompileError:
                    raise  # asked for (LUCID_MANUAL_VJP_REQUIRE=1): never a silent fallback
                except MemoryError:
                    raise  # a value too large (check_value_sizes): eager would fail the same
                except Exception as e:
                    if self._options.strict:
                        raise
                    return self._fall_back(key, args, kwargs, e, unexpected=True)
                self._bound.settle()
                if self._mode == "auto" and self._check is None:
                    entry = AutoEntry(self, key, entry)
                if self._check is not None:
                    # "always": every hit is checked too (a wrapper: no cost when unchecked).
                    if self._check == "always":
                        entry = CheckedEntry(self, key, entry)
                    self._entries.put(key, entry)
                    return self._checked(key, getattr(entry, "inner", entry), args, kwargs)
                self._entries.put(key, entry)
        if entry is None:
            return self._model(*args, **kwargs)
        try:
            return entry(args, kwargs)
        except AliasedInputs as e:
            return self._aliased(e, args, kwargs)
        except MemoryError as e:
            raise out_of_memory(_trace_of(entry), e) from e
        except (TypeError, ValueError, FeedMismatch):
            try:
                return self._run_fixed(entry, args, kwargs)
            except FeedMismatch as e:
                graph = getattr(getattr(entry, "inner", entry), "graph", None)
                if not getattr(graph, "from_disk", False):
                    raise
                # A disk-cache entry that does not fit its graph: removed, compiled afresh.
                discard_from_disk(graph, f"its program does not fit the graph ({e})")
                with self._lock:
                    if self._entries.get(key) is entry:
                        self._entries.pop(key, None)
                return self._miss(key, args, kwargs)

    def _checked(self, key: CacheKey, entry: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``entry`` and the model eagerly from the same state and compare (see
        ``inference.checked``); a mismatch returns the eager result and makes ``key``
        eager-only."""
        return checked.check_call(self, key, entry, args, kwargs)

    def _fall_back(
        self, key: CacheKey, args: tuple, kwargs: dict, err: BaseException, unexpected: bool = False
    ) -> Any:
        reason = f"{type(err).__name__}: {err}"
        if self._options.strict:
            raise CompileError(f"lucid.compile (strict): cannot compile {key!r}: {reason}") from err
        # The eager result decides: if the model itself rejects the input, the user gets that
        # error and the signature is not marked.
        out = self._model(*args, **kwargs)
        self._cache.mark_eager(key, reason)
        logger.warning("lucid.compile: running %r eagerly: %s", key, reason)
        return out

    @paused_gc()  # the whole compile, tracing included (see lucid.ir._gc)
    def _compile(self, key: CacheKey, args: tuple, kwargs: dict) -> ForwardEntry | GradEntry:
        # Every pipeline of this compile gets the debugging switches (see CompileSession).
        session = CompileSession(self._options.switches)
        if key[3]:  # grad mode
            # Outputs carry a grad_fn running a compiled backward (lucid.compile.inference.grad).
            # Imported here: inference (no_grad, eval) never needs it, nor the VJP and
            # partitioning passes it brings (see tests/compile/test_first_compile_imports.py).
            from lucid.compile.inference.grad import compile_grad_call

            entry = compile_grad_call(
                self._model,
                args,
                kwargs,
                self._options,
                symbolic=_is_symbolic(key),
                session=session,
            )
            entry.compile_ms = session.finish(
                repr(key), trace=entry.trace, backend=self._options.backend
            )
            return entry
        return compile_forward(self._model, key, args, kwargs, self._options, session)

    # --- introspection --------------------------------------------------------------------------
    def cache_info(self) -> dict[str, Any]:
        """``entries``, ``max_entries`` (the LRU cap), ``evictions``, ``keys``, ``eager_only``,
        ``n_calls`` and ``reasons`` (why each eager-only signature fell back)."""
        return introspect.cache_info(
            self._cache,
            n_calls={CacheKey(k): n for k, n in self._cache.call_counts().items()},
            # With LUCID_COMPILE_DYNAMIC=1: symbolic keys served per shape instead, and why.
            not_symbolic=dict(self._not_symbolic),
            # With check=: each parity mismatch (key, what differed, the bisected culprit).
            parity=[dict(r) for r in self._parity],
            # mode="auto": per key, the decision ("compiled", "eager" or None while timing) and
            # the median ms of each path.
            auto={k: dict(v) for k, v in self._auto.items()},
        )

    def timing(self) -> list[dict[str, Any]]:
        """One row per cached signature: ``key``, ``compile_ms``, ``last_run_ms``, ``n_hits``
        (calls served from the cache) and ``passes_ms`` (time per compiler stage)."""
        return [
            introspect.timing_row(
                k,
                e,
                n_hits=e.n_hits,
                from_disk=bool(getattr(getattr(e, "graph", None), "from_disk", False)),
                **({"auto": dict(self._auto[k])} if k in self._auto else {}),
            )
            for k, e in self._entries.items()
        ]

    def profile(self, *args: Any, repeats: int = 100, **kwargs: Any) -> list[dict[str, Any]]:
        """Where a call's time goes: runs the native executable serving ``args`` ``repeats``
        times and returns one row per instruction, slowest first: ``index``, ``op``, ``ms``
        (mean wall time) and ``instr`` (the instruction as the native program prints it).
        Profiles the inference executable (grad mode off). When none serves ``args`` yet, one
        ordinary call compiles it (and, like any call, updates BatchNorm statistics in training
        mode); the timed runs themselves leave the model, its buffers and the RNG as they were.

        >>> rows = lucid.compile(model).profile(x)
        >>> rows[0]["op"], rows[0]["ms"]          # e.g. ('matmul', 0.25)
        """
        introspect.check_repeats(repeats)
        from lucid._autograd import no_grad

        with no_grad():
            return self._profile(args, kwargs, repeats)

    def _profile(self, args: tuple, kwargs: dict, repeats: int) -> list[dict[str, Any]]:
        def lookup() -> Any:
            key = self._key(args, kwargs)
            if self._symbolic:
                key = self._symbolic_key(key, args, kwargs)
            return key, self._entries.get(key)

        key, entry = lookup()
        if entry is None:
            self(*args, **kwargs)
            key, entry = lookup()
        if entry is None:
            reason = self._cache.eager_reason(key) or "it falls back to eager"
            raise RuntimeError(f"profile: these arguments run eagerly ({reason}): no executable")
        executable = getattr(entry.graph, "executable", None)
        if executable is None:
            raise RuntimeError(
                "profile: these arguments run through the symbolic-batch path (one executable "
                "per batch size); profile without LUCID_COMPILE_DYNAMIC=1"
            )
        args, kwargs = _contiguous(args, kwargs)
        ensure_c_layout(t for _, t in self._bound.tensors)
        ensure_c_layout(entry.captured_tensors)
        feeds = entry.bind(args, kwargs)
        return introspect.profile_rows(executable, feeds, repeats, self._options.backend)

    def clear_cache(self) -> None:
        """Drop every entry, the eager-only list, the call counters, the parameter fingerprint
        and the training-step callables."""
        with self._lock:
            self._reset()

    def graph_dump(self, key: CacheKey | None = None) -> str:
        """The trace JSON of every cached signature (a list of ``{sig, graph}``), or of one."""
        import json

        if key is not None:
            e = self._entries.get(key)
            return "" if e is None else e.trace.to_json()
        return json.dumps(
            [{"sig": repr(k), "graph": e.trace.to_dict()} for k, e in self._entries.items()]
        )

    dump_trace = graph_dump

    def ir(self, key: CacheKey | None = None, stage: str = "final") -> str:
        """The MLIR text of a cached signature at ``stage``: ``imported``, ``optimized``,
        ``prim`` or ``final``. Without ``key``: the most recently compiled signature."""
        if key is None:
            if not self._entries:
                raise KeyError("no compiled signature yet: call the module first")
            key = list(self._entries)[-1]
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"no compiled signature {key!r}")
        return introspect.trace_ir(
            entry.trace, stage, backend=self._options.backend, pipeline=self._options.pipeline
        )

    # --- training ------------------------------------------------------------------------------
    def step(self, *args: Any, loss_fn: Callable[..., Tensor]) -> Tensor:
        """One compiled training step (forward + backward); the loss has a working grad_fn."""
        steps = self.__dict__["_steps"]
        fn = steps.get(loss_fn)
        if fn is None:
            # The wrapper's options and parity checking apply to its training steps too.
            from lucid.compile.training import make_step  # imported by its first use

            fn = make_step(
                self._model,
                loss_fn,
                dynamic=self._dynamic,
                backend=self._options.backend,
                options=self.__dict__["_raw_options"],
                check=self._check,
                check_tolerance=self._check_tol,
            )
            steps.put(loss_fn, fn)
        return fn(*args)


class _HookedCompiledModule(CompiledModule):
    """A ``CompiledModule`` with forward hooks of its own: ``Module.__call__`` runs them around
    ``forward``, the compiled call."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Module.__call__(self, *args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return CompiledModule.__call__(self, *args, **kwargs)


def compile(
    target: Any = None,
    *,
    dynamic: bool = False,
    backend: str = "auto",  # noqa: A001
    strict: bool = False,
    options: dict[str, Any] | None = None,
    check: str | None = None,
    check_tolerance: tuple[float, float] | None = None,
    mode: str = "default",
):
    """Wrap an ``nn.Module`` or a callable so its calls run as cached native executables.

    Usable directly (``lucid.compile(model)``) and as a decorator (``@lucid.compile``,
    ``@lucid.compile(dynamic=True)``). ``check="first"`` (or ``LUCID_COMPILE_CHECK``) compares
    the first call of each signature with eager within ``check_tolerance=(rtol, atol)``;
    ``check="always"`` every call. ``mode="auto"`` times compiled against eager on the first
    calls of each signature and serves it with the faster (default: always compiled).
    """
    kw = dict(
        dynamic=dynamic,
        backend=backend,
        strict=strict,
        options=options,
        check=check,
        check_tolerance=check_tolerance,
        mode=mode,
    )
    if target is None:
        return lambda t: CompiledModule(t, **kw)
    return CompiledModule(target, **kw)
