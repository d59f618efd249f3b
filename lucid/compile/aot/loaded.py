"""Loading a saved compiled module: ``load_compiled`` checks every record of the file (shapes,
output structures, argument paths, depth) and returns a ``LoadedModule`` serving the saved
signatures without the model's class (or a ``LoadedStep`` for a saved training step)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import numpy as np

# lucid.ir loads on first use: a file whose saved programs all run here loads no xDSL.
from lucid import _random, ir
from lucid._tensor import Tensor
from lucid.compile import introspect
from lucid.compile._pytree import _at, _tensor_paths
from lucid.compile.aot.file import (
    _SCALARS,
    STEP_KINDS,
    _bad,
    _lucid_version,
    _model_weights,
    _NotSaveable,
    _owned,
    _read,
)
from lucid.compile.aot.module import (
    _arg_sig,
    _decode_output,
    _match_text,
)
from lucid.compile.cache import SignatureCache
from lucid.compile.errors import Unsupported
from lucid.compile.inference.module import CompiledModule
from lucid.compile.options import backend_of, resolve_backend
from lucid.compile.session import compile_module

logger = logging.getLogger("lucid.compile")

__all__ = ["LoadedModule", "load_compiled"]


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
        self._cache = SignatureCache.holding(signatures)  # keyed by the saved match text
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
        return introspect.ir_at(ir.parse_ir(text), "optimized", stage, backend=self._backend)


def _build(record: dict, manifest: dict, parts: dict, backend_name: str) -> tuple[Any, str]:
    """The executable of one saved signature: the backend's saved program when it is usable
    here, else rebuilt from the saved IR."""

    backend = backend_of(backend_name)
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
        module = ir.parse_ir(parts[record["ir"]])
    except Exception as e:  # the parser's own errors have no common base
        raise ValueError(f"load_compiled: the IR of {record['key']} does not parse: {e}") from e
    fn = ir.forward_func(module)
    if ir.feed_roles(fn) != record["feed_roles"] or ir.result_roles(fn) != record["result_roles"]:
        raise ValueError(f"load_compiled: the IR of {record['key']} disagrees with the manifest")
    try:
        executable, _ = compile_module(module, backend)
    except Unsupported as e:
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
    backend_name = resolve_backend(backend)
    kind = manifest.get("kind", "module")
    if kind != "module":
        if kind not in STEP_KINDS:
            raise _bad(path, f"it holds a {kind!r}, which this Lucid does not know")
        from lucid.compile.aot import loaded_step  # a training step: the training builder

        return loaded_step.load_step(path, manifest, parts, arrays, backend_name, model)
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
