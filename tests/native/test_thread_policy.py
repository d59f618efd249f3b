"""Fewer threads while other processes keep the cores busy (issue 14, "Threads on a busy
machine"): the policy's decisions, their effect on the BLAS (read through its own getter), and
the real measurement against a competing busy process."""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from lucid.backends.cpu import (
    CPUBackend,
    Program,
    get_num_threads,
    set_adaptive_threads,
    set_num_threads,
    thread_stats,
)
from lucid.backends.cpu.backend import thread_setting_error


def _native_blas_threads() -> int | None:
    """The native BLAS's own count, from its getter (None where it is not OpenBLAS)."""
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    for line in lines:
        path = line.split(maxsplit=5)[-1].strip()
        if path.endswith("libscipy_openblas.so"):
            return int(ctypes.CDLL(path).scipy_openblas_get_num_threads())
    return None


@pytest.fixture
def policy():
    configured, adaptive = get_num_threads(), thread_stats()["adaptive"]
    set_adaptive_threads(True)
    yield
    set_num_threads(configured)
    set_adaptive_threads(adaptive)


def _observe(other_cores: float, cpus: int) -> int:
    from lucid import _native

    return _native.observe_load(other_cores, cpus)


@pytest.mark.skipif(sys.platform == "darwin", reason="the load is read from /proc/stat")
def test_contention_lowers_blas_and_pool_threads_and_recovers(policy):
    set_num_threads(2)
    assert _observe(0.0, 2) == 2
    assert _observe(1.0, 2) == 1  # one busy process on two cores
    stats = thread_stats()
    assert (stats["effective"], stats["configured"], stats["contended"]) == (1, 2, True)
    assert stats["blas_threads"] == 1 and get_num_threads() == 2
    if _native_blas_threads() is not None:
        assert _native_blas_threads() == 1
    assert _observe(0.5, 2) == 1  # between the thresholds: no flapping
    assert _observe(0.2, 2) == 2  # the load went away
    assert thread_stats()["blas_threads"] == 2
    if _native_blas_threads() is not None:
        assert _native_blas_threads() == 2


@pytest.mark.skipif(sys.platform == "darwin", reason="the load is read from /proc/stat")
def test_threads_follow_the_free_cores_never_above_the_setting(policy):
    set_num_threads(4)
    assert _observe(1.0, 8) == 4  # plenty of free cores
    assert _observe(5.2, 8) == 2
    assert _observe(6.5, 8) == 1
    assert _observe(9.0, 8) == 1  # never fewer than one
    set_num_threads(3)  # a new setting applies the last observation at once
    assert thread_stats()["effective"] == 1
    assert _observe(0.0, 8) == 3


def test_adaptation_off_keeps_the_configured_count(policy):
    set_num_threads(2)
    _observe(1.5, 2)
    set_adaptive_threads(False)
    assert thread_stats()["effective"] == 2 and thread_stats()["blas_threads"] == 2
    assert _observe(1.5, 2) == 2


def test_one_configured_thread_is_never_raised(policy):
    set_num_threads(1)
    assert _observe(0.0, 8) == 1
    assert thread_stats()["blas_threads"] == 1


def test_bad_observations_are_refused():
    from lucid import _native

    with pytest.raises(ValueError, match="other_cores"):
        _native.observe_load(-1.0, 2)
    with pytest.raises(ValueError, match="allowed_cpus"):
        _native.observe_load(0.5, 0)


@pytest.mark.parametrize("value", ["yes", "2", "-1"])
def test_bad_adaptive_setting_is_named(monkeypatch, value):
    monkeypatch.setenv("LUCID_ADAPTIVE_THREADS", value)
    assert "LUCID_ADAPTIVE_THREADS must be 0 or 1" in thread_setting_error()


def _gemm_executable():
    p = Program()
    a, b = p.feed((64, 784)), p.feed((784, 256))
    p.result(p.op("matmul", a, b, transpose_a=False, transpose_b=False))
    return CPUBackend(cache=False).compile(p)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the load is read from /proc/stat")
def test_a_competing_busy_process_is_noticed_and_results_do_not_change(policy):
    set_num_threads(2)
    ex = _gemm_executable()
    rng = np.random.default_rng(0)
    feeds = [
        rng.standard_normal((64, 784), np.float32),
        rng.standard_normal((784, 256), np.float32),
    ]
    expected = feeds[0] @ feeds[1]
    samples_before = thread_stats()["samples"]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            out = ex.run(feeds)[0]
            stats = thread_stats()
            if stats["samples"] >= samples_before + 3 and stats["contended"]:
                break
            time.sleep(0.005)  # leave the competitor its share, as an application would
    finally:
        busy.kill()
        busy.wait()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    assert stats["samples"] >= samples_before + 2, stats
    assert stats["other_cores"] >= 0.6 and stats["contended"], stats
    # Two cores here: one thread; a bigger machine keeps threads on its free cores.
    free = max(1, min(2, math.floor(stats["allowed_cpus"] - stats["other_cores"])))
    assert stats["effective"] == free and stats["blas_threads"] == free, stats
    # Back to two threads once the load is gone; the shared test machine may stay busy, so
    # this part only holds when the policy saw the load go away.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        ex.run(feeds)
        stats = thread_stats()
        if not stats["contended"]:
            break
        time.sleep(0.005)
    if stats["contended"]:
        pytest.skip(f"other processes keep this machine busy ({stats['other_cores']:.2f} cores)")
    assert stats["effective"] == 2 and stats["blas_threads"] == 2, stats


def test_sampling_costs_little(policy):
    set_num_threads(2)
    ex = _gemm_executable()
    feeds = [np.ones((64, 784), np.float32), np.ones((784, 256), np.float32)]
    before = thread_stats()
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end:
        ex.run(feeds)
    after = thread_stats()
    sampled = after["samples"] - before["samples"]
    # At most one sample per 100 ms of runs (the first run after a pause samples at once).
    assert 1 <= sampled <= 7, sampled
    assert (after["sample_seconds"] - before["sample_seconds"]) / sampled < 0.005
