"""Bounded caches and stable keys (issue 15, items 9 and 10): a ``CompiledModule`` keeps at most
``LUCID_COMPILE_MAX_CACHE`` entries (least recently used evicted, visible in ``cache_info()``),
resident memory stays bounded over many shapes, and tuple/list/dict-of-tensor and NaN arguments
hit one entry instead of a new one per call."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn as nn
from lucid.compile import fused_step, make_step


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_entries_are_an_lru_of_the_configured_cap(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_MAX_CACHE", "3")
    model = nn.Linear(4, 2)
    cm = lucid.compile(model)
    with lucid.no_grad():
        for n in (1, 2, 3, 1, 4):  # 1 is used again, so 2 is the least recently used
            cm(lucid.ones(n, 4))
        info = cm.cache_info()
        assert info["max_entries"] == 3 and info["entries"] == 3 and info["evictions"] == 1
        batches = sorted(k[0][0][0][0] for k in info["keys"])
        assert batches == [1, 3, 4]
        # every counted key is cached or eager-only
        assert set(info["n_calls"]) <= set(info["keys"]) | set(info["eager_only"])
        x = lucid.randn(2, 4)
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_training_steps_are_bounded(monkeypatch):
    import lucid.nn.functional as F
    from lucid import optim

    monkeypatch.setenv("LUCID_COMPILE_MAX_CACHE", "2")
    model = nn.Linear(4, 3)
    step = make_step(model, F.mse_loss)
    fstep = fused_step(model, F.mse_loss, optim.SGD(model.parameters(), lr=0.01))
    for n in (1, 2, 3):
        step(lucid.ones(n, 4), lucid.zeros(n, 3))
        fstep(lucid.ones(n, 4), lucid.zeros(n, 3))
    for s in (step, fstep):
        assert s.cache_info()["entries"] == 2 and s.cache_info()["max_entries"] == 2


def _memory_run(n_shapes: int, warmup: int) -> float:
    # Each entry's executable holds a scratch arena of ~0.6 MB (the (256+n, 256) activations).
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    cm = lucid.compile(model)
    with lucid.no_grad():
        for n in range(1, warmup + 1):
            cm(lucid.zeros(256 + n, 64))
        before = _rss_mb()
        for n in range(warmup + 1, n_shapes + 1):
            cm(lucid.zeros(256 + n, 64))
        after = _rss_mb()
    info = cm.cache_info()
    assert info["entries"] <= info["max_entries"]
    return after - before


def test_memory_stays_bounded_over_many_shapes(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_MAX_CACHE", "4")
    from lucid.backends.cpu import cache_info as native_cache_info
    from lucid.ir import types
    from lucid.ir.prim import dialect as prim

    growth = _memory_run(160, warmup=40)
    # Unbounded, each compile kept ~600 kB (120 compiles: ~70 MB); bounded, ~10 kB.
    assert growth < 15, f"RSS grew {growth:.1f} MB over 120 compiles"
    assert len(types._TYPE_CACHE) <= types._TYPE_CACHE_LIMIT
    assert len(prim._TYPE_CACHE) <= prim._TYPE_CACHE_LIMIT
    native = native_cache_info()
    assert native["size"] <= native["capacity"]


@pytest.mark.slow
def test_memory_stays_bounded_over_thousands_of_shapes(monkeypatch):
    monkeypatch.setenv("LUCID_COMPILE_MAX_CACHE", "8")
    growth = _memory_run(2500, warmup=300)
    assert growth < 30, f"RSS grew {growth:.1f} MB over 2200 compiles"


Pair = collections.namedtuple("Pair", "a b")


@pytest.mark.parametrize(
    "make",
    [
        lambda a, b: (a, b),
        lambda a, b: [a, b],
        lambda a, b: {"a": a, "b": b},
        lambda a, b: Pair(a, b),
        lambda a, b: (a, [b, 2.0]),
    ],
    ids=["tuple", "list", "dict", "namedtuple", "nested"],
)
def test_containers_of_tensors_are_keyed_by_signature(make):
    def f(pair, scale):
        items = list(pair.values()) if isinstance(pair, dict) else list(pair)
        b = items[1][0] if isinstance(items[1], list) else items[1]
        return items[0] * scale + b

    cf = lucid.compile(f)
    rng = np.random.default_rng(0)
    with lucid.no_grad():
        for _ in range(6):
            a = lucid.tensor(rng.standard_normal(3).astype(np.float32))
            b = lucid.tensor(rng.standard_normal(3).astype(np.float32))
            arg = make(a, b)
            np.testing.assert_allclose(cf(arg, 3.0).numpy(), f(arg, 3.0).numpy(), rtol=1e-6)
    info = cf.cache_info()
    assert info["entries"] == 1 and not info["eager_only"], info


def test_container_shapes_are_part_of_the_key():
    cf = lucid.compile(lambda t: t[0] + t[1])
    with lucid.no_grad():
        cf((lucid.ones(2), lucid.ones(2)))
        out = cf((lucid.ones(3), lucid.ones(3)))
    assert out.shape == (3,) and cf.cache_info()["entries"] == 2


def test_nan_scalars_share_one_entry():
    def f(x, fill):
        return x + fill

    cf = lucid.compile(f)
    x = lucid.ones(3)
    with lucid.no_grad():
        for _ in range(6):
            out = cf(x, float("nan"))
            assert np.isnan(out.numpy()).all()
        np.testing.assert_array_equal(cf(x, 1.0).numpy(), np.full(3, 2.0))
    assert cf.cache_info()["entries"] == 2


_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
_structures = st.recursive(
    _shapes,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from("abc"), inner, min_size=1, max_size=3),
    ),
    max_leaves=5,
)


def _build(structure, rng):
    if isinstance(structure, tuple) and all(isinstance(d, int) for d in structure):
        return lucid.tensor(rng.standard_normal(structure).astype(np.float32))
    if isinstance(structure, dict):
        return {k: _build(v, rng) for k, v in structure.items()}
    return type(structure)(_build(e, rng) for e in structure)


def _total(arg):
    if isinstance(arg, lucid.Tensor):
        return (arg * 2.0).sum()
    items = arg.values() if isinstance(arg, dict) else arg
    out = lucid.zeros(())
    for e in items:
        out = out + _total(e)
    return out


@given(structure=_structures, seed=st.integers(0, 2**16))
@settings(max_examples=15)
def test_random_containers_hit_one_entry_and_match_eager(structure, seed):
    rng = np.random.default_rng(seed)
    cf = lucid.compile(_total)
    with lucid.no_grad():
        for _ in range(3):
            arg = _build(structure, rng)
            np.testing.assert_allclose(cf(arg).numpy(), _total(arg).numpy(), rtol=1e-5, atol=1e-5)
    assert cf.cache_info()["entries"] == 1
