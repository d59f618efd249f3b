"""The IR type caches are bounded (issue 22, item 9): compiling many distinct shapes keeps the
types of the most recent ones only, and a type in use stays cached while one-off shapes pass."""

from __future__ import annotations

import gc
import tracemalloc

import lucid
from lucid.ir import types
from lucid.ir.prim import dialect as prim


def _one_off_shapes(n: int, start: int) -> None:
    for i in range(start, start + n):
        types.aval_of_type(types.tensor_type((i, 3), lucid.float32))
        prim.prim_type((i, 3), "f32")


def test_the_memory_the_type_caches_keep_is_bounded():
    _one_off_shapes(10, 10**6)  # first-use allocations (interned attributes) out of the way
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _one_off_shapes(3000, 0)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(types._TYPE_CACHE) <= types._TYPE_CACHE_LIMIT
    assert len(prim._TYPE_CACHE) <= prim._TYPE_CACHE_LIMIT
    # Unbounded (or clear-when-1024-full) the caches kept ~1.2 kB per shape: 1.4 MB here.
    assert kept < 0.5e6, f"the type caches kept {kept / 1e6:.2f} MB after 3000 shapes"


def test_a_type_in_use_stays_cached_while_one_off_shapes_pass():
    hot = types.tensor_type((5, 5), lucid.float32)
    hot_prim = prim.prim_type((5, 5), "f32")
    for start in range(0, 3000, 50):
        _one_off_shapes(50, 2 * 10**6 + start)
        assert types.tensor_type((5, 5), lucid.float32) is hot
        assert prim.prim_type((5, 5), "f32") is hot_prim
    assert types.aval_of_type(hot) == types.aval_of_type(types.tensor_type((5, 5), lucid.float32))


def test_bounded_cache_evicts_the_least_recently_used():
    cache = types.BoundedCache(2)
    cache.get("a", lambda: 1)
    cache.get("b", lambda: 2)
    cache.get("a", lambda: 0)  # a used again: b is now the oldest
    cache.get("c", lambda: 3)
    assert len(cache) == 2
    assert cache.get("a", lambda: -1) == 1 and cache.get("b", lambda: -2) == -2


def test_equal_attributes_are_shared_and_read_back_unchanged():
    for value in [3, -(2**63), 2**63 - 1, (1, 2, 3), (), (0,), (-1, 2**40)]:
        a = types.attr_to_ir(value)
        assert types.attr_to_ir(value) is a and types.attr_from_ir(a) == value
    # prim's int kinds share the lucid dialect's attributes; a bool stays a bool.
    assert prim.attr_to_prim("ints", [4, 5]) is types.attr_to_ir((4, 5))
    assert prim.attr_to_prim("int", 7) is types.attr_to_ir(7)
    assert prim.attr_from_prim("ints", prim.attr_to_prim("ints", (4, 5))) == (4, 5)
    assert types.attr_from_ir(types.attr_to_ir(True)) is True
    assert types.attr_from_ir(types.attr_to_ir(1)) == 1 and types.attr_to_ir(1) is not (
        types.attr_to_ir(True)
    )
    assert types.attr_from_ir(types.attr_to_ir((None, 1.5))) == (None, 1.5)


def test_the_attribute_cache_is_bounded():
    for i in range(3 * types._ATTR_CACHE_LIMIT):
        types.attr_to_ir((i, i + 1))
    assert len(types._ATTR_CACHE) <= types._ATTR_CACHE_LIMIT
