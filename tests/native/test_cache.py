"""The process-wide executable cache, concurrent runs, and run-to-run determinism."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program


def scaled_program(scale: float):
    """relu(x @ w + b) * scale: programs differing only in an attribute."""
    p = Program()
    x, w, b = p.feed((8, 16)), p.feed((16, 16)), p.feed((16,))
    k = p.op("constant", shape=(), dtype="f32", value=[scale])
    y = p.op("mul", p.op("relu", p.op("add", p.op("matmul", x, w), b)), k)
    p.result(y)
    return p


@pytest.fixture
def fresh_cache():
    before = _native.cache_stats()["capacity"]
    _native.cache_clear()
    yield
    _native.cache_set_capacity(before)
    _native.cache_clear()


def test_equal_programs_hit_and_different_attributes_miss(fresh_cache):
    backend = CPUBackend()
    first = backend.compile(scaled_program(2.0))
    again = backend.compile(scaled_program(2.0))
    other = backend.compile(scaled_program(3.0))
    assert not first.cache_hit and again.cache_hit and not other.cache_hit
    assert first.hash == again.hash != other.hash
    stats = _native.cache_stats()
    assert (stats["size"], stats["hits"], stats["misses"]) == (2, 1, 2)


def test_shapes_and_dtypes_are_part_of_the_key(fresh_cache):
    def program(shape, dtype):
        p = Program()
        p.result(p.op("exp", p.feed(shape, dtype)))
        return p

    hashes = {
        CPUBackend().compile(program(s, d)).hash
        for s, d in [((2,), "f32"), ((3,), "f32"), ((2,), "f64"), ((2, 1), "f32")]
    }
    assert len(hashes) == 4
    assert _native.cache_stats()["misses"] == 4


def test_eviction_at_the_cap_and_recompile_after_eviction(fresh_cache):
    _native.cache_set_capacity(3)
    backend = CPUBackend()
    for scale in (1.0, 2.0, 3.0):
        backend.compile(scaled_program(scale))
    assert backend.compile(scaled_program(1.0)).cache_hit  # 1.0 becomes most recent
    backend.compile(scaled_program(4.0))  # evicts the least recent: 2.0
    stats = _native.cache_stats()
    assert stats["size"] == 3 and stats["evictions"] == 1
    assert backend.compile(scaled_program(1.0)).cache_hit
    recompiled = backend.compile(scaled_program(2.0))
    assert not recompiled.cache_hit
    x, w, b = (np.ones(s, np.float32) for s in ((8, 16), (16, 16), (16,)))
    np.testing.assert_allclose(recompiled.run([x, w, b])[0], np.full((8, 16), 34.0))
    _native.cache_set_capacity(1)
    assert _native.cache_stats()["size"] == 1


def test_capacity_zero_disables_caching(fresh_cache):
    _native.cache_set_capacity(0)
    CPUBackend().compile(scaled_program(1.0))
    assert not CPUBackend().compile(scaled_program(1.0)).cache_hit
    assert _native.cache_stats()["size"] == 0
    with pytest.raises(ValueError):
        _native.cache_set_capacity(-1)


@pytest.mark.slow  # starts Python processes: CI runs it after the main suite
@pytest.mark.parametrize(("env", "expected"), [(None, 32), ("5", 5)])
def test_capacity_comes_from_the_environment(env, expected):
    environ = {k: v for k, v in os.environ.items() if k != "LUCID_COMPILE_MAX_CACHE"}
    if env is not None:
        environ["LUCID_COMPILE_MAX_CACHE"] = env
    script = "from lucid import _native; print(_native.cache_stats()['capacity'])"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == expected


def test_eight_threads_share_one_executable(fresh_cache):
    ex = CPUBackend().compile(scaled_program(0.5))
    rng = np.random.default_rng(0)
    feeds = [
        [rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 16), (16,))]
        for _ in range(8)
    ]
    expected = [np.maximum(x @ w + b, 0) * 0.5 for x, w, b in feeds]
    errors = []

    def worker(i):
        try:
            for _ in range(200):
                (out,) = ex.run(feeds[i])
                np.testing.assert_allclose(out, expected[i], rtol=1e-5, atol=1e-5)
                # compiling an equal program concurrently must hit the same entry
                assert CPUBackend().compile(scaled_program(0.5)).hash == ex.hash
        except Exception as e:  # noqa: BLE001  (reported in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _native.cache_stats()["size"] == 1


def test_runs_are_bit_identical():
    rng = np.random.default_rng(3)
    p = Program()
    x, w = p.feed((32, 64)), p.feed((16, 64))
    state = p.feed((2,), "i64")
    h = p.op("matmul", x, w, transpose_b=True)
    s = p.op("softmax", p.op("tanh", h), axis=-1)
    noise = p.op("random_normal", state, shape=(32, 16))
    p.result(p.op("reduce_sum", p.op("add", s, noise), axes=[0]), s)
    ex = CPUBackend().compile(p)
    feeds = [
        rng.standard_normal((32, 64)).astype(np.float32),
        rng.standard_normal((16, 64)).astype(np.float32),
        np.array([5, 9], np.int64),
    ]
    first = ex.run(feeds)
    for _ in range(3):
        for a, b in zip(first, ex.run(feeds), strict=True):
            assert a.tobytes() == b.tobytes()
