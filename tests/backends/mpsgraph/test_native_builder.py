"""The native backend's Python side against a stand-in for ``lucid._native``'s MPSGraph entry
points that keeps their documented contract (docs/backend-mpsgraph-native.md): compile takes the
recorded program, ``run`` returns every target and writes the program's in-place results into
their feeds after a successful run (the backend records none: Python writes back). What this
checks is the Python wiring (who writes back, range checks, the executable's results); Apple's
runtime itself is only checked on a Mac."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from lucid.backends.mpsgraph import backend as B
from lucid.backends.mpsgraph import native as N
from lucid.backends.mpsgraph.program import validate
from lucid.backends.mpsgraph.reference import run_program

_spec = importlib.util.spec_from_file_location(
    "mpsgraph_zoo_fake", pathlib.Path(__file__).with_name("_zoo.py")
)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


class _FakeExecutable:
    def __init__(self, program: dict):
        self.program = program

    def run(self, feeds):
        outs = run_program(self.program, feeds)
        for r, f in self.program["inplace"]:  # the native run's write-back
            np.copyto(feeds[f], outs[r])
        return outs


class _FakeNative:
    def __init__(self):
        self.compiled: list[dict] = []

    def mpsgraph_available(self):
        return True, "stand-in"

    def mpsgraph_compile(self, program, cache):
        validate(program)
        self.compiled.append(program)
        return _FakeExecutable(program)


@pytest.fixture
def fake_native(monkeypatch):
    fake = _FakeNative()
    monkeypatch.setattr(N, "_native_module", lambda: fake)
    monkeypatch.setattr(N, "_on_macos", lambda: True)
    return fake


def test_the_native_backend_compiles_through_lucid_native(fake_native):
    assert B.MPSGraphBackend().available() == (True, "stand-in")
    for train in (False, True):
        eager, got, model, twin = zoo.eager_and_compiled(B.MPSGraphBackend(), "cnn", train)
        np.testing.assert_allclose(got[0], eager[0], rtol=1e-4, atol=1e-5)
        for k, v in zoo.buffers(model).items():
            np.testing.assert_allclose(zoo.buffers(twin)[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert len(fake_native.compiled) == 2
    # Python writes the statistics back (the buffers above match), after the run and the checks:
    # the program's own in-place list stays empty, so the native side never writes a feed.
    assert all(not p["inplace"] for p in fake_native.compiled)


def test_with_range_checks_python_writes_back_after_the_checks(fake_native):
    zoo.check_index_error_and_random_stream(B.MPSGraphBackend())
    assert any(p.get("checks") for p in fake_native.compiled)
    assert all(not p["inplace"] for p in fake_native.compiled if p.get("checks"))
