"""The native ``attention`` and ``attention_grad`` kernels with ``causal``: against float64 numpy
references (query i attends to keys j <= i, top-left aligned when the lengths differ), dense and
head-view operands, the weights as a second output zero above the diagonal, several query blocks
(both the register-tiled float32 path and the BLAS float64 path), bit-identical at one and two
threads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid.backends.cpu import (
    CPUBackend,
    Program,
    set_num_threads,
)
from lucid.backends.cpu.program import Instr

NUMPY = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": (2e-5, 2e-6), "f64": (1e-12, 1e-13)}


pytestmark = pytest.mark.usefixtures("fixed_threads")


def reference(q, k, v, alpha, d_out=None):
    """(output, weights[, dq, dk, dv]) of causal attention in float64."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * alpha
    s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    if d_out is None:
        return p @ v, p
    d_o = d_out.astype(np.float64)
    dp = d_o @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return (
        p @ v,
        p,
        ds @ k * alpha,
        np.swapaxes(ds, -1, -2) @ q * alpha,
        np.swapaxes(p, -1, -2) @ d_o,
    )


def _run(program: Program, feeds, threads=(1, 2)) -> list[list[np.ndarray]]:
    outs = []
    for n in threads:
        set_num_threads(n)
        outs.append(CPUBackend(cache=False).compile(program).run([f.copy() for f in feeds]))
    return outs


def _close(got, want, dtype, scale=10.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol * scale, atol=atol * scale)


SHAPES = st.tuples(
    st.integers(1, 2),  # batch
    st.integers(1, 3),  # heads
    st.sampled_from([1, 2, 7, 13, 100]),  # query length (over one float32 task of 96 rows)
    st.sampled_from([1, 5, 13, 40]),  # key length
    st.sampled_from([1, 4, 8, 16]),  # head dim
    st.sampled_from([1, 3, 8, 17]),  # value dim
)


@settings(max_examples=30, deadline=None)
@given(
    shape=SHAPES,
    dtype=st.sampled_from(["f32", "f64"]),
    weights=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_forward_equals_float64_reference(shape, dtype, weights, seed):
    b, h, lq, lk, d, dv = shape
    rng = np.random.default_rng(seed)
    arrays = [
        rng.standard_normal(s).astype(NUMPY[dtype])
        for s in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, dv))
    ]
    p = Program()
    slots = [p.feed(a.shape, dtype) for a in arrays]
    out = p.new_slot((b, h, lq, dv), dtype)
    outputs = (out, p.new_slot((b, h, lq, lk), dtype)) if weights else (out,)
    p.instrs.append(Instr("attention", tuple(slots), outputs, {"alpha": 0.3, "causal": True}))
    for s in outputs:
        p.result(s)
    one, two = _run(p, arrays)
    want = reference(*arrays, 0.3)
    for a, c, w in zip(one, two, want, strict=False):
        np.testing.assert_array_equal(a, c)
        _close(a, w, dtype)
    if weights:  # exact zeros above the diagonal: what the gradient reads of the mask
        assert not np.triu(one[1], 1).any()
    for a, w in zip(one, p.interpret([a.copy() for a in arrays]), strict=True):
        _close(a, w, dtype)  # the kernel's own reference (lucid.backends.cpu.reference)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("lq,lk", [(130, 300), (300, 130), (200, 200)])
def test_forward_over_several_query_blocks(dtype, lq, lk):
    rng = np.random.default_rng(lq + lk)
    arrays = [
        rng.standard_normal(s).astype(NUMPY[dtype])
        for s in ((1, 2, lq, 8), (1, 2, lk, 8), (1, 2, lk, 5))
    ]
    p = Program()
    slots = [p.feed(a.shape, dtype) for a in arrays]
    p.result(p.op("attention", *slots, alpha=0.5, causal=True))
    one, two = _run(p, arrays)
    np.testing.assert_array_equal(one[0], two[0])
    _close(one[0], reference(*arrays, 0.5)[0], dtype)


def _head_view_programs(b, h, length, d, dtype):
    """(forward with weights, gradient) over one [B, L, 3E] projection, as fuse-kernels writes
    them for a causal self-attention."""
    e = h * d
    views = {"q_view": [h, d, 0], "k_view": [h, d, e], "v_view": [h, d, 2 * e]}
    fwd = Program()
    qkv = fwd.feed((b, length, 3 * e), dtype)
    out, probs = fwd.new_slot((b, length, e), dtype), fwd.new_slot((b, h, length, length), dtype)
    attrs = {"alpha": 0.3, "causal": True, "out_view": [h, d], **views}
    fwd.instrs.append(Instr("attention", (qkv, qkv, qkv), (out, probs), attrs))
    fwd.result(out)
    fwd.result(probs)
    grad = Program()
    qkv_g, d_out = grad.feed((b, length, 3 * e), dtype), grad.feed((b, length, e), dtype)
    probs_g = grad.feed((b, h, length, length), dtype)
    g = grad.new_slot((b, length, 3 * e), dtype)
    attrs = {"alpha": 0.3, "causal": True, "d_out_view": [h, d, 0], **views}
    attrs.update(grad_cols=[0, e, 2 * e], grad_width=[3 * e])
    grad.instrs.append(Instr("attention_grad", (d_out, qkv_g, qkv_g, qkv_g, probs_g), (g,), attrs))
    grad.result(g)
    return fwd, grad


def _heads(x, h):
    b, length, w = x.shape
    return x.reshape(b, length, h, w // h).transpose(0, 2, 1, 3)


def _merged(x):
    b, h, length, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, length, h * d)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize(
    "b,h,length,d", [(2, 3, 5, 4), (1, 2, 300, 8), (3, 1, 1, 2), (1, 8, 128, 64)]
)
def test_head_view_forward_and_gradient_equal_float64_reference(dtype, b, h, length, d):
    rng = np.random.default_rng(length)
    e = h * d
    qkv = rng.standard_normal((b, length, 3 * e)).astype(NUMPY[dtype])
    d_out = rng.standard_normal((b, length, e)).astype(NUMPY[dtype])
    q, k, v = (_heads(qkv[..., i * e : (i + 1) * e], h) for i in range(3))
    out, p, dq, dk, dv = reference(q, k, v, 0.3, _heads(d_out, h))
    fwd, grad = _head_view_programs(b, h, length, d, dtype)
    one, two = _run(fwd, [qkv])
    np.testing.assert_array_equal(one[0], two[0])
    _close(one[0], _merged(out), dtype)
    _close(one[1], p, dtype)
    g_one, g_two = _run(grad, [qkv, d_out, one[1]])
    np.testing.assert_array_equal(g_one[0], g_two[0])
    want = np.concatenate([_merged(x) for x in (dq, dk, dv)], axis=-1)
    _close(g_one[0], want, dtype, scale=100.0)


@settings(max_examples=25, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(["f32", "f64"]), seed=st.integers(0, 2**16))
def test_dense_gradient_equals_float64_reference_and_the_unmasked_kernel(shape, dtype, seed):
    b, h, lq, lk, d, dv = shape
    rng = np.random.default_rng(seed)
    q, k, v = (
        rng.standard_normal(s).astype(NUMPY[dtype])
        for s in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, dv))
    )
    d_out = rng.standard_normal((b, h, lq, dv)).astype(NUMPY[dtype])
    _, p64, dq, dk, dv_ = reference(q, k, v, 0.7, d_out)
    probs = p64.astype(NUMPY[dtype])
    results = []
    for causal in (True, False):  # the causal kernel skips products whose weights are zero
        prog = Program()
        slots = [prog.feed(a.shape, dtype) for a in (d_out, q, k, v, probs)]
        for s in prog.op_results("attention_grad", *slots, alpha=0.7, causal=causal):
            prog.result(s)
        one, two = _run(prog, [d_out, q, k, v, probs])
        for a, c in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, c)
        results.append(one)
    for got, want in zip(results[0], (dq, dk, dv_), strict=True):
        _close(got, want, dtype, scale=100.0)
    for got, plain in zip(results[0], results[1], strict=True):
        _close(got, plain, dtype, scale=100.0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,length,d", [(2, 3, 5, 4), (1, 2, 70, 24), (1, 8, 128, 64)])
def test_the_avx512_and_avx2_products_give_the_same_bits(causal, b, h, length, d):
    # The register tiles' AVX-512 form (where sgemm_isa() is 2) runs each element's FMAs in the
    # AVX2 tiles' order: forcing AVX2 changes no bit, forward or gradient.
    from lucid import _native

    rng = np.random.default_rng(length)
    e = h * d
    qkv = rng.standard_normal((b, length, 3 * e)).astype(np.float32)
    d_out = rng.standard_normal((b, length, e)).astype(np.float32)
    fwd, grad = _head_view_programs(b, h, length, d, "f32")
    for ins in (*fwd.instrs, *grad.instrs):
        ins.attrs["causal"] = causal
    runs = []
    for isa in ("avx2", "auto"):
        _native.set_sgemm_isa(isa)
        try:
            (out, probs) = _run(fwd, [qkv], (2,))[0]
            (g,) = _run(grad, [qkv, d_out, probs], (2,))[0]
        finally:
            _native.set_sgemm_isa("auto")
        runs.append((out, probs, g))
    for a, c in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, c)
