"""Non-elementwise prim ops: native kernels against the numpy reference, generated attributes."""

import inspect
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lucid.backends.cpu import CPUBackend, Program
from lucid.backends.cpu.program import COMPUTE_DTYPES
from lucid.backends.cpu.testing import check, random_array, run_both
from lucid.ir import prim as prim_ops

# The dtypes the native kernels compute in (half precision is storage only: casts).
NATIVE_DTYPES = COMPUTE_DTYPES

SEEDS = st.integers(0, 2**32 - 1)
SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)


@st.composite
def axes_of(draw, ndim):
    """A set of distinct axes, each possibly written negative."""
    chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
    return [a - ndim if draw(st.booleans()) else a for a in chosen]


@pytest.mark.parametrize("name", sorted(prim_ops.REDUCTIONS))
@settings(max_examples=10)
@given(shape=SHAPES, keepdims=st.booleans(), seed=SEEDS, data=st.data())
def test_reductions_over_axes_with_keepdims(name, shape, keepdims, seed, data):
    dtype = data.draw(st.sampled_from(sorted(prim_ops.REDUCTIONS[name][0] & set(NATIVE_DTYPES))))
    axes = data.draw(axes_of(len(shape)))
    x = random_array(np.random.default_rng(seed), shape, dtype)
    if name == "reduce_prod" and dtype in prim_ops.FLOAT:
        x = (x / 3).astype(x.dtype)
    check(name, [x], {"axes": axes, "keepdims": keepdims}, scale=10.0)


def test_reduction_of_empty_axis_is_identity_and_full_reduction_works():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    check("reduce_sum", [x], {"axes": []})
    check("reduce_sum", [np.zeros((0, 3), np.float32)], {"axes": [0]})
    out = check("reduce_mean", [x], {"axes": [0, 1, 2]})
    assert out == pytest.approx(11.5)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@settings(max_examples=15)
@given(shape=SHAPES, keepdims=st.booleans(), seed=SEEDS, data=st.data())
def test_arg_reductions_pick_first_extreme(name, shape, keepdims, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dtype = data.draw(st.sampled_from(sorted(prim_ops.NUMERIC & set(NATIVE_DTYPES))))
    # Few distinct values: ties are common, and the first one must win.
    x = np.random.default_rng(seed).integers(0, 3, size=shape).astype(prim_ops.NUMPY_DTYPES[dtype])
    check(name, [x], {"axis": axis, "keepdims": keepdims})


@settings(max_examples=25)
@given(shape=SHAPES, seed=SEEDS, descending=st.booleans(), data=st.data())
def test_argsort_is_stable_with_nan_largest(shape, seed, descending, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dtype = data.draw(st.sampled_from(sorted(NATIVE_DTYPES)))
    # Few distinct values (and NaN, infinities for floats): ties decide the order.
    rng = np.random.default_rng(seed)
    if dtype in prim_ops.FLOAT:
        pool = np.array([0.0, -0.0, 1.5, -2.0, np.nan, np.inf, -np.inf])
        x = rng.choice(pool, size=shape).astype(prim_ops.NUMPY_DTYPES[dtype])
    else:
        x = rng.integers(0, 3, size=shape).astype(prim_ops.NUMPY_DTYPES[dtype])
    got = check("argsort", [x], {"axis": axis, "descending": descending})
    moved = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    rows = np.moveaxis(got, axis, -1).reshape(moved.shape)
    for row, idx in zip(moved, rows, strict=True):
        keys = [(bool(np.isnan(v)) if v.dtype.kind == "f" else False, v) for v in row]
        for p, q in zip(idx[:-1], idx[1:], strict=True):  # each neighbour pair in order
            (nan_p, vp), (nan_q, vq) = keys[p], keys[q]
            if nan_p and nan_q or (not nan_p and not nan_q and vp == vq):
                assert p < q  # ties keep their positions
            elif descending:
                assert nan_p or (not nan_q and vp > vq)
            else:
                assert nan_q or (not nan_p and vp < vq)


def test_argmax_returns_the_first_nan():
    x = np.array([[1.0, np.nan, 5.0, np.nan]], np.float32)
    assert check("argmax", [x], {"axis": 1})[0] == 1


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@settings(max_examples=12)
@given(shape=SHAPES, seed=SEEDS, data=st.data())
def test_softmax_along_any_axis(name, shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dtype = data.draw(st.sampled_from(["f32", "f64"]))
    x = random_array(np.random.default_rng(seed), shape, dtype) * 10
    check(name, [x], {"axis": axis}, scale=10.0)


@settings(max_examples=15)
@given(shape=SHAPES, seed=SEEDS, exclusive=st.booleans(), reverse=st.booleans(), data=st.data())
def test_cumsum_exclusive_and_reverse(shape, seed, exclusive, reverse, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dtype = data.draw(st.sampled_from(sorted(prim_ops.NUMERIC & set(NATIVE_DTYPES))))
    x = random_array(np.random.default_rng(seed), shape, dtype)
    check("cumsum", [x], {"axis": axis, "exclusive": exclusive, "reverse": reverse}, scale=10.0)


@st.composite
def matmul_case(draw):
    m, n, k = (draw(st.integers(1, 6)) for _ in range(3))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = (*batch.input_shapes[0], *((k, m) if ta else (m, k)))
    b = (*batch.input_shapes[1], *((n, k) if tb else (k, n)))
    return a, b, ta, tb


@settings(max_examples=30)
@given(
    case=matmul_case(),
    dtype=st.sampled_from(sorted(prim_ops.NUMERIC & set(NATIVE_DTYPES))),
    seed=SEEDS,
)
def test_matmul_batched_broadcast_and_transposes(case, dtype, seed):
    a_shape, b_shape, ta, tb = case
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, a_shape, dtype), random_array(rng, b_shape, dtype)
    check("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb}, scale=10.0)


@settings(max_examples=25)
@given(
    m=st.integers(0, 6),
    n=st.integers(0, 6),
    k=st.integers(0, 6),
    ta=st.booleans(),
    tb=st.booleans(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=SEEDS,
)
def test_matmul_accumulate_adds_the_scaled_product(m, n, k, ta, tb, dtype, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, (k, m) if ta else (m, k), dtype)
    b = random_array(rng, (n, k) if tb else (k, n), dtype)
    c = random_array(rng, (m, n), dtype)
    alpha = random_array(rng, (), dtype)
    out = check("matmul_accumulate", [a, b, c, alpha], {"transpose_a": ta, "transpose_b": tb})
    a2, b2 = (a.T if ta else a), (b.T if tb else b)
    np.testing.assert_allclose(out, c + alpha * (a2 @ b2), rtol=1e-4, atol=1e-3)


def test_matmul_accumulate_rejects_mismatched_accumulators():
    p = Program()
    a, b = p.feed((2, 3)), p.feed((3, 4))
    with pytest.raises(prim_ops.PrimError, match="accumulator has shape"):
        p.op("matmul_accumulate", a, b, p.feed((4, 2)), p.feed(()))
    with pytest.raises(prim_ops.PrimError, match="alpha must be 0-d"):
        p.op("matmul_accumulate", a, b, p.feed((2, 4)), p.feed((1,)))


def test_matmul_with_zero_contraction_gives_zeros():
    out = check("matmul", [np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)])
    np.testing.assert_array_equal(out, np.zeros((2, 3)))


@settings(max_examples=20)
@given(shape=SHAPES, seed=SEEDS, dtype=st.sampled_from(NATIVE_DTYPES), data=st.data())
def test_layout_ops(shape, seed, dtype, data):
    x = random_array(np.random.default_rng(seed), shape, dtype)
    perm = data.draw(st.permutations(range(len(shape))))
    check("transpose", [x], {"perm": perm})
    check("reshape", [x], {"shape": (int(np.prod(shape)),)})
    target = data.draw(
        hnp.broadcastable_shapes(shape, min_dims=len(shape), max_dims=len(shape) + 2)
    )
    target = tuple(
        max(t, s) if s != 1 else t for t, s in zip(target[-len(shape) :], shape, strict=True)
    )
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    check("broadcast_to", [x], {"shape": (*lead, *target)})
    starts, ends, strides = [], [], []
    for d in shape:
        s = data.draw(st.integers(0, d))
        starts.append(s)
        ends.append(data.draw(st.integers(s, d)))
        strides.append(data.draw(st.integers(1, 3)))
    check("slice", [x], {"starts": starts, "ends": ends, "strides": strides})
    low = data.draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape)))
    high = data.draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape)))
    check("pad", [x], {"low": low, "high": high, "value": 1.0})


@settings(max_examples=15)
@given(shape=SHAPES, seed=SEEDS, count=st.integers(1, 4), data=st.data())
def test_concat_along_any_axis(shape, seed, count, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    parts = []
    for _ in range(count):
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 3))
        parts.append(random_array(rng, tuple(s), "f32"))
    check("concat", parts, {"axis": axis})


@settings(max_examples=20)
@given(
    shape=SHAPES,
    seed=SEEDS,
    idx_shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=4),
    idx_dtype=st.sampled_from(["i32", "i64"]),
    data=st.data(),
)
def test_gather_and_scatter_add(shape, seed, idx_shape, idx_dtype, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    x = random_array(rng, shape, "f32")
    np_idx = prim_ops.NUMPY_DTYPES[idx_dtype]
    idx = np.asarray(rng.integers(-size, size, size=idx_shape), np_idx)
    gathered = check("gather", [x, idx], {"axis": axis})
    updates = random_array(rng, gathered.shape, "f32")
    check("scatter_add", [x, idx, updates], {"axis": axis}, scale=10.0)
    along = list(shape)
    along[axis] = data.draw(st.integers(1, 4))
    idx2 = np.asarray(rng.integers(-size, size, size=along), np_idx)
    check("gather_along_axis", [x, idx2], {"axis": axis})
    upd2 = random_array(rng, tuple(along), "f32")
    check("scatter_add_along_axis", [x, idx2, upd2], {"axis": axis}, scale=10.0)


def test_out_of_range_index_raises_index_error_not_a_crash():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(IndexError, match="out of range"):
        run_both("gather", [x, np.array([0, 3], np.int64)], {"axis": 0})
    with pytest.raises(IndexError):
        run_both(
            "scatter_add", [x, np.array([-4], np.int64), np.ones((1, 2), np.float32)], {"axis": 0}
        )


@settings(max_examples=15)
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    idx_dtype=st.sampled_from(["i32", "i64"]),
    low=st.integers(-4, 0),
    seed=SEEDS,
)
def test_check_index_passes_values_in_range_and_raises_the_message_otherwise(
    shape, idx_dtype, low, seed
):
    rng = np.random.default_rng(seed)
    high = 4
    msg = "nll_loss: target {} is out of bounds for 4 classes"
    attrs = {"low": low, "high": high, "message": msg}
    idx = np.asarray(rng.integers(low, high, size=shape), prim_ops.NUMPY_DTYPES[idx_dtype])
    np.testing.assert_array_equal(check("check_index", [idx], attrs), idx)
    if idx.size:
        bad = idx.copy().reshape(-1)
        k = int(rng.integers(0, bad.size))
        bad[k] = low - 1 if rng.random() < 0.5 else high
        bad[k + 1 :] = high + 5  # a later bad value: the first one is reported
        bad = bad.reshape(idx.shape)
        expected = msg.replace("{}", str(int(bad.reshape(-1)[k])))
        program = Program()
        program.result(program.op("check_index", program.feed(bad.shape, idx_dtype), **attrs))
        executable = CPUBackend(cache=False).compile(program)
        with pytest.raises(IndexError) as native:
            executable.run([bad])
        with pytest.raises(IndexError) as ref:
            program.interpret([bad])
        assert str(native.value) == str(ref.value) == expected


def test_check_index_rejects_a_float_operand_and_an_empty_range():
    from lucid import _native

    program = Program()
    with pytest.raises(prim_ops.PrimError, match="index"):
        program.op("check_index", program.feed((2,), "f32"), low=0, high=2, message="m")
    desc = {
        "slots": [((2,), "i64"), ((2,), "i64")],
        "instrs": [("check_index", (0,), (1,), {"low": 3, "high": 2, "message": "m"})],
        "feeds": [0],
        "results": [1],
    }
    with pytest.raises(ValueError, match="low must be <= high"):
        _native.compile(desc, False)
    desc["instrs"] = [("check_index", (0,), (1,), {"low": 0, "high": 2, "message": 5})]
    with pytest.raises(ValueError, match="message"):
        _native.compile(desc, False)


@settings(max_examples=15)
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    depth=st.integers(0, 5),
    seed=SEEDS,
    dtype=st.sampled_from(NATIVE_DTYPES),
    data=st.data(),
)
def test_one_hot_with_out_of_range_rows(shape, depth, seed, dtype, data):
    axis = data.draw(st.integers(-(len(shape) + 1), len(shape)))
    idx = np.asarray(np.random.default_rng(seed).integers(-1, depth + 2, size=shape), np.int64)
    check("one_hot", [idx], {"depth": depth, "axis": axis, "dtype": dtype})


@st.composite
def conv_case(draw):
    groups = draw(st.integers(1, 3))
    cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(1, 7))
    w = draw(st.integers(1, 7))
    assume(h + pad[0] + pad[1] >= dh * (kh - 1) + 1 and w + pad[2] + pad[3] >= dw * (kw - 1) + 1)
    n = draw(st.integers(1, 2))
    attrs = {"strides": (sh, sw), "dilation": (dh, dw), "padding": pad, "groups": groups}
    return (n, cg * groups, h, w), (og * groups, cg, kh, kw), attrs


@settings(max_examples=30)
@given(case=conv_case(), dtype=st.sampled_from(["f32", "f64"]), seed=SEEDS)
def test_conv2d_and_its_gradients(case, dtype, seed):
    x_shape, w_shape, attrs = case
    rng = np.random.default_rng(seed)
    x, w = random_array(rng, x_shape, dtype), random_array(rng, w_shape, dtype)
    y = check("conv2d", [x, w], attrs, scale=10.0)
    dy = random_array(rng, y.shape, dtype)
    check("conv2d_data_grad", [dy, w], {**attrs, "input_shape": x_shape}, scale=10.0)
    check("conv2d_weights_grad", [x, dy], {**attrs, "weight_shape": w_shape}, scale=10.0)


@st.composite
def pool_case(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pad = (
        draw(st.integers(0, kh // 2)),
        draw(st.integers(0, kh // 2)),
        draw(st.integers(0, kw // 2)),
        draw(st.integers(0, kw // 2)),
    )
    h, w = draw(st.integers(kh, 7)), draw(st.integers(kw, 7))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w)
    return shape, {"kernel": (kh, kw), "strides": (sh, sw), "padding": pad}


@settings(max_examples=25)
@given(
    case=pool_case(),
    dtype=st.sampled_from(["f32", "f64"]),
    seed=SEEDS,
    include_pad=st.booleans(),
    dilation=st.sampled_from([(1, 1), (1, 2), (2, 1)]),
)
def test_pooling_and_gradients(case, dtype, seed, include_pad, dilation):
    shape, attrs = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, dtype)
    x_ties = np.round(x).astype(x.dtype)  # ties: the first maximum must receive the gradient
    avg = {**attrs, "count_include_pad": include_pad}
    y = check("avg_pool2d", [x], avg)
    check("avg_pool2d_grad", [random_array(rng, y.shape, dtype)], {**avg, "input_shape": shape})
    span_ok = all(
        s + p0 + p1 >= d * (k - 1) + 1
        for s, p0, p1, d, k in zip(
            shape[2:],
            attrs["padding"][::2],
            attrs["padding"][1::2],
            dilation,
            attrs["kernel"],
            strict=False,
        )
    )
    mx = {**attrs, "dilation": dilation if span_ok else (1, 1)}
    for source in (x, x_ties):
        y = check("max_pool2d", [source], mx)
        check("max_pool2d_grad", [random_array(rng, y.shape, dtype), source], mx)


@pytest.mark.parametrize("name", ["random_uniform", "random_normal"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_random_matches_the_reference_philox_stream(name, dtype):
    state = np.array([12345, 7], np.int64)
    attrs = {"shape": (3, 5), "dtype": dtype}
    out = check(name, [state], attrs)
    again, _ = run_both(name, [state], attrs)
    np.testing.assert_array_equal(out, again)
    other, _ = run_both(name, [np.array([12345, 8], np.int64)], attrs)
    assert not np.array_equal(out, other)


def test_random_moments_are_plausible():
    state = np.array([1, 0], np.int64)
    u, _ = run_both("random_uniform", [state], {"shape": (20000,), "low": -1.0, "high": 3.0})
    assert u.min() >= -1 and u.max() < 3 and abs(u.mean() - 1.0) < 0.05
    z, _ = run_both("random_normal", [state], {"shape": (20001,), "mean": 2.0, "std": 0.5})
    assert abs(z.mean() - 2.0) < 0.02 and abs(z.std() - 0.5) < 0.02


@settings(max_examples=10)
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    dtype=st.sampled_from(NATIVE_DTYPES),
    seed=SEEDS,
)
def test_fill(shape, dtype, seed):
    value = random_array(np.random.default_rng(seed), (), dtype)
    check("fill", [value], {"shape": shape})


@settings(max_examples=10)
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    dtype=st.sampled_from(NATIVE_DTYPES),
    splat=st.booleans(),
    seed=SEEDS,
)
def test_constant_splat_and_full_values(shape, dtype, splat, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-5, 6, size=1 if splat else int(np.prod(shape))).astype(float).tolist()
    p = Program()
    p.result(p.op("constant", shape=shape, dtype=dtype, value=values))
    (native,) = CPUBackend(cache=False).compile(p).run([])
    (ref,) = p.interpret([])
    assert native.dtype == ref.dtype and native.shape == tuple(shape)
    np.testing.assert_array_equal(native, ref)
    np.testing.assert_array_equal(
        ref.ravel(), np.resize(np.array(values), ref.size).astype(ref.dtype)
    )


def test_every_prim_op_is_exercised_by_this_suite():
    here = inspect.getsource(sys.modules[__name__])
    covered = {name for name in prim_ops.PRIM_OPS if f'"{name}"' in here}
    covered |= set(prim_ops.UNARY) | set(prim_ops.BINARY) | set(prim_ops.REDUCTIONS)
    covered |= {"select", "cast", "normalize"}  # test_elementwise_native.py
    assert covered == set(prim_ops.PRIM_OPS), set(prim_ops.PRIM_OPS) - covered


@pytest.mark.parametrize(
    ("n", "c", "o", "hw", "k", "pad", "strides"),
    [(3, 4, 5, (6, 7), 3, (1, 0, 2, 1), (2, 1)), (4, 2, 3, (5, 5), 1, (0, 0, 0, 0), (1, 1))],
)
def test_conv2d_batched_gemm_path(n, c, o, hw, k, pad, strides):
    # groups == 1 with several images takes the one-GEMM-for-the-batch path in all three ops.
    rng = np.random.default_rng(n)
    x = random_array(rng, (n, c, *hw), "f32")
    w = random_array(rng, (o, c, k, k), "f32")
    attrs = {"padding": pad, "strides": strides}
    y = check("conv2d", [x, w], attrs, scale=10.0)
    dy = random_array(rng, y.shape, "f32")
    check("conv2d_data_grad", [dy, w], {**attrs, "input_shape": x.shape}, scale=10.0)
    check("conv2d_weights_grad", [x, dy], {**attrs, "weight_shape": w.shape}, scale=10.0)
