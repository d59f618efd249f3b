"""``SignatureCache``, the one cache loop of every compiled wrapper: LRU eviction order,
eager-only signatures, call counting, the recompile log and the rebuild-once rule."""

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
from lucid import nn
from lucid.compile.cache import RecompileLog, SignatureCache
from lucid.compile.errors import FeedMismatch


class Entry:
    def __init__(self, name, n_hits=0):
        self.name = name
        self.n_hits = n_hits
        self.last_used = 0


def test_the_least_recently_used_entry_is_evicted_first():
    cache = SignatureCache(2)
    cache.put("a", Entry("a"))
    cache.put("b", Entry("b"))
    assert cache.get("a").name == "a"  # a is now more recent than b
    cache.put("c", Entry("c"))
    assert list(cache.entries) == ["a", "c"]
    assert cache.info()["evictions"] == 1
    cache.put("d", Entry("d"))
    assert sorted(cache.entries) == ["c", "d"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pg"), st.integers(0, 5)), max_size=40))
def test_eviction_follows_a_reference_lru(ops):
    cap = 3
    cache = SignatureCache(cap)
    order: list[int] = []  # least recent first
    for op, k in ops:
        if op == "p":
            cache.put(k, Entry(k))
            if k in order:
                order.remove(k)
            order.append(k)
            if len(order) > cap:
                order.pop(0)
        else:
            hit = cache.get(k)
            assert (hit is not None) == (k in order)
            if hit is not None:
                order.remove(k)
                order.append(k)
        assert sorted(cache.entries) == sorted(order)


def test_an_evicted_signature_stops_being_counted():
    cache = SignatureCache(1)
    cache.count("a")
    cache.put("a", Entry("a", n_hits=2))
    assert cache.call_counts() == {"a": 3}
    cache.count("b")
    cache.put("b", Entry("b"))
    assert cache.call_counts() == {"b": 1}


def test_eager_only_drops_the_entry_and_keeps_its_calls_and_reason():
    cache = SignatureCache(4)
    cache.count("a")
    cache.put("a", Entry("a", n_hits=4))
    cache.mark_eager("a", "parity check failed: output 0")
    assert cache.get("a") is None
    assert cache.eager_reason("a") == "parity check failed: output 0"
    assert cache.eager_reason("b") is None
    assert cache.call_counts() == {"a": 5}
    info = cache.info()
    assert info["eager_only"] == ("a",) and info["entries"] == 0
    assert info["reasons"] == {"a": "parity check failed: output 0"}


def test_move_calls_follows_a_changed_key():
    cache = SignatureCache(4)
    cache.count("old")
    cache.count("old")
    cache.move_calls("old", "new")
    assert cache.call_counts() == {"new": 2}


def test_rebuild_once_rebuilds_one_time_and_runs_the_new_entry():
    cache = SignatureCache(4)
    stale = Entry("stale")
    cache.put("k", stale)
    rebuilt = []

    def run(key, entry):
        if entry is stale:
            raise FeedMismatch("feed 0 has dtype float64")
        return f"{key}:{entry.name}"

    def rebuild():
        rebuilt.append(1)
        fresh = Entry("fresh")
        cache.put("k2", fresh)
        return "k2", fresh

    key, entry, out = cache.rebuild_once("k", stale, run, rebuild, (FeedMismatch,))
    assert (key, entry.name, out) == ("k2", "fresh", "k2:fresh")
    assert rebuilt == [1] and "k" not in cache.entries


def test_rebuild_once_does_not_loop_when_the_new_entry_fails_too():
    cache = SignatureCache(4)
    calls = []

    def run(key, entry):
        calls.append(key)
        raise FeedMismatch("still wrong")

    with pytest.raises(FeedMismatch, match="still wrong"):
        cache.rebuild_once("k", Entry("a"), run, lambda: ("k2", Entry("b")), (FeedMismatch,))
    assert calls == ["k", "k2"]


def test_rebuild_once_lets_other_errors_through_without_rebuilding():
    cache = SignatureCache(4)

    def run(key, entry):
        raise KeyError("the model's own error")

    def rebuild():
        raise AssertionError("must not rebuild")

    with pytest.raises(KeyError):
        cache.rebuild_once("k", Entry("a"), run, rebuild, (FeedMismatch,))


def test_clear_keeps_the_recompile_log_and_the_entry_table_object(caplog):
    caplog.set_level(logging.INFO, logger="lucid.compile")
    log = RecompileLog("step: ", differ=lambda old, new: [])
    cache = SignatureCache(4, recompiles=log)
    table = cache.entries
    cache.note_compile("a")
    cache.put("a", Entry("a"))
    cache.note_compile("b")
    assert len(cache.info()["recompiles"]) == 1
    assert any(m.startswith("lucid.compile: step: recompiling for 'b'") for m in caplog.messages)
    cache.clear()
    assert cache.entries is table and not table
    assert len(cache.info()["recompiles"]) == 1 and log.n_compiled == 2


def test_every_wrapper_serves_calls_through_a_signature_cache(tmp_path):
    lucid.manual_seed(0)
    model = nn.Linear(3, 2)
    x = lucid.randn(4, 3)
    cm = lucid.compile(model)
    with lucid.no_grad():
        cm(x)
    step = lucid.compile.make_step(model, lambda out: out.sum())
    step(x)
    fused = lucid.compile.fused_step(
        model, lambda out: out.sum(), lucid.optim.SGD(model.parameters(), lr=0.1)
    )
    fused(x)
    path = tmp_path / "m.lucid"
    lucid.compile.save_compiled(cm, str(path))
    loaded = lucid.compile.load_compiled(str(path))
    for wrapper in (cm, step, fused, loaded):
        assert isinstance(wrapper._cache, SignatureCache)
        info = wrapper.cache_info()
        assert info["entries"] == 1 and info["evictions"] == 0 and info["eager_only"] == ()
