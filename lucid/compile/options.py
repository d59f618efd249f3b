"""What a compiled wrapper is asked for: the backend by name, the graph pipeline and the pass
manager's debugging switches of ``options=``, environment flags, and the check of ``LUCID_*``
settings made once at the first compile.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from lucid.backends import get_backend
from lucid.backends import resolve_backend as _resolve
from lucid.compile import _disk_cache
from lucid.compile.cache import max_entries

__all__ = [
    "GRAPH_PIPELINE",
    "SWITCH_OPTIONS",
    "Options",
    "backend_of",
    "check_settings",
    "env_flag",
    "parse_options",
    "resolve_backend",
]

GRAPH_PIPELINE = "canonicalize,cse,dce"


@dataclass
class Options:
    """A ``CompiledModule``'s compile options: the backend (a registry name), ``strict``, the
    graph pipeline (None: ``GRAPH_PIPELINE``) and the pass-manager switches set on top of the
    ``LUCID_COMPILE_*`` variables (Instrumentation fields)."""

    backend: str = "auto"
    strict: bool = False
    pipeline: str | None = None
    switches: dict[str, Any] = field(default_factory=dict)


def backend_of(name: str) -> Any:
    """The backend called ``name`` (resolved, available), from the registry."""
    return get_backend(name)


def resolve_backend(name: str) -> str:
    """The backend a ``backend=`` argument selects: ``LUCID_COMPILE_BACKEND`` when it is
    ``"auto"`` and the variable is set, resolved through the registry (``auto``: the best
    backend available here). Unknown: ValueError; unavailable: ``BackendUnavailable`` (why)."""
    if name == "auto":
        name = os.environ.get("LUCID_COMPILE_BACKEND", "").strip() or "auto"
    return _resolve(name)


# ``options=`` keys besides "pipeline": the pass manager's debugging switches, named as the
# environment variables are (``LUCID_COMPILE_<KEY upper-cased>``), mapped to Instrumentation.
SWITCH_OPTIONS = {
    "print_ir_before_all": "print_ir_before_all",
    "print_ir_after_all": "print_ir_after_all",
    "print_ir_after_change": "print_ir_after_change",
    "print_ir_after_failure": "print_ir_after_failure",
    "print_ir_tree_dir": "print_ir_tree_dir",
    "verify_each": "verify_each",
    "pass_timing": "timing",
    "pass_statistics": "statistics",
    "print_generic": "generic",
    "print_debuginfo": "debuginfo",
}


def parse_options(
    options: dict[str, Any] | None, who: str = "lucid.compile"
) -> tuple[str | None, dict[str, Any]]:
    """An ``options=`` dict as ``(graph pipeline or None, switches)``: the switches are
    Instrumentation fields for ``CompileSession``. Unknown keys and a non-string pipeline are
    refused by name (``who`` starts the message)."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - {"pipeline", *SWITCH_OPTIONS})
    if unknown:
        raise ValueError(
            f"{who}: unknown option(s) {', '.join(map(repr, unknown))}; accepted: "
            + ", ".join(["pipeline", *SWITCH_OPTIONS])
        )
    pipeline = opts.pop("pipeline", None)
    if pipeline is not None and not isinstance(pipeline, str):
        raise TypeError(f"{who}: option 'pipeline' must be a string, got {pipeline!r}")
    switches = {}
    for key, value in opts.items():
        if key == "print_ir_tree_dir":
            switches[SWITCH_OPTIONS[key]] = None if value is None else os.fspath(value)
        else:
            switches[SWITCH_OPTIONS[key]] = bool(value)
    return pipeline, switches


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to anything but 0/false/no/off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def check_settings(backend: str) -> None:
    """Refuse a bad ``LUCID_*`` setting once, at the first compile, with a ValueError naming it
    (rather than sending every signature to eager with a warning each): the backend's own
    settings (``Backend.check_settings``), the cache cap and the debug folder."""
    get_backend(backend).check_settings()
    max_entries()
    if _disk_cache.enabled():
        _disk_cache.max_bytes()  # LUCID_COMPILE_DISK_CACHE_MAX_MB
    if os.environ.get("LUCID_COMPILE_DEBUG", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    folder = os.environ.get("LUCID_COMPILE_DEBUG_DIR")
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(
            f"LUCID_COMPILE_DEBUG_DIR={folder!r} is not a writable folder "
            f"({type(e).__name__}: {e.strerror or e})"
        ) from None
