"""The ``lucid.compiled`` file: its format constants, writing and reading it with every checksum
checked, and the helpers the savers (``aot.module``, ``aot.step``) and loaders (``aot.loaded``,
``aot.loaded_step``) share.

The file is a Lucid checkpoint (safetensors, written and validated by ``lucid.serialization``)
holding one object::

    {"format": "lucid.compiled", "manifest": <JSON text>, "manifest_sha256": <hex>,
     "parts": {name: text}, "weights": {feed role: ndarray}}
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np

from lucid import serialization
from lucid._tensor import Tensor
from lucid.compile.options import backend_of

__all__ = ["FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS"]

FORMAT = "lucid.compiled"

FORMAT_VERSION = 2

#: Versions this Lucid reads: 1 (compiled modules only) and 2 (adds ``kind``: training steps).
READABLE_VERSIONS = (1, 2)
# The training steps a file may hold (its ``kind``; a compiled module's file has none).
STEP_KINDS = ("fused_step", "make_step")

_SCALARS = (bool, int, float, str, type(None))


class _NotSaveable(Exception):
    """One signature cannot be written (the reason is logged, the others are saved)."""


def _sha256(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _array_sha256(arr: np.ndarray) -> str:
    h = hashlib.sha256(f"{arr.dtype.str}{list(arr.shape)}".encode())
    # The array's own bytes, hashed in place (tobytes() would copy every weight once more).
    h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _lucid_version() -> str:
    import lucid

    return str(lucid.__version__)


# --- argument signatures, as JSON: computed from a CacheKey (save) and from arguments (load) ----
def _scalar(value: Any) -> list:
    if isinstance(value, float) and not math.isfinite(value):
        return ["float", repr(value)]
    if isinstance(value, _SCALARS):
        return [type(value).__name__, value]
    if isinstance(value, np.generic):
        return _scalar(value.item())
    if isinstance(value, (tuple, list)):
        return [type(value).__name__ if type(value) in (tuple, list) else "tuple",
                [_scalar(v) for v in value]]  # fmt: skip
    raise _NotSaveable(f"an argument of type {type(value).__name__} is not a JSON value")


def _write(path: str, manifest: dict, parts: dict, weights: dict) -> None:
    manifest_text = json.dumps(manifest, sort_keys=True, allow_nan=False)
    payload = {
        "format": FORMAT,
        "manifest": manifest_text,
        "manifest_sha256": _sha256(manifest_text),
        "parts": parts,
        "weights": weights,
    }
    serialization.save(payload, path)


def _backend_program_format(name: str) -> str | None:
    return getattr(backend_of(name), "program_format", None)


# --- load ----------------------------------------------------------------------------------------
def _bad(path: str, problem: str) -> ValueError:
    return ValueError(f"load_compiled: {path!r} is not a usable compiled file: {problem}")


def _read(path: str) -> tuple[dict, dict, dict]:
    try:
        obj = serialization.load(path)
    except ValueError as e:
        raise _bad(path, str(e)) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise _bad(path, f"it is not a {FORMAT} file (a plain checkpoint? use lucid.load)")
    manifest_text, digest = obj.get("manifest"), obj.get("manifest_sha256")
    parts, weights = obj.get("parts"), obj.get("weights")
    if not (isinstance(manifest_text, str) and isinstance(digest, str)):
        raise _bad(path, "its manifest is missing")
    if _sha256(manifest_text) != digest:
        raise _bad(path, "the manifest does not match its checksum (corrupted or tampered)")
    try:
        manifest = json.loads(manifest_text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise _bad(path, f"the manifest is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _bad(path, "the manifest is not a lucid.compiled manifest")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise _bad(
            path,
            f"format version {version!r}; this Lucid reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}",
        )
    if not isinstance(parts, dict) or not isinstance(weights, dict):
        raise _bad(path, "its parts or weights are missing")
    expected_parts = manifest.get("parts")
    if not isinstance(expected_parts, dict) or set(expected_parts) != set(parts):
        raise _bad(path, "its parts are not the ones the manifest lists")
    for name, text in parts.items():
        if not isinstance(text, str) or _sha256(text) != expected_parts[name]:
            raise _bad(path, f"part {name!r} does not match its checksum (corrupted or tampered)")
    arrays = {}
    specs = manifest.get("weights")
    if not isinstance(specs, dict):
        raise _bad(path, "the manifest lists no weights")
    for role, arr in weights.items():
        spec = specs.get(role)
        if isinstance(arr, Tensor):
            arr = arr._data
        if not isinstance(arr, np.ndarray) or not isinstance(spec, dict):
            raise _bad(path, f"weight {role!r} is not listed in the manifest")
        if spec.get("sha256") != _array_sha256(arr):
            raise _bad(path, f"weight {role!r} does not match its checksum")
        arrays[role] = arr
    return manifest, parts, arrays


def _owned(arr: np.ndarray) -> np.ndarray:
    """A weight read from the file as the loaded module's own C-contiguous, writable array:
    ``lucid.load`` already made each a fresh copy (shared with nothing), so no second one."""
    if arr.flags.c_contiguous and arr.flags.writeable:
        return arr
    return np.array(arr, order="C", copy=True)


def _model_weights(model: Any) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for method, kind in (("named_parameters", "param"), ("named_buffers", "buffer")):
        fn = getattr(model, method, None)
        if fn is not None:
            for name, t in fn():
                if t is not None:
                    out.setdefault(f"{kind}:{name}", t)
    return out
