"""prim-simplify: transposes folded into matmul flags, duplicates merged; checked against the prim
interpreter before and after the pass."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid
import lucid.nn.functional as F
from lucid._tensor import Tensor
from lucid.ir import import_trace, parse_ir, print_ir
from lucid.ir.importer import forward_func
from lucid.ir.prim.dialect import make_prim_context, prim_attrs
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassManager, get_pass
from lucid.passes.prim_simplify import PrimSimplify
from lucid.trace import trace


def _lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("lower-to-prim").run(module)
    return module


def _ops(module, name: str) -> list:
    return [op for op in forward_func(module).body.blocks.first.ops if op.name == name]


def _simplified_matches(module, arrays) -> None:
    before = interpret_prim(module, list(arrays))
    PassManager("prim-simplify").run(module)
    module.verify()
    after = interpret_prim(module, list(arrays))
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_pass_is_registered_under_its_name():
    assert get_pass("prim-simplify") is PrimSimplify


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    batch=st.sampled_from([(), (2,), (3, 1)]),
    which=st.sampled_from(["a", "b", "both"]),
    seed=st.integers(0, 2**16),
)
def test_transposed_matmul_operands_become_flags(m, k, n, batch, which, seed):
    rng = np.random.default_rng(seed)
    a_shape = (*batch, k, m) if which in ("a", "both") else (*batch, m, k)
    b_shape = (*batch, n, k) if which in ("b", "both") else (*batch, k, n)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)

    def fn(u, v):
        if which in ("a", "both"):
            u = u.transpose(-1, -2)
        if which in ("b", "both"):
            v = v.transpose(-1, -2)
        return lucid.matmul(u, v)

    module = _lowered(fn, a, b)
    assert _ops(module, "prim.transpose")
    _simplified_matches(module, [a, b])
    assert not _ops(module, "prim.transpose")
    (mm,) = _ops(module, "prim.matmul")
    flags = prim_attrs(mm)
    assert flags["transpose_a"] == (which in ("a", "both"))
    assert flags["transpose_b"] == (which in ("b", "both"))


def test_a_transpose_that_is_not_of_the_last_two_dims_stays():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.ones((2, 4, 2), np.float32)
    module = _lowered(lambda u, v: lucid.matmul(u.permute(1, 0, 2), v[:1]), a, b)
    _simplified_matches(module, [a, b])
    assert _ops(module, "prim.transpose")


def test_a_transpose_with_other_users_is_kept_for_them():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    module = _lowered(lambda u: (lucid.matmul(u.t(), u), u.t() * 2.0), a)
    _simplified_matches(module, [a])
    assert len(_ops(module, "prim.transpose")) == 1
    assert prim_attrs(_ops(module, "prim.matmul")[0])["transpose_a"]


def test_primitives_that_two_lowerings_emit_are_merged():
    logits = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    target = np.array([0, 4, 2, 1])

    def fn(z, t):
        return F.cross_entropy(z, t), F.log_softmax(z, dim=1)

    module = _lowered(fn, logits, target)
    assert len(_ops(module, "prim.log_softmax")) == 2
    _simplified_matches(module, [logits, target])
    assert len(_ops(module, "prim.log_softmax")) == 1


def test_simplified_module_round_trips_through_text():
    a = np.ones((3, 4), np.float32)
    module = _lowered(lambda u: lucid.matmul(u.t(), u), a)
    PassManager("prim-simplify").run(module)
    text = print_ir(module)
    assert print_ir(parse_ir(text, ctx=make_prim_context())) == text


@settings(max_examples=15, deadline=None)
@given(
    op=st.sampled_from(["sub", "add", "radd"]),
    scale_first=st.booleans(),
    transpose_a=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_scaled_gemm_updates_become_matmul_accumulate(op, scale_first, transpose_a, seed):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((4, 3) if transpose_a else (3, 4)).astype(np.float32)
    xs = rng.standard_normal((4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    lr = np.array(0.1, np.float32)

    def fn(g, xs, w, lr):
        prod = lucid.matmul(g.t() if transpose_a else g, xs)
        scaled = lr * prod if scale_first else prod * lr
        if op == "sub":
            return w - scaled
        return w + scaled if op == "add" else scaled + w

    module = _lowered(fn, g, xs, w, lr)
    _simplified_matches(module, [g, xs, w, lr])
    (acc,) = _ops(module, "prim.matmul_accumulate")
    assert prim_attrs(acc)["transpose_a"] == transpose_a
    assert not _ops(module, "prim.matmul") and not _ops(module, "prim.transpose")


def test_a_product_read_elsewhere_is_not_folded():
    rng = np.random.default_rng(0)
    a, b, w = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 5), (3, 5)))
    lr = np.array(0.1, np.float32)

    def fn(a, b, w, lr):
        prod = lucid.matmul(a, b)
        return w - lr * prod, prod.sum()

    module = _lowered(fn, a, b, w, lr)
    _simplified_matches(module, [a, b, w, lr])
    assert not _ops(module, "prim.matmul_accumulate")
