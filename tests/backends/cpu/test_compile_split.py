"""``last_compile_split``: the CPU backend's own time split of a compile (emit, fuse-kernels,
fuse-elementwise, native-compile), per thread, adding up to the ``backend-compile`` stage."""

from __future__ import annotations

import threading

import numpy as np

import lucid
from lucid.backends.cpu import last_compile_split

STEPS = {"emit", "fuse-kernels", "fuse-elementwise", "native-compile"}


def test_the_split_covers_the_backend_compile_stage():
    f = lucid.compile(lambda x: (x * 2.0).tanh().sum(), backend="cpu")
    f(lucid.tensor(np.ones((3, 5), np.float32)))
    split = last_compile_split()
    assert set(split) == STEPS and all(ms >= 0 for ms in split.values())
    (row,) = f.timing()
    assert sum(split.values()) <= row["passes_ms"]["backend-compile"] + 1e-6


def test_each_thread_sees_its_own_last_compile():
    seen = []
    t = threading.Thread(target=lambda: seen.append(last_compile_split()))
    t.start()
    t.join(10)
    assert seen == [{}]  # that thread compiled nothing
