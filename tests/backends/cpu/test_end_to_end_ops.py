"""Every registry op end to end on the CPU backend: trace -> import -> lower-to-prim -> emit ->
native executable, compared with the prim interpreter and with eager.

Skipped when the installed ``lucid._native`` has no CPU runtime (``compile``) yet.
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import lucid
from lucid import _native
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.backends.cpu.emit import EmitError, compile_program, emit_program
from lucid.ir import import_trace
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager
from lucid.passes.lower_to_prim import lower_module
from lucid.trace import trace

_spec = importlib.util.spec_from_file_location(
    "lower_to_prim_samples",
    pathlib.Path(__file__).parents[2] / "passes" / "test_lower_to_prim_ops.py",
)
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

pytestmark = pytest.mark.skipif(
    not hasattr(_native, "compile"), reason="lucid._native has no CPU runtime in this build"
)

CASES = samples.CASES


def _native_run(module, arrays):
    program = emit_program(module)
    executable = compile_program(program, cache=False)
    return executable.run([np.require(a, requirements="C") for a in arrays])


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_op_runs_natively_and_matches_prim_interpreter_and_eager(name, i):
    rng = np.random.default_rng(1000 + i + sum(map(ord, name)))
    operands, attrs = samples.SAMPLES[name][i](rng)
    module, arrays, eager = samples.build(name, operands, attrs)
    lower_module(module)
    reference = interpret_prim(module, arrays)
    got = _native_run(module, arrays)
    assert len(got) == len(eager)
    for k, (g, ref, want) in enumerate(zip(got, reference, eager, strict=True)):
        samples.assert_same(g, ref, f"{name} output {k}: native vs prim interpreter")
        samples.assert_same(g, want, f"{name} output {k}: native vs eager")


def _random_module(name: str, **attrs):
    def fn(state):
        return apply(name, state, **attrs)

    module = import_trace(trace(fn, Tensor._wrap(np.array([7, 3], np.int64))))
    return lower_module(module)


@pytest.mark.parametrize(
    "name,attrs",
    [
        ("uniform", {"shape": (400,), "low": -2.0, "high": 3.0}),
        ("normal", {"shape": (401,), "mean": 1.0, "std": 2.0, "dtype": lucid.float64}),
        ("randint", {"shape": (300,), "low": -3, "high": 4}),
    ],
)
def test_random_draws_are_reproducible_and_follow_the_distribution(name, attrs):
    module = _random_module(name, **attrs)
    state = np.array([12345, 17], np.int64)
    native = _native_run(module, [state])[0]
    again = _native_run(module, [state])[0]
    np.testing.assert_array_equal(native, again)
    np.testing.assert_array_equal(native, interpret_prim(module, [state])[0])
    other = _native_run(module, [np.array([12345, 18], np.int64)])[0]
    assert not np.array_equal(native, other), "a new counter must give new draws"
    if name == "uniform":
        assert native.min() >= -2.0 and native.max() < 3.0
        assert abs(native.mean() - 0.5) < 0.3
    elif name == "normal":
        assert native.dtype == np.float64
        assert abs(native.mean() - 1.0) < 0.4 and abs(native.std() - 2.0) < 0.4
    else:
        assert set(np.unique(native)) == set(range(-3, 4))


def test_randperm_is_a_reproducible_permutation():
    module = _random_module("randperm", n=50)
    state = np.array([3, 4], np.int64)
    perm = _native_run(module, [state])[0]
    assert perm.dtype == np.int64 and sorted(perm) == list(range(50))
    np.testing.assert_array_equal(perm, interpret_prim(module, [state])[0])
    assert not np.array_equal(perm, np.arange(50))
    other = _native_run(module, [np.array([3, 5], np.int64)])[0]
    assert not np.array_equal(perm, other)


def test_dropout_mask_keeps_about_one_minus_p_and_scales():
    def fn(state, x):
        return apply("bernoulli_mask", state, x, p=0.25)

    x = np.ones((50, 40), np.float32)
    module = lower_module(import_trace(trace(fn, Tensor._wrap(np.array([1, 0])), Tensor._wrap(x))))
    mask = _native_run(module, [np.array([99, 5], np.int64), x])[0]
    assert set(np.unique(mask)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((mask > 0).mean() - 0.75) < 0.05


def test_emit_rejects_a_module_that_is_not_lowered():
    module = import_trace(trace(lambda t: t + 1, Tensor._wrap(np.zeros(3, np.float32))))
    with pytest.raises(EmitError, match="not in the prim dialect"):
        emit_program(module)


def test_buffer_update_is_written_back_in_place():
    bn = lucid.nn.BatchNorm1d(3)
    bn.train()
    x = lucid.randn(8, 3)
    module = import_trace(trace(bn, x))
    PassManager("canonicalize,cse,dce,lower-to-prim").run(module)
    program = emit_program(module, inplace_updates=True)
    assert "update:buffer:running_mean" in program.result_roles
    feeds = {
        "input:0": x.numpy().copy(),
        "param:weight": bn.weight.detach().numpy().copy(),
        "param:bias": bn.bias.detach().numpy().copy(),
        "buffer:running_mean": bn.running_mean.numpy().copy(),
        "buffer:running_var": bn.running_var.numpy().copy(),
        "buffer:num_batches_tracked": bn.num_batches_tracked.numpy().copy(),
    }
    ordered = [feeds[r] for r in program.feed_roles]
    reference = interpret_prim(module, ordered)
    out = compile_program(program, cache=False).run(ordered)
    j = program.result_roles.index("update:buffer:running_mean")
    mean_feed = ordered[program.feed_roles.index("buffer:running_mean")]
    assert out[j] is mean_feed, "the update must land in the feed's own array"
    np.testing.assert_allclose(mean_feed, reference[j], rtol=1e-6, atol=1e-6)
    eager_y = bn(x).detach().numpy()
    np.testing.assert_allclose(out[0], eager_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean_feed, bn.running_mean.numpy(), rtol=1e-6, atol=1e-6)
