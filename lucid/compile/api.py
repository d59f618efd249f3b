"""``lucid.compile``: the user-facing wrapper and its per-signature executable cache.

A call computes a cache key from its arguments (see ``CompiledModule``); a hit binds the inputs,
parameters and buffers to the cached executable's feeds and runs it; a miss traces, compiles,
stores and runs. Anything the compiler cannot handle makes that signature eager-only, with the
reason kept in ``cache_info()["reasons"]`` and one warning on the ``lucid.compile`` logger.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from lucid import _random
from lucid._tensor import Tensor
from lucid.compile import _pipeline, _pytree, introspect, parity
from lucid.compile._binding import (
    LRU,
    MODE_VERSION,
    STRUCTURE_VERSION,
    TICK,
    Bound,
    check_settings,
    ensure_c_layout,
    max_entries,
    name_feeds,
    owner_modules,
)
from lucid.compile._grad_call import compile_grad_call
from lucid.compile.cache import SignatureCache
from lucid.compile.entry import ForwardEntry, GradEntry
from lucid.compile.signature import (
    _SYMBOLIC_SAFE_OPS,
    CacheKey,
    _has_tensor,
    _is_symbolic,
    _NotSymbolic,
    _symbolic_sig,
    _Unhashable,
    cache_key,
)
from lucid.compile.training.steps import make_step
from lucid.nn.modules.module import Module
from lucid.trace._tracing import GraphBreak, _tracing

logger = logging.getLogger("lucid.compile")

__all__ = ["CacheKey", "CompileError", "CompiledModule", "compile"]


CompileError = _pipeline.CompileError


def _tensor_paths(obj: Any, path: tuple, out: list[tuple]) -> None:
    """Append the access path (``args[i][k]...``) of every tensor in ``obj``, depth first."""
    if isinstance(obj, Tensor):
        out.append(path)
    elif isinstance(obj, (tuple, list)):
        for i, e in enumerate(obj):
            _tensor_paths(e, (*path, i), out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensor_paths(v, (*path, k), out)


def _at(args: Any, path: tuple) -> Any:
    for k in path:
        args = args[k]
    return args


def _replace_tensors(obj: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``obj`` with every tensor ``t`` replaced by ``fn(t)`` (same containers, same order)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [_replace_tensors(e, fn) for e in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return type(obj)([_replace_tensors(e, fn) for e in obj])
    if isinstance(obj, dict):
        return type(obj)((k, _replace_tensors(v, fn)) for k, v in obj.items())
    return obj


@dataclass
class _Options:
    backend: str = "auto"
    strict: bool = False
    pipeline: str | None = None
    # Pass-manager switches (Instrumentation fields) set on top of the LUCID_COMPILE_* variables.
    switches: dict[str, Any] = field(default_factory=dict)


_parse_options = _pipeline.parse_options
_env_flag = _pipeline.env_flag


class CompiledModule(Module):
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
        pipeline, switches = _parse_options(options)
        # The module tables first (the training setter forwards nothing before _model is set).
        Module.__init__(self)
        if isinstance(target, Module):
            # The wrapper takes the model's place in a module tree: it shares the model's
            # tables, so children, parameters, buffers and their dotted names are the model's.
            for table in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
                self.__dict__[table] = target.__dict__[table]
        self.__dict__["_model"] = target
        self.__dict__["_dynamic"] = bool(dynamic)
        # The shared symbolic-batch executable is opt-in (see the user guide, "dynamic").
        self.__dict__["_symbolic"] = bool(dynamic) and _env_flag("LUCID_COMPILE_DYNAMIC")
        self.__dict__["_options"] = _Options(
            backend=_pipeline.resolve_backend(backend),
            strict=strict or _env_flag("LUCID_COMPILE_STRICT"),
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
        # mode="auto": per signature, compiled vs eager timed on the first calls (_AutoEntry).
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

    # --- properties and delegation --------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self._model

    @property
    def dynamic(self) -> bool:
        """The requested flag (see the user guide: per-shape executables unless
        ``LUCID_COMPILE_DYNAMIC=1`` and the graph is proven safe)."""
        return self._dynamic

    @property
    def training(self) -> bool:
        """The wrapped model's flag (part of every cache key: both modes stay cached)."""
        return bool(getattr(self.__dict__.get("_model"), "training", False))

    @training.setter
    def training(self, mode: bool) -> None:
        # Module.train() sets it on every module it reaches, this one included.
        model = self.__dict__.get("_model")
        if isinstance(model, Module):
            model.training = mode

    @property
    def _orig_mod(self) -> Any:
        """The wrapped model (PyTorch's ``OptimizedModule`` name for it)."""
        return self.__dict__["_model"]

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if "_model" not in d:  # half-built (copy, unpickling)
            raise AttributeError(name)
        return getattr(d["_model"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__dict__ or name in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._model, name, value)

    def __repr__(self) -> str:
        return f"CompiledModule({self._model!r})"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled call (``cm.forward(x)`` is ``cm(x)``)."""
        return self(*args, **kwargs)

    # --- nn.Module surface ----------------------------------------------------------------------
    def _wrapped_module(self) -> Module | None:
        model = self.__dict__["_model"]
        return model if isinstance(model, Module) else None

    def apply(self, fn: Callable[[Module], Any]) -> CompiledModule:
        """``fn`` on every submodule, on the wrapped model itself, then on this wrapper."""
        model = self._wrapped_module()
        if model is not None:
            model.apply(fn)
        fn(self)
        return self

    def _load_from_state_dict(self, *args: Any) -> None:
        model = self._wrapped_module()
        if model is not None:
            return model._load_from_state_dict(*args)
        return Module._load_from_state_dict(self, *args)

    def train(self, mode: bool = True) -> CompiledModule:
        """Set the training flag of the model and every submodule. Nothing is recompiled or
        dropped: the flag is part of the cache key, so both modes' executables stay cached."""
        Module.train(self, mode)
        return self

    def eval(self) -> CompiledModule:
        return self.train(False)

    def to(self, *args: Any, **kwargs: Any) -> CompiledModule:
        """``Module.to``. The cache is dropped only when a parameter's or buffer's dtype or
        device really changes (``to(float64)``); the current dtype or device keeps it."""
        model = self._model_or_refuse("to")
        before = self._placement()
        model.to(*args, **kwargs)
        if self._placement() != before:
            self.clear_cache()
        return self

    def _placement(self) -> tuple:
        tensors = itertools.chain(self.parameters(), self.buffers())
        return tuple((t._data.dtype, str(t.device)) for t in tensors if t._data is not None)

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False):
        """The wrapped model's ``load_state_dict`` (keys may carry PyTorch's ``_orig_mod.``
        prefix). Values are copied in place, so cached executables stay valid; replaced
        tensors (``assign=True``) are noticed by the next call, which recompiles."""
        if isinstance(state_dict, dict) and any(
            isinstance(k, str) and k.startswith("_orig_mod.") for k in state_dict
        ):
            state_dict = type(state_dict)(
                (k.removeprefix("_orig_mod.") if isinstance(k, str) else k, v)
                for k, v in state_dict.items()
            )
        model = self._wrapped_module()
        if model is None:
            return Module.load_state_dict(self, state_dict, strict=strict, assign=assign)
        return model.load_state_dict(state_dict, strict=strict, assign=assign)

    def state_dict(
        self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ):
        """The wrapped model's state dict (its own key names, under ``prefix``)."""
        model = self._wrapped_module()
        if model is None:
            return Module.state_dict(
                self, *args, destination=destination, prefix=prefix, keep_vars=keep_vars
            )
        return model.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def register_forward_hook(self, hook: Callable) -> Any:
        """``hook(cm, args, output)`` after each compiled call (a non-None result replaces
        the output); hooks on the wrapped model run while it is traced instead."""
        handle = Module.register_forward_hook(self, hook)
        self._use_hooks()
        return handle

    def register_forward_pre_hook(self, hook: Callable) -> Any:
        """``hook(cm, args)`` before each compiled call (a non-None result replaces args)."""
        handle = Module.register_forward_pre_hook(self, hook)
        self._use_hooks()
        return handle

    def _use_hooks(self) -> None:
        # A class switch rather than a hook check in __call__: wrappers without hooks keep the
        # cache-hit path as it is.
        if type(self) is CompiledModule:
            object.__setattr__(self, "__class__", _HookedCompiledModule)

    def _model_or_refuse(self, what: str) -> Module:
        model = self._wrapped_module()
        if model is None:
            raise TypeError(
                f"{what}: the compiled {type(self._model).__name__} is not an nn.Module"
            )
        return model

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
            except MemoryError as e:
                raise _pipeline.out_of_memory(_trace_of(entry), e) from e
            except (TypeError, ValueError, _pipeline.FeedMismatch) as e:
                try:
                    return self._run_fixed(entry, args, kwargs)
                except (TypeError, ValueError, _pipeline.FeedMismatch):
                    pass
                key = self._rekey(key, entry, args, kwargs, e)
        d["_cache"].count(key)
        if key in d["_eager_only"]:
            return self._model(*args, **kwargs)
        return self._miss(key, args, kwargs)

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
        except (TypeError, ValueError, _pipeline.FeedMismatch) as e:
            roles = getattr(entry, "feed_roles", None)
            raise _pipeline.FeedMismatch(name_feeds(str(e), roles or [])) from e
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
                except (GraphBreak, _pipeline.Unsupported) as e:
                    return self._fall_back(key, args, kwargs, e)
                except CompileError:
                    raise  # asked for (LUCID_MANUAL_VJP_REQUIRE=1): never a silent fallback
                except MemoryError:
                    raise  # a value too large (check_value_sizes): eager would fail the same
                except Exception as e:
                    if self._options.strict:
                        raise
                    return self._fall_back(key, args, kwargs, e, unexpected=True)
                if self._mode == "auto" and self._check is None:
                    entry = _AutoEntry(self, key, entry)
                if self._check is not None:
                    # "always": every hit is checked too (a wrapper: no cost when unchecked).
                    if self._check == "always":
                        entry = _CheckedEntry(self, key, entry)
                    self._entries.put(key, entry)
                    return self._checked(key, getattr(entry, "inner", entry), args, kwargs)
                self._entries.put(key, entry)
        if entry is None:
            return self._model(*args, **kwargs)
        try:
            return entry(args, kwargs)
        except MemoryError as e:
            raise _pipeline.out_of_memory(_trace_of(entry), e) from e
        except (TypeError, ValueError, _pipeline.FeedMismatch):
            try:
                return self._run_fixed(entry, args, kwargs)
            except _pipeline.FeedMismatch as e:
                graph = getattr(getattr(entry, "inner", entry), "graph", None)
                if not getattr(graph, "from_disk", False):
                    raise
                # A disk-cache entry that does not fit its graph: removed, compiled afresh.
                _pipeline.discard_from_disk(graph, f"its program does not fit the graph ({e})")
                with self._lock:
                    if self._entries.get(key) is entry:
                        self._entries.pop(key, None)
                return self._miss(key, args, kwargs)

    def _checked(self, key: CacheKey, entry: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``entry`` and the model eagerly from the same state and compare every output
        (and buffer update). A mismatch returns the eager result, makes ``key`` eager-only
        with the reason and bisects to the culprit pass or lowering rule."""
        if isinstance(entry, GradEntry):
            return self._checked_grad(key, entry, args, kwargs)
        buffers = [t for _, t in self._bound.tensors if not t._requires_grad]
        saved = [np.array(t._data, copy=True) for t in buffers]
        rng = np.array(_random.get_rng_state()._data, copy=True)
        roles = getattr(entry, "feed_roles", None)
        feeds = None
        if roles is not None:
            args, kwargs = _contiguous(args, kwargs)
            feeds = [np.array(f, copy=True) for f in entry.bind(args, kwargs)]
        try:
            out = entry(args, kwargs)
        except (TypeError, ValueError, _pipeline.FeedMismatch):
            out = self._run_fixed(entry, args, kwargs)
        got = _leaf_arrays(out)
        got_buffers = [np.array(t._data, copy=True) for t in buffers]
        for t, data in zip(buffers, saved, strict=True):
            np.copyto(t._data, data)
        _random.set_rng_state(Tensor._wrap(rng))
        eager = self._model(*args, **kwargs)
        tol = self._check_tol
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
                    pipeline=self._options.pipeline or _pipeline.GRAPH_PIPELINE,
                    backend=self._options.backend,
                    tol=tol,
                    batch=feeds[0].shape[0] if _is_symbolic(key) and feeds[0].ndim else None,
                )
            except Exception as e:  # noqa: BLE001 - the user still gets the eager result
                logger.warning("lucid.compile: parity bisection failed: %s: %s", type(e), e)
        return self._parity_failed(key, bad, culprit, eager)

    def _checked_grad(self, key: CacheKey, entry: Any, args: tuple, kwargs: dict) -> Any:
        """``_checked`` for a grad-mode entry: the outputs, the buffer updates and, through a
        probe backward with seeded random cotangents (``autograd.grad``, ``.grad`` untouched),
        the gradients of every input and parameter that requires grad are compared with eager.
        A mismatch returns eager's outputs (so the user's backward gives eager's gradients)
        and bisects over the grad pipeline (vjp, graph passes, the lowering of forward and
        backward ops)."""
        from lucid._autograd import grad as autograd_grad

        buffers = [t for _, t in self._bound.tensors if not t._requires_grad]
        saved = {id(t): np.array(t._data, copy=True) for t in buffers}
        rng = np.array(_random.get_rng_state()._data, copy=True)
        args, kwargs = _contiguous(args, kwargs)
        prog = entry._program_for(args) if entry.symbolic else entry.program
        tensor_args = [args[i] for i in entry.tensor_pos]

        def tensor_of(role: str) -> Tensor:
            name = role[len("input:") :] if role.startswith("input:") else None
            if name is None:
                return entry.captured[role]
            return tensor_args[int(name)] if name.isdigit() else kwargs[name]

        wrt = [tensor_of(r) for r in prog.grad_roles]
        try:
            out = entry(args, kwargs)
        except (TypeError, ValueError, _pipeline.FeedMismatch):
            out = self._run_fixed(entry, args, kwargs)
        got_buffers = [np.array(t._data, copy=True) for t in buffers]
        for t in buffers:
            np.copyto(t._data, saved[id(t)])
        _random.set_rng_state(Tensor._wrap(rng))
        eager = self._model(*args, **kwargs)
        tol = self._check_tol
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
                backend=self._options.backend,
                tol=tol,
            )
        except Exception as e:  # noqa: BLE001 - the user still gets the eager result
            logger.warning("lucid.compile: parity bisection failed: %s: %s", type(e), e)
        return self._parity_failed(key, bad, culprit, eager)

    def _parity_failed(self, key: CacheKey, bad: str, culprit: Any, eager: Any) -> Any:
        """Make ``key`` eager-only with the mismatch and the culprit; the eager result."""
        reason = f"parity check failed: {bad}" + (f"; culprit: {culprit}" if culprit else "")
        with self._lock:
            self._cache.mark_eager(key, reason)
        self._parity.append({"key": key, "mismatch": bad, "culprit": culprit})
        logger.warning("lucid.compile: running %r eagerly: %s", key, reason)
        return eager

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

    def _compile(self, key: CacheKey, args: tuple, kwargs: dict) -> ForwardEntry | GradEntry:
        # Every pipeline of this compile gets the debugging switches (see CompileSession).
        session = _pipeline.CompileSession(self._options.switches)
        if key[3]:  # grad mode
            # Outputs carry a grad_fn running a compiled backward (lucid.compile._grad_call).

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
        if any(_has_tensor(v) and not isinstance(v, Tensor) for v in kwargs.values()):
            raise _pipeline.Unsupported("tensors inside a container keyword argument")
        with _tracing(self._model) as tracer:
            # tensor_pos: the access path of each tensor input (``(i,)`` for ``args[i]``,
            # ``(i, k)`` for ``args[i][k]``), in feed order ``input:0``, ``input:1``, ...
            tensor_pos: list[tuple] = []
            targs = []
            for i, (a, sig) in enumerate(zip(args, key[0], strict=True)):
                if isinstance(a, Tensor):
                    tensor_pos.append((i,))
                    t = tracer.input(sig[0], a.dtype)
                    t._requires_grad = a._requires_grad
                    targs.append(t)
                elif _has_tensor(a):
                    paths: list[tuple] = []
                    _tensor_paths(a, (i,), paths)
                    tensor_pos.extend(paths)
                    targs.append(_replace_tensors(a, tracer.input_like))
                else:
                    targs.append(a)
            tkwargs = {
                k: tracer.input_like(v, role=f"input:{k}") if isinstance(v, Tensor) else v
                for k, v in kwargs.items()
            }
            symbolic = _is_symbolic(key)
            try:
                out = self._model(*targs, **tkwargs)
            except (TypeError, ValueError, IndexError, GraphBreak) as e:
                if symbolic:
                    raise _NotSymbolic(f"tracing with a symbolic batch failed: {e}") from e
                raise
            leaves: list[Tensor] = []
            rebuild = _pytree.flatten(out, leaves)
            # An input returned unchanged comes back as itself, not as a copy.
            passthrough: dict[int, tuple[str, Any]] = {}
            computed: list[Tensor] = []
            for j, t in enumerate(leaves):
                hit = next(
                    (("arg", path) for path in tensor_pos if _at(targs, path) is t),
                    None,
                )
                if hit is None:
                    hit = next((("kw", k) for k, v in tkwargs.items() if v is t), None)
                if hit is not None:
                    passthrough[j] = hit
                else:
                    computed.append(t)
            trace = tracer.finish(computed)
            captured = tracer.feed_tensors()
        if symbolic:
            unsafe = sorted({op.name for op in trace.ops if op.name not in _SYMBOLIC_SAFE_OPS()})
            if unsafe:
                raise _NotSymbolic(f"ops not safe under a symbolic batch: {', '.join(unsafe)}")
            batch = next(a.shape[0] for a in args if isinstance(a, Tensor))
            graph = _SymbolicGraph(trace, self._options, batch, session)
        else:
            graph = _pipeline.compile_trace(
                trace,
                backend=self._options.backend,
                pipeline=self._options.pipeline,
                session=session,
            )
        bind = _make_binder(graph.feed_roles, tensor_pos, captured)
        finish = _make_finisher(
            graph.result_roles,
            leaves,
            passthrough,
            rebuild,
            captured,
            len(computed),
            tensor_pos,
            returns_tensor=isinstance(out, Tensor),
        )
        compile_ms = session.finish(repr(key), trace=trace, backend=self._options.backend)
        entry = ForwardEntry(
            graph,
            bind,
            finish,
            trace,
            compile_ms,
            graph.passes_ms,
            feed_roles=list(graph.feed_roles),
            captured_tensors=list(captured.values()),
            aot_output=(out, leaves, passthrough),
            aot_captured=captured,
        )
        if not symbolic and not passthrough and len(computed) == len(graph.result_roles):
            # Every result is an output (no buffer update, no input returned as itself): the
            # backend may serve hits in one direct call.
            plan = _simple_bind_plan(graph.feed_roles, tensor_pos, captured)
            if plan is not None:
                single = isinstance(out, Tensor) and len(leaves) == 1
                direct = _direct_call(self._options.backend, graph, *plan, single=single)
                if direct is not None:
                    entry.serve_hits_with(direct, None if single else rebuild)
        return entry

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


class _CheckedEntry:
    """A cache entry under ``check="always"``: every call is compared with eager."""

    def __init__(self, owner: CompiledModule, key: CacheKey, inner: Any):
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


class _AutoEntry:
    """A cache entry under ``mode="auto"``: the next ``2 * AUTO_TRIALS`` calls alternate
    compiled and eager (interleaved, so both see the same machine load) and time them; the
    faster path (by median) serves the signature from then on. A compiled decision puts the
    plain entry back in the cache (no cost on hits); an eager one keeps this wrapper."""

    def __init__(self, owner: CompiledModule, key: CacheKey, inner: Any):
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


def _trace_of(entry: Any) -> Any:
    """The trace of a cache entry, through the auto/checked wrappers (None if it has none)."""
    return getattr(getattr(entry, "inner", entry), "trace", None)


def _leaf_arrays(out: Any) -> list[np.ndarray]:
    leaves: list = []
    _pytree.flatten(out, leaves)
    return [np.array(t._data, copy=True) for t in leaves if isinstance(t, Tensor)]


def _input_tensors(args: tuple, kwargs: dict) -> list[Tensor]:
    """Every tensor among the arguments, including inside tuples, lists and dicts."""
    paths: list[tuple] = []
    _tensor_paths(args, (), paths)
    _tensor_paths(kwargs, (), paths)
    return [_at(args, p) if isinstance(p[0], int) else _at(kwargs, p) for p in paths]


def _contiguous(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every tensor whose array the runtime does not take (not C-contiguous
    or not aligned) replaced by a contiguous copy."""

    def c(a: Tensor) -> Tensor:
        d = a._data
        if d is not None and not (d.flags.c_contiguous and d.flags.aligned):
            return Tensor._wrap(np.array(d, order="C", copy=True))
        return a

    return _replace_tensors(args, c), _replace_tensors(kwargs, c)


class _SymbolicGraph:
    """One compiled graph for every batch size: the trace is taken once with a symbolic batch
    and proven safe. A backend that ``supports_symbolic_batch`` compiles one executable for all
    sizes; on the others the program is specialised per batch size on first sight (no retrace)
    and kept, so later calls of any seen batch size only bind and run."""

    def __init__(self, trace: Any, options: _Options, batch: int, session: Any):
        self.trace = trace
        self.options = options
        self.by_batch: LRU = LRU(max_entries())
        self.shared = None
        if _pipeline.backend_of(options.backend).supports_symbolic_batch:
            try:
                first = self.shared = _pipeline.compile_symbolic_trace(
                    trace,
                    batch,
                    backend=options.backend,
                    pipeline=options.pipeline,
                    session=session,
                )
            except _pipeline.Unsupported as e:
                raise _NotSymbolic(f"the backend cannot share one executable: {e}") from e
        else:
            first = self._specialize(batch, session)
        self.feed_roles, self.result_roles = first.feed_roles, first.result_roles
        self.passes_ms = first.passes_ms

    def _specialize(self, batch: int, session: Any = None) -> Any:
        graph = _pipeline.compile_trace(
            self.trace,
            backend=self.options.backend,
            pipeline=self.options.pipeline,
            switches=self.options.switches,
            batch=batch,
            session=session,
        )
        self.by_batch.put(batch, graph)
        return graph

    def run(self, feeds: list) -> list:
        if self.shared is not None:
            return self.shared.run(feeds)
        graph = self.by_batch.get(feeds[0].shape[0]) if feeds[0].ndim else None
        if graph is None:
            graph = self._specialize(feeds[0].shape[0])
        else:
            graph.last_used = next(TICK)
        return graph.run(feeds)


def _simple_bind_plan(
    feed_roles: list[str], tensor_pos: list[tuple], captured: dict[str, Tensor]
) -> tuple[list[int], list[Tensor]] | None:
    """``(positions, tensors)`` when the feeds are the positional arguments at ``positions``
    (each a tensor argument itself) followed by the bound ``tensors`` (parameters, buffers); None
    for anything else (keyword or nested inputs, the RNG state)."""
    n = len(tensor_pos)
    inputs, rest = feed_roles[:n], feed_roles[n:]
    if inputs != [f"input:{i}" for i in range(n)] or any(len(p) != 1 for p in tensor_pos):
        return None
    if any(r == "rng" or r.startswith("input:") or r not in captured for r in rest):
        return None
    return [p[0] for p in tensor_pos], [captured[r] for r in rest]


def _direct_call(
    backend: str, graph: Any, positions: list[int], tensors: list[Tensor], *, single: bool
) -> Any:
    """The backend's direct call for a cache hit of ``graph`` (its ``bound_call``: binding,
    running and wrapping in one call), or None when the backend has none for it."""
    executable = getattr(graph, "executable", None)
    if executable is None:
        return None
    return _pipeline.get_backend(backend).bound_call(executable, positions, tensors, single=single)


def _make_binder(feed_roles: list[str], tensor_pos: list[tuple], captured: dict[str, Tensor]):
    """A function (args, kwargs) -> the feed arrays, in the executable's feed order
    (``tensor_pos``: the access path of each ``input:N``)."""
    simple = _simple_bind_plan(feed_roles, tensor_pos, captured)
    if simple is not None:
        # The common case (positional inputs, then parameters and buffers) gets a tight loop.
        positions, tensors = simple

        def bind_fast(args: tuple, kwargs: dict) -> list:
            return [args[i]._data for i in positions] + [t._data for t in tensors]

        return bind_fast
    plan: list[tuple[str, Any]] = []
    for role in feed_roles:
        kind, _, name = role.partition(":")
        if kind == "input":
            if name.isdigit():
                plan.append(("arg", tensor_pos[int(name)]))
            else:
                plan.append(("kw", name))
        elif role == "rng":
            plan.append(("rng", None))
        else:
            plan.append(("tensor", captured[role]))

    def bind(args: tuple, kwargs: dict) -> list:
        feeds = []
        for kind, ref in plan:
            if kind == "arg":
                feeds.append(_at(args, ref)._data)
            elif kind == "kw":
                feeds.append(kwargs[ref]._data)
            elif kind == "rng":
                feeds.append(_random.get_rng_state()._data)
            else:
                feeds.append(ref._data)
        return feeds

    return bind


def _make_finisher(
    result_roles: list[str],
    leaves: list,
    passthrough: dict,
    rebuild,
    captured: dict[str, Tensor],
    n_outputs: int,
    tensor_pos: list[tuple],
    returns_tensor: bool = False,
):
    """A function (args, kwargs, result arrays) -> the model's return structure; it also writes
    buffer updates (BatchNorm running statistics) and the advanced RNG state back."""
    out_index: list[int] = []
    writebacks: list[tuple[int, Any]] = []
    for i, role in enumerate(result_roles):
        if role.startswith("output:"):
            out_index.append(i)
        elif role == "update:rng":
            writebacks.append((i, "rng"))
        elif role.startswith("update:"):
            target = role[len("update:") :]
            writebacks.append((i, captured.get(target, target)))
        else:
            raise ValueError(f"unknown result role {role!r}")
    if len(out_index) != n_outputs:
        raise _pipeline.Unsupported(
            f"the executable returns {len(out_index)} outputs, the trace {n_outputs}"
        )
    n_leaves = len(leaves)
    slots = [None] * n_leaves
    computed_slots = [j for j in range(n_leaves) if j not in passthrough]
    wrap = Tensor._wrap

    if not passthrough and not writebacks:
        if n_leaves == 1 and len(out_index) == 1:
            i0 = out_index[0]
            if returns_tensor:  # the model returned one tensor: no structure to rebuild
                return lambda args, kwargs, res: wrap(res[i0])
            return lambda args, kwargs, res: rebuild([wrap(res[i0])])

        def finish_plain(args, kwargs, res):
            return rebuild([wrap(res[i]) for i in out_index])

        return finish_plain

    def finish(args: tuple, kwargs: dict, res: list) -> Any:
        for i, target in writebacks:
            if target == "rng":
                _random.set_rng_state(res[i])
            elif isinstance(target, Tensor):
                if res[i] is not target._data:  # else the runtime already wrote it in place
                    np.copyto(target._data, res[i])
                target._version[0] += 1
            elif target.startswith("input:"):
                name = target[len("input:") :]
                t = kwargs[name] if not name.isdigit() else _at(args, tensor_pos[int(name)])
                np.copyto(t._data, res[i])
                t._version[0] += 1
        vals = list(slots)
        for j, i in zip(computed_slots, out_index, strict=True):
            vals[j] = wrap(res[i])
        for j, (kind, ref) in passthrough.items():
            vals[j] = _at(args, ref) if kind == "arg" else kwargs[ref]
        return rebuild(vals)

    return finish


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
