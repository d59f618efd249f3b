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
from typing import Any

import numpy as np

# lucid.ir loads on first use, the training steps' modules when a step is saved: reading
# a compiled module's file back (``loaded``, which shares this module's helpers) needs neither.
from lucid import _dtype, ir
from lucid._tensor import Tensor
from lucid.backends.base import Unsupported as BackendUnsupported
from lucid.compile.aot.file import (
    _SCALARS,
    FORMAT,
    FORMAT_VERSION,
    _array_sha256,
    _backend_program_format,
    _lucid_version,
    _NotSaveable,
    _scalar,
    _sha256,
    _write,
)
from lucid.compile.errors import Unsupported
from lucid.compile.inference.module import CompiledModule
from lucid.compile.options import backend_of
from lucid.compile.session import _graph_module, lower
from lucid.compile.signature import _has_tensor, _TreeSig

logger = logging.getLogger("lucid.compile")

__all__ = ["FORMAT", "FORMAT_VERSION", "save_compiled"]


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
    args_sig, kwargs_sig, training, grad, _, autocast = key
    if autocast is not None:  # a loaded module matches calls without the autocast region
        raise _NotSaveable("it was compiled inside an autocast region")
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
    module, _, _ = _graph_module(entry.trace, options.pipeline, None)
    ir_text = ir.print_ir(module)
    backend = backend_of(options.backend)
    program = None
    try:
        lower(module, backend)
        program = backend.export_program(module)
    except (Unsupported, BackendUnsupported) as e:
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
    from lucid.compile.training import FusedStep, TrainStep

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
    from lucid.compile.aot import step as aot_step

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
