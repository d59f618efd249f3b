"""Lucid's BLAS thread settings hold whatever the import order (issue 14, item 3).

Each scenario is a fresh process. What the BLAS libraries run with is read through their own
getters (``openblas_get_num_threads`` and ``openblas_thread_timeout`` under each library's symbol
names, via ctypes), and the thread timeout is also checked by what it is for: after a threaded
numpy matmul, numpy's idle workers must not keep spinning on the CPU.

The default run starts two of these processes (numpy alone, then numpy imported before Lucid);
the other scenarios are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="OpenBLAS bundled with numpy (Linux wheels)"
)

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading, time, warnings
    warnings.simplefilter("always")
    order, extra_thread = sys.argv[1], sys.argv[2] == "thread"
    caught = []
    warnings.showwarning = lambda m, *a, **k: caught.append(str(m))
    if extra_thread:
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()  # non-daemon, like a user's worker
    if order == "numpy-first":
        import numpy as np
        import lucid
    elif order == "lucid-first":
        import lucid
        import numpy as np
    else:
        import numpy as np

    def getter(lib, *names):
        for name in names:
            if hasattr(lib, name):
                return int(getattr(lib, name)())
        return None

    libs = {}
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    for line in lines:
        path = line.split(maxsplit=5)[-1].strip()
        name = os.path.basename(path)
        if "openblas" in name and ".so" in name and name not in libs:
            lib = ctypes.CDLL(path)
            libs[name] = {
                "threads": getter(lib, "scipy_openblas_get_num_threads64_",
                                  "scipy_openblas_get_num_threads", "openblas_get_num_threads"),
                "timeout": getter(lib, "openblas_thread_timeout"),
            }
    # numpy's idle workers after threaded matmuls: CPU time of the process beyond this thread's.
    a = np.random.default_rng(0).random((256, 256))
    spin = 0.0
    for _ in range(20):
        a @ a
        p0, t0 = time.process_time(), time.thread_time()
        time.sleep(0.02)
        spin += (time.process_time() - p0) - (time.thread_time() - t0)
    if extra_thread:
        stop.set()
    print(json.dumps({"libs": libs, "spin_s": spin, "warnings": caught}))
    """
)


def _probe(order: str, *, thread: bool = False, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    base.pop("LUCID_NUM_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, order, "thread" if thread else "-"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numpy_lib(result: dict) -> dict:
    (name,) = [n for n in result["libs"] if "openblas64" in n]
    return result["libs"][name]


def _lucid_lib(result: dict) -> dict:
    (name,) = [n for n in result["libs"] if "openblas64" not in n]
    return result["libs"][name]


@pytest.fixture(scope="module")
def numpy_alone() -> dict:
    return _probe("numpy-only")


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
@pytest.mark.parametrize("order", ["numpy-first", "lucid-first"])
def test_settings_hold_in_either_import_order(order, numpy_alone):
    result = _probe(order, LUCID_NUM_THREADS="1")
    # Lucid's own BLAS: LUCID_NUM_THREADS.
    assert _lucid_lib(result)["threads"] == 1
    # numpy's BLAS: Lucid's thread timeout, its thread count untouched.
    numpy_lib = _numpy_lib(result)
    assert numpy_lib["timeout"] == 1
    assert numpy_lib["threads"] == _numpy_lib(numpy_alone)["threads"]
    assert not result["warnings"]
    # What the timeout is for: numpy alone (its default timeout) keeps idle workers spinning.
    assert _numpy_lib(numpy_alone)["timeout"] == 0
    if numpy_lib["threads"] >= 2 and numpy_alone["spin_s"] >= 0.01:
        assert result["spin_s"] < numpy_alone["spin_s"] / 4, (result, numpy_alone)


@pytest.mark.slow
def test_a_timeout_the_user_set_is_left_alone():
    result = _probe("numpy-first", OPENBLAS_THREAD_TIMEOUT="3")
    assert _numpy_lib(result)["timeout"] == 3


@pytest.mark.slow
def test_another_running_thread_gets_a_warning_not_a_restart():
    result = _probe("numpy-first", thread=True)
    assert _numpy_lib(result)["timeout"] == 0  # not restarted under a possibly busy thread
    assert any("OPENBLAS_THREAD_TIMEOUT=1" in w for w in result["warnings"]), result["warnings"]


def test_blas_libraries_reports_what_the_getters_say():
    from lucid._threads import blas_libraries

    libs = blas_libraries()
    assert any("openblas64" in lib["path"] for lib in libs)
    from lucid.backends.cpu import get_num_threads, thread_stats

    (own,) = [lib for lib in libs if "scipy_openblas32" in lib["path"]]
    assert own["num_threads"] == thread_stats()["blas_threads"]
    assert own["num_threads"] <= get_num_threads()
