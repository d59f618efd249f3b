"""The ``lower-to-prim`` pass: registration, explicit promotion, refusals with reasons, and random
graphs (chains and DAGs of registry ops with random shapes) that agree with eager."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid import _native
from lucid._dispatch import apply
from lucid._tensor import Tensor
from lucid.ir import import_trace, parse_ir, print_ir
from lucid.ir.importer import forward_func
from lucid.ir.prim.dialect import make_prim_context
from lucid.ir.prim.interpreter import interpret_prim
from lucid.passes import PassFailure, PassManager, get_pass
from lucid.passes.lower_to_prim import LoweringError, LowerToPrim, lower_module
from lucid.tools.coverage import rows
from lucid.trace import trace
from lucid.trace._tracing import _tracing

DTYPES = [np.bool_, np.int32, np.int64, np.float32, np.float64]


def _lowered(fn, *arrays):
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("lower-to-prim").run(module)
    module.verify()
    return module


def _prim_names(module) -> list[str]:
    return [op.name for op in forward_func(module).body.blocks.first.ops]


def test_pass_is_registered_under_its_name():
    assert get_pass("lower-to-prim") is LowerToPrim


@given(
    st.sampled_from(DTYPES),
    st.sampled_from(DTYPES),
    st.sampled_from(["add", "mul", "maximum", "lt", "eq", "div"]),
    st.sampled_from([None, 2, 1.5, True]),
)
def test_promotion_is_explicit_and_matches_eager(dt_a, dt_b, op, scalar):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((2, 3)) * 3).astype(dt_a)
    b = (rng.standard_normal((3,)) * 3 + 4).astype(dt_b)
    if op == "div":
        b = np.where(b == 0, 1, b).astype(dt_b)

    def fn(x, y):
        return apply(op, x, y if scalar is None else scalar)

    want = fn(Tensor._wrap(a), Tensor._wrap(b)).numpy()
    module = _lowered(fn, a, b)
    (got,) = interpret_prim(module, [a, b])
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
    names = _prim_names(module)
    assert not any(n.startswith("lucid.") for n in names)
    # prim ops take exact dtypes: mixed operands mean an explicit cast or a typed constant.
    if scalar is None and dt_a != dt_b:
        assert "prim.cast" in names


def test_weak_scalar_becomes_a_constant_of_the_compute_dtype():
    module = _lowered(lambda t: t * 0.1, np.ones(3, np.float64))
    text = print_ir(module)
    assert "prim.constant" in text and "tensor<f64>" in text
    (got,) = interpret_prim(module, [np.ones(3)])
    np.testing.assert_array_equal(got, np.full(3, 0.1))


def test_lowered_module_round_trips_through_text():
    module = _lowered(lambda t: lucid.softmax(t * 2, dim=-1).sum(0), np.ones((2, 3), np.float32))
    text = print_ir(module)
    again = parse_ir(text, ctx=make_prim_context())
    again.verify()
    assert print_ir(again) == text


def test_a_refusal_is_named_with_its_reason_through_the_pass_manager():
    def fn(x, idx, src):
        return apply("scatter", x, idx, src, dim=0)

    n = 4100  # more writes than the last-write-wins comparison handles
    arrays = [np.zeros(8, np.float32), np.zeros(n, np.int64), np.ones(n, np.float32)]
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    with pytest.raises(PassFailure) as info:
        PassManager("lower-to-prim").run(module)
    cause = info.value.cause
    assert isinstance(cause, LoweringError)
    assert cause.op == "scatter" and "4100 writes" in str(cause)


def test_a_conditional_refusal_names_the_op_and_the_condition():
    module = import_trace(
        trace(lambda t: apply("one_hot", t, num_classes=-1), Tensor._wrap(np.arange(3)))
    )
    with pytest.raises(LoweringError, match=r"lucid.one_hot .*without num_classes"):
        lower_module(module)


def test_dtype_without_a_prim_type_is_refused():
    module = import_trace(trace(lambda t: t + 1, Tensor._wrap(np.ones(3, np.int16))))
    with pytest.raises(LoweringError, match="int16 has no prim type"):
        lower_module(module)


def test_half_ops_compute_in_float32_and_round_once_per_op():
    # As eager runs a kernel on half tensors: widened operands, float32 arithmetic, one rounding
    # of each op's result; a value read twice is widened once.
    module = import_trace(trace(lambda t: t * 2 + t, Tensor._wrap(np.ones(3, np.float16))))
    lower_module(module)
    ops = [op for op in forward_func(module).body.blocks.first.ops if op.name != "func.return"]
    casts = [str(op.results[0].type) for op in ops if op.name == "prim.cast"]
    assert casts == ["tensor<3xf32>", "tensor<3xf16>", "tensor<3xf32>", "tensor<3xf16>"]
    arith = [op for op in ops if op.name in ("prim.mul", "prim.add")]
    assert [str(op.results[0].type) for op in arith] == ["tensor<3xf32>"] * 2


def test_symbolic_dimension_is_refused_until_shapes_are_specialized():
    with _tracing() as tracer:
        t = tracer.input((None, 3))
        out = tracer.finish(lucid.exp(t))
    module = import_trace(out)
    with pytest.raises(LoweringError, match="symbolic dimension"):
        lower_module(module)


def test_unused_pool_indices_are_not_computed():
    module = _lowered(
        lambda t: apply("max_pool2d", t, kernel_size=(2, 2), stride=(2, 2))[0],
        np.ones((1, 1, 4, 4), np.float32),
    )
    names = _prim_names(module)
    assert "prim.max_pool2d" in names and "prim.argmax" not in names


def test_coverage_table_has_a_lowering_column():
    table = {r["op"]: r for r in rows()}
    assert table["add"]["lowers to prim"] == "yes"
    assert table["nonzero"]["lowers to prim"].startswith("no: ")


# --- random graphs: chains and DAGs of registry ops on random shapes

_UNARY = [
    lambda t: lucid.exp(-lucid.abs(t)),
    lambda t: lucid.tanh(t),
    lambda t: lucid.sigmoid(t),
    lambda t: apply("relu", t),
    lambda t: -t,
    lambda t: t * 0.5 + 1,
    lambda t: apply("gelu", t),
    lambda t: lucid.sqrt(lucid.abs(t) + 1e-3),
]
_BINARY = [
    lambda a, b: a + b,
    lambda a, b: a - b,
    lambda a, b: a * b,
    lambda a, b: apply("maximum", a, b),
    lambda a, b: apply("where", apply("gt", a, b), a, b),
]


def _reduce_step(a, dim: int, k: int):
    kind = k % 5
    if kind == 0:
        return a.sum(dim, keepdim=True)
    if kind == 1:
        return a.mean(dim, keepdim=True)
    if kind == 2:
        return apply("amax", a, dim=dim, keepdim=True)
    if kind == 3:
        return lucid.softmax(a, dim=dim)
    return apply("logsumexp", a, dim=dim, keepdim=True)


@st.composite
def graphs(draw):
    """(fn, input shapes): a random DAG over broadcast-compatible inputs."""
    rank = draw(st.integers(1, 3))
    full = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    n_inputs = draw(st.integers(1, 3))
    shapes = []
    for _ in range(n_inputs):
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in full))
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "reshape", "permute"]))
        picks = (draw(st.integers(0, 99)), draw(st.integers(0, 99)))
        steps.append((kind, picks, draw(st.integers(0, 99))))

    def fn(*inputs):
        values = list(inputs)
        for kind, (i, j), k in steps:
            a, b = values[i % len(values)], values[j % len(values)]
            if kind == "unary":
                v = _UNARY[k % len(_UNARY)](a)
            elif kind == "binary":
                try:
                    np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
                except ValueError:
                    continue
                v = _BINARY[k % len(_BINARY)](a, b)
            elif kind == "reduce":
                v = _reduce_step(a, k % a.ndim, k)
            elif kind == "reshape":
                v = a.reshape(-1).reshape(*a.shape)
            else:
                perm = list(range(a.ndim))[::-1]
                v = a.permute(*perm).permute(*perm)
            values.append(v)
        return values[-1], values[len(inputs) :][0] if len(values) > len(inputs) else values[0]

    return fn, shapes


@given(graphs(), st.sampled_from([np.float32, np.float64]))
def test_random_graphs_agree_with_eager(graph, dtype):
    fn, shapes = graph
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    eager = [t.numpy() for t in fn(*(Tensor._wrap(a) for a in arrays))]
    module = import_trace(trace(fn, *(Tensor._wrap(a) for a in arrays)))
    PassManager("canonicalize,cse,dce,lower-to-prim").run(module)
    got = interpret_prim(module, arrays)
    tol = 1e-5 if dtype == np.float32 else 1e-11
    for g, e in zip(got, eager, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    if hasattr(_native, "compile"):
        from lucid.backends.cpu.emit import compile_program, emit_program

        native = compile_program(emit_program(module)).run(arrays)
        for n, e in zip(native, eager, strict=True):
            np.testing.assert_allclose(n, e, rtol=10 * tol, atol=10 * tol)


@st.composite
def broadcast_pair(draw):
    rank = draw(st.integers(0, 4))
    full = [draw(st.integers(1, 4)) for _ in range(rank)]
    a = tuple(d if draw(st.booleans()) else 1 for d in full)
    b = tuple(d if draw(st.booleans()) else 1 for d in full)
    return a[draw(st.integers(0, rank)) :], b


@given(
    broadcast_pair(),
    st.sampled_from(["add", "sub", "mul", "div", "maximum", "minimum", "remainder", "ge"]),
    st.sampled_from([np.float32, np.float64, np.int64]),
)
def test_broadcast_elementwise_on_random_shapes(shapes, op, dtype):
    rng = np.random.default_rng(2)
    a = np.asarray(rng.standard_normal(shapes[0]) * 4, dtype=dtype)
    b = np.asarray(rng.standard_normal(shapes[1]) * 4, dtype=dtype)
    if op in ("div", "remainder"):
        b = np.asarray(np.where(b == 0, 3, b), dtype=dtype)

    def fn(x, y):
        return apply(op, x, y)

    want = fn(Tensor._wrap(a), Tensor._wrap(b)).numpy()
    module = _lowered(fn, a, b)
    outs = [interpret_prim(module, [a, b])[0]]
    if hasattr(_native, "compile"):
        from lucid.backends.cpu.emit import compile_program, emit_program

        outs.append(compile_program(emit_program(module)).run([a, b])[0])
    for got in outs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.data(),
    st.sampled_from(["sum", "mean", "amax", "amin", "prod", "var", "logsumexp", "argmax"]),
)
def test_reductions_on_random_shapes_and_dims(shape, data, op):
    ndim = len(shape)
    dims = data.draw(
        st.lists(
            st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim, unique_by=lambda d: d % ndim
        )
    )
    keepdim = data.draw(st.booleans())
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    attrs = {"dim": dims[0] if op == "argmax" else tuple(dims), "keepdim": keepdim}

    def fn(t):
        return apply(op, t, **attrs)

    want = fn(Tensor._wrap(x)).numpy()
    module = _lowered(fn, x)
    (got,) = interpret_prim(module, [x])
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@st.composite
def index_cases(draw):
    """(x shape, index items, index tensors) for ``x[index]`` with ints, slices (any step), new
    axes and integer index tensors in any arrangement."""
    shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
    items, tensors = [], []
    bshape = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2))))
    for n in shape[: draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from(["int", "slice", "new", "tensor"]))
        if kind == "new":  # a new axis consumes no dim: index the same one next
            items.append(("new",))
            kind = draw(st.sampled_from(["int", "slice", "tensor"]))
        if kind == "int":
            items.append(("int", draw(st.integers(-n, n - 1))))
        elif kind == "tensor":
            items.append(("tensor",))
            sub = bshape[draw(st.integers(0, len(bshape))) :]
            tensors.append(np.asarray(np.random.default_rng(len(tensors)).integers(-n, n, sub)))
        else:
            start = draw(st.none() | st.integers(-n - 1, n + 1))
            stop = draw(st.none() | st.integers(-n - 1, n + 1))
            step = draw(st.sampled_from([None, 1, 2, -1, -2]))
            items.append(("slice", start, stop, step))
    return shape, tuple(items), tensors


@given(index_cases())
def test_indexing_matches_eager_for_any_index(case):
    shape, index, tensors = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def fn(t, *idx):
        return apply("index", t, list(idx), index=index)

    want = fn(Tensor._wrap(x), *(Tensor._wrap(t) for t in tensors)).numpy()
    module = _lowered(fn, x, *tensors)
    (got,) = interpret_prim(module, [x, *tensors])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@given(index_cases(), st.booleans())
def test_index_put_matches_eager_for_any_index(case, accumulate):
    shape, index, tensors = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    target = apply("index", Tensor._wrap(x), [Tensor._wrap(t) for t in tensors], index=index).shape
    values = np.random.default_rng(5).standard_normal(target).astype(np.float32)

    def fn(t, v, *idx):
        return apply("index_put", t, v, list(idx), index=index, accumulate=accumulate)

    want = fn(*(Tensor._wrap(a) for a in (x, values, *tensors))).numpy()
    module = _lowered(fn, x, values, *tensors)
    (got,) = interpret_prim(module, [x, values, *tensors])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_failed_lowering_leaves_the_module_unchanged():
    def fn(t):
        y = lucid.exp(t) * 2 + 1  # lowers
        return apply("one_hot", apply("cast", y, dtype=lucid.int64), num_classes=-1)  # refused

    module = import_trace(trace(fn, Tensor._wrap(np.zeros(3, np.float32))))
    before = print_ir(module)
    with pytest.raises(LoweringError, match="one_hot"):
        lower_module(module)
    assert print_ir(module) == before
    module.verify()


@given(index_cases(), st.data())
def test_an_index_tensor_out_of_range_raises_eagers_error_in_the_lowered_module(case, data):
    from hypothesis import assume

    from lucid.ops.indexing import index_tensor_dims

    shape, index, tensors = case
    assume(any(t.size for t in tensors))
    k = data.draw(st.sampled_from([i for i, t in enumerate(tensors) if t.size]))
    n = shape[index_tensor_dims(index)[k]]
    bad = [t.copy() for t in tensors]
    flat = bad[k].reshape(-1)
    flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(st.sampled_from([-n - 1, n, 3 * n]))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def fn(t, *idx):
        return apply("index", t, list(idx), index=index)

    with pytest.raises(IndexError) as eager:
        fn(Tensor._wrap(x), *(Tensor._wrap(t) for t in bad))
    module = _lowered(fn, x, *tensors)  # lowered for valid shapes; the values are run-time
    assert "prim.check_index" in _prim_names(module)
    with pytest.raises(IndexError) as lowered:
        interpret_prim(module, [x, *bad])
    assert str(lowered.value) == str(eager.value)


def test_class_targets_are_checked_with_the_losss_message_and_the_module_round_trips():
    import lucid.nn.functional as F

    logits = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    target = np.array([0, 3, 1])
    module = _lowered(lambda a, t: F.cross_entropy(a, t, ignore_index=-100), logits, target)
    checks = [
        op for op in forward_func(module).body.blocks.first.ops if op.name == "prim.check_index"
    ]
    assert [op.prim_attrs() for op in checks] == [
        {"low": 0, "high": 4, "message": "cross_entropy: target {} is out of bounds for 4 classes"}
    ]
    again = parse_ir(print_ir(module), ctx=make_prim_context())
    assert print_ir(again) == print_ir(module)
    np.testing.assert_allclose(
        interpret_prim(again, [logits, np.array([0, -100, 1])])[0],
        F.cross_entropy(lucid.tensor(logits), lucid.tensor([0, -100, 1])).numpy(),
        rtol=1e-6,
    )
    with pytest.raises(IndexError, match="^cross_entropy: target -1 is out of bounds for 4"):
        interpret_prim(again, [logits, np.array([0, -1, 1])])
