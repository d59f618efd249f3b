"""Large compute-bound elementwise chains are split across the native thread pool: the results
must not depend on the split, on concurrent runs, or on a fork."""

import multiprocessing
import threading

import numpy as np
import pytest

from lucid.backends.cpu import (
    CPUBackend,
    FusedNode,
    Program,
    get_num_threads,
    set_num_threads,
)

SHAPE = (300, 700)  # above the parallel threshold (2**16 elements)


def _adam_like_program() -> Program:
    p = Program()
    m, v, w, s = p.feed(SHAPE), p.feed(SHAPE), p.feed(SHAPE), p.feed(())
    nodes = [
        FusedNode("sqrt", (1,), "f32"),  # 4
        FusedNode("add", (4, 3), "f32"),  # 5
        FusedNode("div", (0, 5), "f32"),  # 6
        FusedNode("mul", (6, 3), "f32"),  # 7
        FusedNode("sub", (2, 7), "f32"),  # 8
    ]
    p.result(p.fused([m, v, w, s], nodes))
    return p


def _feeds(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    m, w = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    v = rng.random(SHAPE).astype(np.float32)
    return [m, v, w, np.array(1e-3, np.float32)]


pytestmark = pytest.mark.usefixtures("fixed_threads")


@pytest.fixture
def restore_threads():
    n = get_num_threads()
    yield
    set_num_threads(n)


def test_split_chain_equals_one_thread_and_the_interpreter(restore_threads):
    p = _adam_like_program()
    feeds = _feeds()
    ref = p.interpret([f.copy() for f in feeds])[0]
    outs = []
    for n in (1, 2, 3):
        set_num_threads(n)
        outs.append(CPUBackend(cache=False).compile(p).run(feeds)[0])
    for out in outs:
        np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_allclose(outs[0], ref, rtol=1e-6, atol=1e-6)


def test_concurrent_runs_of_split_chains_are_independent(restore_threads):
    set_num_threads(2)
    ex = CPUBackend(cache=False).compile(_adam_like_program())
    inputs = [_feeds(seed) for seed in range(4)]
    expected = [ex.run(f)[0] for f in inputs]
    got: dict[int, list[np.ndarray]] = {}

    def worker(i: int) -> None:
        got[i] = [ex.run(inputs[i])[0] for _ in range(5)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i in range(4):
        for out in got[i]:
            np.testing.assert_array_equal(out, expected[i])


def _child_run(queue) -> None:
    ex = CPUBackend(cache=False).compile(_adam_like_program())
    queue.put(float(ex.run(_feeds())[0].sum()))


def test_a_forked_child_runs_split_chains_without_hanging(restore_threads):
    set_num_threads(2)
    ex = CPUBackend(cache=False).compile(_adam_like_program())
    expected = float(ex.run(_feeds())[0].sum())  # the parent's pool has started its workers
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_run, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0, "the forked child hung or crashed"
    assert queue.get(timeout=5) == pytest.approx(expected)
