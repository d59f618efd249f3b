"""Idle scratch arenas are bounded by a process-wide byte budget (issue 15, item 9): cached
executables of growing shapes used to keep one arena each, so resident memory grew by
cache capacity x bytes per batch row with every new shape."""

import os

import numpy as np
import pytest

from lucid import _native


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def mlp(rows: int, hidden: int = 1024, scale: float = 1.0) -> dict:
    """relu(x @ w1 + b) @ w2 * scale: the arena holds the (rows, hidden) activations."""
    slots = [
        ((rows, 64), "f32"),
        ((64, hidden), "f32"),
        ((hidden,), "f32"),
        ((hidden, 16), "f32"),
        ((rows, hidden), "f32"),
        ((rows, hidden), "f32"),
        ((rows, hidden), "f32"),
        ((rows, 16), "f32"),
        ((), "f32"),
        ((rows, 16), "f32"),
    ]
    no_transpose = {"transpose_a": False, "transpose_b": False}
    instrs = [
        ("matmul", [0, 1], [4], no_transpose),
        ("add", [4, 2], [5], {}),
        ("relu", [5], [6], {}),
        ("matmul", [6, 3], [7], no_transpose),
        ("constant", [], [8], {"shape": [], "dtype": "f32", "value": [scale]}),
        ("mul", [7, 8], [9], {}),
    ]
    return {"slots": slots, "instrs": instrs, "feeds": [0, 1, 2, 3], "results": [9]}


def feeds(rows: int, hidden: int = 1024, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    shapes = [(rows, 64), (64, hidden), (hidden,), (hidden, 16)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def reference(fs: list, scale: float) -> np.ndarray:
    x, w1, b, w2 = (f.astype(np.float64) for f in fs)
    return np.maximum(x @ w1 + b, 0) @ w2 * scale


@pytest.fixture
def small_budget():
    stats = _native.cache_stats()
    _native.cache_clear()
    _native.set_arena_budget(2 << 20)
    yield 2 << 20
    _native.set_arena_budget(stats["arena_budget"])
    _native.cache_set_capacity(stats["capacity"])
    _native.cache_clear()


def test_idle_arenas_stay_within_the_budget_and_freed_ones_come_back(small_budget):
    executables = [_native.compile(mlp(128, scale=float(k))) for k in range(8)]
    arena = executables[0].arena_bytes
    assert 4 * arena > small_budget > arena  # a few fit, not all eight
    fs = feeds(128)
    freed_before = _native.cache_stats()["arenas_freed"]
    for ex in executables:
        ex.run(fs)
        stats = _native.cache_stats()
        assert stats["idle_arena_bytes"] <= small_budget
    assert stats["idle_arenas"] < len(executables)
    assert stats["arenas_freed"] - freed_before >= len(executables) - stats["idle_arenas"]
    # The first executables lost their arenas; running them again allocates fresh ones.
    for k, ex in enumerate(executables):
        np.testing.assert_allclose(ex.run(fs)[0], reference(fs, float(k)), rtol=1e-4, atol=1e-3)


def test_the_most_recent_arena_is_kept_even_past_the_budget(small_budget):
    _native.set_arena_budget(0)
    ex = _native.compile(mlp(64))
    fs = feeds(64)
    ex.run(fs)
    stats = _native.cache_stats()
    assert stats["idle_arenas"] == 1 and stats["idle_arena_bytes"] >= ex.arena_bytes
    freed = stats["arenas_freed"]
    for _ in range(3):  # a hot loop reuses its arena instead of reallocating it
        ex.run(fs)
    assert _native.cache_stats()["arenas_freed"] == freed


def test_dropping_an_executable_releases_its_idle_arena(small_budget):
    _native.cache_set_capacity(0)
    ex = _native.compile(mlp(64, scale=3.0))
    ex.run(feeds(64))
    assert _native.cache_stats()["idle_arena_bytes"] >= ex.arena_bytes
    del ex
    assert _native.cache_stats()["idle_arenas"] == 0
    assert _native.cache_stats()["idle_arena_bytes"] == 0


def test_negative_budget_is_refused():
    with pytest.raises(ValueError, match="arena budget"):
        _native.set_arena_budget(-1)


def _growth_over_growing_shapes(compiles: int, warmup: int) -> float:
    weights = feeds(1)[1:]
    rows0 = 256
    for k in range(compiles):
        rows = rows0 + k
        x = np.zeros((rows, 64), np.float32)
        _native.compile(mlp(rows)).run([x, *weights])
        if k == warmup:
            before = _rss_mb()
    return _rss_mb() - before


def test_memory_is_bounded_over_growing_shapes(small_budget):
    # Each new shape's arena is ~4 kB per row larger; with 32 cached executables keeping their
    # arenas, RSS grew ~130 kB per compile (~30 MB here). Bounded: the 2 MB budget plus the
    # largest run's own working set.
    _native.cache_set_capacity(32)
    growth = _growth_over_growing_shapes(300, warmup=60)
    assert growth < 10, f"RSS grew {growth:.1f} MB over 240 compiles"
    stats = _native.cache_stats()
    assert stats["idle_arena_bytes"] <= small_budget or stats["idle_arenas"] == 1


@pytest.mark.slow
def test_memory_is_flat_over_thousands_of_distinct_programs(small_budget):
    _native.cache_set_capacity(32)
    weights = feeds(1)[1:]

    def run(k):
        rows = 256 + (k * 7) % 500  # distinct programs (scale), bounded shapes
        _native.compile(mlp(rows, scale=float(k))).run([np.zeros((rows, 64), np.float32), *weights])

    for k in range(600):
        run(k)
    before = _rss_mb()
    for k in range(600, 3000):
        run(k)
    growth = _rss_mb() - before
    assert growth < 3, f"RSS grew {growth:.1f} MB over 2400 distinct programs"
