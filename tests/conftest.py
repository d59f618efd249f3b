import gc
import os
import sys
import threading

import pytest
from hypothesis import HealthCheck, settings

# Cache compiled bytecode (Python's default), in this process and the ones the tests start, even
# where PYTHONDONTWRITEBYTECODE is set: without it every test module is assertion-rewritten again
# and every child process compiles Lucid anew, a sizeable share of the run's time. The caches go
# to the __pycache__ folders git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import lucid._dispatch  # noqa: E402

# Every kernel's output is checked against its op's shape/dtype inference during the tests.
lucid._dispatch.CHECK_INFERENCE = True

settings.register_profile(
    "lucid",
    deadline=None,
    # Few examples in the README's run; .ci/run's second step runs the hypothesis tests with
    # LUCID_HYPOTHESIS_EXAMPLES=100 (a test's own @settings(max_examples=...) takes precedence).
    max_examples=int(os.environ.get("LUCID_HYPOTHESIS_EXAMPLES", "10")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("lucid")


def pytest_collection_finish(session):
    """What collecting loaded (test modules, Lucid, xDSL, hypothesis) lives for the whole run:
    frozen out of the cyclic collector's sight, the full collections during the tests stop
    rescanning it. Then the selected tests' background work starts."""
    gc.collect()
    gc.freeze()
    if not session.config.option.collectonly:
        _start_background_work(session)


def _start_background_work(session) -> None:
    """A test module whose tests wait on other processes (the docs' runner, clang) may define
    ``background_work(items, config)``, called here with its selected tests: it returns a
    function doing that work (or None), which runs on one background thread, one module's after
    another in the run's order. Their processes then use the machine's second core (the run
    itself uses one) while this one runs the tests collected before them."""
    by_module: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "background_work"):
            by_module.setdefault(module, []).append(item)
    jobs = [module.background_work(items, session.config) for module, items in by_module.items()]
    jobs = [job for job in jobs if job is not None]

    def run_jobs() -> None:
        if sys.platform.startswith("linux"):
            # Nice 10 for this thread (on Linux a thread's own) and the processes it starts: the
            # work takes what the run leaves free, and never slows the run on a busy machine.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        for job in jobs:
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job reports its errors to its tests
                continue

    if jobs:
        threading.Thread(target=run_jobs, name="tests-background-work", daemon=True).start()


@pytest.fixture
def fixed_threads():
    """Thread counts a test sets hold (and split paths run) while other processes keep the
    machine busy: the adaptive policy is off for the test. After it, the count, the policy, the
    GEMM tile (``set_sgemm_isa``) and fused reductions come back to what the run uses."""
    from lucid import _native
    from lucid.backends.cpu import (
        get_num_threads,
        set_adaptive_threads,
        set_num_threads,
        thread_stats,
    )

    adaptive, threads = thread_stats()["adaptive"], get_num_threads()
    set_adaptive_threads(False)
    yield
    set_adaptive_threads(adaptive)
    set_num_threads(threads)
    _native.set_sgemm_isa("auto")
    _native.set_fused_reductions(os.environ.get("LUCID_FUSED_REDUCTIONS", "1") != "0")
