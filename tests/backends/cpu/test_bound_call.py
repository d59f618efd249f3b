"""``CPUBackend.bound_call`` (the native ``BoundCall``): a whole cache hit of ``lucid.compile`` in
one C++ call. Its results must be the tensors ``Tensor._wrap`` makes and its feed checks those of
``Executable.run``."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid._native_loader import _native
from lucid._tensor import Tensor
from lucid.backends.cpu import CPUBackend
from lucid.backends.cpu.program import Program

SLOTS = [s for s in Tensor.__slots__ if s not in ("__dict__", "__weakref__")]


def relu_affine(n: int = 4, k: int = 3) -> Program:
    """relu(x @ w + b) for x (n, k), w (k, 5), b (5,)."""
    p = Program()
    x, w, b = p.feed((n, k)), p.feed((k, 5)), p.feed((5,))
    y = p.op("matmul", x, w)
    p.result(p.op("relu", p.op("add", y, p.op("broadcast_to", b, shape=(n, 5)))))
    return p


def arrays(seed: int = 0, n: int = 4, k: int = 3):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n, k)).astype(np.float32),
        rng.standard_normal((k, 5)).astype(np.float32),
        rng.standard_normal(5).astype(np.float32),
    )


def reference(x, w, b):
    return np.maximum(x @ w + b, 0)


@pytest.fixture
def exe():
    return CPUBackend().compile(relu_affine())


def test_results_are_tensors_like_wrap_and_match_numpy(exe):
    xa, wa, ba = arrays()
    x, w, b = Tensor._wrap(xa), Tensor._wrap(wa), Tensor._wrap(ba)
    call = CPUBackend().bound_call(exe, [0], [w, b], single=True)
    out = call((x,), {})
    like = Tensor._wrap(np.zeros(1, np.float32))
    assert type(out) is Tensor
    for name in SLOTS:
        if name == "_data":
            continue
        assert getattr(out, name) == getattr(like, name), name
        assert type(getattr(out, name)) is type(getattr(like, name)), name
    np.testing.assert_allclose(out._data, reference(xa, wa, ba), rtol=1e-6, atol=1e-6)
    again = call((x,), {})
    assert again._version is not out._version  # a counter of its own per tensor
    assert again._data is not out._data
    # The tensors work as eager ones do (ops, autograd).
    again.requires_grad_(True)
    (again * 2).sum().backward()
    np.testing.assert_array_equal(again.grad.numpy(), np.full((4, 5), 2, np.float32))
    assert out._version == [0] and out.grad is None


def test_bound_tensors_are_read_each_call(exe):
    xa, wa, ba = arrays()
    x, w, b = Tensor._wrap(xa), Tensor._wrap(wa), Tensor._wrap(ba)
    call = CPUBackend().bound_call(exe, [0], [w, b], single=True)
    call((x,), None)
    w._data = wa * 3  # a new array in the bound tensor (load_state_dict(assign) does this)
    b._data[:] = 1.0  # and an in-place write
    np.testing.assert_allclose(
        call((x,), None)._data, reference(xa, wa * 3, np.ones(5, np.float32)), rtol=1e-6
    )


def test_positions_pick_the_arguments(exe):
    xa, wa, ba = arrays()
    w, b = Tensor._wrap(wa), Tensor._wrap(ba)
    call = CPUBackend().bound_call(exe, [2], [w, b], single=False)
    outs = call(("ignored", 3, Tensor._wrap(xa)), {})
    assert isinstance(outs, list) and len(outs) == 1
    np.testing.assert_allclose(outs[0]._data, reference(xa, wa, ba), rtol=1e-6)
    with pytest.raises(TypeError, match="position 2"):
        call((Tensor._wrap(xa),), {})


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (np.zeros((4, 4), np.float32), ValueError, "feed 0 has shape"),
        (np.zeros((4, 3), np.float64), TypeError, "feed 0 has dtype"),
        (np.zeros((3, 4), np.float32).T, ValueError, "C-contiguous"),
        (np.zeros((4, 3), np.dtype(">f4")), ValueError, "byte order"),
        (None, TypeError, "must be a numpy array"),
    ],
)
def test_feed_checks_are_runs(exe, bad, error, message):
    _, wa, ba = arrays()
    call = CPUBackend().bound_call(exe, [0], [Tensor._wrap(wa), Tensor._wrap(ba)], single=True)
    with pytest.raises(error, match=message):
        call((Tensor._wrap(bad),), {})
    with pytest.raises(error, match=message):
        exe.run([bad, wa, ba])


def test_construction_is_checked(exe):
    _, wa, ba = arrays()
    w, b = Tensor._wrap(wa), Tensor._wrap(ba)
    template = Tensor._wrap(None)
    with pytest.raises(ValueError, match="1 inputs and 1 bound tensors for 3 feed"):
        _native.BoundCall(exe, [0], [w], template, True)
    with pytest.raises(ValueError, match="negative"):
        _native.BoundCall(exe, [-1], [w, b], template, True)
    spoiled = Tensor._wrap(None)
    spoiled._grad = {}
    with pytest.raises(ValueError, match="mutable dict"):
        _native.BoundCall(exe, [0], [w, b], spoiled, True)
    extra = Tensor._wrap(None)
    extra.note = 1  # an instance attribute outside the slots
    with pytest.raises(ValueError, match="outside the slots"):
        _native.BoundCall(exe, [0], [w, b], extra, True)
    assert CPUBackend().bound_call(object(), [0], [w, b], single=True) is None


def test_programs_updating_a_feed_get_none():
    p = Program()
    x = p.feed((3,))
    p.result(p.op("add", x, x))
    p.inplace_result(0, 0)
    exe = CPUBackend().compile(p)
    assert CPUBackend().bound_call(exe, [0], [], single=True) is None


def test_last_run_ms_is_measured_and_settable(exe):
    xa, wa, ba = arrays()
    call = CPUBackend().bound_call(exe, [0], [Tensor._wrap(wa), Tensor._wrap(ba)], single=True)
    assert call.last_run_ms == 0.0
    call((Tensor._wrap(xa),), {})
    assert call.last_run_ms > 0.0
    call.last_run_ms = 5.0
    assert call.last_run_ms == 5.0


def test_run_accepts_any_sequence_of_feeds(exe):
    xa, wa, ba = arrays()
    want = reference(xa, wa, ba)
    for feeds in ([xa, wa, ba], (xa, wa, ba), iter_seq(xa, wa, ba)):
        np.testing.assert_allclose(exe.run(feeds)[0], want, rtol=1e-6)
    with pytest.raises(ValueError, match="expected 3 feed"):
        exe.run([xa, wa])


class iter_seq:  # noqa: N801  - a sequence that is neither a list nor a tuple
    def __init__(self, *items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_a_compiled_model_serves_hits_with_it():
    model = lucid.nn.Linear(3, 5)
    cm = lucid.compile(model)
    x = lucid.randn(4, 3)
    with lucid.no_grad():
        cm(x)
        (entry,) = cm._entries.values()
        assert isinstance(entry.direct, _native.BoundCall)
        assert entry.hit is entry.direct
