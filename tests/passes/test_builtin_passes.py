"""canonicalize, cse, dce: each checked by interpreting the module before and after on random
inputs, plus the exact rewrites expected."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid.ir import import_trace, interpret, parse_ir, print_ir
from lucid.passes import PassManager
from lucid.trace import trace


def _feeds(module, rng):
    from lucid.ir import feed_roles, forward_func
    from lucid.ir.types import dtype_of_type, shape_of_type

    fn = forward_func(module)
    feeds = {}
    for role, arg in zip(feed_roles(fn), fn.body.blocks.first.args, strict=True):
        dt = dtype_of_type(arg.type)
        feeds[role] = rng.standard_normal(shape_of_type(arg.type)).astype(dt.numpy)
    return feeds


def _check_same_results(module, pipeline, seed=0):
    """Run ``pipeline`` and assert the module computes what it did before, on random feeds."""
    feeds = _feeds(module, np.random.default_rng(seed))
    before = interpret(module, feeds)
    PassManager(pipeline, verify_each=True).run(module)
    after = interpret(module, feeds)
    for b, a in zip(before, after, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    return print_ir(module)


def _ops(text):
    return [line.split("=", 1)[1].split()[0] for line in text.splitlines() if " = lucid." in line]


def _module(fn, *shapes, dtype=np.float32):
    rng = np.random.default_rng(1)
    return import_trace(
        trace(fn, *(lucid.tensor(rng.standard_normal(s).astype(dtype)) for s in shapes))
    )


def test_identities_disappear():
    m = _module(lambda a: ((a * 1 + 0 - 0) / 1) ** 1 + (1 * a), (3, 4))
    text = _check_same_results(m, "canonicalize")
    assert _ops(text) == ["lucid.add"]
    assert "lucid.add %0, %0" in text


def test_identity_that_changes_dtype_stays():
    # int tensor * 1.0 is a float tensor: dropping the mul would change the dtype
    m = _module(lambda a: a * 1.0, (3,), dtype=np.int64)
    text = _check_same_results(m, "canonicalize")
    assert _ops(text) == ["lucid.constant", "lucid.mul"]


def test_identity_that_broadcasts_stays():
    # x + zeros((2, 3)) broadcasts x: dropping the add would change the shape
    text = """
    func.func @forward(%x: tensor<3xf32>) -> tensor<2x3xf32> {
      %z = lucid.constant dense<0.0> : tensor<2x3xf32> -> tensor<2x3xf32>
      %r = lucid.add %x, %z : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
      func.return %r : tensor<2x3xf32>
    }"""
    out = _check_same_results(parse_ir(text), "canonicalize")
    assert _ops(out) == ["lucid.constant", "lucid.add"]


def test_reshape_chains_and_noop_reshape_collapse():
    m = _module(lambda a: a.reshape(12).reshape(2, 6).reshape(4, 3).reshape(4, 3), (3, 4))
    text = _check_same_results(m, "canonicalize")
    assert _ops(text) == ["lucid.reshape"]
    assert "array<i64: 4, 3>" in text


def test_permute_of_permute_composes_or_cancels():
    m = _module(lambda a: a.permute(1, 2, 0).permute(2, 0, 1), (2, 3, 4))
    assert _ops(_check_same_results(m, "canonicalize")) == []
    m = _module(lambda a: a.permute(1, 2, 0).permute(1, 2, 0), (2, 3, 4))
    text = _check_same_results(m, "canonicalize")
    assert _ops(text) == ["lucid.permute"] and "array<i64: 2, 0, 1>" in text


def test_double_negation_and_noop_casts_and_expand():
    m = _module(lambda a: a.neg().neg().float().expand(3, 4), (3, 4))
    assert _ops(_check_same_results(m, "canonicalize")) == []


def test_cast_round_trip_only_through_an_exact_type():
    exact = _module(lambda a: a.double().float(), (5,))
    assert _ops(_check_same_results(exact, "canonicalize")) == []
    lossy = _module(lambda a: a.half().float(), (5,))
    assert _ops(_check_same_results(lossy, "canonicalize")) == ["lucid.cast", "lucid.cast"]


def test_constant_folding_through_registry_kernels():
    text = """
    func.func @forward(%x: tensor<3xf32>) -> tensor<3xf32> {
      %c = lucid.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32> -> tensor<3xf32>
      %two = lucid.constant 2 : i64 -> tensor<i64>
      %e = lucid.exp %c : (tensor<3xf32>) -> tensor<3xf32>
      %m = lucid.mul %e, %two : (tensor<3xf32>, tensor<i64>) -> tensor<3xf32>
      %r = lucid.add %x, %m : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
      func.return %r : tensor<3xf32>
    }"""
    m = parse_ir(text)
    out = _check_same_results(m, "canonicalize")
    assert _ops(out) == ["lucid.constant", "lucid.add"]
    folded = np.exp(np.array([1, 2, 3], np.float32)) * 2
    got = interpret(m, [np.zeros(3, np.float32)])[0]
    np.testing.assert_allclose(got, folded, rtol=1e-6)


def test_fold_limit_option_keeps_large_results():
    text = """
    func.func @forward() -> tensor<4xf32> {
      %c = lucid.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32> -> tensor<4xf32>
      %e = lucid.exp %c : (tensor<4xf32>) -> tensor<4xf32>
      func.return %e : tensor<4xf32>
    }"""
    m = parse_ir(text)
    assert "lucid.exp" in _check_same_results(m, "canonicalize{fold-limit=3}")
    assert "lucid.exp" not in _check_same_results(m, "canonicalize{fold-limit=4}")


def test_cse_merges_identical_ops_but_not_different_attributes():
    m = _module(lambda a: a.sum(0) + a.sum(0) + a.sum(1).sum(0), (3, 3))
    text = _check_same_results(m, "cse")
    assert _ops(text).count("lucid.sum") == 3  # sum(0) once, sum(1), and its sum(0)


def test_cse_compares_attributes_among_ops_of_the_same_operands_and_keys_constants_by_value():
    # cse keys ops by name and operands and compares the rest only among those: interleaved
    # variants each merge with their own first, and constants (no operands) by their value.
    v, m = "tensor<3xf32>", "tensor<2xf32>"
    results = ", ".join([v] * 4 + [m] * 2)
    text = f"""
    func.func @forward(%a: tensor<3x3xf32>) -> ({results}) {{
      %s0 = lucid.sum %a {{dim = array<i64: 0>, keepdim = false}} : (tensor<3x3xf32>) -> {v}
      %s1 = lucid.sum %a {{dim = array<i64: 1>, keepdim = false}} : (tensor<3x3xf32>) -> {v}
      %t0 = lucid.sum %a {{dim = array<i64: 0>, keepdim = false}} : (tensor<3x3xf32>) -> {v}
      %t1 = lucid.sum %a {{dim = array<i64: 1>, keepdim = false}} : (tensor<3x3xf32>) -> {v}
      %c = lucid.constant dense<[1.0, 2.0]> : {m} -> {m}
      %d = lucid.constant dense<[1.0, 3.0]> : {m} -> {m}
      %e = lucid.constant dense<[1.0, 2.0]> : {m} -> {m}
      %ce = lucid.add %c, %e : ({m}, {m}) -> {m}
      func.return %s0, %s1, %t0, %t1, %ce, %d : {results}
    }}"""
    out = _check_same_results(parse_ir(text), "cse")
    assert _ops(out).count("lucid.sum") == 2
    assert _ops(out).count("lucid.constant") == 2
    assert "func.return %s0, %s1, %s0, %s1" in out.replace("\n", " ")


def test_cse_hashes_the_details_of_ops_sharing_an_operand_once_each(monkeypatch):
    # One value read at 200 offsets: 200 ops of one name and operand that differ only in their
    # attributes. Each one's details are computed once (no comparison with every earlier one:
    # that made cse quadratic in an unrolled LSTM's time steps).
    from lucid.passes import _blocks

    calls = []
    details = _blocks._details
    monkeypatch.setattr(_blocks, "_details", lambda op: calls.append(op) or details(op))
    m = _module(lambda a: sum(a[i] for i in range(200)), (200, 3))
    n = sum(1 for line in print_ir(m).splitlines() if " = lucid." in line)
    _check_same_results(m, "cse")
    assert 200 <= len(calls) <= n + 1, (len(calls), n)


def test_dce_removes_dead_chains_only():
    def f(a):
        dead = (a * 3).exp().sum()  # noqa: F841  (traced, then unused)
        return a + 1

    m = _module(f, (4,))
    assert "lucid.exp" in print_ir(m)
    text = _check_same_results(m, "dce")
    assert _ops(text) == ["lucid.constant", "lucid.add"]


@given(
    ops=st.lists(
        st.sampled_from(["mul1", "add0", "neg2", "exp", "sum_keep", "reshape", "dup"]),
        min_size=1,
        max_size=8,
    )
)
def test_random_programs_keep_their_results_through_the_full_pipeline(ops):
    def f(a):
        for name in ops:
            if name == "mul1":
                a = a * 1
            elif name == "add0":
                a = 0 + a
            elif name == "neg2":
                a = a.neg().neg()
            elif name == "exp":
                a = (a * 0.1).exp()
            elif name == "sum_keep":
                a = a + a.sum(1, keepdim=True)
            elif name == "reshape":
                a = a.reshape(6, 2).reshape(2, 6)
            else:
                a = a * 2 + a * 2
        return a

    m = _module(f, (2, 6))
    _check_same_results(m, "canonicalize,cse,dce")


def test_passes_keep_returned_feeds_and_multiple_results():
    m = _module(lambda a, b: (a, a * 1, b + 0), (2,), (2,))
    text = _check_same_results(m, "canonicalize,cse,dce")
    assert _ops(text) == []
    assert "func.return %0, %0, %1" in text


@pytest.mark.parametrize("pipeline", ["canonicalize", "cse", "dce", "canonicalize,cse,dce"])
def test_symbolic_shapes_survive_the_passes(pipeline):
    from lucid.trace import _tracing

    with _tracing() as tr:
        a = tr.input((None, 3))
        t = tr.finish((a * 1 + 0).exp().sum(1))
    m = import_trace(t)
    PassManager(pipeline, verify_each=True).run(m)
    assert "tensor<?x3xf32>" in print_ir(m)
    arr = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(interpret(m, [arr])[0], np.exp(arr).sum(1), rtol=1e-6)
