"""The CPU backend compiles with the cyclic collector paused (``lucid.ir._gc``); the collection
that follows the pause walks every object allocated during it that is still alive. The emitted
program dies right after the native build, so it must already be freed when the pause ends, or
that collection walks the whole program (every instruction, attribute dict and slot) for
nothing on every compile."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import lucid
from lucid.backends.cpu import backend as cpu_backend
from lucid.ir._gc import paused_gc


def test_the_emitted_program_is_freed_before_the_collector_resumes(monkeypatch):
    programs: list[weakref.ref] = []
    alive_when_resumed: list[list[bool]] = []
    fused = cpu_backend.CPUBackend._fused

    def recording_fused(self, program):
        out = fused(self, program)
        programs.append(weakref.ref(out))
        return out

    @contextmanager
    def recording_pause() -> Iterator[None]:
        with paused_gc():
            yield
        alive_when_resumed.append([ref() is not None for ref in programs])

    monkeypatch.setattr(cpu_backend.CPUBackend, "_fused", recording_fused)
    monkeypatch.setattr(cpu_backend, "paused_gc", recording_pause)
    f = lucid.compile(lambda x: ((x * 2.0).tanh() + x).sum(dim=1), backend="cpu")
    x = np.linspace(-1.0, 1.0, 15, dtype=np.float32).reshape(3, 5)
    out = f(lucid.tensor(x))
    np.testing.assert_allclose(out.numpy(), (np.tanh(x * 2.0) + x).sum(axis=1), rtol=1e-5)
    assert alive_when_resumed == [[False]]
