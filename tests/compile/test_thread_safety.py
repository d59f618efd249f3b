"""Step objects called from several threads: each call holds the object's lock, so N threads x
M calls end exactly where N*M sequential calls end (the same inputs every call, so the order of
the calls cannot matter; a lost or torn update can)."""

from __future__ import annotations

import threading

import numpy as np

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
from lucid import optim
from lucid.compile import compile_optimizer, compiled_step, fused_step, make_step

THREADS, CALLS = 4, 25


def _model(seed=0):
    lucid.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8))


def _data():
    rng = np.random.default_rng(0)
    x = lucid.tensor(rng.standard_normal((64, 64)).astype(np.float32))
    return x, lucid.tensor(rng.integers(0, 8, 64))


def _hammer(call, n_threads=THREADS, n_calls=CALLS):
    errors = []
    start = threading.Barrier(n_threads)

    def worker():
        start.wait()
        try:
            for _ in range(n_calls):
                call()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _state(model, opt=None):
    out = [v.numpy().copy() for v in model.state_dict().values()]
    if opt is not None:
        for st in opt.state_dict()["state"].values():
            out += [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in st.values()]
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


def _both(make_and_call):
    """The state after THREADS x CALLS concurrent calls and after as many sequential ones."""
    sequential = make_and_call(lambda call: [call() for _ in range(THREADS * CALLS)])
    concurrent = make_and_call(_hammer)
    _assert_same(concurrent, sequential)


def test_fused_step_from_several_threads_equals_sequential_steps():
    x, y = _data()

    def run(drive):
        model = _model()
        opt = optim.Adam(model.parameters(), lr=1e-3)
        step = fused_step(model, F.cross_entropy, opt, backend="cpu")
        drive(lambda: step(x, y))
        return _state(model, opt)

    _both(run)


def test_compile_optimizer_from_several_threads_equals_sequential_steps():
    x, y = _data()

    def run(drive):
        model = _model()
        opt = optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        F.cross_entropy(model(x), y).backward()  # fixed gradients
        compile_optimizer(opt, backend="cpu")
        drive(opt.step)
        return _state(model, opt)

    _both(run)


def test_make_step_and_compiled_step_from_several_threads_equal_sequential_calls():
    x, y = _data()

    def run_make_step(drive):
        model = _model()
        step = make_step(model, F.cross_entropy, backend="cpu")

        def call():
            with lucid.no_grad():
                step(x, y)  # BatchNorm's running statistics advance in place

        drive(call)
        return _state(model)

    _both(run_make_step)

    def run_compiled_step(drive):
        model = _model()
        drive(lambda: compiled_step(model, x, F.cross_entropy, y, backend="cpu"))
        return _state(model) + [p.grad.numpy() for p in model.parameters()]

    _both(run_compiled_step)


def test_a_loaded_fused_step_from_several_threads_equals_sequential_steps(tmp_path):
    from lucid.compile import load_compiled, save_compiled

    x, y = _data()
    model = _model()
    step = fused_step(model, F.cross_entropy, optim.Adam(model.parameters(), lr=1e-3))
    step(x, y)
    path = tmp_path / "step.lucidc"
    assert save_compiled(step, path)

    def run(drive):
        loaded = load_compiled(path)
        drive(lambda: loaded(x, y))
        return [p.numpy().copy() for p in loaded.parameters()]

    _both(run)
