"""A whole compile, tracing included, runs with the cyclic collector paused and ends by moving
what it keeps to the oldest generation unscanned, timed as the stage ``gc`` (``lucid.ir._gc``):
no collection falls in the middle of a compile, where a full one would cost time growing with
the whole heap. When the process has frozen objects (tests/conftest.py freezes what collection
loaded) the compile ends with one collection of the young generations instead."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import lucid
import lucid.nn as nn


@pytest.fixture(autouse=True)
def _restore_gc(monkeypatch):
    monkeypatch.delenv("LUCID_COMPILE_DISK_CACHE", raising=False)  # a hit compiles nothing
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


class _Probe(nn.Module):
    """A small MLP whose forward notes whether the collector is on while it is traced."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.seen: list[bool] = []

    def forward(self, x):
        self.seen.append(gc.isenabled())
        return self.fc2(self.fc1(x).tanh())


def _x():
    return lucid.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))


def _infer(model):
    cm = lucid.compile(model, backend="cpu")
    with lucid.no_grad():
        cm(_x())
    return cm


def _grad_call(model):
    cm = lucid.compile(model, backend="cpu")
    cm(_x()).sum().backward()
    return cm


def _fused(model):
    opt = lucid.optim.Adam(model.parameters(), lr=1e-3)
    step = lucid.compile.fused_step(model, lambda y: (y * y).mean(), opt, backend="cpu")
    step(_x())
    return step


@pytest.mark.parametrize("compile_and_call", [_infer, _grad_call, _fused])
def test_a_compile_traces_with_the_collector_paused_and_collects_once_at_its_end(
    compile_and_call,
):
    gc.enable()
    collections: list[tuple[int, bool]] = []

    def note(phase, info):
        if phase == "start":
            collections.append((info["generation"], gc.isenabled()))

    model = _Probe()
    gc.callbacks.append(note)
    try:
        compiled = compile_and_call(model)
    finally:
        gc.callbacks.remove(note)
    assert gc.isenabled()
    assert model.seen == [False]  # traced once, inside the pause
    # A collection while paused is the compile's own: one, of the young generations only.
    assert [generation for generation, enabled in collections if not enabled] == [1]
    assert compiled.timing()[0]["passes_ms"]["gc"] >= 0


@pytest.mark.parametrize("compile_and_call", [_infer, _fused])
def test_without_frozen_objects_a_compile_runs_no_collection_and_promotes_what_it_keeps(
    compile_and_call,
):
    gc.unfreeze()  # as in a user's process
    try:
        gc.enable()
        paused: list[int] = []  # collections while the compile's pause runs

        def note(phase, info):
            if phase == "start" and not gc.isenabled():
                paused.append(info["generation"])

        gc.callbacks.append(note)
        try:
            model = _Probe()
            compiled = compile_and_call(model)
        finally:
            gc.callbacks.pop()
        assert paused == []
        assert any(o is model.fc1 for o in gc.get_objects(2))  # young when the compile began
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        assert compiled.timing()[0]["passes_ms"]["gc"] >= 0
    finally:
        gc.freeze()


def test_a_collector_the_user_turned_off_is_never_run_by_a_compile():
    gc.disable()
    collections: list[int] = []
    gc.callbacks.append(lambda phase, info: collections.append(info["generation"]))
    try:
        compiled = _fused(_Probe())
    finally:
        gc.callbacks.pop()
    assert collections == [] and not gc.isenabled()
    assert "gc" not in compiled.timing()[0]["passes_ms"]


class _Chain(nn.Module):
    """``pairs`` of (``x * c``, ``tanh``): a program that grows with ``pairs``."""

    def __init__(self, pairs: int):
        super().__init__()
        self.w = nn.Parameter(lucid.ones(8))
        self.pairs = pairs

    def forward(self, x):
        x = x * self.w
        for _ in range(self.pairs):
            x = (x * 1.01).tanh()
        return x


def _freed_by_the_end_collection(compile_and_call, pairs: int) -> int:
    """What the collection that ends the compile freed (objects found unreachable)."""
    gc.enable()
    gc.collect()  # garbage of earlier tests is not this compile's
    freed: list[int] = []

    def note(phase, info):
        if phase == "stop" and not gc.isenabled():  # the compile's own collection
            freed.append(info["collected"])

    gc.callbacks.append(note)
    try:
        compile_and_call(_Chain(pairs))
    finally:
        gc.callbacks.remove(note)
    assert len(freed) == 1
    return freed[0]


@pytest.mark.parametrize("compile_and_call", [_infer, _grad_call, _fused])
def test_what_a_compile_drops_dies_by_reference_counting_not_by_its_end_collection(
    compile_and_call,
):
    # Erased ops and a lowered module nothing reads are made acyclic (lucid.ir._gc.release_ir),
    # so the end collection finds almost nothing to free, however large the program: before,
    # it freed about 11 objects per op of the chain (op, results, uses, operand tuples).
    small, big = (_freed_by_the_end_collection(compile_and_call, n) for n in (50, 400))
    ops = 2 * 400
    assert big < ops / 4, f"{big} objects freed by the end collection for about {ops} ops"
    assert big <= small + 64  # the same handful at any size, not a share of the program
