"""``paused_gc``: the cyclic collector is off while compile stages run, and its state is
restored afterwards (on only if it was on), across nesting and threads; ``collect_young``
collects at the end of the outermost block only."""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass

import pytest

from lucid.ir import _xdsl as x
from lucid.ir._gc import collect_young, paused_gc
from lucid.passes import PassManager


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


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


def test_collect_young_frees_the_cycles_of_the_outermost_block_only():
    gc.enable()
    with paused_gc():
        cycle = weakref.ref(_Cycle())  # garbage only a collection frees
        with paused_gc():
            assert _young_collections(collect_young) == []  # nested: not yet
            assert cycle() is not None
        assert _young_collections(collect_young) == [1]
        assert cycle() is None
    assert gc.isenabled()


def test_collect_young_does_nothing_outside_a_block_or_with_the_collector_off():
    gc.enable()
    assert _young_collections(collect_young) == []
    gc.disable()
    with paused_gc():
        assert _young_collections(collect_young) == []
    assert not gc.isenabled()
