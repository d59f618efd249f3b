"""Indexing: __getitem__/__setitem__ against numpy, gather/scatter/index_select/masked_fill
against their documented formulas, gradients against finite differences, clear errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lucid
from lucid.ops import REGISTRY
from lucid.ops._registry import DATA_DEPENDENT
from lucid.testing import assert_close, gradcheck


def rand(*shape, seed=0, grad=True):
    data = np.random.default_rng(seed).standard_normal(shape)
    return lucid.tensor(data, dtype=lucid.float64, requires_grad=grad)


def arr(x):
    return x.detach().numpy()


IDX = lucid.tensor([2, 0, 2])  # repeats: gradients must add up
IDX2 = lucid.tensor([[0, 1], [2, 2]])

# (index as written for lucid, the same index for numpy)
GETITEM_CASES = [
    (1, 1),
    (-1, -1),
    (True, True),
    ((0, False), (0, False)),
    ((0, 2), (0, 2)),
    ((1, -1, 0), (1, -1, 0)),
    (slice(1, None), slice(1, None)),
    ((slice(None, None, 2), slice(-3, -1)), (slice(None, None, 2), slice(-3, -1))),
    ((slice(None), slice(None, None, -1)), (slice(None), slice(None, None, -1))),
    (None, None),
    ((Ellipsis, 1), (Ellipsis, 1)),
    ((0, Ellipsis, None, slice(1, 3)), (0, Ellipsis, None, slice(1, 3))),
    (IDX, IDX.numpy()),
    ((slice(None), IDX), (slice(None), IDX.numpy())),
    ([0, 2], [0, 2]),
    ((IDX, slice(None), lucid.tensor([1, 2, 3])), (IDX.numpy(), slice(None), [1, 2, 3])),
    ((slice(None), IDX2, 1), (slice(None), IDX2.numpy(), 1)),  # int + tensor adjacent
    ((0, slice(None), IDX2), (0, slice(None), IDX2.numpy())),  # ints select first
    ((IDX, slice(1, 3), IDX), (IDX.numpy(), slice(1, 3), IDX.numpy())),  # separated: go first
    ((IDX, 1, IDX), (IDX.numpy(), 1, IDX.numpy())),  # an int does not separate
    ((IDX2[:, :1], IDX2[:1]), (IDX2.numpy()[:, :1], IDX2.numpy()[:1])),  # index broadcast
    ((Ellipsis, lucid.tensor([0, 0])), (Ellipsis, [0, 0])),
    ((slice(None), None, IDX), (slice(None), None, IDX.numpy())),  # new axis separates
    ((IDX, None, 1, IDX), (IDX.numpy(), None, 1, IDX.numpy())),
]


def _torch_rule_keys(a, index):
    index = index if isinstance(index, tuple) else (index,)
    consumed = sum(i is not None and i is not Ellipsis for i in index)
    full = []
    for i in index:
        full.extend([slice(None)] * (a.ndim - consumed) if i is Ellipsis else [i])
    select = tuple(i if isinstance(i, int) else slice(None) for i in full if i is not None)
    rest = tuple(i for i in full if not isinstance(i, int))
    return select + (Ellipsis,), rest


def torch_rule(a, index):
    """PyTorch's documented order on a numpy array: integers select first, then numpy indexing
    of what remains (where slices and new axes separate index arrays)."""
    select, rest = _torch_rule_keys(a, index)
    return a[select][rest]


def torch_rule_set(a, index, value):
    out = a.copy()
    select, rest = _torch_rule_keys(out, index)
    out[select][rest] = value  # out[select] is a view: the write lands in out
    return out


def test_torch_rule_differs_from_numpy_where_torch_documents_it():
    # Shapes reported for PyTorch in pytorch/pytorch#157676, #158134 and #141563.
    x = rand(5, 3, 7, 9, grad=False)
    assert x[:, [0], :, 0].shape == (5, 1, 7)
    y = rand(2, 3, 5, 7, grad=False)
    assert y[:, True].shape == (2, 1, 3, 5, 7)
    assert y[:, False].shape == (2, 0, 3, 5, 7)
    assert y[:, True, :, :, 0].shape == (2, 1, 3, 5)
    assert y[:, False, :, :, 0].shape == (2, 0, 3, 5)
    assert rand(3, 4, 5, grad=False)[:, (0, 1), ..., (0, 1)].shape == (3, 2)
    assert_close(x[:, [0], :, 0], arr(x)[..., 0][:, [0]])
    assert_close(y[:, True, 1], arr(y)[:, 1][:, None])


@pytest.mark.parametrize(("index", "np_index"), GETITEM_CASES)
def test_getitem_matches_numpy(index, np_index):
    x = rand(3, 4, 5, grad=False)
    assert_close(x[index], torch_rule(arr(x), np_index))


@pytest.mark.parametrize(("index", "np_index"), GETITEM_CASES)
def test_getitem_gradient(index, np_index):
    gradcheck(lambda t: t[index], rand(3, 4, 5))


def test_getitem_bool_mask():
    x = rand(3, 4)
    mask = x.detach() > 0
    assert_close(x[mask], arr(x)[arr(x) > 0])
    row_mask = lucid.tensor([True, False, True])
    assert_close(x[row_mask, 1:], arr(x)[[True, False, True], 1:])
    assert_close(x[:, [True, False, False, True]], arr(x)[:, [True, False, False, True]])
    gradcheck(lambda t: t[mask], x)
    gradcheck(lambda t: t[row_mask], x)


def test_bool_mask_goes_through_a_data_dependent_op():
    assert DATA_DEPENDENT in REGISTRY["nonzero"].props
    assert DATA_DEPENDENT not in REGISTRY["index"].props
    x = lucid.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert_close(lucid.nonzero(x), np.argwhere(x.numpy()))
    rows, cols = x.nonzero(as_tuple=True)
    assert_close(rows, [0, 1])
    assert_close(cols, [1, 0])


def test_getitem_on_0d_and_scalar_results():
    x = rand()
    assert_close(x[None], arr(x)[None])
    assert_close(x[...], arr(x))
    y = rand(3)
    assert y[1].shape == ()
    assert_close(y[1], arr(y)[1])


@given(data=st.data())
def test_random_basic_and_advanced_indices_match_numpy(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    x = rand(*shape, grad=False)
    items, np_items = [], []
    n_index = data.draw(st.integers(1, 3))  # index tensors must broadcast together
    dim = 0
    while dim < len(shape) and data.draw(st.booleans()):
        n = shape[dim]
        kind = data.draw(st.sampled_from(["int", "slice", "none", "tensor"]))
        if kind == "int":
            i = data.draw(st.integers(-n, n - 1))
            items.append(i)
            np_items.append(i)
        elif kind == "slice":
            start = data.draw(st.none() | st.integers(-n - 1, n + 1))
            stop = data.draw(st.none() | st.integers(-n - 1, n + 1))
            step = data.draw(st.none() | st.integers(-3, 3).filter(bool))
            items.append(slice(start, stop, step))
            np_items.append(slice(start, stop, step))
        elif kind == "none":
            items.append(None)
            np_items.append(None)
            continue
        else:
            size = data.draw(st.sampled_from([1, n_index]))
            ix = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=size, max_size=size)))
            items.append(lucid.tensor(ix))
            np_items.append(ix)
        dim += 1
    expected = torch_rule(arr(x), tuple(np_items))
    assert_close(x[tuple(items)], expected)
    # the same index written to: values broadcast from a trailing slice of the indexed shape
    keep = data.draw(st.integers(0, expected.ndim))
    value = rand(*expected.shape[expected.ndim - keep :], seed=1, grad=False)
    y = x.detach() * 1.0
    y[tuple(items)] = value
    assert_close(y, torch_rule_set(arr(x), tuple(np_items), arr(value)))


def test_getitem_errors():
    x = rand(2, 3)
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 1, 2]
    with pytest.raises(IndexError, match="index 3 is out of bounds for dim 1 with size 3"):
        x[0, 3]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
    with pytest.raises(IndexError, match="integer or bool"):
        x[lucid.tensor([0.0])]
    with pytest.raises(ValueError, match="step cannot be zero"):
        x[::0]
    with pytest.raises(IndexError, match="does not match"):
        x[lucid.tensor([True, False, True])]
    with pytest.raises(IndexError, match="valid indices"):
        x["a"]
    with pytest.raises(IndexError, match="out of bounds"):
        x[lucid.tensor([5])]
    with pytest.raises(IndexError, match="cannot be broadcast"):
        x[lucid.tensor([0, 1]), lucid.tensor([0, 1, 2])]


# --- setitem ------------------------------------------------------------------------------------


SETITEM_CASES = [
    (1, (5,)),
    ((slice(None), 2), (3,)),
    ((slice(0, 2), slice(1, None, 2)), (2, 2)),
    ((Ellipsis, None, 0), (1,)),
    (IDX, (3, 5)),
    ((lucid.tensor([0, 2]), lucid.tensor([4, 1])), ()),
    ((slice(None), [0, 3]), (1, 2)),  # values broadcast
]


def _to_numpy_index(index):
    if isinstance(index, tuple):
        return tuple(_to_numpy_index(i) for i in index)
    return index.numpy() if isinstance(index, lucid.Tensor) else index


@pytest.mark.parametrize(("index", "vshape"), SETITEM_CASES)
def test_setitem_matches_numpy(index, vshape):
    x = rand(3, 5, grad=False)
    v = rand(*vshape, seed=1, grad=False)
    expected = arr(x).copy()
    expected[_to_numpy_index(index)] = arr(v)
    version = x._version_count
    x[index] = v
    assert_close(x, expected)
    assert x._version_count == version + 1


@pytest.mark.parametrize(("index", "vshape"), SETITEM_CASES[:4] + SETITEM_CASES[5:])
def test_setitem_gradient_reaches_tensor_and_value(index, vshape):
    def f(t, v):
        y = t * 1.0
        y[index] = v
        return y * y

    gradcheck(f, rand(3, 5), rand(*vshape, seed=1))


def test_setitem_scalar_mask_and_dtype_cast():
    x = lucid.tensor([[1, 2], [3, 4]])
    x[x > 2] = 0
    assert_close(x, np.array([[1, 2], [0, 0]]))
    assert x.dtype is lucid.int64
    y = lucid.tensor([0.0, 0.0, 0.0])
    y[1] = lucid.tensor(2.5, dtype=lucid.float64)
    assert y.dtype is lucid.float32
    assert_close(y, np.array([0.0, 2.5, 0.0], dtype=np.float32))
    y[[0, 2]] = [7.0, 8.0]
    assert_close(y, np.array([7.0, 2.5, 8.0], dtype=np.float32))


def test_setitem_with_int_and_index_tensor_follows_torch_placement():
    x = rand(3, 4, 5, grad=False)
    v = rand(4, 2, seed=1, grad=False)  # x[0, :, [1, 2]] has shape (4, 2) in PyTorch
    expected = arr(x).copy()
    expected[0][:, [1, 2]] = arr(v)
    x[0, :, [1, 2]] = v
    assert_close(x, expected)
    gradcheck(lambda t: t[0, :, [1, 2]] * 2.0, rand(3, 4, 5))


def test_setitem_false_and_true():
    x = rand(2, 3, grad=False)
    before = arr(x).copy()
    x[False] = 1.0
    assert_close(x, before)
    x[True] = 2.0
    assert_close(x, np.full((2, 3), 2.0))


def test_setitem_errors():
    x = rand(3, 4, grad=False)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        x[0] = rand(3, grad=False)
    leaf = rand(3)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        leaf[0] = 1.0


def test_index_put_accumulates_repeats():
    x = lucid.tensor([0.0, 0.0, 0.0])
    out = x.index_put((lucid.tensor([0, 2, 0]),), lucid.tensor([1.0, 2.0, 3.0]), accumulate=True)
    assert_close(out, np.array([4.0, 0.0, 2.0], dtype=np.float32))
    assert_close(x, np.zeros(3, dtype=np.float32))


# --- gather / scatter ---------------------------------------------------------------------------


def _gather_reference(x, dim, index):
    out = np.empty(index.shape, x.dtype)
    for pos in np.ndindex(*index.shape):
        src = list(pos)
        src[dim] = index[pos]
        out[pos] = x[tuple(src)]
    return out


@given(dim=st.integers(-3, 2), seed=st.integers(0, 5))
def test_gather_matches_documented_formula(dim, seed):
    rng = np.random.default_rng(seed)
    x = rand(3, 4, 2, seed=seed, grad=False)
    ishape = [int(rng.integers(1, n + 1)) for n in (3, 4, 2)]
    d = dim % 3
    ishape[d] = 5  # the gathered dim may be longer than x's
    index = rng.integers(0, x.shape[d], size=ishape)
    out = lucid.gather(x, dim, lucid.tensor(index))
    assert_close(out, _gather_reference(arr(x), d, index))


def test_gather_gradient_and_errors():
    x = rand(3, 4)
    index = lucid.tensor([[0, 2], [1, 1], [3, 0]])
    gradcheck(lambda t: t.gather(1, index), x)
    gradcheck(lambda t: t.gather(0, lucid.tensor([[2, 0, 0, 1]])), x)
    with pytest.raises(ValueError, match="same number of dims"):
        x.gather(1, lucid.tensor([0, 1]))
    with pytest.raises(TypeError, match="integer tensor"):
        x.gather(1, lucid.tensor([[0.0]]))
    with pytest.raises(ValueError, match="larger than the tensor"):
        x.gather(1, lucid.tensor([[0]] * 4))


def _scatter_reference(x, dim, index, src, add):
    out = x.copy()
    for pos in np.ndindex(*index.shape):
        dst = list(pos)
        dst[dim] = index[pos]
        value = src[pos] if np.ndim(src) else src
        if add:
            out[tuple(dst)] += value
        else:
            out[tuple(dst)] = value
    return out


def test_scatter_and_scatter_add_match_documented_formula():
    x = rand(3, 4, grad=False)
    index = lucid.tensor([[0, 2], [1, 1]])
    src = rand(2, 3, seed=1, grad=False)
    for dim in (0, 1):
        expected = _scatter_reference(arr(x), dim, index.numpy(), arr(src), add=False)
        assert_close(x.scatter(dim, index, src), expected)
        expected = _scatter_reference(arr(x), dim, index.numpy(), arr(src), add=True)
        assert_close(lucid.scatter_add(x, dim, index, src), expected)
        assert_close(x.scatter(dim, index, src, reduce="add"), expected)
    expected = _scatter_reference(arr(x), 1, index.numpy(), 9.0, add=False)
    assert_close(x.scatter(1, index, value=9.0), expected)
    assert_close(lucid.scatter(x, 1, index, 9.0), expected)


def test_scatter_gradients():
    index = lucid.tensor([[0, 2], [1, 3]])
    gradcheck(lambda t, s: t.scatter(1, index, s), rand(3, 4), rand(2, 3, seed=1))
    gradcheck(lambda t, s: t.scatter_add(1, index, s), rand(3, 4), rand(2, 2, seed=1))
    repeated = lucid.tensor([[0, 0, 1]])
    gradcheck(lambda t, s: t.scatter_add(0, repeated, s), rand(3, 3), rand(1, 3, seed=1))
    gradcheck(lambda t: t.scatter(0, repeated, value=2.0), rand(3, 3))


def test_scatter_inplace_and_errors():
    x = lucid.tensor([0.0, 0.0, 0.0])
    x.scatter_add_(0, lucid.tensor([1, 1]), lucid.tensor([1.0, 2.0]))
    assert_close(x, np.array([0.0, 3.0, 0.0], dtype=np.float32))
    x.scatter_(0, lucid.tensor([0]), lucid.tensor([5.0]))
    assert_close(x, np.array([5.0, 3.0, 0.0], dtype=np.float32))
    with pytest.raises(TypeError, match="exactly one of src and value"):
        x.scatter(0, lucid.tensor([0]))
    with pytest.raises(ValueError, match="must not be larger than src"):
        x.scatter(0, lucid.tensor([0, 1]), lucid.tensor([1.0]))


def test_take_along_dim():
    x = rand(3, 4, grad=False)
    idx = lucid.tensor(np.argsort(arr(x), axis=1))
    assert_close(lucid.take_along_dim(x, idx, 1), np.take_along_axis(arr(x), idx.numpy(), 1))
    flat = lucid.tensor([0, 5, 11])
    assert_close(x.take_along_dim(flat), arr(x).reshape(-1)[[0, 5, 11]])
    gradcheck(lambda t: lucid.take_along_dim(t, lucid.tensor([[1], [0], [3]]), 1), rand(3, 4))


# --- index_select / masked_fill -----------------------------------------------------------------


@given(dim=st.integers(-2, 1))
def test_index_select_matches_numpy(dim):
    x = rand(3, 4, grad=False)
    index = lucid.tensor([2, 0, 2, 1])
    expected = np.take(arr(x), index.numpy() % x.shape[dim], axis=dim)
    assert_close(x.index_select(dim, index % x.shape[dim]), expected)


def test_index_select_gradient_and_errors():
    gradcheck(lambda t: lucid.index_select(t, 1, lucid.tensor([3, 3, 0])), rand(2, 4))
    with pytest.raises(ValueError, match="must be 1-d"):
        rand(2, 4).index_select(0, lucid.tensor([[0]]))


def test_masked_fill_broadcasts_mask():
    x = rand(2, 3, grad=False)
    mask = lucid.tensor([True, False, True])
    assert_close(x.masked_fill(mask, -1.0), np.where([True, False, True], -1.0, arr(x)))
    value = lucid.tensor(4.0, dtype=lucid.float64)
    assert_close(lucid.masked_fill(x, mask, value), np.where([True, False, True], 4.0, arr(x)))


def test_masked_fill_gradients_to_tensor_and_value():
    mask = lucid.tensor([[True, False, True], [False, False, True]])
    gradcheck(lambda t, v: t.masked_fill(mask, v), rand(2, 3), rand(seed=1))
    gradcheck(lambda t: t.masked_fill(mask[0], 0.0), rand(2, 3))


def test_masked_fill_inplace_and_errors():
    x = lucid.tensor([1.0, 2.0, 3.0])
    x.masked_fill_(lucid.tensor([False, True, False]), 0.0)
    assert_close(x, np.array([1.0, 0.0, 3.0], dtype=np.float32))
    with pytest.raises(TypeError, match="mask must be a bool"):
        x.masked_fill(lucid.tensor([0, 1, 0]), 1.0)
    with pytest.raises(ValueError, match="0-d tensor"):
        x.masked_fill(lucid.tensor([True, False, True]), lucid.tensor([1.0, 2.0]))


def test_masked_select():
    x = rand(2, 3, grad=False)
    mask = lucid.tensor([True, False, True])
    assert_close(x.masked_select(mask), arr(x)[np.broadcast_to([True, False, True], (2, 3))])


# --- the ops trace: static index parts are attributes, index tensors operands -------------------


def _traced_family_ops(x, y):
    a = x[0, 1:, ::2]
    b = x[:, None, lucid.tensor([0, 2])]
    c = lucid.cat([x, x * 2.0], dim=-1).permute(2, 0, 1)
    d = x @ y
    e = lucid.einsum("...ij,jk->...ik", x, y)
    f = lucid.pad(x, (1, 2), mode="reflect")
    g = x.gather(2, lucid.tensor(np.zeros((2, 3, 1), np.int64)))
    h = x.masked_fill(x > 0, 0.0).tril().flip(0).roll(1, 1)
    z = x * 1.0
    z[:, 0] = 5.0
    s = lucid.stack(x.split(2, -1), 0)
    return a, b, c, d, e, f, g, h, z, s, x.unbind(1)[2], x.flatten(1).T


def test_family_ops_trace_and_interpret_like_eager():
    from lucid.ir import import_trace, interpret, parse_ir, print_ir
    from lucid.trace import _tracing

    rng = np.random.default_rng(0)
    xa = rng.standard_normal((2, 3, 4)).astype(np.float32)
    ya = rng.standard_normal((4, 5)).astype(np.float32)
    eager = _traced_family_ops(lucid.tensor(xa), lucid.tensor(ya))
    with _tracing() as tracer:
        outs = _traced_family_ops(tracer.input(xa.shape), tracer.input(ya.shape))
        tr = tracer.finish(outs)
        captured = tracer.feed_tensors()
    index_ops = [op for op in tr.ops if op.name == "index"]
    assert index_ops[0].attrs["index"] == (("int", 0), ("slice", 1, None, None), _slice(2))
    assert len(index_ops[1].inputs[1]) == 1  # the index tensor is an operand
    module = parse_ir(print_ir(import_trace(tr)))
    feeds = {"input:0": xa, "input:1": ya}
    feeds.update({role: t.numpy() for role, t in captured.items()})
    got = interpret(module, feeds)
    assert len(got) == len(eager)
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-6)


def _slice(step):
    return ("slice", None, None, step)


def test_bool_mask_index_is_a_graph_break_under_a_trace():
    from lucid.trace import GraphBreak, _tracing

    with _tracing() as tracer:
        x = tracer.input((3,))
        with pytest.raises(GraphBreak, match="nonzero"):
            x[x > 0]


def test_index_inference_keeps_symbolic_dims():
    from lucid.ops._registry import AVal

    x = AVal((None, 4, 5), lucid.float32)
    i = AVal((7,), lucid.int64)
    infer = REGISTRY["index"].infer
    assert infer(x, [], index=(_slice(None), ("int", 1))).shape == (None, 5)
    assert infer(x, [i], index=(_slice(None), ("tensor",))).shape == (None, 7, 5)
    assert infer(x, [i], index=(("tensor",), ("new",), ("int", 0))).shape == (7, 1, 5)


def test_second_order_gradients_through_index_and_gather():
    x = rand(3, 4)
    idx = lucid.tensor([[0, 1], [2, 2], [3, 0]])

    def grad_of(t):
        y = (t[:, 1:] * t[:, 1:] * t[:, 1:]).sum()
        y = y + (t.gather(1, idx) * t.gather(1, idx)).sum()
        (g,) = lucid.autograd.grad(y, t, create_graph=True)
        return g

    gradcheck(grad_of, x)


def test_setitem_with_a_value_read_from_the_same_tensor():
    # The value's history must reach y's history from before the write (autograd edges are
    # captured when an op runs, not read from the tensor at backward time).
    x = rand(2, 2)

    def f(t):
        y = t * 1.0
        y[0, 0] = y[1, 1] * 3.0
        return y

    gradcheck(f, x)
    f(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.0, 1.0], [1.0, 4.0]])


def test_index_select_on_a_0d_tensor():
    s = lucid.tensor(3.0)
    assert_close(s.index_select(0, lucid.tensor([0])), np.float32(3.0))
    with pytest.raises(IndexError, match="one value"):
        s.index_select(0, lucid.tensor([0, 0]))


def test_index_add_copy_fill_match_numpy():
    x = rand(4, 3, grad=False)
    index = lucid.tensor([2, 0, 2])
    src = rand(4, 3, seed=1, grad=False)[:, :3]
    expected = arr(x).copy()
    np.add.at(expected, (slice(None), index.numpy()), 2.0 * arr(src))
    assert_close(x.index_add(1, index, src, alpha=2.0), expected)
    expected = arr(x).copy()
    expected[:, [1, 0]] = arr(src)[:, :2]
    assert_close(lucid.index_copy(x, -1, lucid.tensor([1, 0]), src[:, :2]), expected)
    expected = arr(x).copy()
    expected[[3, 1]] = -1.0
    assert_close(x.index_fill(0, lucid.tensor([3, 1]), -1.0), expected)
    y = x.detach() * 1.0
    y.index_add_(0, lucid.tensor([0, 0]), lucid.tensor(np.ones((2, 3))))
    assert_close(y, arr(x) + np.array([[2.0], [0.0], [0.0], [0.0]]))
    assert x[range(1, 3)].shape == (2, 3)


def test_index_add_gradients_and_errors():
    index = lucid.tensor([2, 0, 2])
    gradcheck(lambda t, s: t.index_add(0, index, s), rand(3, 2), rand(3, 2, seed=1))
    gradcheck(lambda t, s: t.index_copy(1, lucid.tensor([1]), s), rand(3, 2), rand(3, 1, seed=1))
    gradcheck(lambda t: t.index_fill(1, lucid.tensor([0]), 2.0), rand(3, 2))
    with pytest.raises(ValueError, match="source has shape"):
        rand(3, 2).index_add(0, index, rand(2, 2))
