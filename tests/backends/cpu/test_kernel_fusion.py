"""fuse-kernels (GEMM bias, residual and scale epilogues, single-pass layer norm, sums of pads as
concatenations) and reshapes as views:
native results against the prim interpreter on the unfused program."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucid import _native
from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.rewrites import fuse_kernels
from lucid.backends.cpu.testing import decomposed


def _feeds(p: Program, rng, scale: float = 1.0) -> list[np.ndarray]:
    out = []
    for s in p.feeds:
        a = p.slots[s]
        dt = a.dtype.replace("f", "float")
        out.append(np.asarray(rng.standard_normal(a.shape) * scale, dtype=dt))
    return out


def _native_vs_reference(p: Program, feeds, rtol=2e-5, atol=2e-5):
    ex = CPUBackend(cache=False).compile(p)
    got = ex.run([f.copy() for f in feeds])
    want = p.interpret([f.copy() for f in feeds])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return ex


def _ops(p: Program) -> list[str]:
    return [i.op for i in fuse_kernels(p).instrs]


def _matmul_shapes(batch, m, n, k, ta, tb, b_batched):
    a = (*batch, k, m) if ta else (*batch, m, k)
    b = (n, k) if tb else (k, n)
    return a, ((*batch, *b) if b_batched else b)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.lists(st.integers(1, 3), max_size=2),
    m=st.integers(1, 9),
    n=st.integers(1, 9),
    k=st.integers(0, 9),
    ta=st.booleans(),
    tb=st.booleans(),
    b_batched=st.booleans(),
    bias_first=st.booleans(),
    scale=st.sampled_from([None, 0.125, -3.0]),
    residual=st.booleans(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_gemm_epilogues_match_matmul_then_scale_then_bias(
    batch, m, n, k, ta, tb, b_batched, bias_first, scale, residual, dtype, seed
):
    a_shape, b_shape = _matmul_shapes(batch, m, n, k, ta, tb, b_batched)
    p = Program()
    a, b, bias = p.feed(a_shape, dtype), p.feed(b_shape, dtype), p.feed((n,), dtype)
    y = p.op("matmul", a, b, transpose_a=ta, transpose_b=tb)
    if scale is not None:
        c = p.op("constant", shape=(), dtype=dtype, value=(scale,))
        y = p.op("mul", c, y) if bias_first else p.op("mul", y, c)
    y = p.op("add", bias, y) if bias_first else p.op("add", y, bias)
    if residual:
        r = p.feed(p.slots[y].shape, dtype)
        y = p.op("add", r, y) if bias_first else p.op("add", y, r)
    p.result(p.op("tanh", y))
    assert _ops(p)[-2:] == ["gemm", "tanh"] and "matmul" not in _ops(p)
    _native_vs_reference(p, _feeds(p, np.random.default_rng(seed)))


def test_batched_small_gemms_with_scale_split_across_the_pool_match():
    # attention's per-head products: 64 GEMMs of 16x16x8, split across the worker pool.
    p = Program()
    q, k = p.feed((8, 8, 16, 8)), p.feed((8, 8, 16, 8))
    s = p.op("matmul", q, k, transpose_b=True)
    p.result(p.op("mul", s, p.op("constant", shape=(), dtype="f32", value=(0.35,))))
    assert _ops(p) == ["gemm"]  # the scale is the gemm's alpha; its constant, read no more, goes
    _native_vs_reference(p, _feeds(p, np.random.default_rng(0)))


def test_epilogues_stay_apart_when_the_product_is_used_elsewhere():
    p = Program()
    a, b, bias = p.feed((4, 3)), p.feed((3, 5)), p.feed((5,))
    y = p.op("matmul", a, b)
    p.result(p.op("add", y, bias), y)  # the product itself is a result
    assert _ops(p) == ["matmul", "add"]
    p2 = Program()
    a, b, bias = p2.feed((4, 3)), p2.feed((3, 5)), p2.feed((4, 1))
    p2.result(p2.op("add", p2.op("matmul", a, b), bias))  # a column: stays an add
    assert _ops(p2) == ["matmul", "add"]
    p3 = Program()
    a, b, s = p3.feed((4, 3)), p3.feed((3, 5)), p3.feed(())
    p3.result(p3.op("mul", p3.op("matmul", a, b), s))  # a scale fed at run time: stays a mul
    assert _ops(p3) == ["matmul", "mul"]
    for prog in (p, p2, p3):
        _native_vs_reference(prog, _feeds(prog, np.random.default_rng(1)))


def _layer_norm_program(shape, dtype="f32", eps=1e-5):
    """Layer norm over the last axis as lowering emits it: the composite prim op."""
    p = Program()
    x, g, b = p.feed(shape, dtype), p.feed(shape[-1:], dtype), p.feed(shape[-1:], dtype)
    p.result(p.op("layer_norm", x, g, b, epsilon=eps))
    return p


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 7), min_size=0, max_size=3).flatmap(
        lambda lead: st.integers(1, 300).map(lambda d: (*lead, d))
    ),
    offset=st.sampled_from([0.0, 1e3]),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_kernel_equals_its_decomposition(shape, offset, dtype, seed):
    p = _layer_norm_program(shape, dtype)
    assert _ops(p) == ["layer_norm"]
    feeds = _feeds(p, np.random.default_rng(seed))
    feeds[0] += feeds[0].dtype.type(offset)
    tol = 1e-3 if offset else 2e-5  # float32 rounding of x - mean at |x| ~ 1e3
    ex = _native_vs_reference(p, feeds, rtol=tol, atol=tol)
    (got,) = ex.run([f.copy() for f in feeds])
    np.testing.assert_allclose(got, decomposed(p, feeds)[0], rtol=tol, atol=tol)


def test_layer_norm_of_constant_rows_is_beta_and_large_inputs_split_rows():
    p = _layer_norm_program((300, 256))  # above the size split across the worker pool
    rng = np.random.default_rng(3)
    feeds = _feeds(p, rng)
    feeds[0][:5] = 7.0  # zero variance: (x - mean) = 0 exactly
    ex = _native_vs_reference(p, feeds)
    out = ex.run(feeds)[0]
    np.testing.assert_array_equal(out[:5], np.broadcast_to(feeds[2], (5, 256)))


def _desc(instrs, slots, feeds, results):
    return {"slots": slots, "instrs": instrs, "feeds": feeds, "results": results, "inplace": {}}


@pytest.mark.parametrize(
    "instr, slots, message",
    [
        (
            ("gemm", [0, 1, 2], [3], {"transpose_a": False, "transpose_b": False, "alpha": 1.0}),
            [((2, 3), "f32"), ((3, 4), "f32"), ((3,), "f32"), ((2, 4), "f32")],
            "extra operand 2 has shape",
        ),
        (
            ("gemm", [0, 1], [2], {"transpose_a": False, "transpose_b": False, "alpha": 1.0}),
            [((2, 3), "i64"), ((3, 4), "i64"), ((2, 4), "i64")],
            "float",
        ),
        (
            ("gemm", [0, 1], [2], {"transpose_a": False, "transpose_b": False}),
            [((2, 3), "f32"), ((3, 4), "f32"), ((2, 4), "f32")],
            "alpha",
        ),
        (
            ("gemm", [0], [1], {"transpose_a": False, "transpose_b": False, "alpha": 1.0}),
            [((2, 3), "f32"), ((2, 4), "f32")],
            "2 to 4 operands",
        ),
        (
            ("gemm", [0, 1, 2, 3], [4], {"transpose_a": False, "transpose_b": False, "alpha": 1.0}),
            [((2, 3), "f32"), ((3, 4), "f32"), ((2, 4), "f32"), ((4,), "f32"), ((2, 4), "f32")],
            "extra operand 3",
        ),
        (
            ("layer_norm", [0, 1, 2], [3], {"epsilon": 1e-5}),
            [((2, 3), "f32"), ((2,), "f32"), ((3,), "f32"), ((2, 3), "f32")],
            "weight and bias",
        ),
        (
            ("layer_norm", [0, 1, 2], [3], {"epsilon": 1e-5}),
            [((), "f32"), ((1,), "f32"), ((1,), "f32"), ((), "f32")],
            "rank >= 1",
        ),
    ],
)
def test_validator_refuses_malformed_cpu_kernels(instr, slots, message):
    n_in = len(instr[1])
    desc = _desc([instr], slots, list(range(n_in)), instr[2])
    with pytest.raises(ValueError, match=message):
        _native.validate(desc)


# -- reshapes as views -------------------------------------------------------------------------


def test_reshapes_of_scratch_values_share_their_buffer_and_run_no_step():
    p = Program()
    x = p.feed((6, 8))
    t = p.op("tanh", x)
    v = p.op("reshape", p.op("reshape", t, shape=(2, 3, 8)), shape=(48,))
    # tanh(t) dies here while its views live on: the elementwise op must not take its buffer.
    u = p.op("exp", t)
    w = p.op("add", p.op("reshape", u, shape=(48,)), v)
    p.result(w, p.op("reshape", v, shape=(8, 6)))
    ex = CPUBackend(fuse=False, cache=False).compile(p)
    offsets = ex.arena_offsets
    reshapes = [i for i in p.instrs if i.op == "reshape"]
    assert offsets[reshapes[1].outputs[0]] == offsets[t]
    # No step for the three reshapes of scratch values; the one that is a result is copied.
    steps = [row[1] for row in ex.profile(_feeds(p, np.random.default_rng(0)), 1)]
    assert steps.count("reshape") == 1
    _native_vs_reference(p, _feeds(p, np.random.default_rng(0)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(3, 14))
def test_random_programs_with_reshape_views_match_the_interpreter(seed, n):
    # Random chains of elementwise ops and reshapes of earlier values (some read again much
    # later), unfused, so buffers are reused and taken over around the views.
    rng = np.random.default_rng(seed)
    p = Program()
    values = [p.feed((4, 6))]
    for _ in range(n):
        src = values[int(rng.integers(len(values)))]
        r = rng.random()
        if r < 0.4:
            shape = [(24,), (2, 12), (6, 4), (4, 6), (3, 2, 4)][int(rng.integers(5))]
            values.append(p.op("reshape", src, shape=shape))
        elif r < 0.7:
            values.append(p.op(["tanh", "neg", "square"][int(rng.integers(3))], src))
        else:
            other = values[int(rng.integers(len(values)))]
            flat = p.op("reshape", other, shape=p.slots[src].shape)
            values.append(p.op("add", src, flat))
    p.result(values[-1], values[len(values) // 2])
    ex = CPUBackend(fuse=False, cache=False).compile(p)
    feeds = _feeds(p, rng)
    for g, w in zip(ex.run(feeds), p.interpret(feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- sums of zero pads as concatenations -------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    axis=st.integers(0, 2),
    zeros=st.integers(0, 2),
    order=st.randoms(use_true_random=False),
    seed=st.integers(0, 2**16),
)
def test_sums_of_pads_tiling_an_axis_become_one_concat(sizes, axis, zeros, order, seed):
    base = [3, 2, 4]
    total = [*base]
    total[axis] = sum(sizes)
    p = Program()
    terms, edge = [], 0
    for size in sizes:
        shape = [*base]
        shape[axis] = size
        low, high = [0, 0, 0], [0, 0, 0]
        low[axis], high[axis] = edge, total[axis] - edge - size
        terms.append(p.op("pad", p.feed(tuple(shape)), low=tuple(low), high=tuple(high)))
        edge += size
    if zeros:  # one zero constant, read `zeros` times
        terms += [p.op("constant", shape=tuple(total), dtype="f32", value=(0.0,))] * zeros
    order.shuffle(terms)
    value = terms[0]
    for t in terms[1:]:
        value = p.op("add", value, t)
    p.result(p.op("neg", value))
    assert _ops(p) == ["concat", "neg"]
    _native_vs_reference(p, _feeds(p, np.random.default_rng(seed)))


def test_pads_that_overlap_leave_gaps_or_are_reused_stay_a_sum():
    def build(spans, reuse=False):
        p = Program()
        pads = [
            p.op("pad", p.feed((2, hi - lo)), low=(0, lo), high=(0, 6 - hi)) for lo, hi in spans
        ]
        value = p.op("add", pads[0], pads[1])
        p.result(value, pads[0]) if reuse else p.result(value)
        return p

    for p in (build([(0, 3), (2, 6)]), build([(0, 2), (3, 6)]), build([(0, 3), (3, 6)], True)):
        assert "concat" not in _ops(p)
        _native_vs_reference(p, _feeds(p, np.random.default_rng(0)))
    assert _ops(build([(3, 6), (0, 3)])) == ["concat"]


# -- attention heads read and written in place --------------------------------------------------


def _heads(p: Program, x: int, col0: int, heads: int, dim: int) -> int:
    b, length, width = p.slots[x].shape
    if col0 or heads * dim != width:
        x = p.op(
            "slice", x, starts=(0, 0, col0), ends=(b, length, col0 + heads * dim), strides=(1, 1, 1)
        )
    r = p.op("reshape", x, shape=(b, length, heads, dim))
    return p.op("transpose", r, perm=(0, 2, 1, 3))


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    length=st.integers(1, 9),
    heads=st.integers(1, 4),
    dim=st.integers(1, 6),
    extra=st.integers(0, 2),
    scale=st.booleans(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=st.integers(0, 2**16),
)
def test_attention_reads_heads_from_the_projection_and_writes_them_in_place(
    b, length, heads, dim, extra, scale, dtype, seed
):
    e = heads * dim
    p = Program()
    qkv = p.feed((b, length, 3 * e + extra), dtype)
    q, k, v = (_heads(p, qkv, extra + j * e, heads, dim) for j in range(3))
    s = p.op("matmul", q, k, transpose_b=True)
    if scale:
        s = p.op("mul", s, p.op("constant", shape=(), dtype=dtype, value=(0.5,)))
    o = p.op("matmul", p.op("softmax", s, axis=-1), v)
    t = p.op("transpose", o, perm=(0, 2, 1, 3))
    out = p.op("reshape", t, shape=(b, length, e))
    # The heads' output is read twice, as a weight gradient reads it flattened.
    p.result(p.op("tanh", out), p.op("reshape", t, shape=(b * length, e)))
    ops = _ops(p)
    # The head views then become the fused attention's operands (test_attention.py).
    assert "slice" not in ops and "transpose" not in ops and ops.count("attention") == 1
    _native_vs_reference(p, _feeds(p, np.random.default_rng(seed)))


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    length=st.integers(1, 7),
    heads=st.integers(1, 3),
    dim=st.integers(1, 5),
    n=st.integers(1, 6),
    ta=st.booleans(),
    left=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_one_operand_as_a_head_view_with_transposes(b, length, heads, dim, n, ta, left, seed):
    # A head view [B, H, L, D] on either side, read transposed or not, against a dense operand.
    p = Program()
    x = p.feed((b, length, heads * dim + 2))
    view = _heads(p, x, 2, heads, dim)
    # op(view) is [L, D], or [D, L] when read transposed.
    rows, cols = (dim, length) if ta else (length, dim)
    if left:
        other = p.feed((b, heads, cols, n))
        y = p.op("matmul", view, other, transpose_a=ta)
    else:
        other = p.feed((b, heads, n, rows))
        y = p.op("matmul", other, view, transpose_b=ta)
    p.result(y)
    assert "transpose" not in _ops(p)
    _native_vs_reference(p, _feeds(p, np.random.default_rng(seed)))


def test_heads_still_read_elsewhere_keep_their_copy():
    p = Program()
    x = p.feed((2, 5, 12))
    q = _heads(p, x, 0, 3, 4)
    p.result(p.op("matmul", q, q, transpose_b=True), q)  # the heads are a result too
    assert _ops(p).count("transpose") == 1
    _native_vs_reference(p, _feeds(p, np.random.default_rng(0)))


@pytest.mark.parametrize(
    "attrs, slots, message",
    [
        (
            {"a_view": [2, 4, 1]},
            [((2, 5, 8), "f32"), ((2, 2, 4, 3), "f32"), ((2, 2, 5, 3), "f32")],
            "does not fit",
        ),
        (
            {"a_view": [2, 4, 0]},
            [((2, 5, 8, 1), "f32"), ((2, 2, 4, 3), "f32"), ((2, 2, 5, 3), "f32")],
            "rank-3",
        ),
        (
            {"a_view": [0, 4, 0]},
            [((2, 5, 8), "f32"), ((2, 2, 4, 3), "f32"), ((2, 2, 5, 3), "f32")],
            "heads >= 1",
        ),
        (
            {"a_view": [2, 4]},
            [((2, 5, 8), "f32"), ((2, 2, 4, 3), "f32"), ((2, 2, 5, 3), "f32")],
            "col0",
        ),
        (
            {"c_view": [2, 3]},
            [((2, 2, 5, 4), "f32"), ((2, 2, 4, 3), "f32"), ((2, 5, 7), "f32")],
            r"declared f32\[2,5,7\] but the op gives f32\[2,5,6\]",
        ),
        (
            {"c_view": [3, 2]},
            [((2, 2, 5, 4), "f32"), ((2, 2, 4, 3), "f32"), ((2, 5, 6), "f32")],
            "c_view",
        ),
    ],
)
def test_validator_refuses_bad_head_views(attrs, slots, message):
    base = {"transpose_a": False, "transpose_b": False, "alpha": 1.0}
    desc = _desc([("gemm", [0, 1], [2], {**base, **attrs})], slots, [0, 1], [2])
    with pytest.raises(ValueError, match=message):
        _native.validate(desc)
