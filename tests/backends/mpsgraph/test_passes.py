"""mpsgraph-legalize and symbolic-safety on lowered Lucid graphs, run through the reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import lucid
import lucid.nn.functional as F
from lucid._tensor import Tensor
from lucid.backends.mpsgraph.backend import MPSGraphReferenceBackend
from lucid.backends.mpsgraph.legalize import MPSGraphUnsupported, legalize, legalize_refusal
from lucid.backends.mpsgraph.reference import MPSGraphAbort
from lucid.backends.mpsgraph.symbolic import SymbolicSafety, SymbolicUnsafe, symbolic_dims
from lucid.ir import import_trace, print_ir
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.passes.registry import get_pass
from lucid.trace import trace

BACKEND = MPSGraphReferenceBackend()


def lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("canonicalize,cse,dce,lower-to-prim,prim-simplify").run(module)
    return module


def test_both_passes_are_registered_by_name():
    assert get_pass("mpsgraph-legalize").name == "mpsgraph-legalize"
    assert get_pass("symbolic-safety") is SymbolicSafety


def test_matmul_accumulate_is_split_into_matmul_mul_add_with_the_same_values():
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal((3, 4), np.float32), rng.standard_normal((3, 5), np.float32)
    a = rng.standard_normal((5, 4), np.float32)
    module = lowered(lambda w, g, a: w - 0.1 * (g @ a), w, g, a)
    assert "prim.matmul_accumulate" in print_ir(module)
    want = interpret_prim(module, [w, g, a])
    PassManager("mpsgraph-legalize").run(module)
    text = print_ir(module)
    assert "matmul_accumulate" not in text and "prim.matmul" in text
    np.testing.assert_allclose(interpret_prim(module, [w, g, a])[0], want[0], rtol=1e-6)
    got = BACKEND.compile(module).run([w, g, a])
    np.testing.assert_allclose(got[0], w - 0.1 * (g @ a), rtol=1e-5, atol=1e-6)


def test_float64_is_refused_with_a_reason_naming_it():
    x = np.ones((2, 3), np.float64)
    module = lowered(lambda x: x * 2.0, x)
    reason = legalize_refusal(module)
    assert reason is not None and "float64" in reason and "argument 0" in reason
    with pytest.raises(MPSGraphUnsupported, match="float64"):
        legalize(module)
    with pytest.raises(MPSGraphUnsupported, match="float64"):
        BACKEND.compile(module)


def test_a_zero_sized_dimension_is_refused():
    module = lowered(lambda x: x + 1.0, np.ones((0, 3), np.float32))
    with pytest.raises(MPSGraphUnsupported, match="zero-sized"):
        legalize(module)


def _mlp(x, w1, w2):
    return F.softmax(F.relu(x @ w1).reshape(x.shape[0], 2, 4).sum(1) @ w2, dim=-1)


def _weights():
    rng = np.random.default_rng(1)
    return rng.standard_normal((5, 8), np.float32), rng.standard_normal((4, 3), np.float32)


def _batch(n, seed=2):
    return np.random.default_rng(seed).standard_normal((n, 5), np.float32)


def test_a_safe_graph_serves_every_batch_size_with_one_program():
    w1, w2 = _weights()
    module, probe = lowered(_mlp, _batch(4), w1, w2), lowered(_mlp, _batch(7), w1, w2)
    safety = SymbolicSafety(probe=probe)
    PassManager("mpsgraph-legalize").run(module)
    PassManager("mpsgraph-legalize").run(probe)
    safety.apply(None, module)
    exe = BACKEND.compile(module, symbolic=safety.dims)
    assert exe.program["placeholders"][0]["shape"] == [-1, 5]
    assert any(-1 in a.get("shape", []) for c in exe.program["calls"] for a in c["args"])
    for n in (1, 4, 9):
        x = _batch(n, seed=n)
        want = _mlp(Tensor._wrap(x), Tensor._wrap(w1), Tensor._wrap(w2)).numpy()
        (got,) = exe.run([x, w1, w2])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_compile_symbolic_serves_every_batch_and_refuses_unsafe_graphs():
    w1, w2 = _weights()
    exe = BACKEND.compile_symbolic(
        lowered(_mlp, _batch(2), w1, w2), lowered(_mlp, _batch(3), w1, w2)
    )
    for n in (2, 5):
        x = _batch(n, seed=n)
        want = _mlp(Tensor._wrap(x), Tensor._wrap(w1), Tensor._wrap(w2)).numpy()
        np.testing.assert_allclose(exe.run([x, w1, w2])[0], want, rtol=2e-5, atol=2e-6)
    with pytest.raises(SymbolicUnsafe, match="prim.constant"):
        BACKEND.compile_symbolic(lowered(_unsafe, _batch(2)), lowered(_unsafe, _batch(3)))


def _unsafe(x):
    return x.sum(1).mean() * lucid.ones_like(x)


@pytest.mark.parametrize(
    "fn, reason",
    [
        (_unsafe, "prim.constant"),
        (lambda x: x * lucid.ones((x.shape[0], 1)), "capture"),
        (lambda x: lucid.concatenate([x, x], 0), "along the batch axis"),
        (lambda x: x[1:], "along the batch axis"),
    ],
)
def test_an_unsafe_graph_is_refused_with_the_op_and_would_abort_mpsgraph(fn, reason):
    module, probe = lowered(fn, _batch(4)), lowered(fn, _batch(7))
    with pytest.raises(SymbolicUnsafe, match=reason):
        symbolic_dims(module, probe)
    if fn is _unsafe:
        # Without the proof, the emitted program materializes a batch-shaped constant: the
        # reference raises what MPSGraph does by aborting the process.
        dims = symbolic_dims(module, probe, prove=False)
        exe = BACKEND.compile(module, symbolic=dims)
        with pytest.raises(MPSGraphAbort, match="symbolic axis"):
            exe.run([_batch(4)])


def test_symbolic_safety_without_a_probe_says_what_it_needs():
    module = lowered(lambda x: x + 1.0, _batch(3))
    with pytest.raises(SymbolicUnsafe, match="second batch size"):
        SymbolicSafety().apply(None, module)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the reason given off macOS")
def test_the_native_backend_says_why_it_is_unavailable_here():
    from lucid.backends.mpsgraph import MPSGraphBackend, MPSGraphUnavailable

    ok, reason = MPSGraphBackend().available()
    assert not ok and reason == "MPSGraph native part not built: not macOS"
    assert MPSGraphReferenceBackend().available() == (True, "")
    module = lowered(lambda x: x + 1.0, _batch(2))
    with pytest.raises(MPSGraphUnavailable, match="not macOS"):
        MPSGraphBackend().compile(module)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the reason given off macOS")
def test_asking_lucid_compile_for_mpsgraph_here_says_why_not():
    import lucid
    import lucid.nn as nn

    # The registry or the backend says why: MPSGraph needs macOS (14+, Apple Silicon).
    with pytest.raises(ValueError, match="macOS"):
        lucid.compile(nn.Linear(2, 2), backend="mpsgraph")(lucid.tensor(np.ones((1, 2), "f4")))


def test_diagnose_reports_what_mpsgraph_refuses_and_why():
    import lucid
    import lucid.nn as nn
    from lucid.compile import diagnose

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    report = diagnose(
        model, lucid.tensor(np.ones((2, 3), np.float32)), backend="mpsgraph-reference"
    )
    columns = [s.stages["mpsgraph-reference"] for s in report.support]
    assert columns and all(c == "yes" for c in columns), columns
    double = nn.Linear(3, 4).double()
    report = diagnose(double, lucid.tensor(np.ones((2, 3))), backend="mpsgraph-reference")
    refused = [s.stages["mpsgraph-reference"] for s in report.support]
    assert any(c.startswith("no: ") and "float64" in c for c in refused), refused
