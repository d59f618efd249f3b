"""Lucid's float32 GEMM (native/src/sgemm.cpp): shapes around the 6x16 tile, transposes, row
strides wider than the rows, alpha/beta and each epilogue against a float64 numpy reference;
bit-identical results on one thread and two; gemm() dispatch through compiled programs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program, set_num_threads

pytestmark = [
    pytest.mark.usefixtures("fixed_threads"),
    pytest.mark.skipif(not _native.sgemm_supported(), reason="needs AVX2 + FMA"),
]

ACTIVATIONS = ("none", "relu", "gelu")
_erf = np.vectorize(math.erf)


def _strided(rng, rows: int, cols: int, pad: int) -> np.ndarray:
    """A [rows, cols] float32 view whose rows are cols + pad apart."""
    base = rng.standard_normal((rows, cols + pad)).astype(np.float32)
    return base[:, :cols]


def _reference(a, b, c0, ta, tb, alpha, beta, bias, addend, activation) -> np.ndarray:
    a64 = a.astype(np.float64).T if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    out = alpha * (a64 @ b64)
    if beta != 0.0:
        out = out + beta * c0.astype(np.float64)
    if bias is not None:
        out = out + bias
    if addend is not None:
        out = out + addend
    if activation == "relu":
        out = np.maximum(out, 0.0)
    elif activation == "gelu":
        out = out * 0.5 * (1.0 + _erf(out / math.sqrt(2.0)))
    return out


def _run(a, b, c, **kw) -> np.ndarray:
    _native.sgemm(a, b, c, **kw)
    return c


def _problem(rng, m, n, k, ta, tb, pad, with_bias, with_addend):
    a = _strided(rng, k if ta else m, m if ta else k, pad)
    b = _strided(rng, n if tb else k, k if tb else n, pad)
    c0 = _strided(rng, m, n, pad)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    addend = _strided(rng, m, n, pad) if with_addend else None
    return a, b, c0, bias, addend


def _check(out, ref, k):
    # float32 accumulation of k products of standard normals: error grows like sqrt(k).
    tol = 2e-6 * (math.sqrt(k) + 4) * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)


DIMS = st.one_of(st.integers(1, 40), st.integers(1, 300), st.sampled_from([1, 5, 6, 7, 15, 16, 17]))


@settings(max_examples=60, deadline=None)
@given(
    m=DIMS,
    n=DIMS,
    k=DIMS,
    ta=st.booleans(),
    tb=st.booleans(),
    pad=st.sampled_from([0, 3]),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([0.0, 1.0, 0.25]),
    with_bias=st.booleans(),
    with_addend=st.booleans(),
    activation=st.sampled_from(ACTIVATIONS),
    seed=st.integers(0, 2**16),
)
def test_sgemm_matches_float64(
    m, n, k, ta, tb, pad, alpha, beta, with_bias, with_addend, activation, seed
):
    rng = np.random.default_rng(seed)
    a, b, c0, bias, addend = _problem(rng, m, n, k, ta, tb, pad, with_bias, with_addend)
    c = c0.copy() if pad == 0 else _strided(rng, m, n, pad)
    c[...] = c0
    kw = dict(transpose_a=ta, transpose_b=tb, alpha=alpha, beta=beta, bias=bias, addend=addend)
    out = _run(a, b, c, activation=activation, **kw)
    _check(out, _reference(a, b, c0, ta, tb, alpha, beta, bias, addend, activation), k)


def test_beta_zero_does_not_read_c_and_strided_c_keeps_its_padding():
    rng = np.random.default_rng(1)
    a, b, _, _, _ = _problem(rng, 13, 21, 9, False, True, 0, False, False)
    base = np.full((13, 21 + 5), np.nan, np.float32)
    c = base[:, :21]
    _run(a, b, c, transpose_b=True)
    _check(c, _reference(a, b, None, False, True, 1.0, 0.0, None, None, "none"), 9)
    assert np.isnan(base[:, 21:]).all()  # the padding columns are never written


def test_relu_keeps_nan_and_large_contractions_stay_within_tolerance():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 3000)).astype(np.float32)
    b = rng.standard_normal((3000, 40)).astype(np.float32)
    a[3, 7] = np.nan
    c = _run(a, b, np.zeros((8, 40), np.float32), activation="relu")
    assert np.isnan(c[3]).all() and not np.isnan(np.delete(c, 3, axis=0)).any()
    a[3, 7] = 0.0
    c = _run(a, b, np.zeros((8, 40), np.float32), activation="relu")
    _check(c, _reference(a, b, None, False, False, 1.0, 0.0, None, None, "relu"), 3000)


def test_k_zero_gives_the_epilogue_of_beta_c():
    rng = np.random.default_rng(3)
    a, b = np.zeros((4, 0), np.float32), np.zeros((0, 9), np.float32)
    c0 = rng.standard_normal((4, 9)).astype(np.float32)
    bias = rng.standard_normal(9).astype(np.float32)
    c = _run(a, b, c0.copy(), beta=0.5, bias=bias, activation="relu")
    np.testing.assert_allclose(c, np.maximum(0.5 * c0 + bias, 0), rtol=1e-6)


@pytest.mark.parametrize(
    "m,n,k,ta,tb",
    [
        (64, 256, 784, False, True),
        (1024, 384, 128, False, True),
        (256, 784, 64, True, False),
        (67, 333, 301, True, True),
        (301, 70, 257, False, False),
    ],
)
@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_one_and_two_threads_give_the_same_bits(m, n, k, ta, tb, activation):
    rng = np.random.default_rng(4)
    a, b, c0, bias, addend = _problem(rng, m, n, k, ta, tb, 0, True, True)
    outs = []
    for threads in (1, 2, 1, 2):
        set_num_threads(threads)
        c = c0.copy()
        _run(
            a,
            b,
            c,
            transpose_a=ta,
            transpose_b=tb,
            beta=0.5,
            bias=bias,
            addend=addend,
            activation=activation,
        )
        outs.append(c)
    for c in outs[1:]:
        np.testing.assert_array_equal(c, outs[0])


def test_bad_arguments_raise():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="contraction"):
        _native.sgemm(a, np.zeros((5, 2), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="float32"):
        _native.sgemm(
            a.astype(np.float64), np.zeros((4, 2), np.float32), np.zeros((3, 2), np.float32)
        )
    with pytest.raises(ValueError, match="activation"):
        _native.sgemm(
            a, np.zeros((4, 2), np.float32), np.zeros((3, 2), np.float32), activation="tanh"
        )
    with pytest.raises(ValueError, match="contiguous rows"):
        _native.sgemm(a[:, ::2], np.zeros((2, 2), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="mode"):
        _native.set_sgemm_mode("fastest")


@pytest.fixture
def sgemm_mode():
    before = _native.sgemm_mode()
    yield _native.set_sgemm_mode
    _native.set_sgemm_mode(before)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
def test_programs_give_the_same_values_on_either_kernel(sgemm_mode, ta, tb):
    """A compiled matmul + bias (+ residual) on Lucid's kernel and on the BLAS."""
    rng = np.random.default_rng(5)
    m, k, n = 50, 70, 90
    p = Program()
    a = p.feed((k, m) if ta else (m, k), "f32")
    b = p.feed((n, k) if tb else (k, n), "f32")
    bias, res = p.feed((n,), "f32"), p.feed((m, n), "f32")
    y = p.op("matmul", a, b, transpose_a=ta, transpose_b=tb)
    p.result(p.op("add", p.op("add", y, bias), res))
    feeds = [rng.standard_normal(p.slots[s].shape).astype(np.float32) for s in p.feeds]
    results = {}
    for mode in ("lucid", "blas"):
        sgemm_mode(mode)
        assert _native.sgemm_chosen(ta, tb, m, n, k) == (mode == "lucid")
        (results[mode],) = CPUBackend(cache=False).compile(p).run(feeds)
    ref = _reference(feeds[0], feeds[1], None, ta, tb, 1.0, 0.0, feeds[2], feeds[3], "none")
    for out in results.values():
        _check(out, ref, k)


def test_the_shape_rule_keeps_slivers_narrower_than_a_tile_and_tiny_products_on_the_blas(
    sgemm_mode,
):
    sgemm_mode("auto")
    assert _native.sgemm_chosen(False, True, 64, 256, 784)  # workload A's first layer
    assert _native.sgemm_chosen(False, True, 1024, 384, 128)  # D's QKV projection
    assert not _native.sgemm_chosen(False, True, 64, 10, 256)  # narrower than 16 columns
    assert not _native.sgemm_chosen(True, False, 5, 256, 784)  # fewer than 6 rows
    assert not _native.sgemm_chosen(False, False, 32, 32, 32)  # under 2^18 multiply-adds


# -- gemm + relu / gemm + gelu folded into one gemm (rewrites.gemm.fold_gemm_activation) ------


def _linear_act_program(m, k, n, ta, tb, bias, residual, activation, dtype):
    p = Program()
    x = p.feed((k, m) if ta else (m, k), dtype)
    w = p.feed((n, k) if tb else (k, n), dtype)
    y = p.op("matmul", x, w, transpose_a=ta, transpose_b=tb)
    if bias:
        y = p.op("add", y, p.feed((n,), dtype))
    if residual:
        y = p.op("add", p.feed((m, n), dtype), y)
    # GELU as lowering emits it: the composite prim op
    p.result(p.op(activation, y))
    return p


def _fold_feeds(p: Program, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(p.slots[s].shape).astype(p.slots[s].dtype.replace("f", "float"))
        for s in p.feeds
    ]


# The fixture only restores the mode after the test; each example sets its own.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 90),
    n=st.integers(1, 70),
    ta=st.booleans(),
    tb=st.booleans(),
    bias=st.booleans(),
    residual=st.booleans(),
    activation=st.sampled_from(["relu", "gelu"]),
    dtype=st.sampled_from(["f32", "f32", "f64"]),
    mode=st.sampled_from(["auto", "lucid", "blas"]),
    seed=st.integers(0, 2**16),
)
def test_gemm_activation_folds_into_one_gemm_matching_the_prim_graph(
    sgemm_mode, m, k, n, ta, tb, bias, residual, activation, dtype, mode, seed
):
    from lucid.backends.cpu.rewrites import fuse_kernels

    sgemm_mode(mode)
    p = _linear_act_program(m, k, n, ta, tb, bias, residual, activation, dtype)
    fused = fuse_kernels(p)
    assert [(i.op, i.attrs.get("activation")) for i in fused.instrs] == [("gemm", activation)]
    feeds = _fold_feeds(p, seed)
    (got,) = CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds])
    tol = 2e-6 * (math.sqrt(k) + 4) if dtype == "f32" else 1e-12
    for reference in (p.interpret(feeds), fused.interpret(feeds)):
        (want,) = reference
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def test_activation_stays_apart_when_the_product_is_read_elsewhere():
    from lucid.backends.cpu.rewrites import fuse_kernels

    p = Program()
    x, w, b = p.feed((8, 20)), p.feed((30, 20)), p.feed((30,))
    y = p.op("add", p.op("matmul", x, w, transpose_a=False, transpose_b=True), b)
    p.result(p.op("relu", y), y)  # the pre-activation is a result too (a backward would read it)
    ops = [(i.op, i.attrs.get("activation")) for i in fuse_kernels(p).instrs]
    assert ops == [("gemm", None), ("relu", None)]


def test_fused_activation_gives_the_same_bits_on_one_and_two_threads():
    p = _linear_act_program(256, 300, 200, False, True, True, True, "gelu", "f32")
    feeds = _fold_feeds(p, 7)
    ex = CPUBackend(cache=False).compile(p)
    outs = []
    for threads in (1, 2, 1, 2):
        set_num_threads(threads)
        outs.append(ex.run([f.copy() for f in feeds])[0])
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


class _MLP:
    """Linear -> activation -> Linear, as workloads A and D's feed-forward write it."""

    @staticmethod
    def make(activation: str):
        import lucid
        import lucid.nn as nn

        lucid.manual_seed(0)
        act = nn.ReLU() if activation == "relu" else nn.GELU()
        return nn.Sequential(nn.Linear(40, 48), act, nn.Linear(48, 24))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_compiled_mlp_uses_the_fused_gemm_and_matches_eager(activation):
    import lucid

    model = _MLP.make(activation).eval()
    x = lucid.randn(32, 40)
    cm = lucid.compile(model)
    with lucid.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    rows = cm.profile(x, repeats=1)
    assert [r["op"] for r in rows].count(activation) == 0
    assert any(r["op"] == "gemm" and f"activation=s'{activation}'" in r["instr"] for r in rows)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_training_through_the_activation_matches_eager(activation, sgd_training_matches_eager):
    """Gradients are unaffected: the backward reads the pre-activation, so the training step
    keeps it, and its updates match eager training."""
    import lucid

    def loss_of(out):
        return (out * out).mean()

    compiled, eager = _MLP.make(activation), _MLP.make(activation)
    sgd_training_matches_eager(compiled, eager, loss_of, lucid.randn(16, 40))


@pytest.mark.parametrize("ta,tb", [(True, False), (False, False), (False, True)])
def test_weight_gradient_accumulation_runs_on_either_kernel(sgemm_mode, ta, tb):
    """matmul_accumulate (out = c + alpha op(a) op(b), an SGD weight update) goes through gemm()."""
    m, k, n = 70, 130, 50
    p = Program()
    a = p.feed((k, m) if ta else (m, k))
    b = p.feed((n, k) if tb else (k, n))
    c, alpha = p.feed((m, n)), p.feed(())
    p.result(p.op("matmul_accumulate", a, b, c, alpha, transpose_a=ta, transpose_b=tb))
    feeds = _fold_feeds(p, 8)
    feeds[3] = np.array(-0.25, np.float32)
    ref = feeds[2] + _reference(feeds[0], feeds[1], None, ta, tb, -0.25, 0.0, None, None, "none")
    for mode in ("lucid", "blas"):
        sgemm_mode(mode)
        (out,) = CPUBackend(cache=False).compile(p).run([f.copy() for f in feeds])
        _check(out, ref, k)
