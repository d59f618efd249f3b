"""What would break on the first run on a Mac (issue 24), caught on Linux through the recorded
program and the reference builder, which models Apple where Apple's documentation or PyTorch's
MPS backend contradicts a guess. Each test names its item; the Mac half of each item is in
test_macos_native.py."""

from __future__ import annotations

import numpy as np
import pytest

import lucid
from lucid._tensor import Tensor
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.backends.mpsgraph.program import ProgramError, RecordingBuilder
from lucid.ir import import_trace
from lucid.ir.prim_interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.trace import trace

BACKEND = MPSGraphReferenceBackend()


def lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("canonicalize,cse,dce,lower-to-prim,prim-simplify").run(module)
    return module


def compiled_and_interpreted(fn, *arrays):
    """(the program, the executable's results, the prim interpreter's results)."""
    want = interpret_prim(lowered(fn, *arrays), list(arrays))
    exe = BACKEND.compile(lowered(fn, *arrays))
    return exe.program, exe.run(list(arrays)), want


# --- 1. duplicate targets -----------------------------------------------------------------------
def test_1_a_tensor_returned_twice_is_one_target():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def dup(x):
        y = x * 2.0
        return y, y

    program, got, want = compiled_and_interpreted(dup, x)
    assert len(program["targets"]) == len(set(program["targets"])) == 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[0] is not None and got[1].shape == (2, 3)


def test_1_a_checked_index_that_is_also_a_result_is_one_target():
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    idx = np.array([4, 0, 2], np.int64)

    def lookup(t, i):
        j = i + 0  # a computed index: the checked values are a call's result, not a feed
        return t[j], j

    program, got, want = compiled_and_interpreted(lookup, table, idx)
    assert len(program["targets"]) == len(set(program["targets"]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_1_the_program_format_refuses_a_target_named_twice():
    b = RecordingBuilder()
    x = b.placeholder((2,), "f32", "input:0")
    (y,) = b.call("absoluteWithTensor:name:", [{"tensor": x}, {"nil": True}])
    with pytest.raises(ProgramError, match="name a tensor twice"):
        b.program([y, y], [])


# --- 10. rank-0 shapes --------------------------------------------------------------------------
def _shape_args(program):
    for p in program["placeholders"]:
        yield p["shape"]
    for c in program["calls"]:
        for a in c["args"]:
            if "shape" in a and c["selector"].startswith(("constant", "reshape", "broadcast")):
                yield a["shape"]
            if "constant" in a:
                yield a["constant"]["shape"]


def test_10_rank0_feeds_results_and_constants_are_shape_1_in_the_program():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array(1.5, np.float32)

    def loss(x, s):
        return (x * x).sum() * s, s * 2.0

    program, got, want = compiled_and_interpreted(loss, x, s)
    assert all(len(shape) > 0 for shape in _shape_args(program)), "an @[] shape was emitted"
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape == ()
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_10_a_rank0_index_and_a_rank0_one_hot_keep_their_prim_shapes():
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    i = np.array(3, np.int64)

    def pick(t, i):
        return t[i], lucid.nn.functional.one_hot(i, 5)

    program, got, want = compiled_and_interpreted(pick, table, i)
    assert all(len(shape) > 0 for shape in _shape_args(program))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


# --- 11. unused placeholders --------------------------------------------------------------------
def test_11_a_passed_through_feed_gets_no_placeholder():
    x, z = np.float32([1, 2, 3]), np.float32([4, 5, 6])

    def passthrough(x, z):
        return x, z + 1.0

    program, got, want = compiled_and_interpreted(passthrough, x, z)
    assert [p["role"] for p in program["placeholders"]] == ["input:1"]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert not np.shares_memory(got[0], x), "a returned feed is a copy, as a result would be"


def test_11_a_program_of_feeds_only_compiles_nothing():
    x = np.float32([1, 2])
    exe = BACKEND.compile(lowered(lambda x: x, x))
    assert exe.program["targets"] == [] and exe.program["placeholders"] == []
    (got,) = exe.run([x])
    np.testing.assert_array_equal(got, x)
