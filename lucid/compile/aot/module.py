"""AOT export: ``save_compiled`` writes a ``CompiledModule``'s signatures to one file and
``load_compiled`` serves them again, in another process, without the model's Python class.

The file is a Lucid checkpoint (safetensors, written and validated by ``lucid.serialization``)
holding one object::

    {"format": "lucid.compiled", "manifest": <JSON text>, "manifest_sha256": <hex>,
     "parts": {name: text}, "weights": {feed role: ndarray}}

The manifest (``FORMAT_VERSION``) names the Lucid version, the backend and its pass pipeline,
and per signature: the key it serves (argument signatures, keyword names, training flag), the
feed and result roles with their shapes and dtypes, the output structure used to re-pack the
results, the names of its parts (``ir/<i>``: the optimized ``lucid``-dialect MLIR;
``program/<i>``: the backend's final program when the backend can export one) and the SHA-256
of every part and every weight. Loading parses JSON and numbers only: nothing is imported,
called by name or evaluated. The backend's program is used when the Lucid version and backend
match and the backend accepts it; otherwise the signature is rebuilt from its IR.

Output containers come back as plain ones: a namedtuple as a tuple, a dataclass as a dict of
its fields (loading them as their classes would need the classes' code).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any

import numpy as np

from lucid import _dtype, _random
from lucid._tensor import Tensor
from lucid.backends.base import Unsupported
from lucid.compile import _pipeline, introspect
from lucid.compile.aot import step as aot_step
from lucid.compile.aot.file import (
    _SCALARS,
    FORMAT,
    FORMAT_VERSION,
    _array_sha256,
    _backend_program_format,
    _bad,
    _lucid_version,
    _model_weights,
    _NotSaveable,
    _owned,
    _read,
    _scalar,
    _sha256,
    _write,
)
from lucid.compile.api import CompiledModule, _at, _tensor_paths
from lucid.compile.cache import SignatureCache
from lucid.compile.signature import _has_tensor, _TreeSig
from lucid.compile.training.steps import FusedStep, TrainStep
from lucid.ir import feed_roles, forward_func, parse_ir, print_ir, result_roles

logger = logging.getLogger("lucid.compile")

__all__ = ["FORMAT", "FORMAT_VERSION", "LoadedModule", "load_compiled", "save_compiled"]


def _key_sig(sig: tuple) -> list:
    """The JSON form of one argument signature of a ``CacheKey``."""
    if len(sig) == 3:
        shape, dt, _ = sig
        if any(d is None for d in shape):
            raise _NotSaveable("a symbolic-batch signature (LUCID_COMPILE_DYNAMIC)")
        return ["tensor", [int(d) for d in shape], np.dtype(dt).name]
    kind, value = sig

    if isinstance(value, _TreeSig):
        tree_kind, items = value
        if issubclass(tree_kind, dict):
            return ["dict", [[str(k), _key_sig(s)] for k, s in items]]
        return ["list" if issubclass(tree_kind, list) else "tuple", [_key_sig(s) for s in items]]
    if repr(value) == "nan":
        return ["float", "nan"]
    return _scalar(value)


def _arg_sig(a: Any) -> list:
    """The JSON form of an argument, as ``_key_sig`` gives it for the key that argument makes."""
    if isinstance(a, Tensor):
        if a._data is None:
            raise TypeError("load_compiled: a trace tensor cannot be fed to a loaded module")
        return ["tensor", list(a._data.shape), a._data.dtype.name]
    if isinstance(a, dict) and _has_tensor(a):
        return ["dict", [[str(k), _arg_sig(v)] for k, v in a.items()]]
    if isinstance(a, (tuple, list)) and _has_tensor(a):
        return ["list" if isinstance(a, list) else "tuple", [_arg_sig(e) for e in a]]
    if isinstance(a, float) and a != a:
        return ["float", "nan"]
    return _scalar(a)


def _match_text(args_sig: list, kwargs_sig: list, training: bool) -> str:
    return json.dumps([args_sig, kwargs_sig, bool(training)], separators=(",", ":"))


# --- the output structure ---------------------------------------------------------------------
def _encode_output(out: Any, leaves: list, passthrough: dict) -> Any:
    """The JSON tree that re-packs results: ``["out", k]`` is the k-th computed output,
    ``["arg", path]`` / ``["kw", name]`` an input returned unchanged, ``["const", v]`` a
    constant; containers are ``["tuple"|"list", items]`` and ``["dict", [[key, node], ...]]``."""
    index = {id(t): j for j, t in enumerate(leaves)}
    computed = {j: k for k, j in enumerate(j for j in range(len(leaves)) if j not in passthrough)}

    def enc(obj: Any) -> Any:
        if isinstance(obj, Tensor):
            j = index[id(obj)]
            if j in passthrough:
                kind, ref = passthrough[j]
                return ["arg", list(ref)] if kind == "arg" else ["kw", ref]
            return ["out", computed[j]]
        if isinstance(obj, (tuple, list)):
            tag = "list" if isinstance(obj, list) else "tuple"
            return [tag, [enc(e) for e in obj]]
        if isinstance(obj, dict):
            if not all(isinstance(k, (str, int)) for k in obj):
                raise _NotSaveable("the output is a dict with keys other than str/int")
            return ["dict", [[k, enc(v)] for k, v in obj.items()]]
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = [f.name for f in dataclasses.fields(obj) if f.init]
            return ["dict", [[f, enc(getattr(obj, f))] for f in fields]]
        if isinstance(obj, _SCALARS) and not (isinstance(obj, float) and not math.isfinite(obj)):
            return ["const", obj]
        raise _NotSaveable(f"the output holds a {type(obj).__name__} (not a JSON constant)")

    return enc(out)


def _decode_output(node: Any, outs: list, args: tuple, kwargs: dict) -> Any:
    tag, body = node
    if tag == "out":
        return outs[body]
    if tag == "arg":
        value: Any = args
        for k in body:
            value = value[k]
        return value
    if tag == "kw":
        return kwargs[body]
    if tag == "const":
        return body
    if tag in ("tuple", "list"):
        items = [_decode_output(e, outs, args, kwargs) for e in body]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        return {k: _decode_output(v, outs, args, kwargs) for k, v in body}
    raise ValueError(f"unknown output node {tag!r}")


# --- save ----------------------------------------------------------------------------------------
def _signature_record(cm: Any, key: tuple, entry: Any, index: int, parts: dict) -> dict:
    args_sig, kwargs_sig, training, grad, _ = key
    if isinstance(training, tuple):  # a loaded module knows one flag, not per-submodule modes
        raise _NotSaveable("its submodules were in mixed train/eval modes")
    if grad:
        raise _NotSaveable("it records gradients (loaded modules serve inference only)")
    output = getattr(entry, "aot_output", None)
    graph = entry.graph
    if output is None or not hasattr(graph, "executable"):
        raise _NotSaveable("it is not a plain compiled forward signature")
    record = {
        "key": repr(key),
        "match": _match_text(
            [_key_sig(s) for s in args_sig], [[k, _key_sig(s)] for k, s in kwargs_sig], training
        ),
        "training": bool(training),
    }
    out, leaves, passthrough = output
    record["output"] = _encode_output(out, leaves, passthrough)
    options = cm._options
    module, _, _ = _pipeline._graph_module(entry.trace, options.pipeline, None)
    ir_text = print_ir(module)
    backend = _pipeline.backend_of(options.backend)
    program = None
    try:
        _pipeline.lower(module, backend)
        program = backend.export_program(module)
    except (_pipeline.Unsupported, Unsupported) as e:
        logger.info("save_compiled: no backend program for %r (%s); the IR is saved", key, e)
    record["feed_roles"] = list(graph.feed_roles)
    record["result_roles"] = list(graph.result_roles)
    record["feeds"] = [[list(f.value.shape), _np_name(f.value.dtype)] for f in entry.trace.feeds]
    record["results"] = [[list(v.shape), _np_name(v.dtype)] for _, v in entry.trace.outputs]
    parts[f"ir/{index}"] = ir_text
    record["ir"] = f"ir/{index}"
    if program is not None:
        parts[f"program/{index}"] = program
        record["program"] = f"program/{index}"
    return record


def _np_name(dt: Any) -> str:
    return np.dtype(_dtype.canonical(dt).numpy).name


def save_compiled(
    cm: Any, path: str | os.PathLike, *, include_weights: bool = True, scheduler: Any = None
) -> bool:
    """Write every compiled signature of ``cm`` to the file ``path``: the manifest, the
    optimized IR, the backend's program and (``include_weights``) the parameters, buffers and
    captured tensors. Atomic (written beside, then renamed). Returns False, saying why on the
    ``lucid.compile`` logger, when no signature can be saved.

    ``cm`` is a ``CompiledModule``, or a training step (what ``fused_step`` / ``make_step``
    return): then every compiled entry is saved with the parameters, buffers, optimizer state
    (step counters included), the optimizer's options, ``scheduler``'s state (a
    ``lucid.optim.lr_scheduler`` scheduler of the step's optimizer) and the RNG state, so
    ``load_compiled`` resumes the training exactly (``include_weights`` must stay True)."""

    path = os.fspath(path)
    if isinstance(cm, (FusedStep, TrainStep)):
        return _save_step(cm, path, include_weights, scheduler)
    if not isinstance(cm, CompiledModule):
        raise TypeError(
            "save_compiled needs a CompiledModule or a training step (fused_step, make_step), "
            f"got {type(cm).__name__}"
        )
    if scheduler is not None:
        raise TypeError("save_compiled: scheduler= is for training steps (fused_step)")
    parts: dict[str, str] = {}
    signatures = []
    weights: dict[str, np.ndarray] = {}
    weight_specs: dict[str, list] = {}
    skipped = []
    with cm._lock:
        entries = list(cm._entries.items())
        for key, entry in entries:
            try:
                record = _signature_record(cm, key, entry, len(signatures), parts)
            except _NotSaveable as e:
                skipped.append(f"{key!r}: {e}")
                continue
            captured = getattr(entry, "aot_captured", {})
            for role, tensor in captured.items():
                arr = np.array(tensor._data, order="C")  # (ascontiguousarray makes 0-d 1-d)
                spec = [list(arr.shape), arr.dtype.name]
                if weight_specs.setdefault(role, spec) != spec:
                    raise ValueError(f"save_compiled: feed {role!r} differs between signatures")
                if include_weights:
                    weights[role] = arr
            signatures.append(record)
    for why in skipped:
        logger.warning("save_compiled: skipping signature %s", why)
    if not signatures:
        reasons = "; ".join(skipped) or "the module has no compiled signature (call it first)"
        if cm._eager_only:
            reasons += f"; eager-only signatures: {', '.join(map(repr, cm._eager_only))}"
        logger.warning("save_compiled: nothing to save to %r: %s", path, reasons)
        return False
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": "module",
        "lucid_version": _lucid_version(),
        "backend": cm._options.backend,
        "pipeline": cm._options.pipeline,
        "program_format": _backend_program_format(cm._options.backend),
        "signatures": signatures,
        "weights": {
            role: {"shape": s[0], "dtype": s[1], "sha256": _array_sha256(weights[role])}
            if role in weights
            else {"shape": s[0], "dtype": s[1]}
            for role, s in weight_specs.items()
        },
        "parts": {name: _sha256(text) for name, text in parts.items()},
    }
    _write(path, manifest, parts, weights)
    return True


def _save_step(step: Any, path: str, include_weights: bool, scheduler: Any) -> bool:
    if not include_weights:
        raise ValueError(
            "save_compiled: a training step is saved with its weights and optimizer state "
            "(include_weights=False would lose what it trains)"
        )
    with step._lock if hasattr(step, "_lock") else _NO_LOCK:
        try:
            fields, parts, weights = aot_step.save_step(step, scheduler)
        except aot_step.NotSaveable as e:
            logger.warning("save_compiled: nothing to save to %r: %s", path, e)
            return False
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "lucid_version": _lucid_version(),
        "program_format": _backend_program_format(fields["backend"]),
        **fields,
        "weights": {
            role: {"shape": list(a.shape), "dtype": a.dtype.name, "sha256": _array_sha256(a)}
            for role, a in weights.items()
        },
        "parts": {name: _sha256(text) for name, text in parts.items()},
    }
    _write(path, manifest, parts, weights)
    return True


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_LOCK = _NoLock()


_MAX_DEPTH = 100  # of an output structure or an argument signature: far beyond real models


def _check_record(path: str, i: int, record: Any, parts: dict) -> None:
    """Every field of signature record ``i`` that loading and calling use: types, part names,
    roles against the argument signature, output indices and nesting depth; a ValueError
    naming the file and the field otherwise."""
    where = f"signature {i}"

    def bad(problem: str) -> ValueError:
        return _bad(path, f"{where}: {problem}")

    if not isinstance(record, dict):
        raise bad("is not a record")
    for field, kind in (("key", str), ("match", str), ("training", bool), ("ir", str)):
        if not isinstance(record.get(field), kind):
            raise bad(f"{field!r} is not a {kind.__name__}")
    for field in ("ir", "program"):
        name = record.get(field)
        if (field == "ir" or name is not None) and name not in parts:
            raise bad(f"{field!r} names no part of the file ({name!r})"[:200])
    roles = {}
    for field in ("feed_roles", "result_roles"):
        value = record.get(field)
        if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
            raise bad(f"{field!r} is not a list of role names")
        roles[field] = value
    try:
        match = json.loads(record["match"])
    except (ValueError, RecursionError):
        raise bad("'match' is not a JSON argument signature") from None
    if not (isinstance(match, list) and len(match) == 3 and isinstance(match[0], list)
            and isinstance(match[1], list)):  # fmt: skip
        raise bad("'match' is not [arguments, keyword arguments, training]")
    n_tensors = _count_tensors(match[0], 0, bad)
    kwarg_names = set()
    for pair in match[1]:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise bad("'match' has a keyword entry that is not [name, signature]")
        kwarg_names.add(pair[0])
        _count_tensors([pair[1]], 0, bad)
    for role in roles["feed_roles"]:
        kind, _, name = role.partition(":")
        if kind == "input" and not (
            (name.isdigit() and int(name) < n_tensors)
            or (not name.isdigit() and name in kwarg_names)
        ):
            raise bad(f"feed {role!r} names no tensor argument of the signature")
    n_outputs = sum(r.startswith("output:") for r in roles["result_roles"])
    _check_output(record.get("output"), n_outputs, match[0], kwarg_names, 0, bad)


def _count_tensors(sigs: Any, depth: int, bad: Any) -> int:
    """The number of tensors in a list of argument signatures (as ``_arg_sig`` writes them)."""
    if depth > _MAX_DEPTH:
        raise bad(f"'match' is nested more than {_MAX_DEPTH} deep")
    n = 0
    for sig in sigs:
        if not (isinstance(sig, list) and len(sig) in (2, 3) and isinstance(sig[0], str)):
            raise bad("'match' holds a malformed argument signature")
        tag, body = sig[:2]
        if tag == "tensor":
            n += 1
        elif tag in ("list", "tuple") and isinstance(body, list):
            n += _count_tensors(body, depth + 1, bad)
        elif tag == "dict" and isinstance(body, list):
            if not all(isinstance(p, list) and len(p) == 2 for p in body):
                raise bad("'match' holds a malformed dict signature")
            n += _count_tensors([p[1] for p in body], depth + 1, bad)
    return n


def _is_tensor_at(args: list, path: list) -> bool:
    """Whether ``path`` (as ``_decode_output`` follows it) leads to a tensor of the argument
    signatures ``args`` (checked by ``_count_tensors``)."""
    sig: Any = ["tuple", args]
    for k in path:
        tag, body = sig[:2]
        if tag in ("list", "tuple") and type(k) is int and 0 <= k < len(body):
            sig = body[k]
        elif tag == "dict" and type(k) in (int, str):
            sig = next((v for name, v in body if name == str(k)), None)  # keys as _arg_sig
            if sig is None:
                return False
        else:
            return False
    return sig[0] == "tensor"


def _check_output(node: Any, n_outputs: int, args: list, kwargs: set, depth: int,
                  bad: Any) -> None:  # fmt: skip
    """The output structure (``_encode_output``'s tree) is well formed and refers only to
    results and arguments that exist."""
    if depth > _MAX_DEPTH:
        raise bad(f"its output structure is nested more than {_MAX_DEPTH} deep")
    if not (isinstance(node, list) and len(node) == 2 and isinstance(node[0], str)):
        raise bad(f"its output structure has a malformed node {node!r}"[:200])
    tag, body = node
    if tag == "out":
        if not (type(body) is int and 0 <= body < n_outputs):
            raise bad(f"its output structure refers to result {body!r} of {n_outputs}"[:200])
    elif tag == "arg":
        if not (isinstance(body, list) and _is_tensor_at(args, body)):
            raise bad(f"its output structure returns an argument {body!r} it has not"[:200])
    elif tag == "kw":
        if body not in kwargs:
            raise bad(f"its output structure returns a keyword argument {body!r} it has not"[:200])
    elif tag == "const":
        if not isinstance(body, _SCALARS):
            raise bad("its output structure has a constant that is not a scalar")
    elif tag in ("tuple", "list") and isinstance(body, list):
        for e in body:
            _check_output(e, n_outputs, args, kwargs, depth + 1, bad)
    elif tag == "dict" and isinstance(body, list):
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) in (int, str)):
                raise bad("its output structure has a dict entry that is not [key, node]")
            _check_output(pair[1], n_outputs, args, kwargs, depth + 1, bad)
    else:
        raise bad(f"its output structure has an unknown node {tag!r}"[:200])


class _Signature:
    """One saved signature, ready to run: its executable and how to bind and unpack it."""

    def __init__(self, record: dict, executable: Any, source: str, build_ms: float):
        self.record = record
        self.key = record["key"]
        self.feed_roles = record["feed_roles"]
        self.result_roles = record["result_roles"]
        self.output = record["output"]
        self.executable = executable
        self.source = source
        self.build_ms = build_ms
        self.compile_ms = build_ms  # what timing() reports: building it from the file
        self.n_hits = 0
        self.last_run_ms = 0.0
        self.last_used = 0  # recency stamp of the signature cache


class LoadedModule:
    """What ``load_compiled`` returns: the saved signatures of a compiled module, runnable
    without its class (``__call__``, ``cache_info``, ``timing``, ``ir``, ``profile``,
    ``train``/``eval``)."""

    def __init__(self, path: str, manifest: dict, parts: dict, weights: dict[str, Tensor],
                 signatures: dict[str, _Signature], model: Any, backend: str) -> None:  # fmt: skip
        self.path = path
        self.manifest = manifest
        self._parts = parts
        self._weights = weights
        # Keyed by the saved match text; every saved signature stays (the cap is their number).
        self._cache = SignatureCache(max(len(signatures), 1))
        for match, sig in signatures.items():
            self._cache.put(match, sig)
        self._signatures = self._cache.entries
        self._model = model
        self._backend = backend
        self._fallback = None
        self.training = any(s.record["training"] for s in signatures.values()) and all(
            s.record["training"] for s in signatures.values()
        )

    def train(self, mode: bool = True) -> LoadedModule:
        self.training = bool(mode)
        if self._model is not None and hasattr(self._model, "train"):
            self._model.train(mode)
        return self

    def eval(self) -> LoadedModule:
        return self.train(False)

    def __repr__(self) -> str:
        return f"LoadedModule({self.path!r}, {len(self._signatures)} signature(s))"

    def _saved_signature(self, args: tuple, kwargs: dict) -> Any:
        """The saved signature these arguments (and the current mode) match, or None."""
        try:
            match = _match_text(
                [_arg_sig(a) for a in args],
                sorted([[k, _arg_sig(v)] for k, v in kwargs.items()]),
                self.training,
            )
        except _NotSaveable:
            return None
        return self._cache.get(match)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig = self._saved_signature(args, kwargs)
        if sig is None:
            return self._unsaved(args, kwargs)
        t0 = time.perf_counter()
        feeds = self._bind(sig, args, kwargs)
        try:
            results = sig.executable.run(feeds)
        except (TypeError, ValueError) as e:
            raise ValueError(f"load_compiled: the inputs do not fit {sig.key}: {e}") from e
        out = self._finish(sig, results, args, kwargs)
        sig.n_hits += 1
        sig.last_run_ms = (time.perf_counter() - t0) * 1e3
        return out

    def _unsaved(self, args: tuple, kwargs: dict) -> Any:
        if self._model is None:
            saved = "; ".join(s.key for s in self._signatures.values())
            raise ValueError(
                "load_compiled: these arguments match no saved signature (pass model= to "
                f"compile new ones); saved: {saved}"
            )
        if self._fallback is None:
            self._fallback = CompiledModule(self._model, backend=self._backend)
        return self._fallback(*args, **kwargs)

    def _bind(self, sig: _Signature, args: tuple, kwargs: dict) -> list[np.ndarray]:
        positions: list[tuple] = []
        _tensor_paths(args, (), positions)
        feeds = []
        for role in sig.feed_roles:
            kind, _, name = role.partition(":")
            if kind == "input":
                t = _at(args, positions[int(name)]) if name.isdigit() else kwargs[name]
                data = t._data
                if not (data.flags.c_contiguous and data.flags.aligned):
                    data = np.array(data, order="C")
                feeds.append(data)
            elif role == "rng":
                feeds.append(_random.get_rng_state()._data)
            else:
                feeds.append(self._weights[role]._data)
        return feeds

    def _finish(self, sig: _Signature, results: list, args: tuple, kwargs: dict) -> Any:
        outs = []
        for res, role in zip(results, sig.result_roles, strict=True):
            if role.startswith("output:"):
                outs.append(Tensor._wrap(res))
            elif role == "update:rng":
                _random.set_rng_state(res)
            elif role.startswith("update:"):
                target = role[len("update:") :]
                if target.startswith("input:"):
                    name = target[len("input:") :]

                    positions: list[tuple] = []
                    _tensor_paths(args, (), positions)
                    t = kwargs[name] if not name.isdigit() else _at(args, positions[int(name)])
                else:
                    t = self._weights[target]
                if res is not t._data:
                    np.copyto(t._data, res)
                t._version[0] += 1
        return _decode_output(sig.output, outs, args, kwargs)

    # --- introspection ---------------------------------------------------------------------------
    def cache_info(self) -> dict[str, Any]:
        """``entries``, ``keys`` (the saved signatures), ``n_calls``, ``sources`` (``program``:
        the backend's saved program ran; ``ir``: rebuilt from the saved IR) and, with
        ``model=``, the ``compiled`` module's own cache_info for new signatures."""
        sigs = list(self._signatures.values())
        info = introspect.cache_info(
            self._cache,
            keys=tuple(s.key for s in sigs),
            n_calls={s.key: s.n_hits for s in sigs},
            sources={s.key: s.source for s in sigs},
            backend=self._backend,
        )
        if self._fallback is not None:
            info["compiled"] = self._fallback.cache_info()
        return info

    def timing(self) -> list[dict[str, Any]]:
        """One row per saved signature: ``key``, ``load_ms`` (building its executable),
        ``last_run_ms``, ``n_hits`` and ``source`` (``program`` or ``ir``)."""
        return [
            introspect.timing_row(
                s.key,
                s,
                load_ms=s.build_ms,
                n_hits=s.n_hits,
                source=s.source,
                from_file=True,
            )
            for s in self._signatures.values()
        ]

    def profile(self, *args: Any, repeats: int = 100, **kwargs: Any) -> list[dict[str, Any]]:
        """Where a call's time goes, as ``CompiledModule.profile``: the executable of the saved
        signature ``args`` match, run ``repeats`` times on copies of its feeds (weights, buffers
        and the RNG are left as they were): one row per instruction, slowest first: ``index``,
        ``op``, ``ms`` (mean wall time) and ``instr``."""
        introspect.check_repeats(repeats)
        sig = self._saved_signature(args, kwargs)
        if sig is None:
            saved = "; ".join(s.key for s in self._signatures.values())
            raise ValueError(f"profile: these arguments match no saved signature; saved: {saved}")
        feeds = self._bind(sig, args, kwargs)
        return introspect.profile_rows(sig.executable, feeds, repeats, self._backend)

    def ir(self, key: str | None = None, stage: str = "optimized") -> str:
        """The saved MLIR of a signature (``key``: its repr, as in ``cache_info()["keys"]``;
        default the first): ``optimized`` as saved, or ``final`` (lowered for the backend)."""
        sigs = {s.key: s for s in self._signatures.values()}
        if key is None:
            key = next(iter(sigs))
        sig = sigs.get(str(key))
        if sig is None:
            raise KeyError(f"no saved signature {key!r}; saved: {', '.join(sigs)}")
        text = self._parts[sig.record["ir"]]
        if stage == "optimized":
            return text
        if stage not in ("prim", "final"):
            raise ValueError(f"load_compiled: stage must be optimized, prim or final: {stage!r}")
        return introspect.ir_at(parse_ir(text), "optimized", stage, backend=self._backend)


def _build(record: dict, manifest: dict, parts: dict, backend_name: str) -> tuple[Any, str]:
    """The executable of one saved signature: the backend's saved program when it is usable
    here, else rebuilt from the saved IR."""

    backend = _pipeline.backend_of(backend_name)
    program_name = record.get("program")
    same = (
        manifest.get("backend") == backend_name
        and manifest.get("lucid_version") == _lucid_version()
        and manifest.get("program_format") == getattr(backend, "program_format", None)
    )
    if program_name is not None and same:
        try:
            return backend.import_program(parts[program_name]), "program"
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            logger.info("load_compiled: rebuilding %s from its IR: %s", record["key"], e)
    try:
        module = parse_ir(parts[record["ir"]])
    except Exception as e:  # the parser's own errors have no common base
        raise ValueError(f"load_compiled: the IR of {record['key']} does not parse: {e}") from e
    fn = forward_func(module)
    if feed_roles(fn) != record["feed_roles"] or result_roles(fn) != record["result_roles"]:
        raise ValueError(f"load_compiled: the IR of {record['key']} disagrees with the manifest")
    try:
        executable, _ = _pipeline.compile_module(module, backend)
    except _pipeline.Unsupported as e:
        raise ValueError(
            f"load_compiled: backend {backend_name!r} cannot run {record['key']}: {e}"
        ) from e
    return executable, "ir"


def load_compiled(path: str | os.PathLike, *, model: Any = None, backend: str = "auto"):
    """Load what ``save_compiled`` wrote: a callable serving the saved signatures (weights from
    the file, or from ``model=`` by name, checked against the manifest). With ``model=``, a call
    that matches no saved signature is compiled as ``lucid.compile(model)`` would; without, it
    raises naming the saved ones. Never executes code from the file; a truncated, corrupted,
    tampered or wrong-version file raises ValueError (OSError when it cannot be read)."""

    path = os.fspath(path)
    manifest, parts, arrays = _read(path)
    backend_name = _pipeline.resolve_backend(backend)
    kind = manifest.get("kind", "module")
    if kind != "module":
        if kind not in aot_step.KINDS:
            raise _bad(path, f"it holds a {kind!r}, which this Lucid does not know")
        return aot_step.load_step(path, manifest, parts, arrays, backend_name, model)
    try:
        records = list(manifest["signatures"])
        specs = dict(manifest["weights"])
    except (KeyError, TypeError) as e:
        raise _bad(path, f"the manifest lacks {e}") from None
    weights: dict[str, Tensor] = {}
    from_model = _model_weights(model) if model is not None else {}
    for role, spec in specs.items():
        if role in from_model:
            t = from_model[role]
            got = [list(t._data.shape), t._data.dtype.name]
            if got != [spec["shape"], spec["dtype"]]:
                raise ValueError(
                    f"load_compiled: model= has {role} of shape {tuple(got[0])} and dtype "
                    f"{got[1]}; the file was compiled for {tuple(spec['shape'])} {spec['dtype']}"
                )
            if not t._data.flags.c_contiguous:
                t._data = np.array(t._data, order="C")
            weights[role] = t
        elif role in arrays:
            arr = arrays[role]
            if [list(arr.shape), arr.dtype.name] != [spec["shape"], spec["dtype"]]:
                raise _bad(path, f"weight {role!r} does not have the manifest's shape and dtype")
            weights[role] = Tensor._wrap(_owned(arr))
        else:
            raise ValueError(
                f"load_compiled: {path!r} holds no weight {role!r} (saved with "
                "include_weights=False?) and model= does not provide it"
            )
    signatures: dict[str, _Signature] = {}
    for i, record in enumerate(records):
        _check_record(path, i, record, parts)
        try:
            t0 = time.perf_counter()
            executable, source = _build(record, manifest, parts, backend_name)
        except RecursionError:
            raise _bad(path, f"signature {i}: its IR is nested too deeply") from None
        except ValueError as e:
            raise _bad(path, f"signature {i}: {e}") from None
        sig = _Signature(record, executable, source, (time.perf_counter() - t0) * 1e3)
        signatures[record["match"]] = sig
    return LoadedModule(path, manifest, parts, weights, signatures, model, backend_name)
