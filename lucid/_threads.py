"""Lucid's BLAS threading policy, applied whatever the import order.

Two OpenBLAS thread pools live in one Lucid process: numpy's (eager kernels) and the native
runtime's (compiled matmul and convolution). By default an idle OpenBLAS worker keeps spinning
for a while after each call; with both pools spinning on a 2-core machine, alternating eager and
compiled work slowed matmuls 10-40x. Idle workers therefore go to sleep at once
(``OPENBLAS_THREAD_TIMEOUT=1``) unless the user set the variable.

An OpenBLAS reads that variable when it loads and starts its workers. One loaded after this
module (Lucid's own, numpy's when Lucid is imported first) sees it. One loaded before (numpy
imported before Lucid) is told at run time through its own entry points: ``openblas_read_env``
re-reads the environment and ``blas_thread_shutdown_`` stops the idle workers, which the library
restarts, with the new timeout, at its next threaded call (as it does after a fork). Stopping
workers while another thread is inside that library's BLAS would hang, so this is done only when
no other non-daemon Python thread runs; otherwise a warning says how to set it instead.

``LUCID_NUM_THREADS`` sizes the native pool and BLAS (``lucid.backends.cpu.set_num_threads``),
applied through the native BLAS's own ``openblas_set_num_threads`` as soon as the native module
loads (``apply_thread_env``); ``LUCID_ADAPTIVE_THREADS=0`` keeps that count on a busy machine.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

TIMEOUT_VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
LUCID_TIMEOUT = "1"

_user_set_timeout = TIMEOUT_VARIABLE in os.environ
os.environ.setdefault(TIMEOUT_VARIABLE, LUCID_TIMEOUT)

# Symbol names of the same entry point across OpenBLAS builds: plain, scipy-openblas32
# (``scipy_`` prefix) and scipy-openblas64 as numpy bundles it (``64_`` suffix).
_GET_THREADS = (
    "openblas_get_num_threads",
    "scipy_openblas_get_num_threads",
    "scipy_openblas_get_num_threads64_",
    "openblas_get_num_threads64_",
)
_SET_THREADS = (
    "openblas_set_num_threads",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "openblas_set_num_threads64_",
)


def loaded_openblas_paths() -> list[str]:
    """Files of the OpenBLAS libraries mapped into this process, in load order (Linux; empty
    where ``/proc/self/maps`` does not exist)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path)
                if "openblas" in name and ".so" in name and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _function(lib: ctypes.CDLL, names: tuple[str, ...]):
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    return None


def blas_libraries() -> list[dict[str, object]]:
    """Each loaded OpenBLAS with its own view of its settings: ``path``, ``num_threads`` (its
    ``openblas_get_num_threads``) and ``thread_timeout`` (its ``openblas_thread_timeout``: the
    ``OPENBLAS_THREAD_TIMEOUT`` value it runs with, 0 for its default; None where the library
    does not export the getter)."""
    found = []
    for path in loaded_openblas_paths():
        lib = ctypes.CDLL(path)  # already loaded: the same handle, nothing runs
        get_threads = _function(lib, _GET_THREADS)
        get_timeout = _function(lib, ("openblas_thread_timeout",))
        found.append(
            {
                "path": path,
                "num_threads": int(get_threads()) if get_threads else None,
                "thread_timeout": int(get_timeout()) if get_timeout else None,
            }
        )
    return found


def _other_threads_running() -> bool:
    me = threading.current_thread()
    return any(t is not me and t.is_alive() and not t.daemon for t in threading.enumerate())


def _apply_timeout_to_loaded_blas() -> list[str]:
    """Give the OpenBLAS libraries loaded before this module Lucid's thread timeout; returns the
    paths it was applied to."""
    applied: list[str] = []
    for path in loaded_openblas_paths():
        lib = ctypes.CDLL(path)
        get_timeout = _function(lib, ("openblas_thread_timeout",))
        read_env = _function(lib, ("openblas_read_env",))
        shutdown = _function(lib, ("blas_thread_shutdown_",))
        if get_timeout is None or read_env is None or shutdown is None:
            continue  # the build keeps these internal: nothing to apply through
        if str(get_timeout()) == LUCID_TIMEOUT:
            continue
        if _other_threads_running():
            warnings.warn(
                f"{path} was loaded before Lucid and another thread is running, so its idle "
                f"BLAS workers keep spinning (they slow compiled calls); set "
                f"{TIMEOUT_VARIABLE}={LUCID_TIMEOUT} before starting Python, or import lucid "
                "before numpy",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        read_env()
        shutdown()
        applied.append(path)
    return applied


# numpy (or scipy, or anything bundling OpenBLAS) imported before Lucid already read the
# environment: apply the timeout through the libraries themselves.
applied_at_import = (
    [] if _user_set_timeout or sys.platform == "darwin" else _apply_timeout_to_loaded_blas()
)


def thread_env_error() -> str | None:
    """Why ``LUCID_NUM_THREADS`` or ``LUCID_ADAPTIVE_THREADS`` is not a usable setting (None when
    unset or valid)."""
    adaptive = os.environ.get("LUCID_ADAPTIVE_THREADS", "").strip()
    if adaptive not in ("", "0", "1"):
        return f"LUCID_ADAPTIVE_THREADS must be 0 or 1, got {adaptive!r}"
    value = os.environ.get("LUCID_NUM_THREADS", "")
    if not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        return f"LUCID_NUM_THREADS must be a positive integer, got {value!r}"
    return None


def apply_thread_env(native) -> None:
    """Apply ``LUCID_NUM_THREADS`` and ``LUCID_ADAPTIVE_THREADS`` to the native module."""
    # A bad value is not applied here (an import error would hide it); the compiler refuses it
    # once, at the first compile, through thread_env_error().
    if thread_env_error() is not None:
        return
    if os.environ.get("LUCID_NUM_THREADS", "").strip():
        native.set_num_threads(int(os.environ["LUCID_NUM_THREADS"]))
    native.set_adaptive_threads(os.environ.get("LUCID_ADAPTIVE_THREADS", "").strip() != "0")
