"""``paused_gc``: the cyclic collector is off while compile stages run, and its state is
restored afterwards (on only if it was on), across nesting and threads; ``promote_young``
moves the young generations to the oldest, unscanned, at the end of the outermost block only."""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass

import pytest

from lucid.ir import _xdsl as x
from lucid.ir._gc import paused_gc, promote_young
from lucid.passes import PassManager


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.fixture
def unfrozen():
    """No frozen objects during the test (tests/conftest.py freezes what collection loaded, and
    ``promote_young`` treats frozen objects as the user's); frozen again after it."""
    gc.unfreeze()
    yield
    gc.freeze()


def test_off_inside_nested_blocks_and_back_on_after():
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()


def test_back_on_after_an_exception():
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("a stage failed")
    assert gc.isenabled()


def test_overlapping_blocks_on_two_threads_restore_once_both_end():
    gc.enable()
    entered, release = threading.Event(), threading.Event()

    def other():
        with paused_gc():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with paused_gc():
        t.start()
        entered.wait(10)
    assert not gc.isenabled()  # the other thread's stage is still running
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_the_pass_manager_runs_passes_with_the_collector_paused():
    seen = []

    @dataclass(frozen=True)
    class Probe(x.ModulePass):
        name = "probe"

        def apply(self, ctx, op) -> None:
            seen.append(gc.isenabled())

    gc.enable()
    PassManager([Probe()]).run(x.ModuleOp([]))
    assert seen == [False] and gc.isenabled()


class _Cycle:
    def __init__(self):
        self.me = self


def _young_collections(fn) -> list[int]:
    seen: list[int] = []

    def note(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        fn()
    finally:
        gc.callbacks.remove(note)
    return seen


def _generation_of(obj) -> int | None:
    for generation in range(3):
        if any(o is obj for o in gc.get_objects(generation)):
            return generation
    return None


def test_promote_young_moves_the_outermost_blocks_objects_to_the_oldest_generation_unscanned(
    unfrozen,
):
    gc.enable()
    with paused_gc():
        kept = _Cycle()
        assert _generation_of(kept) == 0
        with paused_gc():
            assert _young_collections(promote_young) == []  # nested: not yet
            assert _generation_of(kept) == 0
        assert _young_collections(promote_young) == []  # no collection: nothing is scanned
        assert _generation_of(kept) == 2
        assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_promote_young_keeps_the_users_frozen_objects_frozen_and_collects_instead(unfrozen):
    gc.enable()
    gc.freeze()  # the user's own (a pre-fork server's, say)
    frozen = gc.get_freeze_count()
    with paused_gc():
        cycle = weakref.ref(_Cycle())  # garbage only a collection frees
        assert _young_collections(promote_young) == [1]
        assert cycle() is None
    assert gc.get_freeze_count() == frozen


def test_promote_young_does_nothing_outside_a_block_or_with_the_collector_off(unfrozen):
    gc.enable()
    kept = _Cycle()
    assert _young_collections(promote_young) == []
    assert _generation_of(kept) == 0
    gc.disable()
    with paused_gc():
        assert _young_collections(promote_young) == []
        assert _generation_of(kept) == 0
    assert not gc.isenabled()
